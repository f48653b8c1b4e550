"""Rendering: golden command lines per engine (and per SGLang release), and the rules behind them.

Golden files: tests/data/sglang/golden/<engine>-<version>/<profile>.txt, one argv element per
line. After an intended change: SERVELAB_REGEN_GOLDEN=1 pytest tests/unit/test_server_render.py,
then review the diff like code.
"""
import json
import os

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import ProfileError, resolve_profile
from ansible_collections.servelab.serving.plugins.module_utils.server.render import render_server
from ansible_collections.servelab.serving.plugins.module_utils.server.render_sglang import SGLANG_PINNED_VERSIONS
from ansible_collections.servelab.serving.plugins.module_utils.server.render_vllm import VLLM_DEFAULT_VERSION

DATA = os.path.join(os.path.dirname(__file__), "..", "data", "sglang")
GOLDEN = os.path.join(DATA, "golden")
PYTHON = "/opt/venv/bin/python"
SIM_SCRIPT = "/state/sim/servelab_simulator.py"
with open(os.path.join(DATA, "golden_profiles.json"), encoding="utf-8") as _fh:
    PROFILES = json.load(_fh)


def render(engine, raw, version=None, **kw):
    kw.setdefault("host", "0.0.0.0")
    kw.setdefault("port", 8000 if engine == "command" else None)
    return render_server(resolve_profile(raw), engine, python=PYTHON, engine_version=version,
                         simulator_script=SIM_SCRIPT, **kw)


def golden_text(spec):
    lines = [f"# engine={spec.engine} version={spec.engine_version or '-'} "
             f"profile={spec.profile_name}", "cmd:"]
    lines += [f"  {part}" for part in spec.cmd]
    lines.append("env:")
    lines += [f"  {k}={v}" for k, v in sorted(spec.env.items())]
    lines.append(f"ready: {spec.ready.method} {spec.ready.path}"
                 + (f" {json.dumps(spec.ready.body, sort_keys=True)}" if spec.ready.body else ""))
    lines.append(f"base_url: {spec.base_url}")
    lines.append(f"model: {spec.model}")
    lines += [f"note: {n}" for n in spec.notes]
    lines += [f"ignored: {k}" for k in spec.ignored_keys]
    return "\n".join(lines) + "\n"


def golden_cases():
    for version in SGLANG_PINNED_VERSIONS:
        for name in PROFILES["sglang"]:
            yield "sglang", version, name
    for name in PROFILES["vllm"]:
        yield "vllm", VLLM_DEFAULT_VERSION, name
    for engine in ("simulator", "command"):
        for name in PROFILES[engine]:
            yield engine, None, name


@pytest.mark.parametrize("engine, version, name", list(golden_cases()))
def test_golden_command_lines(engine, version, name):
    spec = render(engine, PROFILES[engine][name], version)
    path = os.path.join(GOLDEN, f"{engine}-{version or 'any'}", f"{name}.txt")
    text = golden_text(spec)
    if os.environ.get("SERVELAB_REGEN_GOLDEN"):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    with open(path, encoding="utf-8") as fh:
        assert text == fh.read(), f"{path} differs (regenerate and review if intended)"


# --- the rules the golden files encode, stated explicitly --------------------------------------

def test_sglang_fusion_and_cuda_graph_flags_follow_the_release():
    raw = PROFILES["sglang"]["switches"]
    old = render("sglang", raw, "0.5.13.post1").cmd
    new = render("sglang", raw, "0.5.23").cmd
    assert "--enable-flashinfer-allreduce-fusion" in old
    assert "--flashinfer-allreduce-fusion-backend" not in old
    i = new.index("--flashinfer-allreduce-fusion-backend")
    assert new[i + 1] == "auto" and "--enable-flashinfer-allreduce-fusion" not in new
    assert old[old.index("--cuda-graph-max-bs") + 1] == "64"
    assert new[new.index("--cuda-graph-max-bs-decode") + 1] == "64"
    assert "--cuda-graph-max-bs" not in new


def test_sglang_spec_v2_switch_follows_the_release():
    v2 = PROFILES["sglang"]["eagle3_v2"]
    off = PROFILES["sglang"]["eagle3_no_overlap"]
    assert render("sglang", v2, "0.5.10").env["SGLANG_ENABLE_SPEC_V2"] == "True"
    assert render("sglang", off, "0.5.13.post1").env["SGLANG_ENABLE_SPEC_V2"] == "False"
    new_v2, new_off = render("sglang", v2, "0.5.23"), render("sglang", off, "0.5.23")
    assert "SGLANG_ENABLE_SPEC_V2" not in new_v2.env and "SGLANG_ENABLE_SPEC_V2" not in new_off.env
    assert "--disable-overlap-schedule" in new_off.cmd
    assert "--disable-overlap-schedule" not in new_v2.cmd
    assert any("spec_v2" in note for note in new_v2.notes)


def test_sglang_speculative_flags_are_all_there():
    cmd = render("sglang", PROFILES["sglang"]["eagle3"], "0.5.23").cmd
    pairs = dict(zip(cmd, cmd[1:]))
    assert pairs["--speculative-algorithm"] == "EAGLE3"
    assert pairs["--speculative-draft-model-path"] == "/models/draft-eagle3"
    assert (pairs["--speculative-num-steps"], pairs["--speculative-eagle-topk"],
            pairs["--speculative-num-draft-tokens"]) == ("3", "4", "16")
    assert pairs["--tp-size"] == "8" and "--enable-metrics" in cmd
    assert cmd[:3] == (PYTHON, "-m", "sglang.launch_server")


@pytest.mark.parametrize("engine, raw, version, needles", [
    ("sglang", {"base": "eagle3", "model": "/m"}, "0.5.23",
     ["speculative.draft_model_path is required for EAGLE3"]),
    ("sglang", {"name": "a"}, "0.5.23", ["model is required for engine sglang"]),
    ("sglang", {"name": "a", "model": "/m", "flashinfer_allreduce_fusion": "trtllm"},
     "0.5.13.post1", ["backend 'trtllm' needs SGLang >= 0.5.14"]),
    ("sglang", {"name": "a", "model": "/m", "tp": 8, "extra_args": ["--tp-size=4"]}, "0.5.23",
     ["extra_args repeats --tp-size"]),
    ("vllm", {"base": "eagle3", "model": "/m", "speculative": {"draft_model_path": "/d"}}, None,
     ["vLLM drafts chains", "eagle_topk must be 1", "got 4"]),
    ("vllm", {"base": "eagle3_v2", "model": "/m", "speculative": {"draft_model_path": "/d"}},
     None, ["spec_v2 is not rendered for engine vllm"]),
    ("vllm", {"name": "a", "model": "/m", "flashinfer_allreduce_fusion": True}, None,
     ["flashinfer_allreduce_fusion is not rendered for engine vllm", "extra_args"]),
    ("vllm", {"name": "a", "model": "/m", "speculative": {"algorithm": "EAGLE3",
                                                          "draft_model_path": "/d"}}, None,
     ["vLLM needs the number of speculative tokens"]),
    ("command", {"name": "a", "model": "/m"}, None, ["engine command needs profile.command"]),
    ("command", {"name": "a", "tp": 2, "command": ["srv"]}, None,
     ["tp cannot be rendered for engine command"]),
    ("command", {"name": "a", "command": ["srv", "{model}"]}, None,
     ["uses {model} but no model is set"]),
    ("sglang", {"name": "a", "model": "/m", "command": ["x"]}, "0.5.23",
     ["command is only used with engine command"]),
    ("simulator", {"name": "a", "simulator": {"levels": [1, 2]}}, None,
     ["simulator.levels must be a single value"]),
])
def test_render_errors_name_the_key(engine, raw, version, needles):
    with pytest.raises(ProfileError) as err:
        render(engine, raw, version)
    for needle in needles:
        assert needle in str(err.value)


def test_rendered_env_conflicting_with_module_env_is_an_error():
    with pytest.raises(ProfileError) as err:
        render("sglang", PROFILES["sglang"]["eagle3_v2"], "0.5.10",
               module_env={"SGLANG_ENABLE_SPEC_V2": "False"})
    assert "env.SGLANG_ENABLE_SPEC_V2='False' conflicts with 'True'" in str(err.value)


def test_env_layers_module_then_profile_then_rendered():
    spec = render("sglang", dict(PROFILES["sglang"]["eagle3_v2"], env={"CUDA_HOME": "/cuda-13"}),
                  "0.5.10", module_env={"CUDA_HOME": "/usr/local/cuda", "PATH": "/x:/usr/bin"})
    assert spec.env == {"CUDA_HOME": "/cuda-13", "PATH": "/x:/usr/bin",
                        "SGLANG_ENABLE_SPEC_V2": "True"}


def test_vllm_speculative_config_is_json_with_chain_length():
    spec = render("vllm", PROFILES["vllm"]["eagle3_chain"])
    config = json.loads(spec.cmd[spec.cmd.index("--speculative-config") + 1])
    assert config == {"method": "eagle3", "model": "/models/draft-eagle3",
                      "num_speculative_tokens": 3}
    assert spec.cmd[:2] == ("/opt/venv/bin/vllm", "serve")
    assert spec.ready.path == "/v1/completions" and spec.ready.body["max_tokens"] == 1
    assert spec.ready.body["model"] == "/models/target"


def test_simulator_ignores_engine_switches_and_says_so():
    spec = render("simulator", PROFILES["simulator"]["eagle3"])
    assert set(spec.ignored_keys) == {"tp", "speculative", "enable_metrics"}
    pairs = dict(zip(spec.cmd, spec.cmd[1:]))
    assert pairs["--profile"] == "eagle3" and pairs["--time-scale"] == "20"
    assert pairs["--die-after"] == "100" and pairs["--truth-log"] == "/tmp/truth.jsonl"
    assert spec.cmd[:2] == (PYTHON, SIM_SCRIPT)
    assert spec.ready.path == "/health_generate"


def test_command_placeholders_are_filled():
    spec = render("command", PROFILES["command"]["transformers_serve"], host="127.0.0.1",
                  port=8123)
    assert spec.cmd == ("transformers", "serve", "/tmp/model", "--continuous-batching",
                        "--host", "127.0.0.1", "--port", "8123")
    assert spec.ready.body["model"] == "/tmp/model"   # added to the user's readiness body


def test_config_hash_tracks_argv_env_and_version_only():
    raw = PROFILES["sglang"]["eagle3"]
    a, b = render("sglang", raw, "0.5.23"), render("sglang", raw, "0.5.23")
    assert a.config_hash == b.config_hash
    assert render("sglang", dict(raw, tp=4), "0.5.23").config_hash != a.config_hash
    assert render("sglang", dict(raw, env={"X": "1"}), "0.5.23").config_hash != a.config_hash
    assert render("sglang", raw, "0.5.23.post1").config_hash != a.config_hash
    # A different label for the same server is the same server.
    assert render("sglang", dict(raw, name="other"), "0.5.23").config_hash == a.config_hash


def test_wildcard_bind_probes_loopback_and_advertises_the_given_host():
    spec = render("sglang", PROFILES["sglang"]["baseline"], "0.5.23", host="0.0.0.0",
                  advertise_host="10.0.0.5")
    assert spec.probe_host == "127.0.0.1" and spec.base_url == "http://10.0.0.5:30000"
    v6 = render("sglang", PROFILES["sglang"]["baseline"], "0.5.23", host="::1", port=30001)
    assert v6.base_url == "http://[::1]:30001"


def test_versions_outside_the_checked_range_warn():
    raw = PROFILES["sglang"]["baseline"]
    assert render("sglang", raw, "0.5.23").warnings == ()
    assert any("outside the releases" in w for w in render("sglang", raw, "0.6.0").warnings)
    assert any("outside the releases" in w for w in render("sglang", raw, "0.4.10").warnings)
    assert any("pre-release" in w for w in render("sglang", raw, "0.5.20rc1").warnings)


SIMULATOR_CLI = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "module_utils",
                             "simulator", "cli.py")


def test_rendered_simulator_flags_are_the_simulators_own():
    from ansible_collections.servelab.serving.plugins.module_utils.server.argdefs import argdefs_from_sources, flags_in
    from ansible_collections.servelab.serving.plugins.module_utils.server.render import SIMULATOR_FLAGS
    with open(SIMULATOR_CLI, encoding="utf-8") as fh:
        defined = argdefs_from_sources([("cli.py", fh.read())])
    raw = {"name": "all", "simulator": {key: "1" for key in SIMULATOR_FLAGS}}
    rendered = flags_in(render("simulator", raw).cmd)
    assert set(rendered) == {"--host", "--port", "--model-name"} | set(SIMULATOR_FLAGS.values())
    assert [flag for flag in rendered if flag not in defined] == []


# llm_server hands its parameters to ServerRequest(**params) and returns ServerResult.as_dict()
# (less `changed` and `warnings`, which go through Ansible's own keys). ansible-test's
# validate-modules checks its documentation against its argument spec; these check the code.
def test_llm_server_options_are_request_fields_and_its_engines_render():
    from ansible_collections.servelab.serving.plugins.module_utils.server.manager import ServerRequest
    from ansible_collections.servelab.serving.plugins.module_utils.server.render import ENGINES
    from ansible_collections.servelab.serving.plugins.modules import llm_server
    assert set(llm_server.ARGUMENT_SPEC) <= set(ServerRequest.__dataclass_fields__)
    assert llm_server.ARGUMENT_SPEC["engine"]["choices"] == list(ENGINES)


def test_every_result_field_of_llm_server_is_documented():
    import dataclasses

    import yaml

    from ansible_collections.servelab.serving.plugins.module_utils.server.manager import ServerResult
    from ansible_collections.servelab.serving.plugins.modules import llm_server
    returned = set(yaml.safe_load(llm_server.RETURN))
    fields = {f.name for f in dataclasses.fields(ServerResult)} - {"changed", "warnings"}
    assert fields <= returned, "undocumented in RETURN: %s" % sorted(fields - returned)
