"""A level's latency samples, kept on disk, and their exact statistics in bounded memory. Stdlib only.

The level's figures (metrics.level_row) are exact: percentiles are order statistics of every
sample (linear interpolation between the two closest ranks, numpy's default), means and standard
deviations are sums over every sample. Holding the samples in memory made the end of a long level
grow with its length: 16 bytes per window token for ITL alone (benchmarks/results/
soak-2026-12-03-streamed.md). So a series of samples (`Samples`) is written to a file as the
records are reduced, in the order they come, and its statistics are taken in passes over that file:

- sums (mean, standard deviation): one pass each, every sample added in the order written, by one
  `sum()` over the whole stream, so the result is the same float, to the bit, as the sum over the
  list in memory was (the order of a merge is kept: process 0's samples, then process 1's);
- order statistics (`select_ranks`): the values at given ranks, found exactly. Samples are mapped
  to integer keys in the same order (an int is its own key; a float's key is its IEEE-754 bits,
  made monotonic for negative values). A pass counts the samples of a key range in 2^12 buckets
  (`collections.Counter` over C-level `map`/`filter`, no Python loop per sample when every weight
  is 1); the bucket that holds a wanted rank becomes the next pass's range. A range with few
  samples is collected and sorted in the next pass; a range whose samples are all one key is
  resolved at once. Each pass narrows a range 4096-fold, so the 64-bit keys need at most 6 passes
  and most levels take 3. Memory: one block of samples, at most MAX_GROUPS histograms of
  BUCKET_BITS buckets and MAX_GROUPS x COLLECT collected keys - none of it grows with the level.

Weighted samples (per-token ITL: a chunk of k tokens is k samples of gap/k, metrics.itl_samples)
count `int(round(weight))` times towards a rank, as metrics.weighted_percentile counts them.
Without a directory (tests, small callers) a series stays in memory; the statistics are the same.
"""
from __future__ import annotations

import math
import os
from array import array
from collections import Counter
from functools import partial
from itertools import chain, repeat
from operator import gt, le, mul, rshift, sub
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

BLOCK = 1 << 13          # samples buffered before a write; samples per block read back
BUCKET_BITS = 12         # a histogram pass narrows a key range 2^12-fold
MAX_GROUPS = 8           # key ranges refined in one pass (more wait for the next pass)
COLLECT = 1 << 12        # a range with at most this many samples is collected and sorted

_SIGN = 1 << 63
_MASK = _SIGN - 1

# One stored run of samples: a file (values path, weights path or None when every weight is 1,
# count) or memory (values array, weights array or None).
Segment = Tuple[object, object, int]


class Samples:
    """An append-only series of samples, in memory or (with `path`) written to `path` in blocks.

    typecode "q": int64 values (nanoseconds; their sums are exact integers), "d": floats.
    `weighted`: each sample has a weight (a float, as metrics.itl_samples gives them); weights
    are stored only once one other than 1 came (before it, every weight was 1)."""

    def __init__(self, typecode: str = "q", weighted: bool = False,
                 path: Optional[str] = None) -> None:
        self.typecode = typecode
        self.weighted = weighted
        self.path = path
        self.segments: List[Segment] = []
        self.count = 0
        self.unit = True            # every weight so far is 1
        self.vmin = None            # smallest and largest value (the first pass's key range)
        self.vmax = None
        self._values = array(typecode)
        self._weights: Optional[array] = None   # the buffer's weights, once one was not 1
        self._written = 0           # samples already in this series' own file
        self._wpath: Optional[str] = None       # its weights file, once one was not 1

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def __eq__(self, other) -> bool:
        """The same samples (values and weights) in the same order, wherever they are kept."""
        if not isinstance(other, Samples):
            return NotImplemented
        return (self.typecode == other.typecode and self.weighted == other.weighted
                and self.count == other.count
                and all(a == b for a, b in zip(self.values(), other.values()))
                and all(a == b for a, b in zip(self.weights(), other.weights())))

    __hash__ = None     # mutable

    def __repr__(self) -> str:
        return "Samples(%r, weighted=%r, count=%d)" % (self.typecode, self.weighted, self.count)

    # --- writing

    def append(self, value, weight: float = 1.0) -> None:
        self._values.append(value)
        if self.weighted and (self._weights is not None or weight != 1.0):
            self._start_weights(len(self._values) - 1)
            self._weights.append(weight)
        self.count += 1
        if len(self._values) >= BLOCK:
            self._flush()

    def extend(self, values: Sequence, weights: Optional[Sequence[float]] = None) -> None:
        """Append `values` (with their `weights` in a weighted series; None: every weight 1).
        `weights`: a list, tuple or array (its count() is the check for a weight other than 1,
        in C: a firehose level's end extends a series by its 2000 gaps per request)."""
        if not values:
            return
        before = len(self._values)
        self._values.extend(values)
        if self.weighted and (self._weights is not None or (
                weights is not None and weights.count(1.0) != len(weights))):
            self._start_weights(before)
            self._weights.extend(weights if weights is not None else repeat(1.0, len(values)))
        self.count += len(values)
        if len(self._values) >= BLOCK:
            self._flush()

    def _start_weights(self, before: int) -> None:
        """From now on weights are kept: 1 for the `before` samples buffered until now (and a
        weights file of ones for those this series already wrote)."""
        self.unit = False
        if self._weights is not None:
            return
        self._weights = array("d", repeat(1.0, before))
        if self.path is not None and self._wpath is None:
            self._wpath = self.path + ".w"
            with open(self._wpath, "wb") as fh:
                left = self._written
                while left:
                    n = min(left, BLOCK)
                    array("d", repeat(1.0, n)).tofile(fh)
                    left -= n

    def _flush(self) -> None:
        values = self._values
        if not values:
            return
        low, high = min(values), max(values)
        self.vmin = low if self.vmin is None else min(self.vmin, low)
        self.vmax = high if self.vmax is None else max(self.vmax, high)
        if self.path is None:
            self.segments.append((values, self._weights, len(values)))
            self._weights = None            # each memory segment has its own weights (or none)
        else:
            with open(self.path, "ab") as fh:
                values.tofile(fh)
            if self._weights is not None:
                with open(self._wpath, "ab") as fh:
                    self._weights.tofile(fh)
                self._weights = array("d")  # the file has weights: every later sample too
            self._written += len(values)
        self._values = array(self.typecode)

    def seal(self) -> Samples:
        """Write what is buffered. A file-backed series becomes one file segment and takes no
        more samples into it: it can be pickled (to the level's controller) and merged."""
        self._flush()
        if self.path is not None:
            if self._written:
                self.segments.append((self.path, self._wpath, self._written))
            self.path = None
            self._written = 0
            self._wpath = None
            self._weights = None
        return self

    def merge(self, other: Samples) -> Samples:
        """Append `other`'s samples after this series' (the order of the merged lists)."""
        self.seal()
        other.seal()
        self.segments.extend(other.segments)
        self.count += other.count
        self.unit = self.unit and other.unit
        for value in (other.vmin, other.vmax):
            if value is not None:
                self.vmin = value if self.vmin is None else min(self.vmin, value)
                self.vmax = value if self.vmax is None else max(self.vmax, value)
        return self

    def remove(self) -> None:
        """Delete this series' files (a level's files are in its spool directory anyway)."""
        for values, weights, _n in self.segments:
            for path in (values, weights):
                if isinstance(path, str):
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass

    # --- reading

    def blocks(self) -> Iterator[Tuple[array, Optional[array]]]:
        """(values, weights or None) blocks of at most BLOCK samples, in the order appended."""
        self.seal()
        for values, weights, count in self.segments:
            if not isinstance(values, str):
                yield values, weights
                continue
            with open(values, "rb") as vfh:
                wfh = open(weights, "rb") if weights else None
                try:
                    left = count
                    while left:
                        n = min(left, BLOCK)
                        block = array(self.typecode)
                        block.fromfile(vfh, n)
                        wblock = None
                        if wfh is not None:
                            wblock = array("d")
                            wblock.fromfile(wfh, n)
                        left -= n
                        yield block, wblock
                finally:
                    if wfh is not None:
                        wfh.close()

    def values(self) -> Iterator:
        return chain.from_iterable(values for values, _weights in self.blocks())

    def weights(self) -> Iterator[float]:
        """Every sample's weight (1.0 where none was kept), in order."""
        for values, weights in self.blocks():
            if weights is None:
                yield from repeat(1.0, len(values))
            else:
                yield from weights


# --------------------------------------------------------------------------------------------
# Sums, as the lists in memory were summed


def mean(samples: Samples) -> Optional[float]:
    """sum(values) / n."""
    if not samples:
        return None
    return sum(samples.values()) / samples.count


def std(samples: Samples) -> Optional[float]:
    """Population standard deviation (divisor n): mean first, then the squares, as two sums."""
    if not samples:
        return None
    m = sum(samples.values()) / samples.count
    return math.sqrt(sum((v - m) ** 2 for v in samples.values()) / samples.count)


def weighted_sums(samples: Samples) -> Tuple[float, Optional[float], Optional[float]]:
    """(total weight, weighted mean, weighted population standard deviation) of a weighted series:
    sum(w), sum(v * w) / sum(w), sqrt(sum(w * (v - mean) ** 2) / sum(w)) - each sum over every
    sample in order. Where every weight is 1 the products are the values themselves (x * 1.0 is
    x), so the unweighted sums give the same floats."""
    if not samples:
        return 0.0, None, None
    if samples.unit:
        total = sum(repeat(1.0, samples.count))
        m = sum(samples.values()) / total
        var = sum((v - m) ** 2 for v in samples.values()) / total
    else:
        total = sum(samples.weights())
        if not total:
            return total, None, None
        m = sum(map(mul, samples.values(), samples.weights())) / total
        var = sum(w * (v - m) ** 2 for v, w in zip(samples.values(), samples.weights())) / total
    return total, m, math.sqrt(var)


# --------------------------------------------------------------------------------------------
# Order statistics


def _float_keys(block: array) -> array:
    """Keys of floats, in their order: the IEEE-754 bits as int64 (ascending for values >= 0);
    a negative value's bits are mapped below every positive key, reversed."""
    keys = array("q", block.tobytes())
    if keys and min(keys) < 0:
        keys = array("q", [k if k >= 0 else -(k & _MASK) - 1 for k in keys])
    return keys


def _key(value, typecode: str) -> int:
    return int(value) if typecode == "q" else _float_keys(array("d", [value]))[0]


def key_value(key: int, typecode: str):
    """The value a key stands for (the inverse of the key mapping)."""
    if typecode == "q":
        return key
    bits = key if key >= 0 else ((-key - 1) | _SIGN) - (1 << 64)
    return array("d", array("q", [bits]).tobytes())[0]


class _Group:
    """A key range [lo, hi) holding wanted ranks. `below`: the weight of the samples under lo;
    `count`: how many samples it holds. A pass fills its histogram (bucket -> samples, and
    bucket -> weight where weights are kept) or, for a small range, collects its keys."""
    __slots__ = ("lo", "hi", "below", "ranks", "count", "hist", "weights", "items",
                 "item_weights", "kmin", "kmax", "shift")

    def __init__(self, lo: int, hi: int, below: int, ranks: List[int], count: int) -> None:
        self.lo, self.hi, self.below, self.ranks, self.count = lo, hi, below, ranks, count
        self.hist: Counter = Counter()
        self.weights: Counter = Counter()
        self.items: Optional[array] = array("q") if count <= COLLECT else None
        self.item_weights: Optional[array] = None     # the items' weights, once one is not 1
        self.kmin = self.kmax = None
        self.shift = max(0, (hi - lo - 1).bit_length() - BUCKET_BITS)


def _pass(samples: Samples, groups: List[_Group], whole: bool) -> None:
    """One pass over the samples: each group's histogram (or its collected keys), and its
    smallest and largest key. `whole`: the one group spans every sample (nothing to filter)."""
    float_keys = samples.typecode == "d"
    unit = samples.unit
    for values, weights in samples.blocks():
        keys = _float_keys(values) if float_keys else values
        if weights is None:
            for group in groups:
                sel = keys if whole else list(filter(partial(gt, group.hi),
                                                     filter(partial(le, group.lo), keys)))
                if not sel:
                    continue
                low, high = min(sel), max(sel)
                group.kmin = low if group.kmin is None else min(group.kmin, low)
                group.kmax = high if group.kmax is None else max(group.kmax, high)
                if group.items is not None:
                    if group.item_weights is not None:
                        group.item_weights.extend(repeat(1, len(sel)))
                    group.items.extend(sel)
                    continue
                counts = Counter(map(rshift, map(sub, sel, repeat(group.lo)), repeat(group.shift)))
                group.hist.update(counts)
                if not unit:
                    group.weights.update(counts)
            continue
        # Weights other than 1 (speculative decoding's multi-token chunks): a loop per sample.
        for key, weight in zip(keys, weights):
            w = int(round(weight))
            for group in groups:
                if group.lo <= key < group.hi:
                    if group.kmin is None or key < group.kmin:
                        group.kmin = key
                    if group.kmax is None or key > group.kmax:
                        group.kmax = key
                    if group.items is not None:
                        if group.item_weights is None:
                            group.item_weights = array("q", repeat(1, len(group.items)))
                        group.items.append(key)
                        group.item_weights.append(w)
                    else:
                        bucket = (key - group.lo) >> group.shift
                        group.hist[bucket] += 1
                        group.weights[bucket] += w
                    break


def _walk(group: _Group, found: Dict[int, int], out: List[_Group]) -> None:
    """After a pass: each rank of `group` is resolved (its keys collected, or all one key) or
    handed on to the child range of the bucket that holds it."""
    ranks = sorted(group.ranks)
    i = 0
    if group.kmin is not None and group.kmin == group.kmax:
        for rank in ranks:          # every sample of the range is one key
            found[rank] = group.kmin
        return
    if group.items is not None:
        acc = group.below
        items = (sorted(zip(group.items, group.item_weights)) if group.item_weights is not None
                 else zip(sorted(group.items), repeat(1)))
        for key, weight in items:
            acc += weight
            while i < len(ranks) and ranks[i] < acc:
                found[ranks[i]] = key
                i += 1
    else:
        acc = group.below
        weights = group.weights if group.weights else group.hist
        for bucket in sorted(group.hist):
            weight = weights[bucket]
            child = None
            while i < len(ranks) and ranks[i] < acc + weight:
                if child is None:
                    lo = max(group.kmin, group.lo + (bucket << group.shift))
                    hi = min(group.kmax + 1, group.lo + ((bucket + 1) << group.shift))
                    child = _Group(lo, hi, acc, [], group.hist[bucket])
                    out.append(child)
                child.ranks.append(ranks[i])
                i += 1
            acc += weight
    for rank in ranks[i:]:
        # Weights whose rounded parts do not add up to the rounded total (not integers): the
        # largest key, as metrics.weighted_percentile falls back to its largest value.
        found[rank] = group.kmax


def select_ranks(samples: Samples, ranks: Sequence[int]) -> Dict[int, object]:
    """{rank: value} of the samples sorted ascending, each counted int(round(weight)) times
    (rank 0 is the smallest), for every rank in `ranks`; exact, in bounded memory (passes over
    the samples)."""
    wanted = sorted(set(int(r) for r in ranks))
    if not wanted or not samples:
        return {}
    samples.seal()
    tc = samples.typecode
    # -0.0 and 0.0 compare equal (either may be the min or max) but have keys -1 and 0.
    lo, hi = _key(samples.vmin, tc) - 1, _key(samples.vmax, tc) + 2
    found: Dict[int, int] = {}
    groups = [_Group(lo, hi, 0, wanted, samples.count)]
    first = True
    while groups:
        for group in [g for g in groups if g.hi - g.lo == 1]:     # one key: nothing to read
            for rank in group.ranks:
                found[rank] = group.lo
        groups = [g for g in groups if g.hi - g.lo > 1]
        if not groups:
            break
        batch, groups = groups[:MAX_GROUPS], groups[MAX_GROUPS:]
        _pass(samples, batch, whole=first)
        first = False
        for group in batch:
            _walk(group, found, groups)
    return {rank: key_value(key, tc) for rank, key in found.items()}


def quantiles(samples: Samples, qs: Sequence[float]) -> List[Optional[float]]:
    """Percentile q (0-100) of the samples, for each q: linear interpolation between the two
    closest ranks (numpy's default), a weighted sample counted int(round(weight)) times - the
    floats metrics.percentile gives over the sorted list, and metrics.weighted_percentile over
    (value, weight) pairs. None for no samples."""
    if not samples:
        return [None] * len(qs)
    if samples.unit:
        total = samples.count
        if total == 1:
            only = float(next(iter(samples.values())))
            return [only] * len(qs)
    else:
        total = int(round(sum(samples.weights())))
        if total <= 0:
            return [None] * len(qs)
    plan = []
    for q in qs:
        pos = (total - 1) * q / 100.0
        lo = int(math.floor(pos))
        plan.append((lo, min(lo + 1, total - 1), pos - lo))
    values = select_ranks(samples, [r for lo, hi, _f in plan for r in (lo, hi)])
    return [float(values[lo]) + (float(values[hi]) - float(values[lo])) * frac
            for lo, hi, frac in plan]
