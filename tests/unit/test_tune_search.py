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
    check = check_tune(values(
        tune_space=SPACE, bench_profiles=[{"name": "base", "simulator": dict(PRIOR)}],
        bench_slo=SLO, bench_level_seconds=4,
        bench_workload={"kind": "synthetic", "input_tokens": PROMPT, "output_tokens": OUTPUT},
        bench_max_tokens=OUTPUT, tune_budget={"trials": 6}, tune_tolerance=0.05,
        tune_first_load=4, **over), [], {}, "h")
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
