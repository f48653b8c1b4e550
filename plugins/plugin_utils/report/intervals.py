"""What the report draws and says about a 95% interval: bars clipped at the physical bound, and
a warning where too few repeats make the interval across them meaningless.

A throughput (or any count per second, any latency) is never below zero, but a t interval is
symmetric: with `bench_repeats: 2` t(1) is 12.7, and a level at 30.9 +- 827 tok/s drew its bar
down to -796. The bar's lower arm stops at the bound; the upper arm stays the half-width (the
interval is not recomputed, only not drawn where no value can be).

Standard library only (the plots hand matplotlib the two lists).
"""
from __future__ import annotations

import math
from typing import Iterable, List, Optional

# The fewest repeats whose interval across them means something: with 2, t(1) = 12.7 and one
# degree of freedom; from 3 on (t(2) = 4.3) repeats separate profiles that differ.
MIN_MEANINGFUL_REPEATS = 3


def _number(value) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def clipped_yerr(values: Iterable, half_widths: Iterable, floor: float = 0.0) -> List[List[float]]:
    """matplotlib's asymmetric `yerr` ([lower arms], [upper arms]) for `values` +- `half_widths`,
    the lower arm cut where it would pass `floor` (a missing half-width: no bar)."""
    lower, upper = [], []
    for value, half in zip(values, half_widths):
        v, h = _number(value), _number(half)
        h = abs(h) if h is not None else 0.0
        lower.append(min(h, max(0.0, v - floor)) if v is not None else 0.0)
        upper.append(h)
    return [lower, upper]


def few_repeats_warning(counted: Iterable[int]) -> Optional[str]:
    """The warning for a run where some level's interval comes from 2 to
    MIN_MEANINGFUL_REPEATS - 1 repeats (`counted`: the repeats counted per level, 1 for a level
    measured once, whose interval is its own window's batch means); None when none has."""
    counts = [int(n) for n in counted]
    few = [n for n in counts if 2 <= n < MIN_MEANINGFUL_REPEATS]
    if not few:
        return None
    return ("%d of %d level(s) have only %s counted repeats: a 95%% interval across fewer than %d "
            "repeats is meaningless (with 2, t(1) = 12.7 on one degree of freedom), and so are "
            "its error bars and the ties (~) read from it. Measure with bench_repeats: %d or more "
            "(llm_bench repeats)." % (len(few), len(counts), "/".join(
                str(n) for n in sorted(set(few))), MIN_MEANINGFUL_REPEATS,
                MIN_MEANINGFUL_REPEATS))
