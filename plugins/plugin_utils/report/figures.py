"""The data the report's figures draw beside the tables: GPUs per host, the Pareto frontier,
speedup bands, the levels whose latency CDFs are drawn, ECDFs and the time-scale badge. Split from
analysis.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Controller requirements (requirements.txt), as in analysis.py: the plugin loads without them.
try:
    import pandas as pd
except ImportError:  # pragma: no cover - checked by the action plugin
    pd = None

from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    exclusion_reason,
    finite_number as _num,
)


def gpu_counts(manifest: dict) -> dict:
    """{host: number of GPUs} from manifest.json's hosts.<host>.gpu_facts.gpus; a host whose
    facts list no GPU (or have none) is left out: its figures cannot be put per GPU."""
    out = {}
    hosts = manifest.get("hosts") if isinstance(manifest, dict) else None
    for host, info in (hosts or {}).items() if isinstance(hosts, dict) else ():
        facts = info.get("gpu_facts") if isinstance(info, dict) else None
        gpus = facts.get("gpus") if isinstance(facts, dict) else None
        if isinstance(gpus, list) and gpus:
            out[str(host)] = len(gpus)
    return out


def pareto_frontier(points: list) -> list:
    """Indices of the (x, y) points no other point beats on both (higher is better on both
    axes), in ascending x. A point equal to another on both is kept once (the first)."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1], i))
    frontier, best_y = [], -math.inf
    for i in order:
        if points[i][1] > best_y:
            frontier.append(i)
            best_y = points[i][1]
    return sorted(frontier, key=lambda i: (points[i][0], i))


@dataclass
class ParetoPoint:
    host: str
    profile: str
    concurrency: int
    per_user: float      # output tok/s / C: the tok/s each of the C closed-loop users receives
    per_unit: float      # output tok/s / the host's GPUs, or per host when their count is unknown
    gpus: int | None     # the divisor; None: per host
    usable: bool
    reason: str = ""     # exclusion_reason when not usable
    frontier: bool = False


def pareto_points(levels: pd.DataFrame, gpus: dict) -> list:
    """One ParetoPoint per measured level with an output tok/s. The frontier is computed over
    the usable points that share a y unit: all hosts together when every host's GPU count is
    known (per GPU), else each host apart (per host figures of different machines do not
    compare)."""
    points = []
    for _key, row in levels.iterrows():
        tok_s = _num(row["output_tok_s"])
        c = int(row["concurrency"])
        if tok_s is None or c <= 0:
            continue
        n = gpus.get(str(row["host"]))
        points.append(ParetoPoint(
            host=str(row["host"]), profile=str(row["profile"]), concurrency=c,
            per_user=tok_s / c, per_unit=tok_s / n if n else tok_s, gpus=n,
            usable=bool(row["usable"]), reason=exclusion_reason(row)))
    every_host_known = all(p.gpus for p in points)
    groups: dict = {}
    for p in points:
        if p.usable:
            groups.setdefault("gpu" if every_host_known else p.host, []).append(p)
    for members in groups.values():
        for i in pareto_frontier([(p.per_user, p.per_unit) for p in members]):
            members[i].frontier = True
    return points


def speedup_bands(speedup: list, levels: pd.DataFrame) -> list:
    """[(host, profile, concurrency, low, high)] of the usable speedup points whose two levels
    both have a CI95.

    The ratio r = p / b of the profile's and the baseline's output tok/s carries both levels'
    95% CI half-widths (batch means, the two levels measured independently) by first-order
    error propagation: dr = r * sqrt((dp / p)^2 + (db / b)^2). It is an approximation (the
    ratio's distribution is not symmetric) good while both relative half-widths are small.
    """
    ci = {(str(r["host"]), str(r["profile"]), int(r["concurrency"])): _num(r["output_tok_s_ci95"])
          for _key, r in levels.iterrows()}
    bands = []
    for p in speedup:
        if not p.usable or p.speedup is None or not p.profile_tok_s or not p.baseline_tok_s:
            continue
        dp = ci.get((p.host, p.profile, p.concurrency))
        db = ci.get((p.host, p.baseline, p.concurrency))
        if dp is None or db is None:
            continue
        dr = p.speedup * math.hypot(dp / p.profile_tok_s, db / p.baseline_tok_s)
        bands.append((p.host, p.profile, p.concurrency, p.speedup - dr, p.speedup + dr))
    return bands


def cdf_levels_for(levels: pd.DataFrame, crossovers: list, requested: list | None = None) -> dict:
    """{host: [C, ...]}: the levels whose TTFT and ITL distributions are drawn.

    Default: the host's lowest and highest measured level and the bracket of every crossover
    on it. `requested` (bench_report's cdf_levels) replaces them as given, measured or not (a
    level not measured shows as such in its panel)."""
    out = {}
    for host, host_rows in levels.groupby("host", sort=True):
        measured = sorted(int(c) for c in set(host_rows["concurrency"]))
        if requested:
            chosen = {int(c) for c in requested}
        else:
            chosen = {measured[0], measured[-1]}
            for cross in crossovers:
                if cross.host == host and cross.status == "crossed" and cross.bracket:
                    chosen.update(int(c) for c in cross.bracket)
        out[str(host)] = sorted(chosen)
    return out


def ecdf(values: list, weights: list | None = None, max_points: int = 2000) -> tuple:
    """(x, y) of the empirical CDF: x ascending, y the fraction of the (weighted) samples at or
    below x, ending at 1. Long samples are thinned to about max_points steps for drawing (the
    smallest and largest values always kept)."""
    if not values:
        return [], []
    pairs = sorted(zip(values, weights or [1.0] * len(values), strict=True))
    total = sum(w for _v, w in pairs)
    xs, ys, acc = [], [], 0.0
    for v, w in pairs:
        acc += w
        if xs and xs[-1] == v:
            ys[-1] = acc / total
        else:
            xs.append(float(v))
            ys.append(acc / total)
    if len(xs) > max_points:
        step = (len(xs) - 1) / (max_points - 1)
        keep = sorted({round(i * step) for i in range(max_points)})
        xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
    return xs, ys


def time_scale_factors(records: list, measured: set) -> dict:
    """{profile: time_scale} of the measured profiles that ran time-scaled (factor not 1)."""
    out = {}
    for r in records:
        if r.time_scale is None or r.time_scale == 1:
            continue
        if (r.profile, r.host) in measured or (
                r.host == "*" and any(p == r.profile for p, _host in measured)):
            out[r.profile] = r.time_scale
    return out


def time_scale_badge(records: list, measured: set) -> str | None:
    """The badge every plot of a time-scaled run carries; None for a real-time run.

    The simulator divides every model duration by time_scale (module_utils/simulator/), so a
    real engine as fast as the calibrated model would give tok/s / k and latencies x k. Only
    the model's time is scaled: the HTTP and client overheads in the latencies are real, so
    the real-time equivalent of a short latency is an upper estimate."""
    factors = time_scale_factors(records, measured)
    if not factors:
        return None
    values = sorted(set(factors.values()))
    if len(values) == 1:
        k = f"{values[0]:g}"
        return (f"time-scaled simulator x{k} | real-time equivalent \u2248 tok/s \u00f7 {k}, "
                f"latencies \u00d7 {k} (speedup ratios and crossover C unchanged)")
    each = ", ".join(f"{p} x{s:g}" for p, s in sorted(factors.items()))
    return (f"time-scaled simulator ({each}) | real-time equivalent \u2248 tok/s \u00f7 each "
            "profile's factor, latencies \u00d7 it")
