"""The tuner's search against the simulator, without Ansible (plugins/plugin_utils/tune/
offline.py: the same rounds, capacity searches and records as tune.yml, an oracle engine in place
of llm_bench): the engine's hidden parameters differ from the tuner's prior; the model-guided
tune reaches the grid's best in fewer trials, a failed trial is recorded with its reason and the
search goes on, the grid strategy tries every candidate. A few seconds each."""
from __future__ import annotations

from ansible_collections.servelab.serving.plugins.plugin_utils.tune import offline
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import state as st
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.settings import check_tune

from test_tune_settings import values

PROMPT, OUTPUT = 256, 32
SLO = {"ttft_ms": 300, "tpot_ms": 6}
PRIOR = {"profile": "baseline", "time_scale": 10}
# The engine tuned: slower per running request and in prefill than the prior says.
TRUTH = dict(PRIOR, step_per_req_ms=2.0, prefill_per_token_ms=0.1, request_overhead_ms=400)
SPACE = {"max_running_requests": [2, 4, 8, 16, 32, 64]}


def settings(**over):
    given = dict(
        tune_space=SPACE, bench_profiles=[{"name": "base", "simulator": dict(PRIOR)}],
        bench_slo=SLO, bench_level_seconds=4,
        bench_workload={"kind": "synthetic", "input_tokens": PROMPT, "output_tokens": OUTPUT},
        bench_max_tokens=OUTPUT, tune_budget={"trials": 6}, tune_tolerance=0.05,
        tune_first_load=4)
    given.update(over)
    check = check_tune(values(**given), [], {}, "h")
    assert check.ok, [p.message for p in check.problems]
    return check.settings


def engine(seed=1, failing=None):
    return offline.SimulatorEngine(TRUTH, PROMPT, OUTPUT, SLO, seed=seed, failing=failing)


def test_the_model_guided_tune_reaches_the_grids_best_in_fewer_trials():
    grid = offline.run_tune(settings(tune_strategy="grid"), engine(seed=2))
    assert len(grid.trials) == 6 and grid.done == "the budget of 6 trial(s) is spent"
    grid_best = max(t.score for t in grid.trials if t.score is not None)
    tuned = offline.run_tune(settings(), engine(seed=3))
    best = tuned.best()
    assert best is not None
    assert best.score >= 0.93 * grid_best, (best.key, best.score, grid_best)
    assert len(tuned.trials) < len(grid.trials), [t.key for t in tuned.trials]
    assert tuned.done.startswith("no untried candidate is expected to beat the best")
    # the prediction it was proposed with is recorded beside the measurement
    assert all(t.prediction.get("source") == "simulator" for t in tuned.trials)
    assert tuned.model["model"] == "simulator" and tuned.model["scales"]


def test_a_failed_trial_is_recorded_and_the_search_goes_on():
    def oom(flags):
        if flags["--max-running-requests"] >= 32:
            return "CUDA out of memory: the KV cache for 32 requests does not fit"
        return None
    state = offline.run_tune(settings(), engine(failing=oom))
    failed = [t for t in state.trials if t.status == st.FAILED]
    assert failed and all("CUDA out of memory" in t.reason for t in failed)
    assert state.best() is not None and state.best().flags["--max-running-requests"] < 32
    assert len(state.trials) > len(failed)


def test_every_trial_starts_at_the_best_load_and_a_worse_one_is_pruned_early():
    state = offline.run_tune(settings(tune_strategy="grid"), engine(seed=4))
    pruned = [t for t in state.trials if t.status == st.PRUNED]
    finished = [t for t in state.trials if t.status == st.FINISHED]
    assert pruned and finished, [(t.key, t.status) for t in state.trials]
    assert min(t.levels for t in pruned) <= 2, [(t.key, t.levels) for t in pruned]
    assert sum(t.levels for t in pruned) / len(pruned) < \
        sum(t.levels for t in finished) / len(finished)
    for t in state.trials[1:]:
        best = max((p for p in state.trials[:state.trials.index(t)] if p.score is not None),
                   key=lambda p: p.score)
        assert t.search["beat"] == best.score and t.search["start"] == best.outcome["best_x"]


def test_a_tune_out_of_levels_scores_lower_bounds_and_says_so(tmp_path):
    """The device's shape (tests/gpu/tune, 2026-12-06): a first load far under the capacity and
    few levels. Every trial still has a score, marked as a lower bound in trials.csv, best.yml
    and the report; the tune has an answer."""
    import csv

    import yaml

    from ansible_collections.servelab.serving.plugins.plugin_utils.report import tune_section
    from ansible_collections.servelab.serving.plugins.plugin_utils.tune import results

    state = offline.run_tune(settings(tune_strategy="grid", tune_first_load=4, bench_level_seconds=8,
                                      tune_max_levels=3, tune_budget={"trials": 2}),
                             engine(seed=5))
    assert [t.status for t in state.trials] == [st.FINISHED, st.FINISHED], [
        (t.status, t.reason) for t in state.trials]
    assert all(t.lower_bound and t.score for t in state.trials)
    assert all("raise tune_max_levels" in t.reason and "at least" in t.reason
               for t in state.trials)
    st.save(str(tmp_path), state)
    results.write_results(str(tmp_path), state, {})
    with open(tmp_path / "tune" / "trials.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["lower_bound"] for r in rows} == {"True"}
    assert all(float(r["highest_load_met"]) >= float(r["load"]) for r in rows)
    best = (tmp_path / "tune" / "best.yml").read_text()
    assert "A LOWER BOUND: its capacity is at least rate" in best
    assert yaml.safe_load(best)["bench_profiles"][0]["name"] == "tuned"
    view = tune_section.read_tune(str(tmp_path), {}, {}, "r1")
    line = [x for x in tune_section.summary_lines(view) if x.startswith("best: ")][0]
    assert "a lower bound: its capacity is at least rate" in line


def test_a_tune_without_a_score_says_what_its_levels_showed():
    from ansible_collections.servelab.serving.plugins.plugin_utils.report.tune_section import (
        no_score_words,
    )
    rate = {"axis": "rate"}
    assert no_score_words([{"status": "no_score", "highest_load_met": 16.0},
                           {"status": "no_score", "highest_load_met": None}], rate) == (
        "no trial ended with a score, though loads up to rate 16/s met the SLO (each trial's "
        "reason says why)")
    assert no_score_words([{"status": "no_score", "highest_load_met": None}], rate) == \
        "no load any trial measured met the SLO"
    assert "every trial failed" in no_score_words([{"status": "failed"}], rate)
