"""predict_run (simulator/runs.py): per-request predictions of a level, closed and open loop, for
the tuner. Checked against hand-computable profiles, against predict_level (the same engine,
another observer), and against the load generator's own rules (goodput is metrics.meets_slo's).
Speed figures: benchmarks/sim_predict_bench.py."""
import dataclasses
import math

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import metrics
from ansible_collections.servelab.serving.plugins.module_utils.simulator import runs
from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import (
    predict_level,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    PROFILES, SimError,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.runs import (
    PredictedRun, predict_run,
)

# Every step 10 ms, nothing else: a request of 11 tokens is a prefill step (first token) and 10
# decode steps, 110 ms; 100 ms of overhead outside the batch before it is admitted.
FLAT = dataclasses.replace(PROFILES["baseline"], name="flat", step_base_ms=10.0,
                           step_per_req_ms=0.0, moe_ms=0.0, prefill_per_token_ms=0.0,
                           request_overhead_ms=100.0, request_overhead_jitter=0.0)


def test_a_lone_request_is_hand_computable():
    run = predict_run(FLAT, concurrency=1, prompt_tokens=8, output_tokens=11, requests=5)
    assert isinstance(run, PredictedRun) and len(run.requests) == 5
    for r in run.requests:
        assert r.ttft_ms == pytest.approx(110.0)          # 100 overhead + the prefill step
        assert r.tpot_ms == pytest.approx(10.0)
        assert r.e2e_ms == pytest.approx(210.0)
    # one client: back to back, every 210 ms; the window holds exactly 5 sends, 5 gaps
    assert [r.t_send_ms for r in run.requests] == pytest.approx([210.0 * i for i in range(1, 6)])
    assert run.window_s == pytest.approx(5 * 0.210)
    assert run.request_s == pytest.approx(1 / 0.210)
    # tokens emitted in [ws, we): the 5th request's last token lands exactly on we, outside
    assert run.output_tok_s == pytest.approx((5 * 11 - 1) / (5 * 0.210))
    assert run.itl_mean_ms == pytest.approx(10.0) and run.itl_p99_ms == pytest.approx(10.0)


def test_constant_arrivals_below_capacity_serve_each_request_alone():
    run = predict_run(FLAT, rate=2.0, arrival="constant", prompt_tokens=8, output_tokens=11,
                      seconds=10)
    assert len(run.requests) == 20                        # [ws, ws + 10 s) at 2/s
    assert run.request_s == pytest.approx(2.0)
    assert all(r.e2e_ms == pytest.approx(210.0) for r in run.requests)
    assert run.output_tok_s == pytest.approx(22.0, rel=0.06)   # 11 tokens per arrival
    assert run.mean_running == pytest.approx(2.0 * 0.110, rel=0.06)  # in the batch 110 of 500 ms


def test_open_loop_queues_once_the_rate_passes_capacity():
    one_slot = dataclasses.replace(FLAT, max_running=1, request_overhead_ms=0.0)
    calm = predict_run(one_slot, rate=5.0, arrival="constant", prompt_tokens=8,
                       output_tokens=11, requests=40)
    over = predict_run(one_slot, rate=12.0, arrival="constant", prompt_tokens=8,
                       output_tokens=11, requests=40)
    # capacity: one request per 110 ms = 9.1/s. Below it no wait; above it the queue grows.
    assert calm.mean("ttft_ms") == pytest.approx(10.0) and calm.mean_queued < 0.01
    ttfts = [r.ttft_ms for r in over.requests]
    assert ttfts[-1] > ttfts[0] + 500 and over.mean_queued > 1


def test_poisson_arrivals_offer_the_rate_and_repeat_with_the_seed():
    a = predict_run("baseline", rate=1.0, seconds=200, time_scale=20)
    assert a.request_s == pytest.approx(1.0, rel=0.05)     # the loadgen's stratified blocks
    assert a == predict_run("baseline", rate=1.0, seconds=200, time_scale=20)
    b = predict_run("baseline", rate=1.0, seconds=200, time_scale=20, seed=1)
    assert [r.t_send_ms for r in a.requests] != [r.t_send_ms for r in b.requests]
    gaps = [y.t_send_ms - x.t_send_ms for x, y in zip(a.requests, a.requests[1:])]
    assert max(gaps) > 2 * min(gaps)                       # bursts, not a constant stream


@pytest.mark.parametrize("profile, c", [("baseline", 30), ("eagle3", 5), ("eagle3", 70)])
def test_closed_loop_agrees_with_predict_level(profile, c):
    run = predict_run(profile, concurrency=c, requests=400)
    level = predict_level(profile, c)
    assert run.output_tok_s == pytest.approx(level.output_tok_s, rel=0.03)
    assert run.mean("ttft_ms") == pytest.approx(level.ttft_ms, rel=0.05)
    assert run.mean("tpot_ms") == pytest.approx(level.tpot_ms, rel=0.03)
    assert run.mean_running == pytest.approx(level.mean_running, rel=0.05)


def test_time_scale_divides_every_duration():
    slow = predict_run("eagle3", concurrency=4, prompt_tokens=256, output_tokens=64, requests=50)
    fast = predict_run("eagle3", concurrency=4, prompt_tokens=256, output_tokens=64, requests=50,
                       time_scale=8)
    assert fast.output_tok_s == pytest.approx(8 * slow.output_tok_s)
    assert fast.requests[3].ttft_ms == pytest.approx(slow.requests[3].ttft_ms / 8)
    assert fast.itl_p90_ms == pytest.approx(slow.itl_p90_ms / 8)


def test_speculative_chunks_give_per_token_itl():
    run = predict_run("eagle3", concurrency=1, prompt_tokens=16, output_tokens=301, requests=3)
    # a chunk of k tokens after a step is k samples of step/k: the mean is the TPOT, the spread
    # runs from step/6 (all 5 drafts accepted) to the step itself (none)
    assert run.itl_mean_ms == pytest.approx(run.mean("tpot_ms"), rel=0.01)
    assert run.latency("itl_ms", 0) < run.itl_p50_ms < run.latency("itl_ms", 100)


def test_goodput_is_the_load_generators_rule(monkeypatch):
    calls = []

    def spy(r, slo):
        calls.append(r)
        return metrics.meets_slo(r, slo)

    monkeypatch.setattr(runs, "meets_slo", spy)
    run = predict_run("eagle3", concurrency=30, requests=100, slo={"ttft_ms": 1700})
    assert len(calls) == 100 and all(isinstance(r, metrics.RequestTiming) for r in calls)
    ttfts = sorted(r.ttft_ms for r in run.requests)
    assert ttfts[0] < 1700 < ttfts[-1]                       # the SLO splits the window
    met = sum(t <= 1700 for t in ttfts)
    assert run.goodput == pytest.approx(met / run.window_s)
    assert run.goodput_for({"ttft_ms": None}) == pytest.approx(run.request_s)
    # metrics.meets_slo: a 1-token answer has no TPOT and meets any TPOT SLO
    one = predict_run(FLAT, concurrency=2, prompt_tokens=8, output_tokens=1, requests=10,
                      slo={"tpot_ms": 0.001})
    assert one.requests[0].tpot_ms is None and one.goodput == pytest.approx(one.request_s)


def test_timeout_cuts_an_overloaded_level_as_the_loadgen_does():
    """Baseline serves ~1.5 req/s of the default workload. Unbounded, 20 req/s queues the window
    behind hours of work and every request still finishes; with timeout_s (the level_timeout)
    the run ends at it and the window requests still waiting fail, missing every SLO."""
    slo = {"e2e_ms": 1e12}
    unbounded = predict_run("baseline", rate=20.0, requests=200, slo=slo)
    cut = predict_run("baseline", rate=20.0, requests=200, slo=slo, timeout_s=600)
    assert unbounded.failed == 0 and unbounded.goodput == pytest.approx(unbounded.request_s)
    assert cut.window_complete and cut.failed == 200 and cut.goodput == 0.0
    assert all(r.e2e_ms is None and r.timing().error.startswith("timeout:") for r in cut.requests)
    # a window that would outlast half of timeout_s closes there, flagged incomplete
    half = predict_run("baseline", rate=5.0, seconds=400, slo=slo, timeout_s=600)
    assert not half.window_complete and 0 < half.failed < len(half.requests)
    assert max(r.t_send_ms for r in half.requests) < 300_000
    assert half.goodput == pytest.approx((len(half.requests) - half.failed) / half.window_s)
    assert half.mean("e2e_ms") is not None                 # over the ones that finished
    calm = predict_run("baseline", rate=0.5, requests=20, timeout_s=600)
    assert calm.window_complete and calm.failed == 0
    # the warm-up not over at half of timeout_s: no window at all (the loadgen stops the level)
    none = predict_run("eagle3", rate=20.0, requests=50, timeout_s=1, slo=slo)
    assert not none.window_complete and none.requests == () and none.goodput == 0.0
    assert none.output_tok_s == 0.0 and none.goodput_for({"ttft_ms": 1}) == 0.0


def test_percentiles_are_the_metrics_module_ones():
    run = predict_run("baseline", rate=3.0, seconds=120, time_scale=20)
    values = sorted(r.e2e_ms for r in run.requests)
    assert run.latency("e2e_ms", 90) == metrics.percentile(values, 90)
    assert run.latency("tpot_ms", 50) <= run.latency("tpot_ms", 99)


@pytest.mark.parametrize("kwargs, word", [
    ({}, "exactly one of concurrency"),
    ({"concurrency": 2, "rate": 1.0}, "exactly one of concurrency"),
    ({"concurrency": 0, "requests": 5}, "concurrency"),
    ({"concurrency": 2}, "requests"),
    ({"rate": -1, "requests": 5}, "rate"),
    ({"rate": 1, "arrival": "bursty", "requests": 5}, "arrival"),
    ({"rate": 1, "arrival": "gamma", "burstiness": 0, "requests": 5}, "burstiness"),
    ({"concurrency": 2, "requests": 5, "prompt_tokens": 0}, "prompt_tokens"),
    ({"concurrency": 2, "seconds": 0}, "seconds"),
    ({"concurrency": 2, "requests": 5, "slo": {"ttft": 5}}, "slo.ttft"),
    ({"concurrency": 2, "requests": 5, "slo": {"ttft_ms": "soon"}}, "slo.ttft_ms"),
    ({"concurrency": 2, "requests": 5, "time_scale": 0}, "time_scale"),
    ({"concurrency": 2, "requests": 5, "timeout_s": -1}, "timeout_s"),
])
def test_bad_input_names_the_argument(kwargs, word):
    with pytest.raises(SimError, match=word):
        predict_run("baseline", **kwargs)


def test_profiles_as_mappings_and_their_time_scale():
    a = predict_run({"profile": "eagle3", "time_scale": 10, "max_running": 4}, concurrency=8,
                    requests=40)
    b = predict_run(dataclasses.replace(PROFILES["eagle3"], max_running=4), concurrency=8,
                    requests=40, time_scale=10)
    assert a.time_scale == 10 and a.output_tok_s == pytest.approx(b.output_tok_s)
    assert a.mean_running <= 4 + 1e-9 and a.mean_queued > 1
    with pytest.raises(SimError, match="batched"):
        predict_run("fixed", concurrency=1, requests=3)
    assert math.isfinite(a.itl_p99_ms)
