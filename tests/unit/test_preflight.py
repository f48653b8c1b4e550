"""bench.yml's preflight, unit by unit: the controller's checks (plugins/plugin_utils/preflight/)
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


def test_the_role_engine_choices_are_the_engines_llm_server_renders_and_external():
    assert set(SPEC["bench_engine"].choices) == set(ENGINES) | {pf.EXTERNAL}


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
    assert report.profiles == 2
    # only the server port, checked free on the host
    assert [(c.host, [p["port"] for p in c.ports], c.servers, c.workloads, c.executables)
            for c in report.target_checks] == [("localhost", [30123], [], [], [])]


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
    # The range is LevelConfig.validate's, llm_bench's one validator (no copy in the preflight).
    msg = only(run(host(bench_level_seconds=0)), "bench_level_seconds")
    assert "level_seconds: expected seconds > 0 (given 0); fix bench_level_seconds" in msg
    msg = only(run(host(bench_level_seconds=900)), "bench_level_timeout")
    assert "level_timeout: must exceed level_seconds (900.0): it bounds warmup + window" in msg


@pytest.mark.parametrize("variable, value, says", [
    ("bench_min_latency_samples", -1, "min_latency_samples: expected an integer >= 0"),
    ("bench_drain_timeout", -5, "drain_timeout: expected seconds >= 0"),
    ("bench_processes", -1, "processes: expected >= 1 client processes, or 0 for automatic"),
    ("bench_target_ci_pct", 0, "target_ci_pct: expected a percentage > 0"),
    ("bench_min_window_requests", 0, "min_window_requests: expected an integer >= 1"),
    ("bench_max_requests", 0, "max_requests: expected an integer >= 1"),
    ("bench_ci_batches", 1, "ci_batches: expected >= 2 batches"),
    ("bench_socket_rcvbuf", -1, "socket_rcvbuf: expected bytes >= 0"),
    ("bench_ramp_seconds", -1, "ramp_seconds: expected seconds >= 0"),
    ("bench_request_rate", [1, 2], "request_rate: only used with load_mode rate"),
])
def test_sweep_options_llm_bench_refuses_name_the_bench_variable(variable, value, says):
    msg = only(run(host(**{variable: value})), variable)
    assert says in msg
    assert msg.endswith("fix %s" % variable)


@pytest.mark.parametrize("given, variable, says", [
    # rate mode without rates
    ({"bench_load_mode": "rate", "bench_concurrency": [8]}, "bench_request_rate",
     "load_mode rate needs a list of request rates per second"),
    ({"bench_load_mode": "rate", "bench_concurrency": [8], "bench_request_rate": [2, -1]},
     "bench_request_rate", "-1.0 is not a positive number of requests per second"),
    # the default eight closed-loop levels: rate mode takes one value, the cap in flight
    ({"bench_load_mode": "rate", "bench_request_rate": [2, 4]}, "bench_concurrency",
     "with load_mode rate give one value, the cap on requests in flight"),
])
def test_rate_mode_mistakes_name_the_bench_variable(given, variable, says):
    msg = only(run(host(**given)), variable)
    assert says in msg, msg


@pytest.mark.parametrize("given, says", [
    ({"bench_load_mode": "rte"}, "bench_load_mode: 'rte' is not one of concurrency, rate; did "
                                 "you mean rate?"),
    ({"bench_arrival": "poison"}, "bench_arrival: 'poison' is not one of poisson, constant"),
    ({"bench_rx_timestamps": "kernal"}, "bench_rx_timestamps: 'kernal' is not one of kernel, "
                                        "user; did you mean kernel?"),
    ({"bench_extra_body": "temperature=0"}, "bench_extra_body: expected a mapping, got a string"),
    ({"bench_request_rate": "1,2"}, "bench_request_rate: '1,2' is a string; give a YAML list "
                                    "[1, 2]"),
    ({"bench_ignore_eos": "maybe"}, "bench_ignore_eos: 'maybe' is not true or false"),
    ({"bench_server_metrics": "sometimes"}, "bench_server_metrics: 'sometimes' is not true or "
                                            "false"),
    ({"bench_processes": "two"}, "bench_processes: 'two' is a string, not an integer"),
])
def test_sweep_option_types_and_choices_name_the_variable(given, says):
    report = run(host(**given))
    assert any(says in t for t in texts(report)), texts(report)


def test_good_rate_mode_and_every_sweep_option_pass():
    report = run(host(bench_load_mode="rate", bench_request_rate=[0.5, 2, 8], bench_arrival="constant",
                      bench_concurrency=[64], bench_processes=2, bench_target_ci_pct=2.5,
                      bench_extra_body={"temperature": 0}, bench_ignore_eos=True,
                      bench_min_window_requests=20, bench_max_requests=500, bench_ci_batches=8,
                      bench_level_timeout=300, bench_stall_timeout=60, bench_ramp_seconds=0,
                      bench_socket_rcvbuf=0, bench_seed=7, bench_per_chunk_usage=False,
                      bench_rx_timestamps="user", bench_server_metrics=False))
    assert report.ok, texts(report)
    # -e key=value strings, as llm_bench converts them
    report = run(host(bench_processes="2", bench_target_ci_pct="2.5", bench_ignore_eos="yes",
                      bench_server_metrics="false", bench_level_timeout="300"))
    assert report.ok, texts(report)


@pytest.mark.parametrize("value", [0, -3, "0"])
def test_repeats_below_one_name_bench_repeats_and_the_fix(value):
    msg = only(run(host(bench_repeats=value)), "bench_repeats")
    assert "must be an integer >= 1, the times each level is measured" in msg
    assert msg.endswith("fix it where it is set (group_vars, host_vars or -e)")


@pytest.mark.parametrize("value", [2.5, "two", True])
def test_repeats_that_are_not_integers_are_named_once(value):
    assert "not an integer" in only(run(host(bench_repeats=value)), "bench_repeats")


def test_repeats_of_three_pass():
    assert run(host(bench_repeats=3)).ok and run(host(bench_repeats="3")).ok


def test_a_level_timeout_below_the_level_seconds_is_named():
    msg = only(run(host(bench_level_timeout=10, bench_level_seconds=20)), "bench_level_timeout")
    assert "must exceed level_seconds (20.0)" in msg and "(given 10)" in msg


def test_every_llm_bench_option_a_user_sets_is_a_bench_variable_the_role_passes():
    """Each llm_bench option but the ones a sweep task sets per call reaches the module from its
    bench_* variable through the one lookup (llm_bench_args) every sweep task passes as
    `settings`; the names are derived from the two specs, and the role's defaults of the options
    are llm_bench's own (but the few the role chooses itself)."""
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import (
        ARGUMENT_SPEC,
    )
    # repeat, progress_file: the action sets them on each call; the rest: set by each sweep task
    # itself.
    internal = {"results_dir", "return_requests", "drain_after", "repeat", "progress_file"}
    per_call = {"base_url", "model", "api_key", "host_label", "profile"}
    derived = pf.llm_bench_variables()
    assert set(ARGUMENT_SPEC) - internal - per_call <= set(derived), \
        set(ARGUMENT_SPEC) - internal - per_call - set(derived)
    assert {"repeats", "run_id", "results_root"} <= set(derived)
    assert "api_key" not in derived            # a secret: never in the shared dict
    for name in ("profile.yml", "router.yml"):
        with open(os.path.join(pf.ROLE_DIR, "tasks", name), encoding="utf-8") as fh:
            block = yaml.safe_load(fh)[0]["block"]
        [sweep] = [t for t in block if "servelab.serving.llm_bench" in t]
        args = sweep["servelab.serving.llm_bench"]
        assert args["settings"] == "{{ lookup('servelab.serving.llm_bench_args') }}", name
        assert set(args) - {"settings", "server_metrics"} <= per_call | {
            "profile_index", "profile_count"}, (name, set(args))
    role_chosen = {"max_tokens", "level_seconds", "warmup_requests", "api", "base_url", "model",
                   "run_id", "results_root", "concurrency", "workload"}
    for option, variable in derived.items():
        if option in ARGUMENT_SPEC and option not in role_chosen:
            assert DEFAULTS[variable] == ARGUMENT_SPEC[option].get("default"), option
            assert OPTIONS[variable].get("default") == ARGUMENT_SPEC[option].get("default"), option
    assert DEFAULTS["bench_request_rate"] is None and DEFAULTS["bench_extra_body"] == {}


def test_the_llm_bench_args_leave_unset_options_out_and_the_record_keeps_them():
    values = dict(DEFAULTS, **TEMPLATED, bench_run_id="r1", bench_api_key="secret")
    args = pf.llm_bench_args(values)
    assert args["concurrency"] == DEFAULTS["bench_concurrency"] and args["run_id"] == "r1"
    assert "request_rate" not in args and "api_key" not in args
    record = pf.llm_bench_args(values, record=True)
    assert record["request_rate"] is None and "run_id" not in record
    assert "results_root" not in record and "secret" not in repr(record)


# ---------------------------------------------------------------------------------------------
# External endpoints (engine external)

PROD = {"name": "prod", "engine": "external", "base_url": "https://llm.example.com/v1",
        "model": "served-name"}


def test_an_external_profile_passes_and_needs_nothing_on_a_target():
    report = run(host(bench_profiles=[PROD]))
    assert report.ok, texts(report)
    assert report.profiles == 1 and report.target_checks == []
    # beside launched profiles, and host-wide through bench_engine / bench_base_url
    assert run(host(bench_profiles=PROFILES + [PROD])).ok
    report = run(host(bench_engine="external", bench_base_url="http://10.0.0.5:8000",
                      bench_profiles=[{"name": "router"}, {"name": "direct", "model": "m",
                                                           "base_url": "http://10.0.0.6:8000/"}]))
    assert report.ok, texts(report)


def test_an_external_profile_without_a_base_url():
    msg = only(run(host(bench_profiles=[{"name": "prod", "engine": "external"}])),
               "bench_profiles[0] (prod).base_url")
    assert "required for an external profile" in msg and "bench_base_url" in msg
    msg = only(run(host(bench_engine="external", bench_profiles=[{"name": "prod"}])),
               "bench_profiles[0] (prod).base_url")
    assert "required for an external profile" in msg


@pytest.mark.parametrize("url, says", [
    ("ftp://llm.example.com", "expected http:// or https://"),
    ("llm.example.com:8000", "expected http:// or https://"),
    ("http://", "names no host"),
    ("http://llm.example.com:99999", "not a URL"),
    ("http://llm example.com", "white space"),
    ("", "required for an external profile"),
])
def test_an_external_base_url_must_be_http_host_port_path(url, says):
    msg = only(run(host(bench_profiles=[dict(PROD, base_url=url)])),
               "bench_profiles[0] (prod).base_url")
    assert says in msg, msg


@pytest.mark.parametrize("url, secret", [
    ("https://alice:s3cr3t-pw@llm.example.com/v1", "s3cr3t-pw"),
    ("https://llm.example.com/v1?api_key=s3cr3t-q", "s3cr3t-q"),
    ("https://llm.example.com/v1#s3cr3t-f", "s3cr3t-f"),
])
def test_credentials_in_an_external_url_are_refused_and_not_repeated(url, secret):
    report = run(host(bench_profiles=[dict(PROD, base_url=url)]))
    msg = only(report, "bench_profiles[0] (prod).base_url")
    assert "bench_api_key" in msg and "https://llm.example.com/v1" in msg
    assert secret not in "\n".join(texts(report))
    report = run(host(bench_engine="external", bench_base_url=url,
                      bench_profiles=[{"name": "prod"}]))
    assert "bench_api_key" in only(report, "bench_base_url")
    assert secret not in "\n".join(texts(report))


@pytest.mark.parametrize("key, value", [
    ("simulator", {"profile": "baseline"}), ("extra_args", ["--tp", "8"]), ("tp", 8),
    ("env", {"A": "1"}), ("command", ["serve"]), ("speculative", {"algorithm": "EAGLE3"}),
])
def test_launched_server_keys_in_an_external_profile_are_named(key, value):
    msg = only(run(host(bench_profiles=[dict(PROD, **{key: value})])),
               "bench_profiles[0] (prod).%s" % key)
    assert "only for a server servelab launches" in msg and "remove %s" % key in msg


def test_an_unknown_key_in_an_external_profile_gets_the_nearest():
    msg = only(run(host(bench_profiles=[dict(PROD, base_ulr="http://x")])), "bench_profiles[0]")
    assert "unknown key 'base_ulr'; did you mean base_url?" in msg


def test_a_base_url_on_a_launched_profile_is_refused():
    msg = only(run(host(bench_profiles=[dict(PROFILES[0], base_url="http://x:1")])),
               "bench_profiles[0] (baseline).base_url")
    assert "only for an external profile" in msg


def test_external_ready_timeout_is_seconds_at_least_zero():
    msg = only(run(host(bench_external_ready_timeout=-1)), "bench_external_ready_timeout")
    assert "must be >= 0" in msg


def test_a_typo_variable_gets_the_nearest_known_name():
    msg = only(run(host(bench_concurency=[1, 2])), "bench_concurency")
    assert msg == "bench_concurency: unknown variable; did you mean bench_concurrency?"


def test_an_unknown_variable_without_a_near_name_says_how_to_name_helpers():
    msg = only(run(host(bench_xyzzy_quux=1)), "bench_xyzzy_quux")
    assert "without the bench_ prefix" in msg


def test_the_playbook_level_variables_are_declared_in_the_one_spec():
    # Read by bench.yml's plays or the shipped inventories, not the role: declared all the same
    # (argument_specs.yml is the one list of names), so they are known and type-checked.
    given = {"bench_compare_to": "", "bench_time_scale": 20, "bench_draft_model": "/models/d",
             "bench_resume": None, "bench_remeasure": True, "bench_break_lock": False,
             "bench_continue_on_profile_failure": True}
    assert set(given) <= set(SPEC) and run(host(**given)).ok
    assert "not a number" in only(run(host(bench_time_scale="fast")), "bench_time_scale")


def test_concurrency_as_a_string_is_refused_with_the_list_to_write():
    msg = only(run(host(bench_concurrency="1,2,5")), "bench_concurrency")
    assert "'1,2,5' is a string; give a YAML list [1, 2, 5]" in msg


def test_concurrency_levels_are_positive_integers_not_strings():
    report = run(host(bench_concurrency=[1, "5", 0, 2.5]))
    joined = "\n".join(texts(report))
    assert "bench_concurrency[1]: '5' is a string" in joined
    assert "bench_concurrency[3]: 2.5 is not an integer" in joined
    report = run(host(bench_concurrency=[1, 0]))
    assert "0 is not a positive integer (levels must be numbers of workers >= 1) (given [1, 0])" \
        in only(report, "bench_concurrency")


def test_wrong_types_and_choices_name_the_variable():
    report = run(host(bench_engine="sglangg", bench_workload="kind=builtin", bench_reap="maybe",
                      bench_server_port="port"))
    joined = "\n".join(texts(report))
    assert "bench_engine: 'sglangg' is not one of simulator, sglang, vllm, command, external; " \
           "did you mean sglang?" in joined
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
    [check] = [c.as_dict() for c in report.target_checks if c.host == "client1"]
    # One read on the client for both servers that use the same file.
    assert check["host"] == "client1" and check["servers"] == []
    assert [(w["hosts"], w["workload"]["path"]) for w in check["workloads"]] == [
        (["gpu1", "gpu2"], "/p.jsonl")]


def test_every_workload_that_reads_client_files_is_left_for_the_bench_client():
    """Issue 28: not only jsonl - a sharegpt file, an hf dataset, a tokenizer path - is read on the
    bench client before anything starts; a workload that reads no file is not sent there."""
    sent = {
        "sharegpt": {"kind": "sharegpt", "path": "/s.json"},
        "hf": {"kind": "hf", "path": "/ds"},
        "tokenizer": {"kind": "synthetic", "input_tokens": 8, "output_tokens": 8,
                      "tokenizer": "/tok"},
    }
    for name, workload in sent.items():
        report = run(host("gpu1", bench_client="client1", bench_workload=workload),
                     inventory=("gpu1", "client1"))
        assert report.ok, (name, texts(report))
        [check] = [c.as_dict() for c in report.target_checks if c.host == "client1"]
        assert [(w["variable"], w["hosts"], w["workload"]["kind"]) for w in check["workloads"]] \
            == [("bench_workload", ["gpu1"], workload["kind"])], name
    report = run(host("gpu1", bench_client="client1",
                      bench_workload={"kind": "synthetic", "input_tokens": 8, "output_tokens": 8}),
                 inventory=("gpu1", "client1"))
    assert not any(c.as_dict()["workloads"] for c in report.target_checks), texts(report)


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


def test_bench_compare_to_must_name_an_earlier_run(tmp_path):
    root = tmp_path / "results"
    (root / "run-old" / "parts").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "levels.csv").write_text("host,profile,concurrency\n")

    def check(value):
        controller = pf.HostInput("localhost", {"bench_compare_to": value,
                                                "bench_results_root": str(root)},
                                  given=("bench_compare_to",))
        return run(host(), controller=controller)

    assert not check("run-old").problems                        # a run id under the root
    assert not check(str(tmp_path / "elsewhere")).problems      # a path
    msg = only(check("run-gone"), "bench_compare_to")
    assert "no earlier run at %s" % (root / "run-gone") in msg
    assert pf.compare_to_dir("run-old", str(root)) == str(root / "run-old")


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


def test_a_missing_sharegpt_file_or_tokenizer_is_named_on_the_client(tmp_path):
    def check(workload):
        return target.check_workload({"variable": "bench_workload", "hosts": ["gpu1"],
                                      "workload": workload})

    [missing] = check({"kind": "sharegpt", "path": str(tmp_path / "nope.json")})
    assert missing.message.startswith("bench_workload.path"), missing.message
    assert "nope.json" in missing.message and missing.hosts == ("gpu1",)
    [tok] = check({"kind": "synthetic", "input_tokens": 8, "output_tokens": 8,
                   "tokenizer": str(tmp_path / "no-tokenizer")})
    assert tok.message.startswith("bench_workload.tokenizer"), tok.message
    assert "no such file or directory on the bench client" in tok.message


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


def test_a_router_derived_profile_leaves_haproxy_for_its_gpu_server():
    report = run(host("gpu1", bench_derived_profiles=["router"], bench_derived_source="eagle3",
                      bench_derived_baseline="baseline", bench_haproxy_binary="/opt/hx/haproxy"))
    assert report.ok, texts(report)
    [check] = report.target_checks
    [program] = check.executables
    assert check.host == "gpu1" and program["path"] == "/opt/hx/haproxy"
    assert program["variable"] == "bench_haproxy_binary" and program["hosts"] == ["gpu1"]
    assert check.as_dict()["executables"] == [program]
    # its two halves' ports are checked free with the server's, naming bench_server_port
    port = DEFAULTS["bench_server_port"]
    assert [(p["port"], p["variable"]) for p in check.ports] == [
        (port, "bench_server_port"), (port + 1, "bench_server_port"),
        (port + 2, "bench_server_port")]
    assert "speculative half of the router" in check.ports[1]["needed_for"]
    # Without the router nothing is asked of the host but its server port.
    [check] = run(host("gpu1")).target_checks
    assert check.executables == [] and [p["port"] for p in check.ports] == [port]


def test_a_missing_or_unexecutable_program_is_named_with_its_variable_and_fix(tmp_path):
    item = {"variable": "bench_haproxy_binary", "hosts": ["gpu1"], "where": "vars.yml:3",
            "path": str(tmp_path / "haproxy"), "needed_for": "the router",
            "fix": "install HAProxy (apt-get install haproxy)"}
    [missing] = target.run_checks([], [], [item])
    assert missing.message.startswith("bench_haproxy_binary: %s on this host (no such file)"
                                      % item["path"]), missing.message
    assert "needed for the router; install HAProxy" in missing.message
    assert missing.hosts == ("gpu1",) and missing.where == "vars.yml:3"
    (tmp_path / "haproxy").write_text("#!/bin/sh\n")
    [plain] = target.run_checks([], [], [item])
    assert "(not executable)" in plain.message
    os.chmod(tmp_path / "haproxy", 0o755)
    assert target.run_checks([], [], [item]) == []


def test_the_target_checks_touch_nothing(tmp_path):
    python = fake_sglang(tmp_path)
    item = server_item(python)
    item["request"]["state_dir"] = str(tmp_path / "servers")
    assert target.run_checks([], [item]) == []
    assert not (tmp_path / "servers").exists()


# ---------------------------------------------------------------------------------------------
# Multi-node profiles (nodes): resolved against the inventory before anything starts
def nodes_host(name="gpu1", nodes=None, tp=16, **given):
    profile = {"name": "big", "engine": "sglang", "model": "/m", "tp": tp,
               "nodes": nodes or {"group": "pair"}}
    inp = host(name, bench_profiles=[profile], **given)
    inp.groups = {"pair": ["gpu1", "gpu2"], "gpu_servers": ["gpu1"]}
    inp.addresses = {"gpu1": "10.0.0.11", "gpu2": "10.0.0.12"}
    return inp


def test_a_two_node_profile_passes_and_its_rank_0_flags_are_checked_on_the_host():
    report = run(nodes_host())
    assert report.problems == [], texts(report)
    request = report.target_checks[0].servers[0]["request"]
    assert request["profile"]["nodes"] == {"group": "pair", "hosts": ["gpu1", "gpu2"], "port": 50000, "nnodes": 2,
                                           "addresses": {"gpu1": "10.0.0.11", "gpu2": "10.0.0.12"}, "this": "gpu1"}


@pytest.mark.parametrize("nodes, given, message", [
    ({"group": "trio"}, {}, "nodes.group 'trio' is not a group of the inventory"),
    ({"group": "pair", "nnodes": 3}, {}, "nodes.nnodes is 3 but group 'pair' has 2 host(s)"),
    ({"hosts": ["gpu2", "gpu3"]}, {}, "gpu1 is not in nodes.hosts (gpu2, gpu3)"),
    ({"group": "pair"}, {"bench_dist_init_port": 80}, "nodes.port must be in 1024-65530"),
])
def test_a_bad_node_group_stops_the_run_naming_the_profile(nodes, given, message):
    msg = only(run(nodes_host(nodes=nodes, **given)), "bench_profiles[0] (big)")
    assert message in msg


def test_tp_that_does_not_split_over_the_nodes_is_refused():
    msg = only(run(nodes_host(tp=9)), "bench_profiles[0] (big)")
    assert "tp 9 is not divisible by the 2 nodes" in msg
