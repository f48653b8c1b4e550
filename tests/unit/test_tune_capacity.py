"""The capacity search of one trial (plugins/plugin_utils/tune/capacity.py) against servers whose
capacity is known: it brackets, bisects, screens with short levels, prunes a trial that cannot
beat the best after one level, never measures a load twice, and replays the same decisions from
kept levels (a resumed sweep)."""
from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.tune import capacity as cap
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.objective import (
    Objective, ObjectiveError,
)

OBJ = {"metric": "goodput", "slo": {"ttft_ms": 500}, "percentile": 99}


def server(capacity, saturation=None, verdict_errors=0):
    """measure(step) of an open-loop server that meets the SLO up to `capacity` req/s."""
    saturation = saturation or capacity * 1.3

    def measure(step):
        x = step.x
        done = min(x, saturation)
        ttft = 100.0 if x <= capacity else 2000.0
        return {"host": "h", "profile": "p", "concurrency": 64, "requests": 200,
                "errors": verdict_errors, "window_s": step.seconds, "output_tok_s": done * 100,
                "output_tok_s_ci95": done * 2, "request_s": done, "ttft_p99_ms": ttft,
                "goodput_request_s": done if x <= capacity else done * 0.3,
                "client_limited": False, "load_mode": "rate", "request_rate": x}
    return measure


def spec(**kw):
    base = dict(axis="rate", objective=OBJ, start=4.0, full_seconds=10, short_seconds=2,
                minimum=0.1, maximum=1000, tolerance=0.05, short_tolerance=0.25)
    base.update(kw)
    return cap.SearchSpec.parse(base)


@pytest.mark.parametrize("capacity", [0.7, 3.3, 4.0, 9.5, 37.0, 60.0])
def test_finds_the_capacity_within_the_tolerance(capacity):
    steps = []
    measure = server(capacity)
    out = cap.run_search(spec(), lambda s: (steps.append(s), measure(s))[1])
    assert out.status == cap.FOUND, out
    assert out.lo <= capacity < out.hi
    assert out.hi / out.lo - 1 <= 0.05
    # the score is a full-length level's, short levels only screened
    assert out.best_x <= capacity and out.score == pytest.approx(out.best_x)
    assert any(s.phase == cap.SHORT for s in steps) and steps[-1].phase == cap.FULL
    xs = [s.x for s in steps]
    assert len(xs) == len(set(xs)), "a load was measured twice: %s" % xs
    assert len(xs) <= 12
    assert out.score_ci95 == pytest.approx(out.score * 0.02)


def test_bisection_beats_a_stepwise_walk():
    """vLLM's walk from a high rate down in steps of 1/s needs ~(start - capacity) levels."""
    out = cap.run_search(spec(start=5.0), server(37.0))
    assert out.status == cap.FOUND and out.levels <= 10


def test_a_trial_that_cannot_beat_the_bar_stops_after_one_short_level():
    steps = []
    measure = server(3.0)
    out = cap.run_search(spec(start=4.0, beat=3.96),
                         lambda s: (steps.append(s), measure(s))[1])
    assert out.status == cap.PRUNED and len(steps) == 1 and steps[0].phase == cap.SHORT
    assert "cannot beat the best" in out.reason


def test_a_trial_that_beats_the_bar_is_not_pruned():
    out = cap.run_search(spec(start=4.0, beat=3.96), server(6.0))
    assert out.status == cap.FOUND and out.score > 3.96 * 1.05


def test_without_short_levels_every_level_is_full():
    steps = []
    measure = server(9.0)
    out = cap.run_search(spec(short_seconds=None), lambda s: (steps.append(s), measure(s))[1])
    assert out.status == cap.FOUND and {s.phase for s in steps} == {cap.FULL}


def test_concurrency_axis_is_integer_and_stops_at_adjacent_levels():
    def measure(step):
        c = step.x
        return {"concurrency": int(c), "requests": 100, "errors": 0, "window_s": 5,
                "output_tok_s": 50 * min(c, 40), "request_s": min(c, 40) / 2,
                "ttft_p99_ms": 100 if c <= 23 else 900, "goodput_request_s": min(c, 40) / 2,
                "client_limited": False}
    out = cap.run_search(spec(axis="concurrency", start=8, minimum=1, maximum=512,
                              tolerance=0.05, short_tolerance=0.3), measure)
    assert out.status == cap.FOUND and (out.lo, out.hi) == (23, 24)


def test_maximum_and_minimum_end_the_search():
    assert cap.run_search(spec(maximum=20), server(50)).status == cap.AT_MAXIMUM
    out = cap.run_search(spec(minimum=1), server(0.5))
    assert out.status == cap.NONE_PASSED and out.score is None


def test_a_failed_level_ends_the_trial_as_failed():
    def measure(step):
        return {"requests": 0, "errors": 50, "window_s": 2, "output_tok_s": None,
                "request_s": None, "client_limited": False, "first_error": "connection refused"}
    out = cap.run_search(spec(), measure)
    assert out.status == cap.FAILED and "did not serve" in out.reason


def test_resume_replays_the_same_decisions():
    """next_step depends only on the levels so far: the kept levels of an interrupted sweep lead
    to the same next load (run_record keeps part files by load)."""
    measure = server(9.5)
    first = cap.Search(spec())
    seen = []
    for _level in range(4):
        step = first.next_step()
        seen.append((step.x, step.phase))
        first.add(step.x, step.phase, measure(step))
    replay = cap.Search(spec())
    for x, phase in seen:
        step = replay.next_step()
        assert (step.x, step.phase) == (x, phase)
        replay.add(x, phase, measure(step))
    assert replay.next_step() == first.next_step()


@pytest.mark.parametrize("bad, words", [
    ({"axis": "qps"}, "axis"),
    ({"short_seconds": 20}, "short_seconds"),
    ({"tolerance": 0.5, "short_tolerance": 0.2}, "short_tolerance"),
    ({"start": None}, "start"),
    ({"surprise": 1}, "unknown key"),
    ({"objective": {"metric": "goodput"}}, "slo"),
])
def test_bad_specs_name_the_key(bad, words):
    with pytest.raises(cap.SearchError, match=words):
        spec(**bad)


def test_objective_judges_percentiles_and_verdicts():
    obj = Objective.parse({"metric": "output_tok_s", "slo": {"ttft_ms": 200, "tpot_ms": 40},
                           "percentile": 90})
    row = {"requests": 100, "errors": 0, "output_tok_s": 500.0, "request_s": 2.0,
           "ttft_p90_ms": 150, "tpot_p90_ms": 41, "client_limited": False}
    j = obj.judge(row)
    assert not j.passed and "p90 TPOT 41 ms > 40 ms" in j.reason and j.score == 500
    assert obj.judge(dict(row, tpot_p90_ms=39)).passed
    assert not obj.judge(dict(row, tpot_p90_ms=39, client_limited=True)).passed
    with pytest.raises(ObjectiveError, match="percentile"):
        Objective.parse({"slo": {"ttft_ms": 1}, "percentile": 95})


def test_a_lucky_short_level_never_makes_the_result():
    """Short levels pass up to 10/s (a noisy window), full ones only up to 8/s: the search steps
    under the short bracket until a full-length level passes, and reports that."""
    def measure(step):
        capacity = 10.0 if step.phase == cap.SHORT else 8.0
        return server(capacity)(step)
    out = cap.run_search(spec(start=4.0, tolerance=0.05, short_tolerance=0.3, max_levels=16),
                         measure)
    assert out.status == cap.FOUND, out
    assert out.best_x <= 8.0 and out.lo <= 8.0 < out.hi and out.score == pytest.approx(out.best_x)


def test_a_borderline_short_miss_is_confirmed_at_full_length_not_trusted():
    """A short window's p99 is a handful of requests: one that misses the limit by less than the
    margin (here 4 %) is confirmed at full length before it may prune or cap the trial."""
    def measure(step):
        row = server(15.0)(step)
        if step.phase == cap.SHORT and step.x >= 9.5:
            row["ttft_p99_ms"] = 520.0        # noise: 4 % over the 500 ms limit
        return row
    steps = []
    out = cap.run_search(spec(start=10.0, beat=9.9),
                         lambda s: (steps.append(s), measure(s))[1])
    assert steps[1].phase == cap.FULL and steps[1].x < 10.0 and "borderline" in steps[1].why
    assert out.status == cap.FOUND and out.score > 14.0, out


# The device's run (tests/gpu/tune, H100, 2026-12-06): tune_first_load 2, tune_max_levels 5,
# tune_load_max 40, short levels 3 s, full 8 s, tolerance 0.25. Both trials ended without a
# score: every level short, the last ones still doubling.
DEVICE = dict(start=2.0, maximum=40.0, minimum=0.05, max_levels=5, tolerance=0.25,
              short_tolerance=0.75, short_seconds=3, full_seconds=8)


@pytest.mark.parametrize("capacity", [24.0, 100.0])
def test_a_search_out_of_levels_scores_a_lower_bound_not_nothing(capacity):
    """t01 met the SLO up to 16/s and missed at 32/s; t02 met it everywhere up to 40/s. The last
    level is kept for a full-length level under the highest load that met the SLO: the trial
    has a score, marked as a lower bound of its capacity."""
    steps = []
    measure = server(capacity)
    out = cap.run_search(spec(**DEVICE), lambda s: (steps.append(s), measure(s))[1])
    assert out.score is not None and out.best_x is not None, out
    assert out.lower_bound and out.status in (cap.MAX_LEVELS, cap.AT_MAXIMUM), out
    assert len(steps) <= 5 and steps[-1].phase == cap.FULL
    assert out.best_x <= capacity and out.score == pytest.approx(out.best_x)
    assert "at least" in out.reason and "lower bound" in out.reason
    xs = [s.x for s in steps]
    assert len(xs) == len(set(xs)), xs


def test_galloping_brackets_a_far_capacity_in_fewer_levels():
    """Started 30x under its capacity: 1, 2, 8 met the SLO, 32 missed (doubling: 1, 2, 4, 8, 16
    met, 32 missed); the search still ends with the capacity within the tolerance."""
    steps = []
    measure = server(30.0)
    out = cap.run_search(spec(start=1.0, max_levels=16),
                         lambda s: (steps.append(s), measure(s))[1])
    assert [s.x for s in steps[:4]] == [1.0, 2.0, 8.0, 32.0]
    assert "galloping" in steps[3].why
    assert out.status == cap.FOUND and out.lo <= 30.0 < out.hi and not out.lower_bound


def test_a_maximum_met_at_a_short_level_is_confirmed_at_full_length():
    steps = []
    measure = server(50.0)
    out = cap.run_search(spec(maximum=20), lambda s: (steps.append(s), measure(s))[1])
    assert out.status == cap.AT_MAXIMUM and out.lower_bound
    assert steps[-1].phase == cap.FULL and 19.0 < steps[-1].x < 20.0
    assert out.score == pytest.approx(steps[-1].x) and "at least" in out.reason


def test_loads_met_only_at_short_levels_are_said_so_not_none():
    """Short windows pass up to 10/s, full-length ones never: out of levels, the outcome names
    the loads that met the SLO and the full-length miss, not 'no load met the SLO'."""
    def measure(step):
        return server(10.0 if step.phase == cap.SHORT else 0.01, saturation=40.0)(step)
    wide = dict(DEVICE)
    wide["maximum"] = 1000
    out = cap.run_search(spec(**wide), measure)
    assert out.status == cap.MAX_LEVELS and out.score is None and not out.lower_bound
    assert "met the SLO at short levels, but no full-length level did" in out.reason
    assert "p99 TTFT" in out.reason
    floor = dict(DEVICE)
    floor["minimum"] = 1.9
    none = cap.run_search(spec(**floor), server(0.5))
    assert none.status == cap.NONE_PASSED and "not even the minimum" in none.reason


def test_out_of_levels_with_a_full_length_pass_only_above_the_lowest_miss_still_scores():
    """A noisy server: a short miss at 8/s below a full-length pass at 12/s. Out of levels,
    the outcome scores the full-length pass as a lower bound instead of failing on an empty
    max() (the search's own outcome must never raise)."""
    search = cap.Search(spec(start=12.0, max_levels=2))
    search.add(12.0, cap.FULL, server(20.0)(cap.Step(12.0, cap.FULL, 10, "")))
    search.add(8.0, cap.SHORT, server(5.0)(cap.Step(8.0, cap.SHORT, 2, "")))
    out = search.next_step()
    assert isinstance(out, cap.Outcome) and out.status == cap.MAX_LEVELS, out
    assert out.score == pytest.approx(12.0) and out.lower_bound, out
    assert "at least rate=12/s" in out.reason, out.reason


def test_resume_replays_a_search_that_ends_on_its_kept_level():
    """The reserved last level is a pure function of the levels too: a replay of the kept levels
    asks for the same loads, phases and outcome."""
    measure = server(100.0)
    first = cap.Search(spec(**DEVICE))
    seen = []
    while True:
        step = first.next_step()
        if isinstance(step, cap.Outcome):
            break
        seen.append((step.x, step.phase))
        first.add(step.x, step.phase, measure(step))
    replay = cap.Search(spec(**DEVICE))
    for x, phase in seen:
        step = replay.next_step()
        assert (step.x, step.phase) == (x, phase)
        replay.add(x, phase, measure(step))
    assert replay.next_step() == first.next_step()
