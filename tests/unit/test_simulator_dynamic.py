"""The simulator's speculation by load (healthy and pathological schedules) and the split halves.

Predictions are the discrete-event model (deterministic, ~0.3 s per level); the live checks run
one server each for a few seconds at time_scale 20.
"""
import contextlib
import dataclasses
import re
import urllib.request

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import (
    predict_level,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, PROFILES, resolve_profile, SimError,
    single_stream_tok_s, SPLIT_MAX_RUNNING, SPLIT_STEP_SCALE,
)

from simproc import ServerProcess
from test_simulator import closed_loop

PROMPT, OUTPUT = DEFAULT_PROMPT_TOKENS, DEFAULT_OUTPUT_TOKENS


@pytest.fixture
def start_sim():
    """start_sim(*args) -> a listening simulator, ended by PID when the test ends."""
    with contextlib.ExitStack() as running:
        yield lambda *args: running.enter_context(ServerProcess("--host", "127.0.0.1", *args))


def tok_s(profile, c):
    return predict_level(profile, c, PROMPT, OUTPUT).output_tok_s


@pytest.mark.parametrize("c", [1, 2, 5, 10, 30])
def test_the_healthy_schedule_sits_on_the_upper_envelope(c):
    envelope = max(tok_s("baseline", c), tok_s("eagle3", c))
    dynamic = tok_s("eagle3_dynamic", c)
    assert dynamic >= 0.97 * envelope, (c, dynamic, envelope)


def test_the_healthy_schedule_leaves_both_static_profiles_where_they_lose():
    # Below the threshold it is eagle3 (no switch happens), well above it the baseline.
    assert tok_s("eagle3_dynamic", 2) == pytest.approx(tok_s("eagle3", 2), rel=1e-9)
    assert tok_s("eagle3_dynamic", 30) > 1.5 * tok_s("eagle3", 30)


def test_the_switch_cost_shows_where_the_batch_crosses_the_threshold():
    free = dataclasses.replace(PROFILES["eagle3_dynamic"], spec_switch_ms=0.0)
    costly = dataclasses.replace(PROFILES["eagle3_dynamic"], spec_switch_ms=400.0)
    # C=4: the decoding batch moves around spec_max_batch=3, so steps switch.
    assert tok_s(costly, 4) < 0.97 * tok_s(free, 4)
    # C=2: the batch never passes the threshold, no switch, no cost.
    assert tok_s(costly, 2) == pytest.approx(tok_s(free, 2), rel=1e-9)


@pytest.mark.parametrize("c", [5, 10, 30])
def test_the_pathological_schedule_collapses_below_both_static_profiles(c):
    thrash = tok_s("eagle3_thrash", c)
    worst_static = min(tok_s("baseline", c), tok_s("eagle3", c))
    assert thrash < 0.7 * worst_static, (c, thrash, worst_static)


def test_the_pathological_schedule_is_healthy_below_its_threshold():
    assert tok_s("eagle3_thrash", 2) == pytest.approx(tok_s("eagle3", 2), rel=1e-9)


def test_a_split_half_is_the_fit_slowed_by_the_stated_factor():
    # At one request the step is everything: the half's pure decode rate is the fit's / scale.
    assert single_stream_tok_s("baseline_half") == pytest.approx(
        single_stream_tok_s("baseline") / SPLIT_STEP_SCALE, rel=1e-9)
    assert PROFILES["eagle3_half"].max_running == SPLIT_MAX_RUNNING
    assert "assumed" in PROFILES["eagle3_half"].description


def test_dynamic_settings_are_checked():
    with pytest.raises(SimError, match="spec_dynamic must be one of"):
        resolve_profile({"profile": "eagle3_dynamic", "spec_dynamic": "sometimes"})
    with pytest.raises(SimError, match="needs a speculative profile"):
        resolve_profile({"profile": "baseline", "spec_dynamic": "threshold",
                         "spec_max_batch": 3, "spec_off_step_base_ms": 5})
    with pytest.raises(SimError, match="spec_max_batch >= 1"):
        resolve_profile({"profile": "eagle3_dynamic", "spec_max_batch": 0})
    with pytest.raises(SimError, match="step_scale"):
        resolve_profile({"profile": "baseline", "step_scale": 0})


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return float(re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M).group(1))


def test_served_dynamic_schedule_matches_its_prediction_and_counts_its_switches(start_sim):
    prompt, output, scale = 512, 128, 20.0
    srv = start_sim("--profile", "eagle3_dynamic", "--time-scale", scale)
    live = closed_loop(srv.port, 5, prompt, output, 6)
    pred = predict_level("eagle3_dynamic", 5, prompt, output, time_scale=scale).output_tok_s
    print(f"C=5: live {live:.1f} tok/s, predicted {pred:.1f} ({live / pred - 1:+.1%})")
    # The band of test_simulator's live check (a busy box runs late, never early).
    assert 0.75 * pred <= live <= 1.12 * pred
    assert metric(srv.port, "servelab_sim:spec_switches_total") > 0


def test_served_pathological_schedule_collapses(start_sim):
    prompt, output, scale = 512, 128, 20.0
    thrash = start_sim("--profile", "eagle3_thrash", "--time-scale", scale)
    base = start_sim("--profile", "baseline", "--time-scale", scale)
    live_thrash = closed_loop(thrash.port, 8, prompt, output, 3)
    live_base = closed_loop(base.port, 8, prompt, output, 3)
    print(f"C=8: thrash {live_thrash:.1f} tok/s, baseline {live_base:.1f}")
    assert live_thrash < 0.6 * live_base
