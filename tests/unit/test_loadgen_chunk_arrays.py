"""The level's end reduces each request's chunk arrays in bulk (loadgen/chunk_arrays.py, and the
`itl` text of results/request_itl.py): the same floats and the same text, to the bit, as the
definitions chunk by chunk (written out here as they were), on random requests - firehose-shaped
ones (one token a chunk: slices summed at once), per-chunk counts, fractional or mixed weights
(slices added one by one), arrival times out of order (as kernel receive stamps can be), and the
one case left to the loop itself (differing weights, not whole, over unordered times)."""
from __future__ import annotations

import random
import struct
from array import array

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import chunk_arrays
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    RequestTiming, chunk_token_weights, itl_samples, reduce_requests,
)
from ansible_collections.servelab.serving.plugins.module_utils.results import request_itl
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    ITL_BASIS_CHUNK, ITL_BASIS_TOKEN,
)


def bits(values):
    """Floats as their IEEE-754 bits (0.0 and -0.0 differ, as 'to the bit' means)."""
    return [struct.pack("<d", float(v)) for v in values]


def window_loop(times, weights, ws, we, batch_tokens, total):
    """The definition (metrics.reduce_requests before the bulk path), chunk by chunk."""
    nb = len(batch_tokens)
    span = we - ws
    for t, w in zip(times, weights):
        if ws <= t < we:
            total += w
            batch_tokens[min(nb - 1, (t - ws) * nb // span)] += w
    return total


def encode_loop(chunk_times, chunk_tokens=None):
    """request_itl.encode as it was written first: one item per chunk in a Python loop."""
    if not chunk_times:
        return None, None
    per_token = chunk_tokens is not None and len(chunk_tokens) == len(chunk_times)
    first = chunk_times[0]
    items = []
    previous = 0
    for i in range(1, len(chunk_times)):
        at = (chunk_times[i] - first + 500) // 1000
        gap = at - previous
        previous = at
        k = chunk_tokens[i] if per_token else 1
        items.append(str(gap) if k == 1 else "%dx%d" % (gap, k))
    return " ".join(items), ITL_BASIS_TOKEN if per_token else ITL_BASIS_CHUNK


def firehose_times(rng, n, start=10 ** 12):
    """Arrival times as a firehose gives them: runs of chunks read at one instant."""
    times, now = [], start
    while len(times) < n:
        times.extend([now] * rng.randrange(1, 24))
        now += rng.randrange(1, 400_000)
    return times[:n]


def random_request(rng, shape):
    n = rng.randrange(1, 300)
    times = firehose_times(rng, n)
    if shape.startswith("unordered"):   # a kernel stamp earlier than the previous chunk's
        for _swap in range(rng.randrange(1, 6)):
            i = rng.randrange(n)
            times[i] -= rng.randrange(1, 6_000_000)
        if rng.random() < 0.2:
            rng.shuffle(times)
    elif shape == "array":          # as the spool stores them
        times = array("q", times)
    kind = shape.rsplit("-", 1)[-1]
    if kind == "fraction":          # completion_tokens not a multiple of the chunks
        weights = [(n * 3 + 1) / n] * n
    elif kind == "counts":          # the server's per-chunk counts, 0 included
        weights = [float(rng.choice((0, 1, 1, 2, 3))) for _t in times]
    elif kind == "tail" and rng.random() < 0.3:    # cancelled: 1 token over its chunks
        weights = [1 / n] * n
    elif kind == "mixed":           # one fractional weight among whole ones
        weights = [1.0] * n
        weights[rng.randrange(n)] = 0.25
    else:
        weights = [1.0] * n
    return times, weights


SHAPES = ("firehose", "counts", "fraction", "tail", "mixed", "array", "unordered",
          "unordered-counts", "unordered-tail", "unordered-mixed")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", range(30))
def test_window_tokens_are_the_loops_to_the_bit(shape, seed):
    rng = random.Random(seed * 31 + SHAPES.index(shape))
    nb = rng.choice((2, 3, 7, 10, 16))
    batches_a = [0.0] * nb
    batches_b = [0.0] * nb
    total_a = total_b = 0.0
    for _request in range(rng.randrange(1, 12)):
        times, weights = random_request(rng, shape)
        lo, hi = min(times), max(times)
        # Window edges on chunk times, between them, outside them, and a 1 ns window.
        ws = rng.choice((lo, lo - 5, lo + rng.randrange(0, hi - lo + 1), hi))
        we = rng.choice((hi, hi + 1, ws + 1, ws + rng.randrange(1, hi - lo + 3)))
        if we <= ws:
            we = ws + 1
        total_a = chunk_arrays.add_window_tokens(times, weights, ws, we, batches_a, total_a)
        total_b = window_loop(times, weights, ws, we, batches_b, total_b)
        assert bits([total_a] + batches_a) == bits([total_b] + batches_b)


def test_the_slices_are_taken_unless_the_order_of_inexact_sums_is_unknown():
    rng = random.Random(5)
    times = firehose_times(rng, 2000)
    ws, we = times[300], times[1700] + 1
    early = list(times)
    early[900] -= 3_000_000         # one stamp earlier than the chunk before it
    counts = [float(rng.choice((1, 2, 3))) for _t in times]
    # Whole weights (summed at once), one weight for all (its count matters, not the order),
    # fractional ones in order (added one by one in the loop's order), a total that is not
    # whole: the slices, and the loop's floats.
    for order, weights, total in ((times, [1.0] * 2000, 7.0), (times, counts, 0.0),
                                  (early, counts, 0.0), (early, [1 / 1229] * 2000, 0.0),
                                  (times, [1 / 1229] * 1000 + [0.5] * 1000, 0.0),
                                  (times[::-1], [1.0] * 2000, 0.5)):
        batches, reference = [0.0] * 10, [0.0] * 10
        got = chunk_arrays.window_slices(order, weights, ws, we, batches, total)
        assert got is not None
        assert bits([got] + batches) == bits(
            [window_loop(order, weights, ws, we, reference, total)] + reference)
        assert sum(batches) > 0
    # Differing weights that are not whole over unordered times: nothing added, None (the
    # caller runs the loop).
    untouched = [0.0] * 10
    assert chunk_arrays.window_slices(early, [1 / 1229] * 1000 + [0.5] * 1000, ws, we,
                                      untouched, 0.0) is None
    assert untouched == [0.0] * 10


def test_what_is_not_exact_is_added_one_by_one_as_the_loop_adds_it():
    """0.1 added 3 times is not 0.1 * 3 added once; nor are 762 whole tokens added one by one to
    a count that is not whole (a cancelled request's fraction came before) their sum added once:
    the loop's float is the one kept."""
    batches = [0.0, 0.0]
    total = chunk_arrays.add_window_tokens([10, 20, 30], [0.1] * 3, 0, 100, batches, 0.7)
    assert total == ((0.7 + 0.1) + 0.1) + 0.1 and total != 0.7 + 0.1 * 3
    start = 0.8375779756625729
    batches = [start, 0.0]
    total = chunk_arrays.add_window_tokens(list(range(762)), [1.0] * 762, 0, 2000, batches, start)
    one_by_one = start
    for _chunk in range(762):
        one_by_one += 1.0
    assert one_by_one != start + 762.0
    assert bits([total, batches[0]]) == bits([one_by_one, one_by_one])


@pytest.mark.parametrize("seed", range(40))
def test_itl_series_are_the_itl_samples(seed):
    rng = random.Random(seed)
    times = firehose_times(rng, rng.randrange(0, 400))
    for tokens in (None, [1] * len(times), [rng.choice((0, 1, 2, 3)) for _t in times],
                   [rng.choice((1, 1, 1, 2)) for _t in times]):
        r = RequestTiming(worker=0, request_id=1, t_send=0, chunk_times=times, chunk_tokens=tokens)
        for per_token in (True, False):
            pairs = itl_samples(r, per_token)
            values, weights = chunk_arrays.itl_series(times, tokens, per_token)
            assert bits(values) == bits([v for v, _w in pairs])
            if weights is None:
                assert all(w == 1.0 for _v, w in pairs)
            else:
                assert bits(weights) == bits([w for _v, w in pairs])


@pytest.mark.parametrize("seed", range(40))
def test_the_itl_text_is_the_loops(seed):
    rng = random.Random(seed)
    times = firehose_times(rng, rng.randrange(0, 400), start=rng.randrange(0, 10 ** 13))
    if rng.random() < 0.3:      # a real server's gaps: milliseconds, none equal
        times = [10 ** 9 + i * rng.randrange(4_000_000, 40_000_000) for i in range(len(times))]
    for tokens in (None, [1] * len(times), [rng.choice((0, 1, 2, 3)) for _t in times],
                   [1] * (len(times) + 1)):
        assert request_itl.encode(times, tokens) == encode_loop(times, tokens)


def test_the_reduction_keeps_its_figures_with_the_bulk_paths():
    """reduce_requests over firehose-shaped requests (the bulk paths) gives the floats of the
    definitions: the window's tokens, each batch's, and every ITL sample."""
    rng = random.Random(11)
    requests = []
    for i in range(40):
        times = firehose_times(rng, rng.randrange(2, 600), start=10 ** 12 + i * 3_000_000)
        requests.append(RequestTiming(
            worker=i % 4, request_id=i, t_send=times[0] - 1000, t_first=times[0],
            t_last=times[-1], completion_tokens=len(times), tokens_source="server",
            chunks=len(times), chunk_times=times, in_window=10 <= i < 30))
    ws, we = requests[10].t_send, requests[30].t_send
    part = reduce_requests(requests, ws, we, 10, {}, per_token_itl=False)
    batches = [0.0] * 10
    total = 0.0
    for r in requests:
        total = window_loop(r.chunk_times, chunk_token_weights(r), ws, we, batches, total)
    assert bits([part.window_output_tokens] + part.batch_tokens) == bits([total] + batches)
    expected = [v for r in requests if r.in_window for v, _w in itl_samples(r, False)]
    assert bits(part.itl.values()) == bits(expected)
    assert list(part.itl.weights()) == [1.0] * len(expected)
