"""Percentiles chosen by the user: llm_bench's `percentiles` (the bench role's bench_percentiles),
their check and the names of their columns. Standard library only.

Every level has p50, p90 and p99 of TTFT, TPOT, ITL and E2E: fixed columns (results/levels.py
FIELDS). A percentile q asked for beyond those adds, for each of the four, the column
<metric>_p<q>_ms, q written as vLLM writes it in its p<q>_ttft_ms keys ("95", "99.9": the rule of
vllm/benchmarks/serve.py, vLLM 0.33.0, lines 1430-1432, which parses --metric-percentiles as
floats, line 2284). The columns come after FIXED_COLUMNS in one stable order: by metric
(PERCENTILE_METRICS' order), then by q ascending (percentile_columns). So runs that ask for the
same percentiles have the same columns, and the fixed columns come first whatever they asked for.
The values are exact, as the fixed ones (loadgen/samples.py).
"""
from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence, Tuple

# (name in the columns, header, vLLM's name in its p<q>_<name>_ms keys)
PERCENTILE_METRICS: Tuple[Tuple[str, str, str], ...] = (
    ("ttft", "TTFT", "ttft"), ("tpot", "TPOT", "tpot"), ("itl", "ITL", "itl"),
    ("e2e", "E2E", "e2el"))
STANDARD_PERCENTILES: Tuple[float, ...] = (50.0, 90.0, 99.0)
METRIC_HEADER = {m: h for m, h, _v in PERCENTILE_METRICS}
METRIC_VLLM = {m: v for m, _h, v in PERCENTILE_METRICS}
METRIC_MEANING = {
    "ttft": "time to first token", "tpot": "time per output token",
    "itl": "inter-token latency per token (a k-token chunk counts k gaps of gap/k)",
    "e2e": "send to last token"}
_NAME = re.compile(r"^(%s)_p([0-9]+(?:\.[0-9]+)?)_ms$" % "|".join(METRIC_HEADER))


def percentile_word(q: float) -> str:
    """q as a column name writes it: vLLM's rule (an integral q without its decimals)."""
    q = float(q)
    return str(int(q)) if int(q) == q else str(q)


def percentile_column(metric: str, q: float) -> str:
    """'ttft_p95_ms' for (ttft, 95), 'itl_p99.9_ms' for (itl, 99.9)."""
    return "%s_p%s_ms" % (metric, percentile_word(q))


def percentile_parts(name: str) -> Optional[Tuple[str, float]]:
    """(metric, q) of a chosen percentile's column; None for any other name (the fixed
    percentile columns included)."""
    match = _NAME.match(name)
    if match is None:
        return None
    metric, q = match.group(1), float(match.group(2))
    if not 0 < q < 100 or q in STANDARD_PERCENTILES or percentile_column(metric, q) != name:
        return None
    return metric, q


def percentile_columns(names: Iterable[str]) -> List[str]:
    """The chosen percentiles' columns among `names`, in their stable order: by metric, then q."""
    order = {m: i for i, (m, _h, _v) in enumerate(PERCENTILE_METRICS)}
    found = {}
    for name in names:
        parts = percentile_parts(name)
        if parts is not None:
            found[name] = (order[parts[0]], parts[1])
    return sorted(found, key=found.__getitem__)


def check_percentiles(values: Optional[Sequence]) -> Optional[str]:
    """Why `values` are not percentiles to report (None when they are): numbers strictly
    between 0 and 100, no two the same (99 and 99.0 are one). The text starts with the option's
    name, as LevelConfig.validate's errors do (the preflight names bench_percentiles from it)."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        return "percentiles: expected a list of numbers between 0 and 100, e.g. [95, 99.9]; " \
               "got %r" % (values,)
    seen = {}
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return ("percentiles: %r is not a number; give percentiles as numbers between 0 and "
                    "100, e.g. [95, 99.9]" % (value,))
        q = float(value)
        if not 0 < q < 100:
            return ("percentiles: %r is not strictly between 0 and 100 (p50, p90 and p99 are "
                    "always reported; use e.g. 99.9 for the 99.9th)" % (value,))
        if q in seen:
            return "percentiles: %r is given twice (as %r and %r); give each once" % (
                q, seen[q], value)
        seen[q] = value
    return None


def extra_percentiles(values: Optional[Sequence]) -> List[float]:
    """The checked percentiles that add columns: those not among STANDARD_PERCENTILES (which
    every level has), ascending."""
    return sorted(float(q) for q in values or () if float(q) not in STANDARD_PERCENTILES)
