"""bench.yml refuses bad settings in seconds, before anything exists.

Each bad input of the issue "A run you can trust" is given to the real bench.yml (through
ansible-runner, as tests/integration/test_bench_playbook.py runs it): the play must fail at its
first task, the preflight, with a message naming the variable; no llm_server state directory may
appear under the test's bench_state_dir, no simulator may run, and the results root must stay
empty (no run directory, no results/latest).
"""
from __future__ import annotations

import json
import os
import socket
import time

import ansible_runner
import pytest
from fakesglang import fake_sglang  # tests/ (conftest.py puts it on sys.path)
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import scan_processes
from testports import free_port as _free_port  # tests/testports.py

# The fast tier (make test) runs this module too: see pyproject.toml's markers.
pytestmark = pytest.mark.core

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
PREFLIGHT = "servelab: preflight"
TARGET_PREFLIGHT = "servelab: preflight on the bench clients and GPU servers"
# Generous for a loaded 2-core box: a failing preflight takes a few seconds.
SECONDS = 60


def _profiles():
    return [{"name": "baseline", "simulator": {"profile": "baseline", "time_scale": 20}},
            {"name": "eagle3", "simulator": {"profile": "eagle3", "time_scale": 20}}]


class Run:
    def __init__(self, runner, seconds: float):
        self.runner, self.seconds, self.rc = runner, seconds, runner.rc
        self.events = list(runner.events)

    def started(self):
        """(host, task) of every task that started on a host."""
        return [(e["event_data"].get("host"), e["event_data"].get("task"))
                for e in self.events if e.get("event") == "runner_on_start"]

    def failure(self, task=PREFLIGHT) -> dict:
        for e in self.events:
            data = e.get("event_data", {})
            if e.get("event") == "runner_on_failed" and data.get("task") == task:
                res = dict(data["res"])
                # A loop's result holds its items' results: the failed one is the message.
                failed = [r for r in res.get("results") or () if r.get("failed")]
                if failed:
                    res = dict(failed[0])
                return res
        raise AssertionError("%r did not fail:\n%s" % (task, self.runner.stdout.read()[-4000:]))

    def ok(self, task=PREFLIGHT) -> dict:
        for e in self.events:
            data = e.get("event_data", {})
            if e.get("event") == "runner_on_ok" and data.get("task") == task:
                return data["res"]
        raise AssertionError("%r did not succeed:\n%s" % (task, self.runner.stdout.read()[-4000:]))


def _run(tmp_path, extravars, inventory=None, cmdline=None) -> Run:
    env = {
        "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "SERVELAB_RESULTS_ROOT": str(tmp_path / "results"),
    }
    (tmp_path / "runner").mkdir(exist_ok=True)
    start = time.monotonic()
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"), project_dir=REPO,
        playbook=os.path.join(REPO, "bench.yml"),
        inventory=inventory or os.path.join(REPO, "inventory", "local"),
        extravars=extravars, envvars=env, quiet=True, timeout=300, cmdline=cmdline)
    return Run(runner, time.monotonic() - start)


def _vars(tmp_path, **overrides):
    out = {"bench_profiles": _profiles(), "bench_concurrency": [1], "bench_level_seconds": 1,
           "bench_server_port": _free_port(), "bench_state_dir": str(tmp_path / "servers")}
    out.update(overrides)
    return out


def _simulators(state_dir) -> list:
    """PIDs of processes whose command line mentions the test's state dir."""
    return [pid for pid, info in scan_processes().items()
            if str(state_dir) in info.cmdline and "servelab_simulator" in info.cmdline]


def _assert_nothing_happened(tmp_path, run: Run, allowed=(PREFLIGHT,)):
    assert run.rc != 0
    assert run.seconds < SECONDS, "the preflight took %.1f s" % run.seconds
    # No server: its state directory is the first thing llm_server makes, and no simulator runs.
    assert not (tmp_path / "servers").exists()
    assert _simulators(tmp_path / "servers") == []
    # No run directory, no results/latest.
    root = tmp_path / "results"
    assert not root.exists() or list(root.iterdir()) == []
    # Nothing but the preflight started (not the run id, not the manifest, not play 2).
    assert {task for _host, task in run.started()} <= set(allowed), run.started()


def _jsonl(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# Each bad input of the issue, and the words its message must start with.
CASES = {
    "unknown engine in one of two profiles": (
        lambda tmp: {"bench_profiles": [_profiles()[0], dict(_profiles()[1], engine="sglangg")]},
        "bench_profiles[1] (eagle3).engine: 'sglangg' is not one of"),
    "half-filled speculative block": (
        lambda tmp: {"bench_profiles": [_profiles()[0], dict(
            _profiles()[1], speculative={"algorithm": "EAGLE3", "num_steps": 3})]},
        "bench_profiles[1] (eagle3): speculative: num_steps set without eagle_topk"),
    "missing jsonl": (
        lambda tmp: {"bench_workload": {"kind": "jsonl", "path": str(tmp / "missing.jsonl")}},
        "bench_workload.path"),
    "malformed jsonl": (
        lambda tmp: {"bench_workload": {"kind": "jsonl", "path": _jsonl(
            tmp, "bad.jsonl", '{"prompt": "fine"}\n{"prompt": "cut off\n')}},
        "bench_workload.path"),
    "negative SLO": (
        lambda tmp: {"bench_slo": {"ttft_ms": -5}}, "bench_slo.ttft_ms: -5 must be > 0"),
    "port 70000": (
        lambda tmp: {"bench_server_port": 70000},
        "bench_server_port: 70000 is not a TCP port (1-65535)"),
    "level seconds 0": (
        lambda tmp: {"bench_level_seconds": 0},
        # LevelConfig.validate's range (llm_bench's one validator), the preflight has no copy
        "bench_level_seconds: llm_bench rejects its option level_seconds: expected seconds > 0 "
        "(given 0)"),
    "typo'd variable": (
        lambda tmp: {"bench_concurency": [1, 2]},
        "bench_concurency: unknown variable; did you mean bench_concurrency?"),
    "an earlier run that is not there": (
        lambda tmp: {"bench_compare_to": "run-that-never-was"},
        "bench_compare_to: no earlier run at"),
    "router without HAProxy on the GPU server": (
        lambda tmp: {"bench_derived_profiles": ["router"], "bench_derived_source": "eagle3",
                     "bench_derived_baseline": "baseline",
                     "bench_haproxy_binary": str(tmp / "no-haproxy")},
        "bench_haproxy_binary: "),
    "an unknown simulator key": (
        lambda tmp: {"bench_profiles": [dict(_profiles()[0], simulator={
            "profile": "baseline", "warp_speed": 9})]},
        "bench_profiles[0] (baseline): simulator.warp_speed: unknown simulator key"),
    "a results root under a regular file": (
        lambda tmp: {"bench_results_root": _jsonl(tmp, "a-file", "") + "/results"},
        "bench_results_root: "),
    "concurrency as a string": (
        lambda tmp: {"bench_concurrency": "1,2,5"},
        "bench_concurrency: '1,2,5' is a string; give a YAML list [1, 2, 5]"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_at_the_preflight_before_anything_exists(tmp_path, case):
    overrides, needle = CASES[case]
    run = _run(tmp_path, _vars(tmp_path, **overrides(tmp_path)))
    _assert_nothing_happened(tmp_path, run)
    failure = run.failure()
    assert [p["message"] for p in failure["problems"] if p["message"].startswith(needle)], \
        failure["msg"]
    assert needle in failure["msg"]
    if case == "malformed jsonl":
        assert "line 2: not JSON" in failure["msg"]
    if case == "missing jsonl":
        assert "no such file on the bench client" in failure["msg"]


@pytest.mark.parametrize("router", [False, True])
def test_a_port_the_run_binds_that_is_busy_fails_at_the_preflight(tmp_path, router):
    """bench_server_port, or a router half's (+1), held by a process that is not the run's."""
    port = _free_port()
    while port > 65530:
        port = _free_port()
    extra = {"bench_server_port": port}
    if router:
        extra.update(bench_derived_profiles=["router"], bench_derived_source="eagle3",
                     bench_derived_baseline="baseline")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port + 1 if router else port))
        holder.listen()
        run = _run(tmp_path, _vars(tmp_path, **extra))
    _assert_nothing_happened(tmp_path, run)
    msg = run.failure()["msg"]
    needle = "bench_server_port: port %d on this host, needed for %s" % (
        port + 1 if router else port,
        "the speculative half of the router (" if router else "the server,")
    assert needle in msg and "is already in use by pid %d (" % os.getpid() in msg, msg


def test_every_problem_is_reported_in_one_failure(tmp_path):
    bad = {}
    for overrides, _needle in CASES.values():
        if "bench_profiles" not in overrides(tmp_path):
            bad.update(overrides(tmp_path))
    bad["bench_workload"] = CASES["missing jsonl"][0](tmp_path)["bench_workload"]
    bad["bench_profiles"] = [_profiles()[0], dict(_profiles()[1], engine="sglangg")]
    run = _run(tmp_path, _vars(tmp_path, **bad))
    _assert_nothing_happened(tmp_path, run)
    msg = run.failure()["msg"]
    for name, (_overrides, needle) in CASES.items():
        if name not in ("half-filled speculative block", "malformed jsonl",
                        "an unknown simulator key"):
            assert needle in msg, (name, msg)


def _inventory(tmp_path, clients="localhost") -> str:
    """gpu1 is a GPU server of its own (a local connection): play 2 would run on it."""
    inv = {"all": {
        "vars": {"ansible_connection": "local",
                 "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                 "bench_engine": "simulator"},
        "children": {"gpu_servers": {"hosts": {"gpu1": {}}},
                     "bench_clients": {"hosts": {clients: {}}}}}}
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(inv))
    return str(path)


def test_a_separate_gpu_server_never_reaches_the_bench_play(tmp_path):
    run = _run(tmp_path, _vars(tmp_path, bench_server_port=70000),
               inventory=_inventory(tmp_path))
    _assert_nothing_happened(tmp_path, run)
    problems = run.failure()["problems"]
    assert [p["hosts"] for p in problems] == [["gpu1"]]
    assert not [h for h, _task in run.started() if h == "gpu1"]


def test_a_jsonl_file_is_checked_on_a_bench_client_of_its_own(tmp_path):
    # client1 is not the play's host: the file is read there, by the delegated preflight task.
    run = _run(tmp_path, _vars(tmp_path, bench_workload={
        "kind": "jsonl", "path": str(tmp_path / "missing.jsonl")}),
        inventory=_inventory(tmp_path, clients="client1"))
    _assert_nothing_happened(tmp_path, run, allowed=(PREFLIGHT, TARGET_PREFLIGHT))
    assert run.ok()["target_checks"][0]["host"] == "client1"
    msg = run.failure(TARGET_PREFLIGHT)["msg"]
    assert "bench_workload.path" in msg and "no such file on the bench client" in msg
    assert "[gpu1]" in msg


def test_good_settings_pass_the_preflight(tmp_path):
    """No false alarm: the embedded default with a readable jsonl workload passes the preflight
    (in check mode, which starts nothing, so the test stays quick), and the play goes on."""
    good = _jsonl(tmp_path, "good.jsonl", json.dumps({"prompt": "hello"}) + "\n")
    run = _run(tmp_path, _vars(tmp_path, bench_workload={"kind": "jsonl", "path": good}),
               cmdline="--check")
    result = run.ok()
    assert result["problems"] == [] and "2 profile(s)" in result["msg"]
    # The jsonl file was read and the server port checked free in the same task, on the
    # controller (the embedded bench client and GPU server).
    assert "2 on localhost" in result["msg"] and result["target_checks"] == []
    assert (None, "Choose the run id and the results directory") in [
        (None, task) for _host, task in run.started()]


def test_an_sglang_flag_the_installed_release_lacks_fails_before_a_server(tmp_path):
    """The engine's own flag check at preflight: the profile is rendered for the SGLang the GPU
    server has (a stand-in 0.5.23 here) and a flag it does not define fails the run at once,
    where llm_server would have refused it only when this profile's turn came."""
    python = fake_sglang(tmp_path / "sglang")
    profiles = [{"name": "baseline", "engine": "sglang", "model": "/models/m", "tp": 8},
                {"name": "attn", "engine": "sglang", "model": "/models/m", "tp": 8,
                 "extra_args": ["--attention-backnd", "fa3"]}]
    run = _run(tmp_path, _vars(tmp_path, bench_profiles=profiles, bench_engine_python=python))
    _assert_nothing_happened(tmp_path, run)
    [problem] = run.failure()["problems"]
    assert problem["message"].startswith(
        "bench_profiles[1] (attn): the installed SGLang 0.5.23 rejects the rendered command: "
        "--attention-backnd is not defined by this release")


def test_the_role_on_its_own_runs_the_same_preflight(tmp_path):
    """tasks/main.yml's checks are the preflight's (tasks/preflight.yml): the role included by
    a playbook of one's own refuses bad settings the same way, before a lock or a server."""
    play = tmp_path / "role.yml"
    play.write_text(
        "- hosts: gpu_servers\n  gather_facts: false\n  vars:\n    bench_run_id: own\n"
        "    bench_results_root: %s\n  roles:\n    - role: servelab.serving.bench\n"
        % (tmp_path / "results"))
    env = {"PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
           "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg")}
    (tmp_path / "runner").mkdir()
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"), project_dir=REPO, playbook=str(play),
        inventory=os.path.join(REPO, "inventory", "local"),
        extravars=_vars(tmp_path, bench_level_seconds=0, bench_profiles=[]),
        envvars=env, quiet=True, timeout=300)
    assert runner.rc != 0
    [failed] = [e["event_data"] for e in runner.events if e.get("event") == "runner_on_failed"]
    assert failed["task"] == "Check this host's bench settings"
    msg = failed["res"]["msg"]
    assert "bench_profiles: no profiles" in msg
    assert "bench_level_seconds: llm_bench rejects its option level_seconds" in msg
    assert not (tmp_path / "servers").exists() and not _simulators(tmp_path / "servers")
