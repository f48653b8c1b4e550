"""A tune's state (plugins/plugin_utils/tune/state.py, rounds.py): a resumed tune keeps its
finished trials and runs the one in flight again under its recorded name, profile and search;
changed settings are refused; the budget in trials and minutes; a trial recorded as finished,
pruned, without a score or failed (with the server's reason)."""
from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.tune import rounds
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import state as st
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.proposer import Flat
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.settings import check_tune

from test_tune_settings import values


@pytest.fixture
def settings():
    check = check_tune(values(tune_space={"max_running_requests": [4, 8, 16, 32]},
                              tune_budget={"trials": 3}), [], {}, "h")
    assert check.ok
    return check.settings


def finish(trial, score, lo, hi):
    outcome = {"status": "found", "reason": "the capacity lies in [...)", "score": score,
               "best_x": lo, "lo": lo, "hi": hi, "bound": hi, "levels": 3}
    return rounds.record(trial, {"status": "finished"}, outcome, [{"window_s": 2.0}] * 3)


def test_resume_keeps_finished_trials_and_reruns_the_one_in_flight(tmp_path, settings):
    run_dir = str(tmp_path / "run")
    state = st.open_state(run_dir, settings, resuming=False)
    first, _why = rounds.next_trial(state, settings, Flat())
    state.trials.append(first)
    finish(first, 10.0, 10.0, 11.0)
    second, _why = rounds.next_trial(state, settings, Flat())
    state.trials.append(second)
    st.save(run_dir, state)                 # interrupted while `second` runs

    resumed = st.open_state(run_dir, settings, resuming=True)
    assert [t.status for t in resumed.trials] == ["finished", "running"]
    assert resumed.resumed_at
    again, why = rounds.next_trial(resumed, settings, Flat())
    assert again.name == second.name == "t02" and "resumed" in why
    assert again.profile == second.profile and again.search == second.search
    assert again.attempts == 2
    # the finished trial is kept as it was
    assert resumed.trials[0].score == 10.0 and resumed.trials[0].key == first.key


def test_changed_settings_are_refused_on_resume(tmp_path, settings):
    run_dir = str(tmp_path / "run")
    st.open_state(run_dir, settings, resuming=False)
    changed = dict(settings, objective=dict(settings["objective"], percentile=90))
    with pytest.raises(st.StateError, match="tune objective changed"):
        st.open_state(run_dir, changed, resuming=True)


def test_budget_in_trials_and_minutes(settings):
    state = st.TuneState(settings=settings)
    for _trial in range(3):
        trial, _why = rounds.next_trial(state, settings, Flat())
        state.trials.append(trial)
        finish(trial, 5.0, 5.0, 6.0)
    trial, why = rounds.next_trial(state, settings, Flat())
    assert trial is None and why == "the budget of 3 trial(s) is spent"
    timed = dict(settings, budget={"minutes": 0.5})
    state.trials[0].wall_s = 40.0
    trial, why = rounds.next_trial(state, timed, Flat())
    assert trial is None and why.startswith("the budget of 0.5 minute(s) is spent")


def test_the_next_trial_starts_at_the_best_load_with_its_score_as_bar(settings):
    state = st.TuneState(settings=settings)
    first, _why = rounds.next_trial(state, settings, Flat())
    state.trials.append(first)
    finish(first, 10.0, 12.0, 12.5)
    second, _why = rounds.next_trial(state, settings, Flat())
    assert second.search["start"] == 12.0 and second.search["beat"] == 10.0
    assert second.key != first.key


def test_record_failed_pruned_and_no_score(settings):
    state = st.TuneState(settings=settings)
    trials = []
    for _trial in range(3):
        t, _why = rounds.next_trial(state, settings, Flat())
        state.trials.append(t)
        trials.append(t)
    rounds.record(trials[0], {"status": "failed", "error": "server exited: CUDA out of memory",
                              "failed_task": "Start the server for t01",
                              "log_tail": "torch.OutOfMemoryError: CUDA out of memory"},
                  None, [])
    assert trials[0].status == st.FAILED
    assert "CUDA out of memory (in 'Start the server for t01')" in trials[0].reason
    assert "server log: torch.OutOfMemoryError" in trials[0].reason
    rounds.record(trials[1], {"status": "finished"},
                  {"status": "pruned", "reason": "cannot beat the best", "score": None,
                   "bound": 9.0, "hi": 9.0}, [{"window_s": 1.0}])
    assert trials[1].status == st.PRUNED and trials[1].score is None
    rounds.record(trials[2], {"status": "finished"},
                  {"status": "none_passed", "reason": "not even the minimum", "score": None},
                  [{"window_s": 1.0}])
    assert trials[2].status == st.NO_SCORE
    assert state.best() is None
