"""bench.yml end to end on the embedded default, through ansible-runner.

Real processes (the simulator server started by llm_server), real HTTP (llm_bench), real files
(results/<run_id>/ on the controller). The crossover the report finds is held against the one the
simulator's own model predicts for the same settings.
"""
from __future__ import annotations

import csv
import json
import os
import socket
import statistics

import ansible_runner
import pytest

from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import (
    predict_crossover,
)
from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from testports import free_port as _free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")

pytestmark = pytest.mark.slow

LEVELS = [1, 5, 30]
TIME_SCALE = 10
PROMPT_TOKENS = 1024
OUTPUT_TOKENS = 256
# The field-fitted eagle3 wins or loses by only 2-4% around its crossover (the field's own margin:
# 96.1 vs 92.6 tok/s single stream), which a short live level cannot resolve on a shared 2-core
# machine. The crossover test therefore uses eagle3's model with a higher draft acceptance, whose
# predicted speedups at these levels are about 1.18x, 1.19x and 0.76x: the same code path, a
# verdict that noise cannot flip.
SPEC = {"profile": "eagle3", "spec_accept_rate": 0.8, "time_scale": TIME_SCALE}
# TIME_SCALE 10, not faster: at 40 the C=30 levels streamed ~15k tok/s, and one client process
# sharing 2 cores with the simulator was (rightly) flagged client-limited, which left the
# crossover level out of the report and the test without a verdict.


def _run_bench(tmp_path, extravars, cmdline=None):
    env = {
        "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "SERVELAB_RESULTS_ROOT": str(tmp_path / "results"),
    }
    (tmp_path / "runner").mkdir(exist_ok=True)
    r = ansible_runner.run(
        private_data_dir=str(tmp_path / "runner"),
        project_dir=REPO,
        playbook=os.path.join(REPO, "bench.yml"),
        inventory=os.path.join(REPO, "inventory", "local"),
        extravars=extravars,
        envvars=env,
        quiet=True,
        timeout=900,
        cmdline=cmdline,
    )
    return r


def _report_result(r):
    for ev in r.events:
        data = ev.get("event_data", {})
        if ev.get("event") == "runner_on_ok" and data.get("task") == "servelab: report":
            return data["res"]
    raise AssertionError("the report task did not run: " + r.stdout.read()[-3000:])


def _profiles():
    return [
        {"name": "baseline", "simulator": {"profile": "baseline", "time_scale": TIME_SCALE}},
        {"name": "eagle3", "simulator": dict(SPEC)},
    ]


def _base_vars(tmp_path, profiles):
    return {
        "bench_profiles": profiles,
        "bench_concurrency": LEVELS,
        "bench_level_seconds": 3,
        "bench_warmup_requests": 1,
        "bench_server_port": _free_port(),
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": {"kind": "synthetic", "input_tokens": PROMPT_TOKENS,
                           "output_tokens": OUTPUT_TOKENS, "count": 32},
        "bench_max_tokens": OUTPUT_TOKENS,
    }


@pytest.mark.core
def test_bench_playbook_end_to_end_and_crossover_matches_the_model(tmp_path):
    r = _run_bench(tmp_path, _base_vars(tmp_path, _profiles()))
    assert r.rc == 0, r.stdout.read()[-5000:]

    root = tmp_path / "results"
    latest = root / results.LATEST_LINK
    assert latest.is_symlink()
    run_dir = latest.resolve()
    for name in (results.MANIFEST, results.REQUESTS, results.LEVELS, results.SUMMARY):
        assert (run_dir / name).is_file(), name

    with open(run_dir / results.LEVELS, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r_["profile"], int(r_["concurrency"])) for r_ in rows} == {
        (p, c) for p in ("baseline", "eagle3") for c in LEVELS}
    for col in results.LEVEL_COLUMNS:
        assert col in rows[0], col
    assert all(int(r_["errors"]) == 0 for r_ in rows)
    # The simulator streams per-chunk usage: ITL is per token even for multi-token chunks.
    assert {r_["itl_basis"] for r_ in rows} == {"token"}

    with open(run_dir / results.REQUESTS) as fh:
        reqs = [json.loads(line) for line in fh]
    assert reqs and all(set(results.REQUEST_FIELDS) <= set(q) for q in reqs)
    # Tokens come from the server: every request produced exactly what ignore_eos asked for.
    assert {q["completion_tokens"] for q in reqs if not q["error"]} == {OUTPUT_TOKENS}

    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert manifest["run_id"] == run_dir.name
    for prof in ("baseline", "eagle3"):
        rec = manifest["profiles"][prof]["localhost"]
        assert rec["status"] == "finished"
        assert "--profile" in rec["cmdline"] and "--time-scale" in rec["cmdline"]
    assert "gpu_facts" in manifest["hosts"]["localhost"]

    # The crossover the report found must be the one the simulator's model predicts for the
    # same settings: same levels, the prompt length the server really counted, same time scale.
    prompt_tokens = round(statistics.mean(q["prompt_tokens"] for q in reqs if not q["error"]))
    predicted = predict_crossover("baseline", SPEC, LEVELS, prompt_tokens,
                                  OUTPUT_TOKENS, time_scale=TIME_SCALE)
    assert predicted is not None, "the model predicts no crossover for these settings"
    report = _report_result(r)
    assert report["crossover"]["eagle3"]["localhost"] == predicted
    assert "crossover" in (run_dir / results.SUMMARY).read_text().lower()


def test_a_dying_server_is_recorded_and_the_other_profiles_still_report(tmp_path):
    profiles = [
        {"name": "baseline", "simulator": {"profile": "baseline", "time_scale": TIME_SCALE}},
        # dies after a handful of requests: mid-sweep
        {"name": "eagle3", "simulator": {"profile": "eagle3", "time_scale": TIME_SCALE,
                                         "die_after": 6}},
    ]
    extravars = _base_vars(tmp_path, profiles)
    extravars["bench_concurrency"] = [1, 2]
    # the cuda_toolkit role's local fact: its env reaches every server, under bench_server_env
    facts = tmp_path / "facts.d"
    facts.mkdir()
    (facts / "servelab_cuda.fact").write_text(json.dumps(
        {"env": {"CUDA_HOME": "/usr/local/cuda", "SERVELAB_PROBE": "from-fact"}}))
    extravars["bench_fact_path"] = str(facts)
    extravars["bench_server_env"] = {"SERVELAB_PROBE": "from-bench"}
    r = _run_bench(tmp_path, extravars)
    # A failed profile fails the play (after the report is written), naming the profile.
    assert r.rc != 0, r.stdout.read()[-5000:]
    run_dir = (tmp_path / "results" / results.LATEST_LINK).resolve()
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    failed = manifest["profiles"]["eagle3"]["localhost"]
    assert failed["status"] == "failed"
    assert failed["error"]
    baseline = manifest["profiles"]["baseline"]["localhost"]
    assert baseline["status"] == "finished"
    assert baseline["env"]["CUDA_HOME"] == "/usr/local/cuda"
    assert baseline["env"]["SERVELAB_PROBE"] == "from-bench"
    with open(run_dir / results.LEVELS, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {int(r_["concurrency"]) for r_ in rows if r_["profile"] == "baseline"} == {1, 2}
    # The run still ends with a report.
    assert (run_dir / results.SUMMARY).is_file()


def test_check_mode_starts_nothing_and_writes_nothing(tmp_path):
    extravars = _base_vars(tmp_path, _profiles())
    r = _run_bench(tmp_path, extravars, cmdline="--check")
    assert r.rc == 0, r.stdout.read()[-5000:]
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
    with socket.socket() as s:   # no server took the port
        s.bind(("127.0.0.1", extravars["bench_server_port"]))
    assert not (tmp_path / "servers").exists() or not any(
        f.name == "state.json" for f in (tmp_path / "servers").rglob("*"))


def test_rate_mode_measures_one_open_loop_level_per_request_rate(tmp_path):
    """bench_load_mode: rate reaches llm_bench: one level per bench_request_rate value, each an
    open-loop level at that offered rate, bench_concurrency the cap in flight."""
    rates = [2.0, 4.0]
    extravars = _base_vars(tmp_path, _profiles()[:1])
    extravars.update(bench_load_mode="rate", bench_request_rate=rates, bench_arrival="constant",
                     bench_concurrency=[8], bench_level_seconds=2, bench_processes=1,
                     bench_min_latency_samples=8,
                     bench_workload={"kind": "synthetic", "input_tokens": 64,
                                     "output_tokens": 32, "count": 16},
                     bench_max_tokens=32)
    r = _run_bench(tmp_path, extravars)
    failed = {e["event_data"].get("task"): e["event_data"]["res"].get("msg", "")
              for e in r.events if e.get("event") == "runner_on_failed"}
    # Every task succeeded, the report too: a rate sweep has its own table and plot.
    assert not failed and r.rc == 0, (failed, r.stdout.read()[-5000:])
    run_dir = (tmp_path / "results" / results.LATEST_LINK).resolve()
    with open(run_dir / results.LEVELS, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r_["profile"], r_["load_mode"], float(r_["request_rate"]),
                   int(r_["concurrency"])) for r_ in rows) == [
        ("baseline", "rate", rate, 8) for rate in rates]
    assert all(int(r_["errors"]) == 0 for r_ in rows)
    settings = json.loads((run_dir / results.MANIFEST).read_text())["hosts"]["localhost"]["bench"]
    assert settings["load_mode"] == "rate" and settings["request_rate"] == rates
    assert settings["arrival"] == "constant" and settings["processes"] == 1
    # A launched run records its server's settings (an all-external one does not:
    # test_bench_external.py).
    assert settings["engine"] == "simulator" and settings["model"] and "base_url" in settings
    assert (run_dir / "plots" / "rate.png").is_file() and (run_dir / "report.html").is_file()
