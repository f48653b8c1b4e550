"""tune.yml end to end on the embedded default (inventory/local, the simulator): each trial a
profile run through the bench role's own path (reap, start, readiness, the capacity search,
stop, reap), the outcome a ready profile that bench.yml runs unchanged; an interrupted tune
resumes keeping its finished trials; bad tune settings are refused before anything starts; a
trial whose server dies is recorded with its reason and the tune goes on (the command engine,
its flags checked against the command's own --help). Nothing is left running.

The space: max_running_requests 1, 4, 16 at time_scale 4 with 256-token prompts and 32-token
answers, p90 TTFT <= 600 ms and TPOT <= 6 ms: one slot queues (~9 req/s), sixteen break the TPOT
limit (~15 req/s), four is best (~19 req/s). Short levels (1 s, full 2 s), a coarse tolerance.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import sys
import time
import uuid

import pytest
import yaml

from playbookproc import PlaybookProcess  # tests/ (conftest.py)
from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import read_parts
from test_bench_lifecycle import MARK, free_port, port_is_free, processes_with

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.slow


def tune_vars(tmp_path, **over):
    extra = {
        "bench_profiles": [{"name": "base", "simulator": {"profile": "baseline",
                                                          "time_scale": 4}}],
        "bench_server_port": free_port(),
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": {"kind": "synthetic", "input_tokens": 256, "output_tokens": 32,
                           "count": 32},
        "bench_max_tokens": 32, "bench_warmup_requests": 0, "bench_min_latency_samples": 10,
        "bench_drain_timeout": 5, "bench_gpu_telemetry": False,
        "bench_slo": {"ttft_ms": 600, "tpot_ms": 6},
        "tune_space": {"max_running_requests": [1, 4, 16]},
        "tune_objective": {"metric": "goodput", "percentile": 90},
        "tune_budget": {"trials": 3}, "tune_level_seconds": 2, "tune_short_level_seconds": 1,
        "tune_tolerance": 0.2, "tune_max_levels": 8, "tune_first_load": 4,
        "tune_load_max": 40, "tune_min_trials": 3,
    }
    extra.update(over)
    return extra


class Play(PlaybookProcess):
    def __init__(self, tmp_path, extra, playbook="tune.yml", *cli):
        self.mark = uuid.uuid4().hex
        self.root = tmp_path / "results"
        self.varsfile = tmp_path / ("vars-%s.json" % self.mark[:8])
        self.varsfile.write_text(json.dumps(extra))
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
                   SERVELAB_RESULTS_ROOT=str(self.root), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1", **{MARK: self.mark})
        env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
        super().__init__([os.path.join(BIN, "ansible-playbook"), "-i",
                          os.path.join(REPO, "inventory", "local"), "-e", "@%s" % self.varsfile,
                          *cli, os.path.join(REPO, playbook)], env, REPO)


@contextlib.contextmanager
def play(tmp_path, extra, playbook="tune.yml", *cli):
    run = Play(tmp_path, extra, playbook, *cli)
    try:
        yield run
    finally:
        run.kill()


def trials_csv(run_dir):
    with open(run_dir / "tune" / "trials.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_tune_finds_the_best_and_its_profile_runs_unchanged_in_bench_yml(tmp_path):
    extra = tune_vars(tmp_path, bench_run_id="tune1")
    with play(tmp_path, extra) as run:
        rc = run.wait(600)
    assert rc == 0, run.output[-6000:]
    run_dir = run.root / "tune1"
    rows = trials_csv(run_dir)
    assert [r["trial"] for r in rows] == ["t01", "t02", "t03"]
    assert {r["max-running-requests"] for r in rows} == {"1", "4", "16"}
    best = max((r for r in rows if r["status"] == "finished"), key=lambda r: float(r["score"]))
    assert best["max-running-requests"] == "4", rows
    # each trial's prediction beside its measurement
    assert all(r["predicted"] for r in rows), rows
    state = json.loads((run_dir / "tune" / "state.json").read_text())
    assert state["done"] == "the budget of 3 trial(s) is spent"
    # the trials ran through the bench role: started, measured, stopped
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert manifest["status"] == "finished"
    assert {p: h["localhost"]["status"] for p, h in manifest["profiles"].items()} == {
        "t01": "finished", "t02": "finished", "t03": "finished"}
    assert manifest["tune"]["candidates"] == 3
    levels = read_parts(str(run_dir / results.PARTS_DIR))
    assert {row["profile"] for row, _jsonl in levels} == {"t01", "t02", "t03"}
    assert all(row["load_mode"] == "rate" for row, _jsonl in levels)
    summary = (run_dir / results.SUMMARY).read_text()
    assert "## Tune" in summary and "best: t0" in summary and "Pareto frontier" in summary
    html = (run_dir / results.REPORT_HTML).read_text()
    assert "<h2>Tune</h2>" in html and "tune_pareto" not in html or "Pareto" in html
    assert (run_dir / results.PLOTS_DIR / "tune_pareto.png").is_file()
    assert "servelab tune: best" in run.output and "best.yml" in run.output
    assert processes_with(run.mark) == [] and port_is_free(extra["bench_server_port"])

    # best.yml runs unchanged in bench.yml: the tuned profile at the load it was measured at
    best_yml = run_dir / "tune" / "best.yml"
    doc = yaml.safe_load(best_yml.read_text())
    assert doc["bench_profiles"][0]["simulator"]["max_running"] == 4
    bench_extra = {k: v for k, v in extra.items() if not k.startswith("tune_")
                   and k not in ("bench_run_id", "bench_slo")}
    bench_extra["bench_run_id"] = "bench-of-best"
    with play(tmp_path, bench_extra, "bench.yml", "-e", "@%s" % best_yml) as bench:
        rc = bench.wait(300)
    assert rc == 0, bench.output[-5000:]
    rows = [row for row, _jsonl in read_parts(str(run.root / "bench-of-best" / results.PARTS_DIR))]
    assert [(r["profile"], r["request_rate"]) for r in rows] == [
        ("tuned", doc["bench_request_rate"][0])]
    assert processes_with(bench.mark) == []


def test_an_interrupted_tune_resumes_keeping_its_finished_trials(tmp_path):
    extra = tune_vars(tmp_path, bench_run_id="tune-int")
    run_dir = tmp_path / "results" / "tune-int"
    with play(tmp_path, extra) as run:
        run.wait_for_line(r"llm_bench localhost/t02 .*: running", timeout=300)
        time.sleep(0.5)
        os.kill(run.proc.pid, signal.SIGINT)
        rc = run.wait(300)
    assert rc != 0, run.output[-5000:]
    assert processes_with(run.mark) == [] and port_is_free(extra["bench_server_port"])
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert manifest["status"] == "interrupted", run.output[-3000:]
    state = json.loads((run_dir / "tune" / "state.json").read_text())
    assert [(t["name"], t["status"]) for t in state["trials"]] == [
        ("t01", "finished"), ("t02", "running")]
    summary = (run_dir / results.SUMMARY).read_text()
    assert "## Run interrupted" in summary
    assert "interrupted: trial t02" in summary and "bench_resume=tune-int" in summary
    t01 = {p.name: p.read_bytes() for p in (run_dir / results.PARTS_DIR).glob("*__t01__*")}
    assert t01

    resumed_extra = {k: v for k, v in extra.items() if k != "bench_run_id"}
    resumed_extra["bench_resume"] = "tune-int"
    with play(tmp_path, resumed_extra) as resumed:
        rc = resumed.wait(600)
    assert rc == 0, resumed.output[-5000:]
    assert "t01" not in [line.split()[-1] for line in resumed.lines
                         if "Benchmark trial" in line], "a finished trial ran again"
    assert {p.name: p.read_bytes() for p in
            (run_dir / results.PARTS_DIR).glob("*__t01__*")} == t01
    state = json.loads((run_dir / "tune" / "state.json").read_text())
    assert [(t["name"], t["status"] in ("finished", "pruned", "no_score")) for t in
            state["trials"]] == [("t01", True), ("t02", True), ("t03", True)]
    assert state["trials"][1]["attempts"] == 2 and state["resumed_at"]
    assert processes_with(resumed.mark) == []


@pytest.mark.core
def test_bad_tune_settings_are_refused_before_anything_starts(tmp_path):
    extra = tune_vars(tmp_path, bench_run_id="refused", tune_budgte={"trials": 2},
                      tune_space={"max_running_requets": [1, 4]})
    with play(tmp_path, extra) as run:
        rc = run.wait(180)
    assert rc != 0
    out = run.output
    assert "tune_budgte: unknown variable; did you mean tune_budget?" in out, out[-3000:]
    assert ("tune_space.max-running-requets: the simulator models no such flag; did you mean "
            "max-running-requests?") in out, out[-3000:]
    assert not (tmp_path / "results" / "refused").exists()
    assert not (tmp_path / "servers").exists() or not any((tmp_path / "servers").iterdir())
    assert processes_with(run.mark) == []


def _command_profile():
    from simproc import simulator_script
    return {"name": "sim", "engine": "command",
            "command": [sys.executable, simulator_script(), "--host", "{host}", "--port",
                        "{port}", "--model-name", "servelab-sim", "--profile", "baseline",
                        "--time-scale", "4"]}


def test_a_trial_whose_server_dies_is_recorded_and_the_tune_goes_on(tmp_path):
    """The command engine: the searched flags are appended to the command line and checked
    against the command's own --help first; the trial with --die-after 3 loses its server in its
    first level and is recorded as failed with the reason; the other one finishes."""
    extra = tune_vars(tmp_path, bench_run_id="tune-fail", bench_engine="command",
                      bench_profiles=[_command_profile()],
                      tune_space={"die_after": [0, 3], "max_running": [4]},
                      tune_budget={"trials": 2})
    with play(tmp_path, extra) as run:
        rc = run.wait(600)
    assert rc == 0, run.output[-6000:]
    rows = {r["die-after"]: r for r in trials_csv(run.root / "tune-fail")}
    assert rows["3"]["status"] == "failed", rows
    assert rows["3"]["reason"], rows
    assert rows["0"]["status"] == "finished" and float(rows["0"]["score"]) > 0
    summary = (run.root / "tune-fail" / results.SUMMARY).read_text()
    assert "1 failed" in summary and "1 finished" in summary
    assert processes_with(run.mark) == [] and port_is_free(extra["bench_server_port"])


def test_a_flag_the_command_does_not_have_is_refused_by_its_own_help(tmp_path):
    extra = tune_vars(tmp_path, bench_run_id="tune-help", bench_engine="command",
                      bench_profiles=[_command_profile()],
                      tune_space={"max_running_requests": [4, 16]})
    with play(tmp_path, extra) as run:
        rc = run.wait(300)
    assert rc != 0
    assert ("tune_space: --max-running-requests is not a flag of the command (its --help lists "
            "no such option); did you mean --max-running?") in run.output, run.output[-3000:]
    assert not (run.root / "tune-help").exists()
    assert processes_with(run.mark) == []


def test_a_tune_out_of_levels_scores_a_lower_bound_and_says_so_everywhere(tmp_path):
    """Two levels a trial, the first far under the capacity (2 req/s, the simulator serves ~19):
    the short level meets the SLO and the last level is kept for a full-length one under it, so
    the trial has a score - a lower bound, said so in trials.csv, best.yml, the report and the
    play's output - and the play succeeds instead of saying no load met the SLO (the device run
    of 2026-12-06, tests/gpu/tune)."""
    extra = tune_vars(tmp_path, bench_run_id="tune-lb", tune_space={"max_running_requests": [4]},
                      tune_budget={"trials": 1}, tune_min_trials=1, tune_max_levels=2,
                      tune_first_load=2)
    with play(tmp_path, extra) as run:
        rc = run.wait(300)
    assert rc == 0, run.output[-6000:]
    assert "No load" not in run.output and "no load" not in run.output
    run_dir = run.root / "tune-lb"
    (row,) = trials_csv(run_dir)
    assert (row["status"], row["lower_bound"]) == ("finished", "True"), row
    assert float(row["score"]) > 0 and float(row["highest_load_met"]) >= float(row["load"]) > 0
    assert "raise tune_max_levels" in row["reason"] and "at least" in row["reason"], row
    assert "A LOWER BOUND: its capacity is at least rate" in (run_dir / "tune" / "best.yml").read_text()
    summary = (run_dir / results.SUMMARY).read_text()
    assert "a lower bound: its capacity is at least rate" in summary
    assert ">= " in summary      # the trials table marks the score
    said = [line for line in run.output.splitlines() if "servelab tune: best t01" in line]
    assert said and "req/s, a lower bound: " in said[0] and "at least rate" in said[0], said
    assert processes_with(run.mark) == [] and port_is_free(extra["bench_server_port"])
