"""bench.yml against an endpoint servelab did not start (a profile with `engine: external`).

The test starts the server itself (the simulator, through tests/simproc.py, ended by its PID), as
a production server, a router or a managed endpoint is started by someone else. The play must
measure it with the same sweep and report, and leave it alone: no reap, no llm_server start or
stop, no state directory or port lock; the endpoint is recorded in the manifest as external, with
its URL. An endpoint that does not answer fails the profile before its first level, with a
message naming the profile and the URL.
"""
from __future__ import annotations

import csv
import json
import os
import tempfile

import ansible_runner
import pytest
from simproc import ServerProcess  # tests/ (conftest.py puts it on sys.path)

from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import scan_processes
from testports import free_port as _free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")

pytestmark = pytest.mark.slow

MODEL = "served-name"
LEVELS = [1, 2]
# Tasks of a launched profile: none of them may run for an external one.
LAUNCH_TASKS = ("Reap GPU zombies before prod", "Start the server for prod",
                "Stop the server of prod", "Reap GPU zombies after prod",
                "Check the run's locks before prod", "Check the run's locks after prod",
                "Hold the server state directory and port for this run", "Gather GPU facts")


def _run_bench(tmp_path, extravars):
    env = {
        "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "SERVELAB_RESULTS_ROOT": str(tmp_path / "results"),
    }
    (tmp_path / "runner").mkdir(exist_ok=True)
    return ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"), project_dir=REPO,
        playbook=os.path.join(REPO, "bench.yml"),
        inventory=os.path.join(REPO, "inventory", "local"),
        extravars=extravars, envvars=env, quiet=True, timeout=600)


def _vars(tmp_path, base_url, **overrides):
    out = {
        "bench_profiles": [{"name": "prod", "engine": "external", "base_url": base_url,
                            "model": MODEL}],
        "bench_concurrency": LEVELS,
        "bench_level_seconds": 2,
        "bench_warmup_requests": 1,
        # The port and state directory a launched server would use: nothing may touch them.
        "bench_server_port": _free_port(),
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": {"kind": "synthetic", "input_tokens": 64, "output_tokens": 32,
                           "count": 8},
        "bench_max_tokens": 32,
        "bench_api_key": "external-endpoint-key",
    }
    out.update(overrides)
    return out


def _tasks(runner, event):
    return [e["event_data"].get("task") for e in runner.events if e.get("event") == event]


def _simulators(needle: str) -> list:
    """PIDs of processes whose command line holds `needle`."""
    return [pid for pid, info in scan_processes().items() if needle in info.cmdline]


def _port_record(port: int) -> str:
    return os.path.join(tempfile.gettempdir(), "servelab-locks", "port-%d.json" % port)


def test_an_external_endpoint_is_measured_and_left_alone(tmp_path):
    truth = tmp_path / "truth.jsonl"
    with ServerProcess("--profile", "baseline", "--time-scale", "10", "--model-name", MODEL,
                       truth_log=truth) as srv:
        extravars = _vars(tmp_path, srv.url + "/v1")
        r = _run_bench(tmp_path, extravars)
        out = r.stdout.read()
        assert r.rc == 0, out[-5000:]
        # The endpoint is still up, the same process: nothing stopped or reaped it.
        assert srv.proc.poll() is None
        assert _simulators(str(truth)) == [srv.pid]
        served = srv.truth_records(wait_for=1)
    assert served, "no request reached the external endpoint"

    # No server was launched, stopped or reaped; no state directory or port lock for it.
    ran = set(_tasks(r, "runner_on_ok")) | set(_tasks(r, "runner_on_failed"))
    assert not ran & set(LAUNCH_TASKS), ran & set(LAUNCH_TASKS)
    assert not (tmp_path / "servers").exists()
    assert _simulators(str(tmp_path / "servers")) == []
    assert not os.path.exists(_port_record(extravars["bench_server_port"]))
    # The readiness check ran (and said nothing of the key: no_log).
    assert "Ask the external endpoint which models it serves - prod" in ran
    assert "external-endpoint-key" not in out

    run_dir = (tmp_path / "results" / results.LATEST_LINK).resolve()
    with open(run_dir / results.LEVELS, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((row["profile"], int(row["concurrency"])) for row in rows) == [
        ("prod", c) for c in LEVELS]
    assert all(int(row["errors"]) == 0 and int(row["requests"]) > 0 for row in rows), rows

    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    record = manifest["profiles"]["prod"]["localhost"]
    assert record["engine"] == "external" and record["status"] == "finished"
    assert record["base_url"] == srv.url + "/v1" and record["model"] == MODEL
    assert record["served_models"] == [MODEL]
    assert "cmdline" not in record
    host = manifest["hosts"]["localhost"]
    assert host["bench"]["engines"] == {"prod": "external"}
    # Issue 28: nothing launched, so no launched server's engine, model or URL (not the
    # defaults simulator / servelab-sim / ""): the endpoint is in the profile record above.
    assert not {"engine", "model", "base_url"} & set(host["bench"]), host["bench"]
    # The GPUs of the endpoint are not this host's: none recorded.
    assert "gpu_facts" not in host
    assert "external-endpoint-key" not in (run_dir / results.MANIFEST).read_text()
    assert manifest["status"] == "finished"
    assert (run_dir / results.SUMMARY).is_file() and (run_dir / results.REPORT_HTML).is_file()


# A server that refuses every request field outside the OpenAI API, as transformers serve does
# (HTTP 422 "Unexpected fields in the request: {'ignore_eos'}"); the real one from PyPI:
# tests/integration/thirdparty (marker thirdparty).
STRICT = os.path.join(REPO, "tests", "unit", "test_loadgen_strict_server.py")


def test_a_strict_openai_endpoint_is_sent_no_ignore_eos_and_measured(tmp_path):
    """Issue 28: bench_ignore_eos unset, the synthetic workload on an external endpoint asks
    for nothing outside the OpenAI API; true would send it, and the failure names the fix."""
    with ServerProcess("--model", MODEL, script=STRICT) as srv:
        r = _run_bench(tmp_path, _vars(tmp_path, srv.url + "/v1"))
        out = r.stdout.read()
        assert r.rc == 0, out[-5000:]
        run_dir = (tmp_path / "results" / results.LATEST_LINK).resolve()
        with open(run_dir / results.LEVELS, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert rows and all(int(row["errors"]) == 0 and int(row["requests"]) > 0
                            for row in rows), rows
        assert "no request asks for ignore_eos" in out

        asked = tmp_path / "asked"
        asked.mkdir()
        r = _run_bench(asked, _vars(asked, srv.url + "/v1", bench_ignore_eos=True))
        out = r.stdout.read()
    assert r.rc != 0
    failed = [e["event_data"]["res"].get("msg", "") for e in r.events
              if e.get("event") == "runner_on_failed"]
    assert any("the server refuses the request field ignore_eos" in m
               and "set bench_ignore_eos: false" in m for m in failed), failed


def test_an_unreachable_external_endpoint_fails_before_any_level(tmp_path):
    url = "http://127.0.0.1:%d/v1" % _free_port()      # nobody listens there
    r = _run_bench(tmp_path, _vars(tmp_path, url, bench_external_ready_timeout=0))
    out = r.stdout.read()
    assert r.rc != 0, out[-5000:]

    failed = [e["event_data"] for e in r.events if e.get("event") == "runner_on_failed"]
    ready = [d for d in failed
             if d.get("task") == "Fail unless the external endpoint answers - prod"]
    assert ready, [d.get("task") for d in failed]
    msg = ready[0]["res"]["msg"]
    assert msg.startswith("external profile prod: %s does not answer GET" % url), msg
    assert "no level was sent" in msg
    # The run fails at its end, naming the profile and the URL: the report has no level to
    # show and says what the manifest recorded (else the closing task names the profile).
    final = [d["res"].get("msg", "") for d in failed
             if d.get("task") in ("servelab: report", "Fail the run when a profile did not finish")]
    assert final and "prod on localhost" in final[-1] and url in final[-1], final

    # No level: the sweep never started.
    assert "servelab: sweep prod" not in _tasks(r, "runner_on_start")
    run_dir = (tmp_path / "results" / results.LATEST_LINK).resolve()
    assert not (run_dir / results.PARTS_DIR).exists() or not any(
        (run_dir / results.PARTS_DIR).iterdir())
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    record = manifest["profiles"]["prod"]["localhost"]
    assert record["status"] == "failed" and url in record["error"]
    assert not (tmp_path / "servers").exists()
