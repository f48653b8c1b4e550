"""bench.yml's preflight, unit by unit: the controller's checks (plugins/plugin_utils/preflight.py)
over a host's settings as the bench role sees them, and the target's (module_utils/preflight.py):
a jsonl workload read where the client reads it, an SGLang profile rendered and flag-checked
against the installed release.

The playbook end of it (nothing started, no run directory) is tests/integration/test_bench_preflight.py.
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys

import pytest
import yaml

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.servelab.serving.plugins.module_utils import preflight as target
from ansible_collections.servelab.serving.plugins.module_utils.server.render import ENGINES
from ansible_collections.servelab.serving.plugins.plugin_utils import preflight as pf
from fakesglang import fake_sglang  # tests/ (conftest.py puts it on sys.path)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

with open(pf.ROLE_SPEC_FILE, encoding="utf-8") as _fh:
    SPEC_DOC = yaml.safe_load(_fh)
OPTIONS = SPEC_DOC["argument_specs"]["main"]["options"]
SPEC = pf.role_spec(SPEC_DOC)
with open(pf.ROLE_DEFAULTS_FILE, encoding="utf-8") as _fh:
    DEFAULTS = yaml.safe_load(_fh)

# The role's defaults as templating leaves them on a host of the embedded inventory.
TEMPLATED = {"bench_engine_python": sys.executable, "bench_client": "localhost",
             "bench_results_root": "/srv/results"}
PROFILES = [{"name": "baseline", "simulator": {"profile": "baseline", "time_scale": 20}},
            {"name": "eagle3", "simulator": {"profile": "eagle3", "time_scale": 20}}]


def host(name="gpu1", **given) -> pf.HostInput:
    values = dict(DEFAULTS, **TEMPLATED)
    values["bench_profiles"] = PROFILES
    values.update(given)
    return pf.HostInput(host=name, values=values, given=tuple(sorted(given)))


def run(*inputs, controller=None, inventory=("localhost", "gpu1", "gpu2")) -> pf.Preflight:
    return pf.run_preflight(list(inputs), OPTIONS, list(inventory), controller=controller)


def texts(report: pf.Preflight):
    return [p.text() for p in report.problems]


def only(report: pf.Preflight, variable: str) -> str:
    """The one problem, which must name `variable`."""
    assert len(report.problems) == 1, texts(report)
    problem = report.problems[0]
    assert problem.message.startswith(variable), problem.message
    return problem.message


# ---------------------------------------------------------------------------------------------
# The role's declarations


def test_every_role_default_is_declared_in_the_argument_spec():
    assert set(DEFAULTS) <= set(SPEC), set(DEFAULTS) - set(SPEC)


def test_the_role_engine_choices_are_the_engines_llm_server_renders():
    assert set(SPEC["bench_engine"].choices) == set(ENGINES)


def test_every_bench_variable_the_playbooks_roles_and_inventories_use_is_known():
    """A name referenced anywhere but known nowhere would be rejected by the preflight: declare it
    in roles/bench/meta/argument_specs.yml (or PLAYBOOK_VARIABLES for playbook-level ones)."""
    # What bench.yml runs (its playbook, the role's main flow and defaults) and the inventories.
    files = ([os.path.join(REPO, "playbooks", "bench.yml"), pf.ROLE_DEFAULTS_FILE]
             + [os.path.join(pf.ROLE_DIR, "tasks", name) for name in ("main.yml", "profile.yml")]
             + glob.glob(os.path.join(REPO, "inventory", "**", "*.yml"), recursive=True))
    pattern = os.path.join(REPO, "plugins", "*", "bench_*.py")
    plugins = {os.path.basename(p)[:-3] for p in glob.glob(pattern)}
    used, registered = set(), set()
    for path in files:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        # `__bench_x` are the role's internal names, `servelab.serving.bench_x` plugins.
        used |= set(re.findall(r"(?<![\w.])bench_[a-z0-9_]+", text))
        # Results a task registers are no settings of the user's.
        registered |= set(re.findall(r"register:\s*(bench_[a-z0-9_]+)", text))
    used -= registered | plugins | {"bench_clients"}     # bench_clients is a group
    assert used - set(pf.known_names(SPEC)) == set()


def test_the_role_defaults_pass_ansibles_own_validation_of_the_role_spec():
    values = dict(DEFAULTS, **TEMPLATED, bench_profiles=PROFILES, bench_run_id="r1")
    result = ArgumentSpecValidator(OPTIONS).validate(values)
    assert result.error_messages == []


def test_the_role_spec_declares_the_port_as_an_int_the_validator_enforces():
    assert SPEC["bench_server_port"].type == "int"
    result = ArgumentSpecValidator(OPTIONS).validate(
        dict(DEFAULTS, **TEMPLATED, bench_profiles=PROFILES, bench_run_id="r1",
             bench_server_port="port"))
    assert any("bench_server_port" in m for m in result.error_messages)


# ---------------------------------------------------------------------------------------------
# Good settings pass


def test_the_embedded_defaults_pass():
    report = run(host("localhost", bench_engine="simulator", bench_server_port=30123,
                      bench_level_seconds=8, bench_workload={"kind": "synthetic",
                                                             "input_tokens": 2048,
                                                             "output_tokens": 512}))
    assert report.ok, texts(report)
    assert report.profiles == 2 and report.target_checks == []


def test_numbers_and_booleans_given_as_strings_pass_as_the_modules_accept_them():
    # -e key=value gives strings; llm_server and llm_bench convert them.
    report = run(host(bench_server_port="30123", bench_level_seconds="2.5", bench_reap="no",
                      bench_max_tokens="64"))
    assert report.ok, texts(report)


# ---------------------------------------------------------------------------------------------
# Each bad input of the issue, named with its fix


def test_unknown_engine_in_one_of_two_profiles_names_that_profile_only():
    profiles = [PROFILES[0], dict(PROFILES[1], engine="sglangg")]
    msg = only(run(host(bench_profiles=profiles)), "bench_profiles[1] (eagle3).engine")
    assert "'sglangg' is not one of simulator, sglang, vllm, command" in msg
    assert "fix the profile" in msg


def test_a_half_filled_speculative_block_fails_with_profiles_own_message():
    profiles = [PROFILES[0], {"name": "eagle3", "engine": "sglang", "model": "/m",
                              "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d",
                                              "num_steps": 3}}]
    msg = only(run(host(bench_profiles=profiles)), "bench_profiles[1] (eagle3)")
    assert "num_steps set without eagle_topk, num_draft_tokens" in msg and "together" in msg


def test_a_profile_the_engine_cannot_render_fails_before_the_engine_is_needed():
    # SGLang needs a draft model for EAGLE3: render_server says so without any SGLang installed.
    profiles = [{"name": "eagle3", "engine": "sglang", "base": "eagle3", "model": "/m"}]
    msg = only(run(host(bench_profiles=profiles)), "bench_profiles[0] (eagle3)")
    assert "draft_model_path is required for EAGLE3" in msg


def test_a_profile_key_typo_gets_the_nearest_key():
    profiles = [{"name": "a", "enigne": "sglang"}]
    msg = only(run(host(bench_profiles=profiles)), "bench_profiles[0] (a)")
    assert "unknown key 'enigne'; did you mean engine?" in msg


def test_profile_names_unique_and_usable_as_instance_names():
    report = run(host(bench_profiles=[{"name": "a"}, {"name": "a"}, {"name": "b c"}, {}]))
    joined = "\n".join(texts(report))
    assert "bench_profiles[1] (a).name: 'a' is also the name of bench_profiles[0]" in joined
    assert "bench_profiles[2] (b c).name: 'b c' must be letters, digits" in joined
    assert "bench_profiles[3].name: missing" in joined


def test_no_profiles_is_an_error():
    only(run(host(bench_profiles=[])), "bench_profiles: no profiles")


def test_a_negative_slo():
    msg = only(run(host(bench_slo={"ttft_ms": -5})), "bench_slo.ttft_ms")
    assert "-5 must be > 0" in msg


def test_an_unknown_slo_key_gets_the_nearest():
    msg = only(run(host(bench_slo={"ttft": 200})), "bench_slo.ttft")
    assert "did you mean ttft_ms?" in msg


def test_port_70000_is_named_as_bench_server_port():
    msg = only(run(host(bench_server_port=70000)), "bench_server_port")
    assert "70000 is not a TCP port (1-65535)" in msg


def test_level_seconds_zero_and_beyond_the_level_timeout():
    assert "0 must be > 0" in only(run(host(bench_level_seconds=0)), "bench_level_seconds")
    msg = only(run(host(bench_level_seconds=900)), "bench_level_seconds")
    assert "below llm_bench's level_timeout (600 s)" in msg


@pytest.mark.parametrize("variable, value, says", [
    ("bench_min_latency_samples", -1, "min_latency_samples: expected an integer >= 0"),
    ("bench_drain_timeout", -5, "drain_timeout: expected seconds >= 0"),
])
def test_sweep_options_llm_bench_refuses_name_the_bench_variable(variable, value, says):
    msg = only(run(host(**{variable: value})), variable)
    assert says in msg


def test_a_typo_variable_gets_the_nearest_known_name():
    msg = only(run(host(bench_concurency=[1, 2])), "bench_concurency")
    assert msg == "bench_concurency: unknown variable; did you mean bench_concurrency?"


def test_an_unknown_variable_without_a_near_name_says_how_to_name_helpers():
    msg = only(run(host(bench_xyzzy_quux=1)), "bench_xyzzy_quux")
    assert "without the bench_ prefix" in msg


def test_the_playbook_level_variables_are_known():
    # Names the role declares (some may move there) are type-checked instead: leave them out.
    given = {name: True for name in pf.PLAYBOOK_VARIABLES
             if name != "bench_report_baseline" and name not in SPEC}
    assert given and run(host(**given)).ok


def test_concurrency_as_a_string_is_refused_with_the_list_to_write():
    msg = only(run(host(bench_concurrency="1,2,5")), "bench_concurrency")
    assert "'1,2,5' is a string; give a YAML list [1, 2, 5]" in msg


def test_concurrency_levels_are_positive_integers_not_strings():
    report = run(host(bench_concurrency=[1, "5", 0, 2.5]))
    joined = "\n".join(texts(report))
    assert "bench_concurrency[1]: '5' is a string" in joined
    assert "bench_concurrency[3]: 2.5 is not an integer" in joined
    report = run(host(bench_concurrency=[1, 0]))
    assert "bench_concurrency[1]: 0 must be >= 1" in only(report, "bench_concurrency[1]")


def test_wrong_types_and_choices_name_the_variable():
    report = run(host(bench_engine="sglangg", bench_workload="kind=builtin", bench_reap="maybe",
                      bench_server_port="port"))
    joined = "\n".join(texts(report))
    assert "bench_engine: 'sglangg' is not one of simulator, sglang, vllm, command; did you " \
           "mean sglang?" in joined
    assert "bench_workload: expected a mapping, got a string" in joined
    assert "bench_reap: 'maybe' is not true or false" in joined
    assert "bench_server_port: 'port' is a string, not an integer" in joined


def test_workload_shape_and_jsonl_left_for_the_bench_client():
    assert "bench_workload.kind 'jsnl': expected one of" in only(
        run(host(bench_workload={"kind": "jsnl"})), "bench_workload.kind")
    assert "bench_workload.input_tokens is required" in only(
        run(host(bench_workload={"kind": "synthetic"})), "bench_workload.input_tokens")
    report = run(host("gpu1", bench_client="client1", bench_workload={"kind": "jsonl",
                                                                      "path": "/p.jsonl"}),
                 host("gpu2", bench_client="client1", bench_workload={"kind": "jsonl",
                                                                      "path": "/p.jsonl"}),
                 inventory=("gpu1", "gpu2", "client1"))
    assert report.ok, texts(report)
    [check] = [c.as_dict() for c in report.target_checks]
    # One read on the client for both servers that use the same file.
    assert check["host"] == "client1" and check["servers"] == []
    assert [(w["hosts"], w["workload"]["path"]) for w in check["workloads"]] == [
        (["gpu1", "gpu2"], "/p.jsonl")]


def test_a_bench_client_outside_the_inventory():
    msg = only(run(host(bench_client="clinet1"), inventory=("gpu1", "client1")), "bench_client")
    assert "not a host of the inventory" in msg


def test_a_reap_pattern_that_is_no_regex():
    msg = only(run(host(bench_reap_patterns=["python(("])), "bench_reap_patterns[0]")
    assert "not a regular expression" in msg


def test_sglang_profiles_are_left_for_their_gpu_server():
    profiles = [{"name": "baseline", "engine": "sglang", "model": "/m", "tp": 8}]
    report = run(host("gpu1", bench_profiles=profiles))
    assert report.ok, texts(report)
    [check] = report.target_checks
    assert check.host == "gpu1" and check.workloads == []
    [server] = check.servers
    assert server["variable"] == "bench_profiles[0] (baseline)"
    assert server["request"]["engine"] == "sglang" and server["request"]["name"] == "servelab-baseline"
    # engine is the role's key: llm_server's profile never sees it.
    assert "engine" not in server["request"]["profile"]


def test_every_problem_is_reported_not_just_the_first():
    report = run(host(bench_server_port=70000, bench_level_seconds=0, bench_slo={"e2e_ms": -1},
                      bench_concurency=[1], bench_concurrency="1,2,5",
                      bench_profiles=[PROFILES[0], dict(PROFILES[1], engine="sglangg")]))
    variables = [p.message.split(":")[0] for p in report.problems]
    for needle in ("bench_server_port", "bench_level_seconds", "bench_slo.e2e_ms",
                   "bench_concurency", "bench_concurrency", "bench_profiles[1] (eagle3).engine"):
        assert needle in variables, texts(report)


def test_the_same_problem_on_several_hosts_is_reported_once_with_the_hosts():
    report = run(host("gpu1", bench_server_port=70000), host("gpu2", bench_server_port=70000))
    [problem] = report.problems
    assert problem.hosts == ("gpu1", "gpu2") and problem.text().endswith("[gpu1, gpu2]")


def test_the_origin_is_in_the_message():
    inp = host(bench_server_port=70000)
    inp.origins["bench_server_port"] = "inventory/x/group_vars/gpu_servers.yml:3"
    assert "(set at inventory/x/group_vars/gpu_servers.yml:3)" in run(inp).problems[0].text()


def test_a_template_that_cannot_be_evaluated_is_named():
    inp = host()
    inp.errors["bench_model"] = "'draft' is undefined"
    msg = only(run(inp), "bench_model")
    assert "cannot be evaluated ('draft' is undefined)" in msg


def test_no_gpu_server_at_all():
    assert "no host in group gpu_servers" in only(run(), "gpu_servers")


def test_the_controllers_own_variables_are_held_to_the_same_rules():
    controller = pf.HostInput("localhost", {"bench_report_baseline": "basline"},
                              given=("bench_report_baseline", "bench_concurency"))
    report = run(host(), controller=controller)
    joined = "\n".join(texts(report))
    assert "bench_concurency: unknown variable; did you mean bench_concurrency?" in joined
    assert "bench_report_baseline: 'basline' is not the name of any profile (baseline, " \
           "eagle3); did you mean baseline?" in joined


def test_failure_lines_say_nothing_was_started():
    lines = pf.failure_lines(run(host(bench_server_port=0)).problems)
    assert lines[0].startswith("bench preflight: 1 problem(s); nothing was started")
    assert lines[1].startswith("- bench_server_port: 0 is not a TCP port")


# ---------------------------------------------------------------------------------------------
# On the target


def test_jsonl_missing_malformed_empty_and_good(tmp_path):
    def check(path):
        return target.check_workload({"variable": "bench_workload", "hosts": ["gpu1"],
                                      "workload": {"kind": "jsonl", "path": str(path)}})

    [missing] = check(tmp_path / "nope.jsonl")
    assert missing.message.startswith("bench_workload.path")
    assert "no such file on the bench client" in missing.message and missing.hosts == ("gpu1",)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": "cut\n')
    [malformed] = check(bad)
    assert "line 2: not JSON" in malformed.message and malformed.variable == "bench_workload"
    shape = tmp_path / "shape.jsonl"
    shape.write_text('{"text": "no prompt key"}\n')
    assert 'expected {"prompt": str}' in check(shape)[0].message
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "no prompts in the file" in check(empty)[0].message
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"prompt": "hello"}) + "\n")
    assert check(good) == []


def server_item(python, **profile):
    return {"variable": "bench_profiles[0] (baseline)", "hosts": ["gpu1"],
            "request": {"name": "servelab-baseline", "engine": "sglang", "host": "127.0.0.1",
                        "port": 30000, "python": python, "state_dir": "/nonexistent",
                        "profile": dict({"name": "baseline", "model": "/m", "tp": 8}, **profile)}}


def test_sglang_flags_checked_against_the_installed_release(tmp_path):
    python = fake_sglang(tmp_path)
    assert target.check_server(server_item(python)) == []
    [problem] = target.check_server(server_item(python, extra_args=["--attention-backnd", "fa3"]))
    assert problem.message.startswith("bench_profiles[0] (baseline): the installed SGLang 0.5.23 "
                                      "rejects the rendered command")
    assert "--attention-backnd is not defined by this release" in problem.message
    assert "extra_args" in problem.message


def test_sglang_not_installed_names_bench_engine_python(tmp_path):
    [problem] = target.check_server(server_item(str(tmp_path / "no-python")))
    assert "cannot tell which SGLang" in problem.message
    assert "bench_engine_python" in problem.message


def test_the_target_checks_touch_nothing(tmp_path):
    python = fake_sglang(tmp_path)
    item = server_item(python)
    item["request"]["state_dir"] = str(tmp_path / "servers")
    assert target.run_checks([], [item]) == []
    assert not (tmp_path / "servers").exists()
