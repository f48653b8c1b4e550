"""The comparison of a run with an earlier one (bench_compare_to): per level, the change in output
tok/s and whether it is inside both runs' intervals or outside the other run's range. Split from
analysis.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Controller requirements (requirements.txt), as in analysis.py: the plugin loads without them.
try:
    import pandas as pd
except ImportError:  # pragma: no cover - checked by the action plugin
    pd = None

from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import finite_number as _num


@dataclass
class ComparePoint:
    host: str
    profile: str
    concurrency: int
    output_tok_s: float | None
    earlier_output_tok_s: float | None
    delta_tok_s: float | None
    delta_pct: float | None
    ttft_p50_ms: float | None
    earlier_ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    earlier_tpot_p50_ms: float | None
    earlier_host: str
    # |delta| beyond both runs' 95% half-widths combined (sqrt(ci_now^2 + ci_then^2)), or a value
    # outside the other run's range: a change; False: inside the noise; None: a run has no CI.
    beyond_ci: bool | None = None
    # Within the half-widths combined, but one run's value lies outside the other's range (its
    # repeats' min..max; measured once, its value +- CI95): a change all the same, never "within
    # CI", however wide the half-widths (issue 28: 161 -> 30.9 tok/s called "within CI").
    outside_range: bool = False


def _level_range(row) -> tuple[float, float] | None:
    """The range a level's throughput was seen in: its counted repeats' min..max, or, measured
    once, its value +- its CI95; None when neither is known."""
    repeats = _num(row.get("repeats"))
    low, high = _num(row.get("output_tok_s_min")), _num(row.get("output_tok_s_max"))
    if repeats is not None and repeats > 1 and low is not None and high is not None:
        return low, high
    value, ci = _num(row.get("output_tok_s")), _num(row.get("output_tok_s_ci95"))
    if value is None or ci is None:
        return None
    return value - ci, value + ci


def _outside(value: float | None, bounds: tuple[float, float] | None) -> bool:
    return value is not None and bounds is not None and not bounds[0] <= value <= bounds[1]


def compare_runs(levels: pd.DataFrame, earlier: pd.DataFrame) -> tuple[list, str]:
    """Per (host, profile, concurrency) the change against an earlier run.

    Matched by host name; when neither run shares a host name but each has exactly one host (a
    laptop run against a field run), the single hosts are matched and the note says so.
    """
    host_map = {h: h for h in set(levels["host"]) & set(earlier["host"])}
    note = ""
    if not host_map and levels["host"].nunique() == 1 and earlier["host"].nunique() == 1:
        now_host, then_host = levels["host"].iloc[0], earlier["host"].iloc[0]
        host_map = {now_host: then_host}
        note = f"hosts differ: {now_host} compared with {then_host} of the earlier run"
    elif not host_map:
        note = "the runs share no host, so nothing is compared"
    before = earlier.set_index(["host", "profile", "concurrency"])
    points = []
    for _key, row in levels.iterrows():
        then_host = host_map.get(row["host"])
        key = (then_host, row["profile"], int(row["concurrency"]))
        if then_host is None or key not in before.index:
            continue
        old = before.loc[key]
        now_v, old_v = _num(row["output_tok_s"]), _num(old["output_tok_s"])
        delta = now_v - old_v if now_v is not None and old_v is not None else None
        pct = 100.0 * delta / old_v if delta is not None and old_v else None
        ci_now, ci_then = _num(row.get("output_tok_s_ci95")), _num(old.get("output_tok_s_ci95"))
        beyond = (None if delta is None or ci_now is None or ci_then is None
                  else abs(delta) > math.hypot(ci_now, ci_then))
        # Inside the half-widths combined but outside the other run's range: still a change
        # (wide half-widths from 2 repeats must not hide a value the other run never saw).
        outside = beyond is not True and delta is not None and (
            _outside(now_v, _level_range(old)) or _outside(old_v, _level_range(row)))
        if outside:
            beyond = True
        points.append(ComparePoint(
            host=row["host"], profile=row["profile"], concurrency=int(row["concurrency"]),
            output_tok_s=now_v, earlier_output_tok_s=old_v, delta_tok_s=delta, delta_pct=pct,
            ttft_p50_ms=_num(row["ttft_p50_ms"]), earlier_ttft_p50_ms=_num(old["ttft_p50_ms"]),
            tpot_p50_ms=_num(row["tpot_p50_ms"]), earlier_tpot_p50_ms=_num(old["tpot_p50_ms"]),
            earlier_host=then_host, beyond_ci=beyond, outside_range=outside))
    if host_map and not points:
        note = (note + "; " if note else "") + "no (profile, concurrency) pair is in both runs"
    return points, note
