"""Open loop (issue 28, item 8): gamma (bursty) arrivals beside Poisson and constant, and an
open-loop level that fell short of its rate says why - the in-flight cap, or a late client."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import sender
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    level_flags,
    open_loop_flag,
)


def gaps(arrival, burstiness, rate=100.0, seed=1, blocks=200):
    schedule = sender.ArrivalSchedule(rate, arrival, random.Random(seed), 0, burstiness=burstiness)
    block = sender.GAMMA_BLOCK if arrival == "gamma" else sender.POISSON_BLOCK
    for _rest_of_first_block in range(block - 1):     # its first gap set the first arrival
        schedule.gap()
    return [schedule.gap() for _draw in range(block * blocks)], block


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_burstiness_asked_for_and_hold_the_rate(burstiness):
    rate = 100.0
    drawn, block = gaps("gamma", burstiness, rate)
    # Every block lasts exactly its expected length: the offered rate is the rate asked for.
    sums = [sum(drawn[i:i + block]) * rate / block for i in range(0, len(drawn), block)]
    assert max(abs(s - 1) for s in sums) < 1e-9
    # The gaps' coefficient of variation is gamma's, 1/sqrt(shape): 2 (bursty), 1, 0.5.
    cv = statistics.pstdev(drawn) / statistics.fmean(drawn)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)


def test_gamma_is_burstier_than_poisson_below_one_and_reproducible_by_seed():
    bursty, _rate = gaps("gamma", 0.25)
    poisson, _rate = gaps("poisson", 1.0)
    # More arrivals packed close together (a gap under a tenth of the mean).
    short = 0.1 / 100.0
    assert (sum(g < short for g in bursty) / len(bursty)
            > 3 * sum(g < short for g in poisson) / len(poisson))
    assert gaps("gamma", 0.25, seed=7)[0][:50] == gaps("gamma", 0.25, seed=7)[0][:50]


@pytest.mark.parametrize("arrival, burstiness, words", [
    ("gamma", 0.0, "burstiness: 0 is outside 0.05..100"),
    ("gamma", 500.0, "burstiness: 500 is outside"),
    ("gamma", float("nan"), "is not a number"),
    ("poisson", 0.5, "burstiness: 0.5 only shapes gamma arrivals; set arrival: gamma"),
])
def test_a_burstiness_that_cannot_be_used_is_refused_naming_it(arrival, burstiness, words):
    assert words in sender.check_burstiness(arrival, burstiness)
    with pytest.raises(ValueError, match="burstiness"):
        sender.ArrivalSchedule(10.0, arrival, random.Random(1), 0, burstiness=burstiness)
    assert sender.check_burstiness("gamma", 0.5) is None
    assert sender.check_burstiness("constant", 1.0) is None


# The level: 6 req/s asked, the cap of 8 in flight, 1.7 s per request: 4.70 achieved.
CAPPED = {"load_mode": "rate", "request_rate": 6.0, "arrival_rate_s": 4.70, "concurrency": 8,
          "e2e_p50_ms": 1700.0, "send_lateness_p99_ms": 1229.77, "output_tok_s": 100.0,
          "requests": 94, "errors": 0}


def test_the_in_flight_cap_is_named_as_the_limit():
    text = open_loop_flag(CAPPED)
    assert text.startswith("in-flight cap: 4.70 of 6 req/s achieved with the cap of 8 in flight")
    assert "allows about 4.71 req/s" in text and "raise the cap" in text
    assert text in level_flags(CAPPED)


def test_a_late_client_is_told_from_the_cap():
    fast = dict(CAPPED, e2e_p50_ms=200.0)           # 8 in flight allow 40 req/s: not the cap
    text = open_loop_flag(fast)
    assert text.startswith("open loop behind: 4.70 of 6 req/s achieved, not for the in-flight cap")
    assert "send lateness p99 1230 ms" in text and "client CPU" in text


# The device's level (tests/gpu/tune, H100, 2026-12-06): 2 req/s asked, 20 requests in a 10.8 s
# window, every arrival sent on time, the cap of 1024 far from binding.
ON_TIME = {"load_mode": "rate", "request_rate": 2.0, "arrival_rate_s": 1.8436, "concurrency": 1024,
           "e2e_p50_ms": 5838.0, "send_lateness_p99_ms": 0.12, "output_tok_s": 117.4,
           "requests": 20, "errors": 0, "window_s": 10.85}


def test_a_window_that_sent_what_its_schedule_drew_is_not_flagged():
    """1.84 of 2 req/s is the draw of 20 Poisson arrivals and the window's edges, not a client
    that sent late: the window held every arrival due in it."""
    assert open_loop_flag(dict(ON_TIME, scheduled_requests=20)) == ""
    assert open_loop_flag(dict(ON_TIME, scheduled_requests=21)) == ""   # one at the edge
    assert not any("behind" in f or "late" in f
                   for f in level_flags(dict(ON_TIME, scheduled_requests=20)))


def test_a_shortfall_sent_on_time_says_it_is_the_draw_not_the_client():
    """An older row (no scheduled_requests): the lateness alone says the sends were on time."""
    text = open_loop_flag(ON_TIME)
    assert text == ("open loop: 1.84 of 2 req/s in this window: the arrivals drawn for it, sent "
                    "on time (send lateness p99 0.12 ms)")
    assert "sent late" not in text and "client CPU" not in text


def test_the_client_is_blamed_only_when_its_lateness_says_so():
    late = dict(ON_TIME, send_lateness_p99_ms=35.0, scheduled_requests=24)
    text = open_loop_flag(late)
    assert text.startswith("open loop behind: 1.84 of 2 req/s achieved; 24 arrivals were due in "
                           "the window and 20 requests were sent in it, not for the in-flight cap")
    assert "the client sent late (send lateness p99 35 ms); check client CPU" in text
    # fewer sent than drawn, yet on time: neither the cap nor the client is blamed
    text = open_loop_flag(dict(ON_TIME, scheduled_requests=24))
    assert "neither for the in-flight cap" in text and "nor a late client" in text
    assert "sent late" not in text.replace("nor a late client", "")
    # no lateness measured: said so, nobody blamed
    text = open_loop_flag({k: v for k, v in ON_TIME.items() if k != "send_lateness_p99_ms"})
    assert "no send lateness was measured" in text and "): the client sent late" not in text


def test_a_late_client_is_blamed_even_where_the_counts_agree():
    """scheduled_requests counts sent arrivals only: an arrival a late client never sent is in
    neither count, so equal counts must not hide a send lateness that says the client was late."""
    text = open_loop_flag(dict(ON_TIME, send_lateness_p99_ms=35.0, scheduled_requests=20))
    assert "the client sent late (send lateness p99 35 ms)" in text, text


def test_the_window_counts_the_arrivals_its_schedule_drew():
    """reduce_requests: an arrival due in the window counts as drawn for it even when it was
    sent after the window closed (late); one due before the window does not."""
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
        RequestTiming, reduce_requests,
    )
    ms = 1_000_000
    ws, we = 1000 * ms, 2000 * ms

    def req(i, sched, send):
        return RequestTiming(worker=0, request_id=i, t_send=send, t_first=send + 5 * ms,
                             t_last=send + 9 * ms, completion_tokens=2, chunks=2,
                             chunk_times=[send + 5 * ms, send + 9 * ms], chunk_tokens=[1, 1],
                             in_window=ws <= send < we, t_sched=sched)
    records = [req(0, 990 * ms, 995 * ms),              # before the window
               req(1, 1100 * ms, 1100 * ms), req(2, 1500 * ms, 1500 * ms),
               req(3, 1990 * ms, 2030 * ms)]            # due in it, sent 40 ms late: after it
    part = reduce_requests(records, ws, we, 2, {})
    assert (part.window_scheduled, part.window_requests) == (3, 2)


def test_a_level_that_kept_its_rate_or_a_closed_loop_one_says_nothing():
    assert open_loop_flag(dict(CAPPED, arrival_rate_s=5.9)) == ""
    assert open_loop_flag(dict(CAPPED, load_mode="concurrency")) == ""


def test_a_sweep_held_back_by_its_cap_warns_with_the_cause(tmp_path):
    """20 req/s asked of a server that takes ~0.2 s per request, with 1 in flight: ~5 req/s."""
    import os

    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
        level_configs,
        run_levels,
    )
    from simproc import ServerProcess

    fake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_loadgen_fakeserver.py")
    with ServerProcess("--ttft-ms", "200", "--step-ms", "1", script=fake,
                       truth_log=tmp_path / "truth.jsonl") as srv:
        configs, workload = level_configs(dict(
            base_url=srv.url + "/v1", model="m", concurrency=[1], load_mode="rate",
            request_rate=[20.0], workload={"kind": "builtin"}, max_tokens=2, level_seconds=1.0,
            level_timeout=30, min_latency_samples=0, min_window_requests=2, drain_timeout=0,
            server_metrics=False))
        outcome = run_levels(configs, workload)
    row = outcome.levels[0]
    # Sent in the window: arrivals from the backlog, due before it. (scheduled_requests, the
    # arrivals due in the window that were sent, may be 0 here: under the cap every send of the
    # window was an older arrival, and the window's own were still queued when the level ended.)
    assert row["requests"] > 0 and row["scheduled_requests"] is not None, row
    cause = [w for w in outcome.warnings if w.startswith("rate=20/s: in-flight cap: ")]
    assert cause and "with the cap of 1 in flight" in cause[0], outcome.warnings
    # The level's lateness note names the cap too, not the sender's priority (issue 28).
    late = [w for w in outcome.warnings if "send lateness p99" in w]
    assert late and "queued behind the in-flight cap of 1" in late[0], outcome.warnings
    assert not any("sender priority" in w or "sender at real-time" in w
                   for w in outcome.warnings), outcome.warnings


@pytest.mark.parametrize("arrival, burstiness, words", [
    ("gamma", 0.0, "burstiness: 0 is outside 0.05..100"),
    ("poisson", 2.0, "burstiness: 2 only shapes gamma arrivals; set arrival: gamma"),
])
def test_level_config_refuses_a_burstiness_it_cannot_use(arrival, burstiness, words):
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
        BenchOptionsError, level_configs,
    )
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import (
        LevelConfig, LoadgenError,
    )
    cfg = LevelConfig(base_url="http://127.0.0.1:1", model="m", load_mode="rate",
                      request_rate=5.0, arrival=arrival, burstiness=burstiness)
    with pytest.raises(LoadgenError, match=words):
        cfg.validate()
    with pytest.raises(BenchOptionsError, match=words):      # the llm_bench option, by name
        level_configs(dict(base_url="http://127.0.0.1:1", model="m", concurrency=[4],
                           load_mode="rate", request_rate=[5.0], arrival=arrival,
                           burstiness=burstiness), read_workload=False)
    LevelConfig(base_url="http://127.0.0.1:1", model="m", load_mode="rate", request_rate=5.0,
                arrival="gamma", burstiness=0.5).validate()


def test_a_real_open_loop_level_sends_gamma_gaps_of_the_burstiness_asked_for(tmp_path):
    """One client process at 200 req/s, gamma shape 4: the scheduled gaps' CV is 1/sqrt(4)."""
    import os

    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
        level_configs,
        run_levels,
    )
    from simproc import ServerProcess

    fake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_loadgen_fakeserver.py")
    with ServerProcess("--ttft-ms", "1", "--step-ms", "1", script=fake,
                       truth_log=tmp_path / "truth.jsonl") as srv:
        configs, workload = level_configs(dict(
            base_url=srv.url + "/v1", model="m", concurrency=[64], load_mode="rate",
            request_rate=[200.0], arrival="gamma", burstiness=4.0, processes=1,
            workload={"kind": "builtin"}, max_tokens=2, level_seconds=2.0, level_timeout=30,
            min_latency_samples=0, drain_timeout=0, server_metrics=False))
        outcome = run_levels(configs, workload)
    sent = [r for r in outcome.requests if r["t_send"]]
    assert len(sent) >= 300, len(sent)
    # t_send - queue_ms is the time the schedule gave: the gaps as drawn, not the send jitter.
    scheduled = sorted(r["t_send"] - r["queue_ms"] * 1e6 for r in sent)
    drawn = [b - a for a, b in zip(scheduled, scheduled[1:])]
    cv = statistics.pstdev(drawn) / statistics.fmean(drawn)
    assert cv == pytest.approx(1 / math.sqrt(4.0), rel=0.15), cv
    assert statistics.fmean(drawn) == pytest.approx(1 / 200.0 * 1e9, rel=0.1)


def _row(**values):
    from dataclasses import MISSING, fields

    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import LevelRow
    row = LevelRow(**{f.name: None for f in fields(LevelRow)
                      if f.default is MISSING and f.default_factory is MISSING})
    for name, value in values.items():
        setattr(row, name, value)
    return row


def test_the_lateness_note_says_the_cap_where_the_cap_was_the_limit_else_the_sender():
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.honesty import (
        lateness_warning,
    )
    capped = lateness_warning(_row(**CAPPED), ["nice -10"])
    assert capped == ("C=8: send lateness p99 1229.77 ms (arrivals queued behind the in-flight "
                      "cap of 8, not sent late by the client)")
    fast = dict(CAPPED)
    fast["e2e_p50_ms"] = 200.0          # 8 in flight allow 40 req/s: the sender was late
    late = lateness_warning(_row(**fast), ["nice -10"])
    assert "arrival sender priority: nice -10" in late and "in-flight cap" not in late
    on_time = dict(CAPPED)
    on_time["send_lateness_p99_ms"] = 0.5
    assert lateness_warning(_row(**on_time), ["nice -10"]) is None
