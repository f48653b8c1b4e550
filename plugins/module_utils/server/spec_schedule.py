"""Speculation by load, as settings: the largest batch that still speculates, and vLLM's schedule.

From a measured crossover (the first level where a speculative profile falls below the baseline,
its bracket and the interpolated estimate) to the batch size up to which speculation pays: in a
closed loop at concurrency C the running batch is about C, so speculation stays on up to the
last concurrency where it still paid: the bracket's lower level, or the interpolated crossover
rounded down when that lies higher. The same number is the vLLM schedule's switch point and the
router's connection limit for the speculative server (server/haproxy.py).

vLLM's `num_speculative_tokens_per_batch_size` rules, read in vLLM's own
vllm/v1/spec_decode/dynamic/utils.py (validate_and_normalize_dynamic_sd_schedule; the pinned
0.33.0 takes the 3-item form used here): a non-empty list of [batch_lo, batch_hi, k], both
bounds positive, lo <= hi, k >= 0, ranges sorted and non-overlapping, the first starting at 1.
vLLM clamps k to num_speculative_tokens silently; servelab refuses a larger k instead, so the
recorded command line is what runs. Standard library only (rendered on the target).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

Schedule = Tuple[Tuple[int, int, int], ...]


class ScheduleError(ValueError):
    """A schedule vLLM would refuse (or silently change); the message names the rule."""


def speculation_max_batch(bracket_low: Optional[int], concurrency: Optional[int],
                          estimate: Optional[float]) -> int:
    """The largest batch that still speculates, from a crossover (at least 1)."""
    keep = int(bracket_low) if bracket_low else int(concurrency or 2) - 1
    if estimate is not None and math.isfinite(estimate):
        keep = max(keep, int(math.floor(estimate)))
    return max(1, keep)


def build_schedule(max_batch: int, tokens: int, top: int) -> Schedule:
    """k tokens up to `max_batch`, none above it up to `top` (--max-num-seqs)."""
    top = max(int(top), max_batch + 1)
    return ((1, int(max_batch), int(tokens)), (int(max_batch) + 1, top, 0))


def validate_schedule(raw, num_tokens: Optional[int], where: str) -> Schedule:
    """Raise ScheduleError naming the rule vLLM applies; return the schedule as tuples."""
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ScheduleError(f"{where} must be a non-empty list of [batch_lo, batch_hi, tokens], "
                            f"e.g. [[1, 4, 3], [5, 256, 0]]")
    entries: List[Tuple[int, int, int]] = []
    for entry in raw:
        if (not isinstance(entry, (list, tuple)) or len(entry) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in entry)):
            raise ScheduleError(f"{where}: each entry is [batch_lo, batch_hi, tokens] of "
                                f"integers (got {entry!r})")
        lo, hi, k = entry
        if lo <= 0 or hi <= 0 or lo > hi:
            raise ScheduleError(f"{where}: batch range [{lo}, {hi}] must be positive with "
                                f"start <= end")
        if k < 0:
            raise ScheduleError(f"{where}: tokens must be >= 0 (got {k} for [{lo}, {hi}])")
        if num_tokens is not None and k > num_tokens:
            raise ScheduleError(f"{where}: {k} tokens for [{lo}, {hi}] exceeds the profile's "
                                f"{num_tokens} speculative tokens (vLLM would cut it silently)")
        entries.append((lo, hi, k))
    entries.sort()
    previous_end = 0
    for lo, hi, _k in entries:
        if lo <= previous_end:
            raise ScheduleError(f"{where}: batch ranges must not overlap ([{lo}, {hi}] starts "
                                f"at or before {previous_end})")
        previous_end = hi
    if entries[0][0] != 1:
        raise ScheduleError(f"{where}: the first batch range must start at 1, so every batch "
                            f"size has a setting")
    return tuple(entries)


def as_lists(schedule: Sequence[Sequence[int]]) -> List[List[int]]:
    return [list(entry) for entry in schedule]
