"""Each request record carries its inter-token gaps (issue 28 item 6b; results/request_itl.py):
`itl` (integer microseconds of each token-carrying chunk after the first, `x<k>` for a k-token
chunk) and `itl_basis`; the report's ITL CDF is per token from them, chunk-weighted as the level's
figures, in bounded memory (report/distributions.py samples_ecdf: exact at its points)."""
from __future__ import annotations

import random

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    NS_PER_MS, RequestTiming, itl_samples, request_row,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.samples import Samples
from ansible_collections.servelab.serving.plugins.module_utils.results import request_itl
from ansible_collections.servelab.serving.plugins.plugin_utils.report import distributions


def timing(times, tokens=None):
    return RequestTiming(worker=0, request_id=1, t_send=times[0] - 7 if times else 5,
                         t_first=times[0] if times else None, t_last=times[-1] if times else None,
                         completion_tokens=sum(tokens) if tokens else len(times),
                         chunks=len(times), chunk_times=times, chunk_tokens=tokens)


def test_the_encoding():
    times = [1_000_000, 13_003_400, 25_001_600, 49_011_000]
    row = request_row(timing(times, [1, 1, 1, 2]), wall_offset_ns=0)
    # From the first chunk: 12003.4 -> 12003, 24001.6 -> 24002, 48011 us; differenced (the
    # second gap is 11999, not 11998.2 rounded alone: no drift).
    assert row["itl"] == "12003 11999 24009x2" and row["itl_basis"] == "token"
    assert request_itl.decode(row["itl"]) == [(12003, 1), (11999, 1), (24009, 2)]
    # Without per-chunk counts: one sample per chunk, no x<k>.
    row = request_row(timing(times), wall_offset_ns=0)
    assert row["itl"] == "12003 11999 24009" and row["itl_basis"] == "chunk"
    # One chunk: no gap; no chunk: nothing.
    assert request_row(timing([5_000_000], [3]), wall_offset_ns=0)["itl"] == ""
    row = request_row(timing([]), wall_offset_ns=0)
    assert row["itl"] is None and row["itl_basis"] is None


@pytest.mark.parametrize("seed", range(20))
def test_the_gaps_add_up_and_match_the_level_samples(seed):
    """Rounded from the first chunk, the gaps add up to t_last - t_first (to the us); per token
    they are the level's ITL samples (metrics.itl_samples) within a microsecond."""
    rng = random.Random(seed)
    times = [10**9]
    for _chunk in range(rng.randrange(1, 600)):
        times.append(times[-1] + rng.choice((0, 1, 499, 500, 501, rng.randrange(1, 10**8))))
    tokens = [rng.choice((1, 1, 1, 2, 3, 0)) for _time in times]
    r = timing(times, tokens)
    row = request_row(r, wall_offset_ns=0)
    gaps = request_itl.decode(row["itl"])
    assert sum(g for g, _k in gaps) == (times[-1] - times[0] + 500) // 1000
    assert [k for _g, k in gaps] == tokens[1:]
    mine = request_itl.itl_samples_ms(row["itl"], row["itl_basis"])
    level = [(v / NS_PER_MS, w) for v, w in itl_samples(r, per_token=True)]
    assert [w for _v, w in mine] == [w for _v, w in level]
    for (a, _w), (b, _w2) in zip(mine, level):
        assert abs(a - b) <= 1e-3          # 1 us
    chunk = request_row(timing(times), wall_offset_ns=0)
    assert request_itl.itl_samples_ms(chunk["itl"], chunk["itl_basis"]) == [
        (g / 1000.0, 1.0) for g, _k in request_itl.decode(chunk["itl"])]


def test_bad_text_is_refused():
    with pytest.raises(ValueError):
        request_itl.decode("12 x3")
    assert request_itl.decode(None) == [] and request_itl.decode("") == []


@pytest.mark.parametrize("seed", range(10))
def test_the_curve_is_exact_at_every_point(tmp_path, seed):
    rng = random.Random(seed)
    weighted = seed % 2 == 0
    samples = Samples("d", weighted=True, path=str(tmp_path / "s"))
    pairs = []
    for _i in range(rng.randrange(2, 3000)):
        value = rng.choice((0.0, rng.lognormvariate(2.5, 0.8), 12.0, 12.0))
        weight = float(rng.choice((1, 1, 2, 4))) if weighted else 1.0
        pairs.append((value, weight))
        samples.append(value, weight)
    x, y = distributions.samples_ecdf(samples, max_points=50)
    values = [v for v, _w in pairs]
    total = sum(w for _v, w in pairs)
    assert x == sorted(x) and len(x) <= 50 and y[-1] == pytest.approx(1.0)
    assert x[0] == min(values) and x[-1] == max(values)
    for xi, yi in zip(x, y):
        assert yi == pytest.approx(sum(w for v, w in pairs if v <= xi) / total)


def test_the_curve_of_one_value_and_of_none():
    one = Samples("d")
    one.extend([6.0] * 10)
    assert distributions.samples_ecdf(one) == ([6.0], [1.0])
    assert distributions.samples_ecdf(Samples("d")) == ([], [])


def test_the_report_reads_the_gaps_per_token(tmp_path):
    part = tmp_path / "h__p__c1.jsonl"
    lines = []
    for i, (itl, basis) in enumerate((("3000 3000 6000x2", "token"), ("3000", "token"))):
        lines.append('{"host": "h", "profile": "p", "concurrency": 1, "in_window": true, '
                     '"error": null, "ttft_ms": %d, "tpot_ms": 3.0, "itl": "%s", '
                     '"itl_basis": "%s"}' % (10 + i, itl, basis))
    part.write_text("\n".join(lines) + "\n")
    samples, warnings = distributions.read_samples([str(part)], {("h", "p", 1)}, str(tmp_path))
    level = samples[("h", "p", 1)]
    assert warnings == [] and level.ok == 2 and distributions.itl_basis(level) == "token"
    # 3 ms x 3 chunks of one token, and a 2-token chunk 6 ms after its previous: 2 x 3 ms.
    assert list(level.itl_ms.values()) == [3.0, 3.0, 3.0, 3.0]
    assert list(level.itl_ms.weights()) == [1.0, 1.0, 2.0, 1.0]
    assert (tmp_path / "0.itl").exists()            # in the directory given, not in memory
