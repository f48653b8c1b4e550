"""Enough samples, and open-loop arrivals on time, against the stdlib fake server: the window
stays open until min_latency_samples requests were sent in it (bounded by level_timeout, and says
so when it got fewer); an open-loop level reports its achieved arrival rate and how late each
window request was sent after its scheduled arrival."""
from __future__ import annotations

import os

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import percentile
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load
from simproc import ServerProcess

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_loadgen_fakeserver.py")
WORKLOAD = load({"kind": "builtin"})


def cfg(url, **kw):
    base = dict(base_url=url, model="m", concurrency=1, max_tokens=8, level_seconds=0.2,
                level_timeout=30, server_metrics=False, warmup_requests=1)
    base.update(kw)
    return LevelConfig(**base)


def test_the_window_stays_open_until_it_has_the_latency_samples():
    # ~50 ms per request at C=1: a 0.2 s window alone would hold ~4 of them.
    with ServerProcess("--ttft-ms", "15", "--step-ms", "4", script=FAKE) as srv:
        short = run_level(cfg(srv.url, min_latency_samples=0), WORKLOAD)
        enough = run_level(cfg(srv.url), WORKLOAD)
    assert short.row.latency_samples < 10
    assert enough.row.min_latency_samples == 30
    assert enough.row.latency_samples >= 30 and enough.row.window_complete
    assert enough.row.window_s > short.row.window_s
    assert not any("min_latency_samples" in w for w in enough.warnings)


def test_a_level_bounded_by_its_timeout_says_it_has_fewer_samples():
    # ~0.25 s per request and a 3 s bound: the window closes at 1.5 s with ~5 requests.
    with ServerProcess("--ttft-ms", "50", "--step-ms", "25", script=FAKE) as srv:
        res = run_level(cfg(srv.url, level_timeout=3.0), WORKLOAD)
    assert res.row.latency_samples < res.row.min_latency_samples == 30
    assert not res.row.window_complete
    assert any("fewer than min_latency_samples (30)" in w for w in res.warnings)


def test_open_loop_reports_achieved_rate_and_send_lateness():
    with ServerProcess("--ttft-ms", "10", "--step-ms", "2", script=FAKE) as srv:
        rate_res = run_level(cfg(srv.url, load_mode="rate", request_rate=40.0, concurrency=16,
                                 level_seconds=1.5, min_latency_samples=0), WORKLOAD)
        closed = run_level(cfg(srv.url, min_latency_samples=0), WORKLOAD).row
    rate = rate_res.row
    # Sent by the sender process (sender.py), at whatever priority it was allowed; every request
    # was sent at or after its scheduled arrival, and answered on the handed-over socket.
    assert rate_res.sender_priority in ("realtime", "nice", "normal")
    window = [r for r in rate_res.requests if r["in_window"]]
    assert window and all(r["queue_ms"] >= 0 and r["error"] is None for r in window)
    assert rate.arrival_rate_s is not None and 20 < rate.arrival_rate_s < 60
    assert rate.arrival_rate_s == round(rate.requests / rate.window_s, 4)
    # The row's lateness is the window requests' own (t_send - t_sched), whatever the machine's
    # load made it: a wall-clock bound here would only measure the CI machine (it read 161 ms
    # at p99 under the no-reap tier's three workers on two cores).
    late = sorted(r["queue_ms"] * 1e6 for r in window)
    assert rate.send_lateness_p50_ms == pytest.approx(percentile(late, 50) / 1e6, abs=1e-3)
    assert rate.send_lateness_p99_ms == pytest.approx(percentile(late, 99) / 1e6, abs=1e-3)
    assert 0 <= rate.send_lateness_p50_ms <= rate.send_lateness_p99_ms
    assert closed.arrival_rate_s is None and closed.send_lateness_p99_ms is None


def test_poisson_gaps_are_exponential_and_hold_the_rate_block_by_block():
    import math
    import random

    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import sender
    rate, block = 200.0, sender.POISSON_BLOCK
    schedule = sender.ArrivalSchedule(rate, "poisson", random.Random(1), 0)
    for _rest_of_first_block in range(block - 1):   # its first gap set the first arrival
        schedule.gap()
    gaps = [schedule.gap() for _draw in range(block * 1000)]
    # Each block lasts exactly its expected length (i.i.d. draws: +-25% for 16 gaps).
    sums = [sum(gaps[i:i + block]) * rate / block for i in range(0, len(gaps), block)]
    assert max(abs(s - 1) for s in sums) < 1e-9
    # ... while the gaps themselves are exponential: P(gap > t) = exp(-rate t).
    for t in (0.5 / rate, 1 / rate, 2 / rate):
        share = sum(1 for g in gaps if g > t) / len(gaps)
        assert share == pytest.approx(math.exp(-rate * t), abs=0.01)
    # ... and not a fixed pattern: consecutive blocks are ordered differently.
    assert gaps[:block] != gaps[block:2 * block]
