"""bench.yml and `servelab bench` against a real third-party OpenAI-compatible server: `transformers
serve` from PyPI (exact pins: requirements-transformers-serve.txt, its own venv under .cache/), on
the CPU, serving a tiny random Llama built here, no hub (tserve.py). Marker `thirdparty`:
`make test-integration` and `make test-all` run it, the fast tier does not.

Issue 28: this server answers HTTP 422 "Unexpected fields in the request: {'ignore_eos'}" to a
request with a field outside its OpenAI schema (transformers/cli/serving/utils.py:1113-1115). An
external profile sends no ignore_eos unless asked, so the sweep runs clean; asked
(bench_ignore_eos: true), the level fails naming the field and the setting that drops it. The
server runs once for the module (one worker: tests/tiers.py groups `thirdparty`), and the last
test stops it and shows nothing of it is left.
"""
from __future__ import annotations

import csv
import json
import os
import re
import socket
import subprocess
import sys

import ansible_runner
import pytest
from tserve import TransformersServe   # this folder (pytest puts it on sys.path)

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import scan_processes
from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from testports import free_port as _free_port  # tests/testports.py

pytestmark = [pytest.mark.thirdparty, pytest.mark.slow]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
PROFILE = "tserve"
LEVEL = 2
MAX_TOKENS = 8
# Synthetic prompts (exact lengths, no ignore_eos on an external endpoint unless asked).
WORKLOAD = {"kind": "synthetic", "input_tokens": 32, "output_tokens": MAX_TOKENS, "count": 8}
# uvicorn's access log line of each request: `INFO: 127.0.0.1:PORT - "POST /v1/... HTTP/1.1" 200 OK`
ACCESS = re.compile(r'"POST (/v1/chat/completions) HTTP/1\.1" (\d{3})')
LAUNCH_TASKS = ("Reap GPU zombies before %s" % PROFILE, "Start the server for %s" % PROFILE,
                "Stop the server of %s" % PROFILE, "Gather GPU facts",
                "Hold the server state directory and port for this run")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = TransformersServe(tmp_path_factory.mktemp("tserve"))
    yield srv
    srv.stop()


def _statuses(srv, start: int) -> list:
    """The HTTP status of each POST the server logged since line `start`."""
    return [int(m.group(2)) for m in (ACCESS.search(line) for line in srv.log_lines()[start:]) if m]


def _vars(tmp_path, srv, **overrides) -> dict:
    out = {
        "bench_profiles": [{"name": PROFILE, "engine": "external", "base_url": srv.url + "/v1",
                            "model": srv.model}],
        "bench_concurrency": [LEVEL],
        "bench_level_seconds": 2,
        "bench_warmup_requests": 1,
        "bench_server_port": _free_port(),      # a launched server's: nothing may use it
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": WORKLOAD,
        "bench_max_tokens": MAX_TOKENS,
        "bench_gpu_telemetry": False,
    }
    out.update(overrides)
    return out


def _run_bench(tmp_path, extravars):
    env = {"PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
           "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "SERVELAB_RESULTS_ROOT": str(tmp_path / "results")}
    (tmp_path / "runner").mkdir(exist_ok=True)
    return ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"), project_dir=REPO,
        playbook=os.path.join(REPO, "bench.yml"), inventory=os.path.join(REPO, "inventory", "local"),
        extravars=extravars, envvars=env, quiet=True, timeout=600)


def _left_running(tmp_path) -> list:
    """Processes of this test's runs still there (their command lines name its directory)."""
    return [info.label() for info in scan_processes().values()
            if str(tmp_path) in info.cmdline and not info.gone]


def _levels(run_dir) -> list:
    with open(os.path.join(run_dir, results.LEVELS), newline="") as fh:
        return list(csv.DictReader(fh))


def test_bench_yml_measures_transformers_serve_with_no_ignore_eos(server, tmp_path):
    first = len(server.log_lines())
    r = _run_bench(tmp_path, _vars(tmp_path, server))
    out = r.stdout.read()
    assert r.rc == 0, out[-6000:]
    assert "no request asks for ignore_eos" in out

    run_dir = (tmp_path / "results" / results.LATEST_LINK).resolve()
    rows = _levels(run_dir)
    assert [(row["profile"], int(row["concurrency"])) for row in rows] == [(PROFILE, LEVEL)], rows
    row = rows[0]
    assert int(row["errors"]) == 0 and int(row["requests"]) > 0, row
    assert float(row["output_tok_s"]) > 0 and float(row["ttft_p50_ms"]) > 0, row
    # The level's files, the summary and the report.
    assert any((run_dir / results.PARTS_DIR).iterdir())
    assert (run_dir / results.SUMMARY).is_file() and (run_dir / results.REPORT_HTML).is_file()
    assert PROFILE in (run_dir / results.SUMMARY).read_text()
    # Every request the server saw from the run was answered 200 (a request with ignore_eos gets
    # 422 from it), and the level's requests are among them (warm-up and readiness come too).
    statuses = _statuses(server, first)
    assert statuses and set(statuses) == {200}, statuses
    assert len(statuses) >= int(row["requests"])
    with open(run_dir / results.REQUESTS) as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    # No request failed; the only errors are the tail requests the level cancelled at its end.
    failed = [rec for rec in records if rec.get("error") and rec.get("error_kind") != "cancelled"]
    assert records and not failed, failed[:3]
    done = [rec for rec in records if not rec.get("error")]
    assert len([rec for rec in done if rec["in_window"]]) == int(row["requests"])
    # The tokens are counted by the server's own usage (the tiny model generates max_tokens:
    # greedy, it never picks its end-of-sequence token).
    assert {(rec["tokens_source"], rec["completion_tokens"]) for rec in done} == {
        ("server", MAX_TOKENS)}, done[:3]

    # The endpoint as recorded: external, its URL, the model it lists in /v1/models; nothing
    # launched (no simulator or other engine on the host record).
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    record = manifest["profiles"][PROFILE]["localhost"]
    assert record["engine"] == "external" and record["status"] == "finished", record
    assert record["base_url"] == server.url + "/v1" and record["model"] == server.model
    assert record["served_models"] == [server.model]
    assert "cmdline" not in record
    bench = manifest["hosts"]["localhost"]["bench"]
    assert bench["engines"] == {PROFILE: "external"}
    assert not {"engine", "model", "base_url"} & set(bench), bench
    assert manifest["status"] == "finished"
    ran = {e["event_data"].get("task") for e in r.events if e.get("event") == "runner_on_ok"}
    assert not ran & set(LAUNCH_TASKS), ran & set(LAUNCH_TASKS)
    assert not (tmp_path / "servers").exists()
    assert _left_running(tmp_path) == []
    assert server.proc.poll() is None          # the endpoint is left alone


def test_bench_ignore_eos_true_fails_naming_the_field_and_the_setting(server, tmp_path):
    first = len(server.log_lines())
    r = _run_bench(tmp_path, _vars(tmp_path, server, bench_ignore_eos=True))
    out = r.stdout.read()
    assert r.rc != 0, out[-6000:]
    failed = [e["event_data"]["res"].get("msg", "") for e in r.events
              if e.get("event") == "runner_on_failed"]
    assert any("the server refuses the request field ignore_eos" in m
               and "set bench_ignore_eos: false" in m for m in failed), failed
    # The refusal is the server's own: it answered 422 to what the run sent.
    assert 422 in _statuses(server, first), server.log_lines()[first:][-20:]
    manifest = json.loads(((tmp_path / "results" / results.LATEST_LINK).resolve()
                           / results.MANIFEST).read_text())
    assert manifest["profiles"][PROFILE]["localhost"]["status"] == "failed"
    assert _left_running(tmp_path) == []
    assert server.proc.poll() is None


def test_servelab_bench_cli_against_transformers_serve(server, tmp_path):
    first = len(server.log_lines())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=os.path.join(REPO, "tools"),
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(
        [sys.executable, "-m", "servelab", "bench", "--base-url", server.url, "--model", server.model,
         "-c", "1", "--level-seconds", "1", "--results-root", str(tmp_path / "results"),
         # The embedded inventory's workload is 2048 in / 512 out: a few tokens here instead.
         "-e", json.dumps({"bench_workload": WORKLOAD, "bench_max_tokens": MAX_TOKENS})],
        cwd=str(tmp_path), env=env, text=True, capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    assert "servelab bench: successful" in done.stdout
    rows = _levels(tmp_path / "results" / results.LATEST_LINK)
    assert [(r["profile"], int(r["concurrency"]), int(r["errors"])) for r in rows] == [
        ("external", 1, 0)], rows
    assert int(rows[0]["requests"]) > 0
    assert set(_statuses(server, first)) == {200}
    with open(tmp_path / "results" / results.LATEST_LINK / results.REQUESTS) as fh:
        done_tokens = {json.loads(line)["completion_tokens"] for line in fh
                       if line.strip() and not json.loads(line).get("error")}
    assert done_tokens == {MAX_TOKENS}
    assert _left_running(tmp_path) == []


def test_the_server_stops_by_its_group_and_nothing_is_left(server):
    """Last in the module: the fixture's server ends through its process group; no process of
    the group is left and the port is free."""
    assert server.proc.poll() is None and server.group_members() == [server.pid]
    rc = server.stop()
    assert rc is not None
    assert server.group_members() == []
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", server.port)) != 0
