"""A request's chunk arrays reduced in bulk, at the level's end. Standard library only.

metrics.py defines each figure once, chunk by chunk: a request's ITL samples (itl_samples) and
the tokens of its chunks that arrived inside the window, by batch (reduce_requests). At the end of
a firehose level a client process reduces every request's 2000 chunks, and a Python loop per
chunk there was most of that end (benchmarks/results/limit-itl-firehose-ab-2026-12-06.md). The
functions here give the same floats, to the bit, with the work per chunk done in C (map, slices,
sum, bisect); where they cannot show it is the same (unsorted times, weights that are not whole
numbers) they run the definition's loop. tests/unit/test_loadgen_chunk_arrays.py compares both
on random requests.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left
from itertools import compress, islice, repeat
from operator import gt, sub, truediv
from typing import List, Optional, Sequence, Tuple

# Sums of whole numbers below this are exact in a float whatever their order.
_EXACT = float(2 ** 53)


def itl_series(times: Optional[Sequence[int]], tokens: Optional[Sequence[int]],
               per_token: bool) -> Tuple[Sequence[float], Optional[List[float]]]:
    """metrics.itl_samples as (values, weights), weights None where every one is 1.

    per_token (and `tokens` given): a chunk of k > 0 tokens `gap` after the previous one is the
    value gap / k of weight k (k = 0: none); otherwise each gap is a value float(gap) of weight
    1 (gap / 1 is float(gap): the same correctly rounded quotient)."""
    times = times or ()
    gaps = list(map(sub, islice(times, 1, None), times))
    counts = (list(islice(tokens, 1, len(times)))
              if per_token and tokens is not None else None)
    if counts is None or counts.count(1) == len(counts):
        # array("d", ints) converts each as float() does, in C; Samples.extend copies it whole.
        return array("d", gaps), None
    keep = list(map(gt, counts, repeat(0)))
    counts = list(compress(counts, keep))
    return list(map(truediv, compress(gaps, keep), counts)), list(map(float, counts))


def _whole(values) -> bool:
    """Every value a float holding a whole number (so sums of them below 2^53 are exact)."""
    try:
        return all(map(float.is_integer, values))
    except TypeError:       # not floats: leave it to the loop
        return False


def add_window_tokens(times: Sequence[int], weights: Sequence[float], ws: int, we: int,
                      batch_tokens: List[float], total: float) -> float:
    """The chunks of one request that arrived in [ws, we): their weights added to `total`
    (returned) and to their batch's entry of `batch_tokens` (nb equal batches of the window), as

        for t, w in zip(times, weights):
            if ws <= t < we:
                total += w
                batch_tokens[min(nb - 1, (t - ws) * nb // span)] += w

    in bulk where that gives the same floats (window_slices), else by that loop."""
    bulk = window_slices(times, weights, ws, we, batch_tokens, total)
    if bulk is not None:
        return bulk
    nb = len(batch_tokens)
    span = we - ws
    for t, w in zip(times, weights):
        if ws <= t < we:
            total += w
            batch_tokens[min(nb - 1, (t - ws) * nb // span)] += w
    return total


def window_slices(times: Sequence[int], weights: Sequence[float], ws: int, we: int,
                  batch_tokens: List[float], total: float) -> Optional[float]:
    """add_window_tokens by slices: over the times sorted, the window's chunks are one slice and
    each batch's a slice within it (found by bisection: a chunk's batch never decreases along
    sorted times). Every sum gets the loop's float:

    - whole-number weights and sums (a firehose's: one token a chunk) are exact in any order, so
      each slice is summed at once;
    - one weight for every chunk (no per-chunk counts: the request's tokens spread evenly) adds
      the same value as many times whatever the order of the chunks, one by one where the sums
      are not whole (a request cancelled before its usage came: 1 token over its chunks);
    - other weights are added one by one in the loop's order, which needs the times in order.

    Arrival times need not be in order (a kernel receive stamp can be earlier than the previous
    chunk's). None, with nothing added, for differing weights that are not whole over unordered
    times (the caller runs the loop)."""
    nb = len(batch_tokens)
    n = min(len(times), len(weights))
    if not nb or not n:
        return None
    head = list(islice(times, n))
    values = list(islice(weights, n))
    order = sorted(head)            # sorting sorted ints: n int compares, no Python per chunk
    first = values[0]
    uniform = values.count(first) == n      # a firehose's [1.0] * n: no scan of the weights
    if uniform:
        whole, largest = isinstance(first, float) and first.is_integer(), abs(first)
    else:
        whole = _whole(values)
        largest = max(map(abs, values)) if whole else 0.0
    whole = (whole and _whole(batch_tokens) and float(total).is_integer()
             and abs(total) + largest * n + sum(map(abs, batch_tokens)) < _EXACT)
    if order != head and not uniform:
        if not whole:
            return None
        pairs = sorted(zip(head, values))       # each sum exact: any order of the weights
        order, values = [t for t, _w in pairs], [w for _t, w in pairs]
    lo = bisect_left(order, ws)
    hi = bisect_left(order, we, lo)
    if lo == hi:
        return total
    span = we - ws
    start = lo
    while start < hi:
        b = min(nb - 1, (order[start] - ws) * nb // span)
        low, high = start + 1, hi       # bisect for the first chunk of a later batch
        while low < high:
            mid = (low + high) // 2
            if min(nb - 1, (order[mid] - ws) * nb // span) > b:
                high = mid
            else:
                low = mid + 1
        batch_tokens[b] = _added(batch_tokens[b], values[start:low], whole)
        start = low
    return _added(total, values[lo:hi], whole)


def _added(acc, values, whole: bool):
    """acc + each of `values` in order: the loop's float, at once where every sum is exact."""
    if whole:
        return acc + sum(values)
    for value in values:
        acc += value
    return acc
