"""The latencies' standard deviations and the E2E mean of a level row (loadgen/metrics.py
level_row): population std (divisor n), numpy.std's default, which vLLM's std_*_ms use."""
from __future__ import annotations

import math

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    NS_PER_MS, RequestTiming, TOKENS_SERVER, level_row, reduce_requests,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    DATE_FORMAT, FIELD, level_date,
)

MS = NS_PER_MS


def req(rid, chunks, tokens):
    """Sent at 100 ms; its chunks arrive `chunks` ms after that, carrying `tokens` each."""
    times = [int((100 + t) * MS) for t in chunks]
    return RequestTiming(
        worker=0, request_id=rid, t_send=100 * MS, t_first=times[0], t_last=times[-1],
        prompt_tokens=10, completion_tokens=sum(tokens), tokens_source=TOKENS_SERVER,
        chunks=len(times), error=None, in_window=True, chunk_times=times, chunk_tokens=tokens)


def test_std_is_the_population_std_of_the_window_latencies_worked_by_hand():
    # TTFT 10, 30, 20 ms; E2E 30, 38, 40 ms; TPOT 10, 4, 20/3 ms; per-token ITL gaps 10, 10,
    # 4, 4 and, for the 3-token chunk 20 ms after the first, three gaps of 20/3 ms.
    reqs = [req(1, [10, 20, 30], [1, 1, 1]), req(2, [30, 34, 38], [1, 1, 1]),
            req(3, [20, 40], [1, 3])]
    row = level_row("h", "p", 3, reduce_requests(reqs, 1 * MS, 1000 * MS, 1, {}), {})
    # TTFT: mean 20, squared deviations 100 + 100 + 0, over n = 3 (not n - 1 = 2).
    assert row.ttft_std_ms == pytest.approx(math.sqrt(200 / 3), abs=1e-4)
    assert row.ttft_std_ms != pytest.approx(math.sqrt(200 / 2), abs=1e-2)
    # E2E: mean 36, deviations -6, 2, 4: (36 + 4 + 16) / 3.
    assert row.e2e_mean_ms == pytest.approx(36.0)
    assert row.e2e_std_ms == pytest.approx(math.sqrt(56 / 3), abs=1e-4)
    # TPOT: (30-10)/2 = 10, (38-30)/2 = 4, (40-20)/3 = 20/3; mean 62/9.
    tpots = (10.0, 4.0, 20 / 3)
    mean = sum(tpots) / 3
    assert row.tpot_std_ms == pytest.approx(
        math.sqrt(sum((t - mean) ** 2 for t in tpots) / 3), abs=1e-4)
    # ITL: seven per-token gaps, as the ITL mean and percentiles count them.
    gaps = (10.0, 10.0, 4.0, 4.0, 20 / 3, 20 / 3, 20 / 3)
    mean = sum(gaps) / 7
    assert row.itl_mean_ms == pytest.approx(mean, abs=1e-4)
    assert row.itl_std_ms == pytest.approx(
        math.sqrt(sum((g - mean) ** 2 for g in gaps) / 7), abs=1e-4)


def test_one_sample_has_std_zero_and_none_has_no_std():
    one = level_row("h", "p", 1, reduce_requests([req(1, [10, 20], [1, 1])], 1 * MS, 1000 * MS,
                                                 1, {}), {})
    assert one.ttft_std_ms == 0.0 and one.e2e_std_ms == 0.0 and one.e2e_mean_ms == 20.0
    none = level_row("h", "p", 1, reduce_requests([], 1 * MS, 1000 * MS, 1, {}), {})
    assert none.ttft_std_ms is none.tpot_std_ms is none.itl_std_ms is none.e2e_std_ms is None
    assert none.e2e_mean_ms is None


def test_the_std_columns_say_which_std_they_are():
    for name in ("ttft_std_ms", "tpot_std_ms", "itl_std_ms", "e2e_std_ms"):
        assert "population" in FIELD[name].meaning and "ddof=0" in FIELD[name].meaning, name
        assert FIELD[name].unit == "ms"
    assert FIELD["e2e_mean_ms"].vllm == ("mean_e2el_ms",)
    assert FIELD["ttft_std_ms"].vllm == ("std_ttft_ms",)


def test_a_level_is_dated_by_its_window_start_in_vllms_format_utc():
    assert DATE_FORMAT == "%Y%m%d-%H%M%S"
    assert level_date(1_700_000_000 * 10**9) == "20231114-221320"   # 2023-11-14 22:13:20 UTC
    assert level_date(None) is None and level_date(0) is None and level_date(True) is None
    assert level_date(float("nan")) is None
