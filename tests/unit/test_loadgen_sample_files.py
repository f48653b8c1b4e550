"""A level's latency samples on disk and their exact statistics in bounded memory
(loadgen/samples.py; issue 26 item 4, what was left): every figure is the float the lists in
memory gave - metrics.percentile over the sorted list, metrics.weighted_percentile over the
(value, weight) pairs, the sums in the same order - on many random levels, ties, weights and tiny
levels included, with the passes forced through every path (small blocks, buckets and
collections)."""
from __future__ import annotations

import math
import os
import random
from array import array

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import samples as S
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    NS_PER_MS, LevelPart, RequestTiming, level_row, percentile, reduce_requests,
    weighted_percentile,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import row_dict

QS = (0, 1, 25, 50, 90, 95, 99, 99.9, 100)


@pytest.fixture
def tiny(monkeypatch):
    """Parameters small enough that a few hundred samples take several blocks, several passes,
    refined ranges, collected ranges and batches of ranges."""
    monkeypatch.setattr(S, "BLOCK", 16)
    monkeypatch.setattr(S, "BUCKET_BITS", 2)
    monkeypatch.setattr(S, "COLLECT", 8)
    monkeypatch.setattr(S, "MAX_GROUPS", 2)


def _values(rng, typecode, n):
    pool = [rng.randrange(0, 10)] * 3          # ties

    def draw():
        if typecode == "q":
            return rng.choice([rng.randrange(-50, 50), rng.randrange(10**9, 10**12),
                               rng.choice(pool), 0])
        return rng.choice([rng.lognormvariate(16, 1), -rng.random() * 1e3, 0.0,
                           float(rng.choice(pool)), rng.randrange(1, 10**7) / 3])
    return [draw() for _i in range(n)]


def _filled(typecode, weighted, values, weights, directory, split):
    """The samples as two processes would give them (files, sealed, merged in order)."""
    parts = []
    for k, (lo, hi) in enumerate(((0, split), (split, len(values)))):
        path = None if directory is None else os.path.join(directory, "s%d" % k)
        part = S.Samples(typecode, weighted, path)
        for i in range(lo, hi):
            if i % 3:
                part.append(values[i], weights[i])
            else:
                part.extend(values[i:i + 1], weights[i:i + 1] if weighted else None)
        parts.append(part.seal())
    return parts[0].merge(parts[1])


@pytest.mark.parametrize("seed", range(40))
def test_quantiles_and_sums_are_the_in_memory_floats(tiny, tmp_path, seed):
    rng = random.Random(seed)
    for trial in range(25):
        n = rng.choice((1, 2, 3, 7, 50, 300))
        typecode = rng.choice("qd")
        weighted = typecode == "d" and rng.random() < 0.6
        values = _values(rng, typecode, n)
        weights = ([float(rng.choice((1, 1, 2, 3, 7))) for _i in values] if weighted
                   else [1.0] * n)
        directory = str(tmp_path) if trial % 4 else None       # files, or memory
        samples = _filled(typecode, weighted, values, weights, directory, rng.randrange(n + 1))
        qs = QS + (rng.random() * 100,)
        if weighted:
            pairs = list(zip(values, weights))
            expected = [weighted_percentile(pairs, q) for q in qs]
            total = sum(weights)
            mean = sum(v * w for v, w in pairs) / total
            std = math.sqrt(sum(w * (v - mean) ** 2 for v, w in pairs) / total)
            assert S.weighted_sums(samples) == (total, mean, std)
        else:
            expected = [percentile(sorted(values), q) for q in qs]
            mean = sum(values) / n
            assert S.mean(samples) == mean
            assert S.std(samples) == math.sqrt(sum((v - mean) ** 2 for v in values) / n)
        assert S.quantiles(samples, qs) == expected, (typecode, weighted, n)
        # Every rank, against the sorted (expanded) list.
        expanded = sorted(v for v, w in zip(values, weights) for _i in range(int(w)))
        assert S.select_ranks(samples, range(len(expanded))) == dict(enumerate(expanded))
        samples.remove()


def test_no_samples_and_one_sample(tmp_path):
    empty = S.Samples("d", True, str(tmp_path / "e")).seal()
    assert S.quantiles(empty, (50, 99)) == [None, None]
    assert S.weighted_sums(empty) == (0.0, None, None)
    assert S.mean(empty) is None and S.std(empty) is None
    one = S.Samples("q", False, str(tmp_path / "o"))
    one.append(12_345)
    assert S.quantiles(one, (1, 50, 99)) == [12345.0] * 3
    assert S.mean(one) == 12345.0 and S.std(one) == 0.0
    heavy = S.Samples("d", True)
    heavy.append(2.5, 4.0)          # one chunk of 4 tokens: 4 samples
    assert S.quantiles(heavy, (0, 50, 100)) == [weighted_percentile([(2.5, 4.0)], q)
                                                for q in (0, 50, 100)]


def test_all_one_value_is_resolved_without_collecting(tiny, tmp_path):
    samples = S.Samples("d", False, str(tmp_path / "t"))
    samples.extend([7.25] * 1000)
    assert S.quantiles(samples, QS) == [7.25] * len(QS)


def test_weights_kept_only_once_one_is_not_1(tmp_path, tiny):
    samples = S.Samples("d", True, str(tmp_path / "w"))
    samples.extend([1.0, 2.0] * 20)
    assert not os.path.exists(str(tmp_path / "w.w")) and samples.unit
    samples.append(3.0, 2.0)
    samples.seal()
    assert not samples.unit and os.path.getsize(str(tmp_path / "w.w")) == 8 * 41
    assert list(samples.weights()) == [1.0] * 40 + [2.0]
    assert list(samples.values()) == [1.0, 2.0] * 20 + [3.0]


def test_a_long_series_stays_in_its_file_and_in_bounded_memory(tmp_path):
    """The point of it: 200k samples written, their statistics taken, and never more than a
    block of them in memory at once (the segments are files, the buffer a block)."""
    path = str(tmp_path / "itl")
    samples = S.Samples("d", True, path)
    rng = random.Random(5)
    values = array("d", (float(rng.randrange(5_000_000, 30_000_000)) for _i in range(200_000)))
    for i in range(0, len(values), 500):
        samples.extend(values[i:i + 500])
        assert len(samples._values) < S.BLOCK
    samples.seal()
    assert os.path.getsize(path) == 8 * len(values)
    assert all(isinstance(v, str) or v is None for seg in samples.segments for v in seg[:2])
    ordered = sorted(values)
    assert S.quantiles(samples, QS) == [percentile(ordered, q) for q in QS]


def _request(rng, i, ws, we, per_token):
    t_send = rng.randrange(0, we + 10**9)
    if rng.random() < 0.1:
        return RequestTiming(worker=i % 5, request_id=i, t_send=t_send, error="connect failed")
    times = sorted(t_send + rng.randrange(1, 5 * 10**8) for _i in range(rng.randrange(1, 30)))
    toks = [rng.choice((1, 1, 1, 2, 4)) for _i in times] if per_token else None
    return RequestTiming(worker=i % 5, request_id=i, t_send=t_send, t_first=times[0],
                         t_last=times[-1], prompt_tokens=10,
                         completion_tokens=sum(toks) if toks else len(times),
                         tokens_source="server", chunks=len(times), chunk_times=times,
                         chunk_tokens=toks, t_sched=t_send - rng.randrange(0, 10**6),
                         in_window=ws <= t_send < we)


def _reference_figures(reqs, part_per_token):
    """The level's latency figures as level_row computed them from lists in memory."""
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
        e2e_ns, itl_samples, tpot_ns, ttft_ns,
    )
    ok = [r for r in reqs if r.in_window and r.ok and not r.cancelled]
    ttft = [ttft_ns(r) for r in ok]
    tpot = [tpot_ns(r) for r in ok if tpot_ns(r) is not None]
    e2e = [e2e_ns(r) for r in ok]
    pairs = [p for r in ok for p in itl_samples(r, part_per_token)]

    def ms(v):
        return None if v is None else round(v / NS_PER_MS, 5)

    out = {}
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        for q in (50, 90, 99, 95, 99.9):
            out["%s_p%s" % (name, q)] = ms(percentile(sorted(values), q))
        mean = sum(values) / len(values) if values else None
        out[name + "_mean"] = ms(mean)
        out[name + "_std"] = (ms(math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)))
                              if values else None)
    for q in (50, 90, 99, 95, 99.9):
        out["itl_p%s" % q] = ms(weighted_percentile(pairs, q))
    total = sum(w for _v, w in pairs)
    mean = sum(v * w for v, w in pairs) / total if total else None
    out["itl_mean"] = ms(mean)
    out["itl_std"] = ms(math.sqrt(sum(w * (v - mean) ** 2 for v, w in pairs) / total)
                        if total else None)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_level_rows_from_files_are_the_in_memory_figures(tiny, tmp_path, seed):
    """reduce_requests writing its samples to files, two processes merged, against the lists
    in memory: every percentile (the chosen ones too), mean and SD the same float."""
    rng = random.Random(seed)
    ws, we = 10**9, 3 * 10**9
    per_token = seed % 3 != 0
    reqs = [_request(rng, i, ws, we, per_token) for i in range(rng.choice((3, 40, 200)))]
    merged = LevelPart()
    for k in range(2):
        share = reqs[k::2]
        part = reduce_requests(iter(share), ws, we, 4, {}, per_token_itl=per_token,
                               samples_path=str(tmp_path / ("client-%d" % k)))
        merged.merge(part)
    row = row_dict(level_row("h", "p", 4, merged, {}, percentiles=[95, 99.9]))
    want = _reference_figures(reqs, per_token)
    for name in ("ttft", "tpot", "itl", "e2e"):
        assert row[name + "_p50_ms"] == want[name + "_p50"]
        assert row[name + "_p90_ms"] == want[name + "_p90"]
        assert row[name + "_p99_ms"] == want[name + "_p99"]
        assert row[name + "_p95_ms"] == want[name + "_p95"]
        assert row[name + "_p99.9_ms"] == want[name + "_p99.9"]
        assert row[name + "_mean_ms"] == want[name + "_mean"]
        assert row[name + "_std_ms"] == want[name + "_std"]
    merged.remove_files()
    assert not [n for n in os.listdir(tmp_path) if not n.endswith(".w")] or all(
        not n.startswith("client-") for n in os.listdir(tmp_path))
