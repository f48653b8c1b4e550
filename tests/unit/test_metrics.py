"""The measurement definitions (plugins/module_utils/loadgen/metrics.py)."""
from __future__ import annotations

import math
import random

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    CANCELLED_PREFIX, ITL_BASIS_CHUNK, ITL_BASIS_TOKEN, LevelPart, NS_PER_MS, NS_PER_S,
    RequestTiming, TOKENS_CHUNKS, TOKENS_SERVER, batch_means_ci95, e2e_ns, itl_samples,
    level_row, meets_slo, percentile, reduce_requests, request_row, t975, tpot_ns, ttft_ns,
    weighted_percentile,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVEL_COLUMNS, REQUEST_FIELDS

MS = NS_PER_MS


def req(t_send, chunks, tokens=None, completion=None, worker=0, in_window=True, error=None,
        rid=0, prompt=10):
    """A request whose token-carrying chunks arrived at `chunks` (ms) with `tokens` each."""
    times = [int(t * MS) for t in chunks]
    if completion is None and tokens is not None:
        completion = sum(tokens)
    if completion is None:
        completion = len(times)
    return RequestTiming(
        worker=worker, request_id=rid, t_send=int(t_send * MS),
        t_first=times[0] if times else None, t_last=times[-1] if times else None,
        prompt_tokens=prompt, completion_tokens=completion if times else None,
        tokens_source=TOKENS_SERVER, chunks=len(times), error=error, in_window=in_window,
        chunk_times=times, chunk_tokens=tokens)


def test_percentile_is_linear_interpolation_between_ranks():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 0) == 1
    assert percentile([1, 2, 3, 4], 100) == 4
    assert percentile([10, 20], 90) == pytest.approx(19.0)
    assert percentile([], 50) is None
    assert percentile([7], 99) == 7


def test_weighted_percentile_equals_percentile_of_the_expanded_samples():
    rng = random.Random(3)
    pairs = [(rng.random(), rng.randint(1, 5)) for _i in range(300)]
    expanded = sorted(v for v, w in pairs for _i in range(w))
    for q in (0, 1, 10, 50, 90, 99, 100):
        assert weighted_percentile(pairs, q) == pytest.approx(percentile(expanded, q))


def test_request_definitions_ttft_tpot_e2e():
    r = req(100, [150, 160, 170, 200])  # 4 chunks, 1 token each
    assert ttft_ns(r) == 50 * MS
    assert e2e_ns(r) == 100 * MS
    assert tpot_ns(r) == pytest.approx(50 * MS / 3)
    # TPOT uses the server's token count, not the chunk count: 4 chunks carrying 8 tokens.
    r8 = req(100, [150, 160, 170, 200], tokens=[2, 2, 2, 2])
    assert tpot_ns(r8) == pytest.approx(50 * MS / 7)
    # One token: no TPOT.
    assert tpot_ns(req(0, [5])) is None


def test_itl_per_token_splits_a_k_token_chunk_into_k_gaps():
    # Chunks of 3 tokens every 30 ms: per token that is 10 ms, not 30.
    r = req(0, [50, 80, 110, 140], tokens=[3, 3, 3, 3])
    per_token = itl_samples(r, per_token=True)
    assert per_token == [(10 * MS, 3.0)] * 3
    per_chunk = itl_samples(r, per_token=False)
    assert per_chunk == [(30 * MS, 1.0)] * 3


def test_slo_needs_every_given_limit():
    r = req(0, [40, 50, 60])       # TTFT 40 ms, TPOT 10 ms, E2E 60 ms
    assert meets_slo(r, {"ttft_ms": 50, "tpot_ms": 10})
    assert not meets_slo(r, {"ttft_ms": 39})
    assert not meets_slo(r, {"tpot_ms": 9.9})
    assert not meets_slo(r, {"e2e_ms": 59})
    assert meets_slo(req(0, [40]), {"tpot_ms": 1})           # 1 token: no TPOT to miss
    assert not meets_slo(req(0, [40, 50], error="boom"), {})  # failed requests never count


def test_window_throughput_counts_tokens_by_arrival_inside_the_window():
    # Window [1000, 2000) ms. A request straddling the start contributes only its tokens after ws.
    straddle = req(900, [950, 990, 1010, 1030], in_window=False)
    inside = req(1100, [1150, 1200, 1250], tokens=[2, 2, 2])
    after = req(1990, [2050, 2100], in_window=True)          # sent in window, tokens after we
    part = reduce_requests([straddle, inside, after], 1000 * MS, 2000 * MS, 4, {})
    assert part.window_output_tokens == 2 + 6
    assert sum(part.batch_tokens) == part.window_output_tokens
    assert part.batch_tokens == [2 + 4, 2, 0, 0]   # 1010,1030 | 1150,1200 | 1250 ...
    assert part.window_requests == 2
    assert part.window_prompt_tokens == 10          # only `inside` got its first token in window
    row = level_row("h", "p", 2, part, {})
    assert row.output_tok_s == pytest.approx(8 / 1.0)
    assert row.total_tok_s == pytest.approx(18 / 1.0)
    assert row.request_s == pytest.approx(2.0)


def test_unknown_chunk_sizes_spread_the_server_count_and_label_itl_as_chunk():
    # 4 chunks, server says 12 tokens, no per-chunk counts: each chunk carries 3 for throughput,
    # ITL falls back to inter-chunk gaps and the level says so.
    r = req(0, [100, 130, 160, 190], tokens=None, completion=12)
    part = reduce_requests([r], 1, 10 * NS_PER_S, 2, {})
    assert part.window_output_tokens == pytest.approx(12)
    row = level_row("h", "p", 1, part, {})
    assert row.itl_basis == ITL_BASIS_CHUNK
    assert row.itl_p50_ms == pytest.approx(30.0)
    r2 = req(0, [100, 130, 160, 190], tokens=[3, 3, 3, 3])
    row2 = level_row("h", "p", 1, reduce_requests([r2], 1, 10 * NS_PER_S, 2, {}), {})
    assert row2.itl_basis == ITL_BASIS_TOKEN
    assert row2.itl_p50_ms == pytest.approx(10.0)


def test_errors_cancelled_tail_and_fallback_tokens():
    ok = req(10, [20, 30])
    failed = req(15, [], error="HTTP 500: boom")
    cancelled = req(40, [45, 50], error=CANCELLED_PREFIX + " level over (tail request)",
                    in_window=False)
    fallback = req(12, [22, 32])
    fallback.tokens_source = TOKENS_CHUNKS
    part = reduce_requests([ok, failed, cancelled, fallback], 1, 1 * NS_PER_S, 2, {})
    assert part.window_requests == 3 and part.window_errors == 1
    assert part.run_errors == 1 and part.cancelled == 1   # the cancelled tail is not an error
    assert part.run_requests == 3
    row = level_row("h", "p", 1, part, {})
    assert row.tokens_source == TOKENS_CHUNKS             # one request needed the fallback
    assert row.first_error == "HTTP 500: boom"
    # The cancelled request's tokens arrived under load: they count for throughput.
    assert part.window_output_tokens == 2 + 2 + 2


def test_goodput_counts_window_requests_meeting_all_slos():
    fast = [req(i * 100, [i * 100 + 20, i * 100 + 30], rid=i) for i in range(6)]
    slow = [req(i * 100 + 50, [i * 100 + 150, i * 100 + 160], rid=10 + i) for i in range(4)]
    slo = {"ttft_ms": 50}
    part = reduce_requests(fast + slow, 1, 2 * NS_PER_S, 2, slo)
    row = level_row("h", "p", 2, part, slo)
    assert row.goodput_request_s == pytest.approx(6 / 2.0, rel=1e-3)
    assert row.request_s == pytest.approx(10 / 2.0, rel=1e-3)
    assert level_row("h", "p", 2, part, {}).goodput_request_s is None   # no SLO, no goodput


def test_batch_means_ci_matches_the_t_interval():
    rates = [100.0, 104.0, 98.0, 102.0, 96.0]
    mean = sum(rates) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in rates) / 4)
    assert batch_means_ci95(rates) == pytest.approx(2.776 * sd / math.sqrt(5))
    assert batch_means_ci95([5.0]) is None
    assert t975(9) == 2.262 and t975(35) == 2.042 and t975(100000) == 1.96


def test_parts_merge_to_the_same_row_as_one_reduction():
    rng = random.Random(5)
    reqs = []
    for i in range(40):
        start = rng.uniform(0, 900)
        chunks = sorted(start + rng.uniform(5, 400) for _i in range(rng.randint(2, 9)))
        reqs.append(req(start, chunks, tokens=[rng.randint(1, 4) for _item in chunks], rid=i,
                        worker=i % 4, in_window=300 <= start < 700))
    ws, we = 300 * MS, 700 * MS
    whole = level_row("h", "p", 4, reduce_requests(reqs, ws, we, 5, {"ttft_ms": 100}),
                      {"ttft_ms": 100})
    merged = LevelPart()
    for k in range(3):
        merged.merge(reduce_requests(reqs[k::3], ws, we, 5, {"ttft_ms": 100}))
    merged.ws, merged.we = ws, we
    split = level_row("h", "p", 4, merged, {"ttft_ms": 100})
    assert split == whole


def test_row_and_request_fields_follow_the_results_contract():
    part = reduce_requests([req(0, [10, 20])], 1, NS_PER_S, 2, {})
    row = level_row("h", "p", 1, part, {})
    fields = list(row.__dataclass_fields__)
    assert fields[:len(LEVEL_COLUMNS)] == list(LEVEL_COLUMNS)
    record = request_row(req(0, [10, 20]))
    record.update(host="h", profile="p", concurrency=1)
    assert set(REQUEST_FIELDS) <= set(record)


def test_request_rows_say_their_phase_error_kind_and_wall_clock_send_time():
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
        ERROR_KIND_OTHER, PHASES, error_kind,
    )
    ws, we = 100 * MS, 200 * MS
    offset = 1_700_000_000 * NS_PER_S
    rows = {
        name: request_row(r, ws, we, offset) for name, r in {
            "warmup": req(50, [60], in_window=False),
            "window": req(150, [160], in_window=True),
            "tail": req(250, [260], in_window=False),
            "cancelled": req(260, [270], in_window=False, error=CANCELLED_PREFIX + " level over"),
        }.items()}
    assert {name: row["phase"] for name, row in rows.items()} == {
        "warmup": "warmup", "window": "window", "tail": "tail", "cancelled": "cancelled"}
    assert set(PHASES) == {row["phase"] for row in rows.values()}
    assert rows["window"]["t_send_unix_ns"] == 150 * MS + offset
    assert rows["window"]["error_kind"] is None and rows["cancelled"]["error_kind"] == "cancelled"
    # No window at all (a level that never warmed up): every request is warmup.
    assert request_row(req(150, [160], in_window=False))["phase"] == "warmup"
    # The kinds of the error texts llm_bench writes.
    assert [error_kind(text) for text in (
        "HTTP 503: overloaded", "connect failed: refused", "connection lost (closed by server)",
        "stalled: no data for 120 s (stall_timeout)", "timeout: level_timeout reached",
        "server error in stream: boom", "aborted by server: x", "malformed chunk: b'x'",
        "stream ended without generated tokens", "something new")] == [
        "http_status", "connect", "connection_lost", "stall", "timeout", "server_error",
        "server_abort", "protocol", "no_tokens", ERROR_KIND_OTHER]
    # The default offset is the wall clock's: a send just now is now.
    import time
    now = time.monotonic_ns()
    fresh = request_row(RequestTiming(worker=0, request_id=1, t_send=now))
    assert abs(fresh["t_send_unix_ns"] - time.time_ns()) < 5 * NS_PER_S
