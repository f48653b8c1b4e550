"""What the report concludes from the level rows: speedup, crossover, recommendation, comparison.

Only rows marked `usable` by report_data (not failed, not client-limited, errors within bounds)
enter speedup ratios used for conclusions, the crossover and the recommendation; the others stay
visible in the tables with their note. A profile that failed on a host (a failed level, or a
manifest status other than finished: it crashed, or the run was cut short in it) is never
recommended there, whatever its other levels measured: a server that stops serving under load is
not a configuration to serve with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Controller requirements (requirements.txt). Guarded so that the plugin loads without them and
# bench_report fails naming what is missing (plugins/action/bench_report.py), not an import error.
try:
    import pandas as pd
except ImportError:  # pragma: no cover - checked by the action plugin
    pd = None

from ansible_collections.servelab.serving.plugins.plugin_utils.report.advice import speculation_advice
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    CLIENT_LIMITED,
    EXCLUDED,
    FAILED,
)

# The manifest status of a profile that ran to its end (docs/plugin-notes.md, bench_manifest).
FINISHED = "finished"
# Command-line flags that switch speculative decoding on (SGLang, vLLM).
SPECULATIVE_FLAGS = ("--speculative-algorithm", "--speculative-config", "--speculative-model",
                     "--speculative-draft-model-path")
SPEC_ACCEPT = "server_spec_accept_length_mean"


@dataclass
class SpeedupPoint:
    host: str
    profile: str
    baseline: str
    concurrency: int
    speedup: float | None  # profile output tok/s / baseline output tok/s
    profile_tok_s: float | None
    baseline_tok_s: float | None
    within_ci: bool | None  # the difference is inside the two 95% CIs together: a tie
    usable: bool  # both levels usable: counts for crossover and recommendation
    note: str = ""


@dataclass
class Crossover:
    """Where a profile's output tok/s falls below the baseline's after having been above it.

    status: crossed | never_won | always_wins | no_baseline | no_common_levels
    Won, lost and tied are decided by is_tie: a level where the difference is within the two
    95% half-widths is tied, neither won nor lost.
    concurrency: the first usable level the profile loses after having won at a lower one
    (status crossed)
    bracket: [the last level it won before, that level]; estimate: the concurrency where the
    piecewise-linear interpolation of (profile - baseline) tok/s over the levels of the bracket
    first falls below zero.
    """

    host: str
    profile: str
    baseline: str
    status: str
    concurrency: int | None = None
    bracket: list | None = None
    estimate: float | None = None
    won_at: list = field(default_factory=list)
    lost_at: list = field(default_factory=list)
    tied_at: list = field(default_factory=list)   # within the two 95% half-widths (is_tie)
    excluded: list = field(default_factory=list)
    text: str = ""
    # Where speculation stops paying: [the last level it won or tied, the first clear loss after
    # it]. Set whenever a clear loss follows a level it held, a crossing or not: a profile that
    # only ties at low load and loses above (short windows resolve a 4 % lead as a tie) still
    # has a load above which it should be off, and the derived schedule is built from it.
    stops_paying: list | None = None


@dataclass
class Segment:
    """A run of consecutive measured levels with the same best profile."""

    profile: str
    levels: list
    speedup_min: float | None = None
    speedup_max: float | None = None
    # (level, profile) where another profile ties the one named (is_tie); a profile that only
    # ties the baseline is never named over it
    ties: list = field(default_factory=list)


@dataclass
class HostRecommendation:
    host: str
    segments: list
    text: str


def finite_number(value) -> float | None:
    """A cell as a number: None for a missing, blank, boolean, unreadable or NaN value (every
    report module reads level cells this way)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


_num = finite_number


def fmt_c(value: float) -> str:
    """A concurrency for prose: 3.4 -> '3.4', 5.0 -> '5'."""
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"


def level_ranges(levels: list) -> str:
    """[1, 2] -> 'C=1-2'; [5] -> 'C=5'; measured levels are sparse, so a range names its ends."""
    if not levels:
        return "no level"
    return f"C={levels[0]}" if len(levels) == 1 else f"C={levels[0]}-{levels[-1]}"


def level_runs(chosen: list, among: list) -> str:
    """Levels `chosen` out of the measured `among`, runs of neighbours joined: [1, 2, 30] out of
    [1, 2, 5, 30] -> 'C=1-2, 30'."""
    order = sorted(among)
    runs: list = []
    for c in sorted(chosen):
        if runs and order.index(c) == order.index(runs[-1][-1]) + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return "C=" + ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def is_tie(value, half, other, other_half) -> bool | None:
    """The report's one notion of a tie (`~` in its tables): two output tok/s figures whose
    difference is within their two 95% half-widths together (a level's batch-means CI95; for
    the mean of a level's repeats, across the repeats: report/repeats.py). A tie is neither a
    win nor a loss for the crossover and the recommendation. None when a figure or a half-width
    is unknown: then the difference's sign decides, as it does for figures without a CI."""
    values = [finite_number(v) for v in (value, half, other, other_half)]
    if None in values:
        return None
    return abs(values[0] - values[2]) <= values[1] + values[3]


def _half(row) -> float | None:
    """A level row's 95% half-width of output tok/s (None where the row has none)."""
    getter = getattr(row, "get", None)
    return finite_number(getter("output_tok_s_ci95") if getter else None)


def profiles_in(levels: pd.DataFrame, baseline: str) -> list:
    """Profiles in a stable order: the baseline first, then the others as they appear."""
    seen = list(dict.fromkeys(levels["profile"].tolist()))
    return ([baseline] if baseline in seen else []) + [p for p in seen if p != baseline]


def compute_speedup(levels: pd.DataFrame, baseline: str) -> list:
    points = []
    for host, host_rows in levels.groupby("host", sort=True):
        base = host_rows[host_rows["profile"] == baseline].set_index("concurrency")
        for profile in profiles_in(host_rows, baseline):
            if profile == baseline:
                continue
            rows = host_rows[host_rows["profile"] == profile]
            for _key, row in rows.iterrows():
                c = int(row["concurrency"])
                tok_s = _num(row["output_tok_s"])
                if c not in base.index:
                    points.append(SpeedupPoint(
                        host=host, profile=profile, baseline=baseline, concurrency=c,
                        speedup=None, profile_tok_s=tok_s, baseline_tok_s=None, within_ci=None,
                        usable=False, note=f"no {baseline} level at C={c}"))
                    continue
                b = base.loc[c]
                b_tok_s = _num(b["output_tok_s"])
                usable = bool(row["usable"]) and bool(b["usable"])
                speedup = tok_s / b_tok_s if tok_s is not None and b_tok_s else None
                within_ci = (is_tie(tok_s, _half(row), b_tok_s, _half(b))
                             if speedup is not None else None)
                note = ""
                if not usable:
                    reasons = []
                    if row["note"]:
                        reasons.append(f"{profile}: {row['note']}")
                    if b["note"]:
                        reasons.append(f"{baseline}: {b['note']}")
                    note = "; ".join(reasons)
                points.append(SpeedupPoint(
                    host=host, profile=profile, baseline=baseline, concurrency=c,
                    speedup=speedup, profile_tok_s=tok_s, baseline_tok_s=b_tok_s,
                    within_ci=within_ci, usable=usable, note=note))
    return points


def _crossover_for(
    host: str, profile: str, baseline: str, rows: pd.DataFrame, base: pd.DataFrame
) -> Crossover:
    if base.empty:
        return Crossover(
            host,
            profile,
            baseline,
            "no_baseline",
            text=f"{profile} on {host}: no {baseline} results on this host, so no crossover",
        )
    p_rows = rows[rows["usable"]].set_index("concurrency")
    b_rows = base[base["usable"]].set_index("concurrency")
    p_ok, b_ok = p_rows["output_tok_s"], b_rows["output_tok_s"]
    common = sorted(set(p_ok.index) & set(b_ok.index))
    every_level = sorted(set(rows["concurrency"]) | set(base["concurrency"]))
    excluded = [c for c in every_level if c not in common]
    cross = Crossover(host, profile, baseline, "no_common_levels", excluded=excluded)
    if not common:
        cross.text = (
            f"{profile} on {host}: no level where both it and {baseline} have usable "
            "results, so no crossover"
        )
        return cross
    diff = {c: float(p_ok[c]) - float(b_ok[c]) for c in common}
    tied = {c for c in common if is_tie(p_ok[c], _half(p_rows.loc[c]), b_ok[c],
                                        _half(b_rows.loc[c]))}
    cross.won_at = [c for c in common if diff[c] > 0 and c not in tied]
    cross.lost_at = [c for c in common if diff[c] < 0 and c not in tied]
    cross.tied_at = sorted(tied)
    last_win = last_held = None
    for c in common:
        if c in cross.lost_at and last_held is not None and cross.stops_paying is None:
            cross.stops_paying = [last_held, c]
        if c in cross.lost_at and last_win is not None:
            cross.status = "crossed"
            cross.concurrency = c
            cross.bracket = [last_win, c]
            # Where the piecewise-linear (profile - baseline) tok/s first falls below zero
            # between the last win and this loss: between two neighbours, d_a >= 0 > d_b.
            span = [x for x in common if last_win <= x <= c]
            for a, b in zip(span, span[1:], strict=False):
                if diff[a] >= 0 > diff[b]:
                    cross.estimate = a + (b - a) * diff[a] / (diff[a] - diff[b])
                    break
            skipped = [e for e in excluded if last_win < e < c]
            ties = [t for t in cross.tied_at if last_win < t < c]
            cross.text = (
                f"{profile} on {host} falls below {baseline} at C={c}: between "
                f"C={last_win} and C={c}, linear estimate C~{fmt_c(round(cross.estimate, 1))}"
            )
            if ties:
                cross.text += (f" ({level_runs(ties, common)} in between: tied, within the "
                               "95% half-widths)")
            if skipped:
                cross.text += (
                    f" (level(s) {', '.join(map(str, skipped))} in between were excluded, "
                    "so the bracket is wider than measured)"
                )
            return cross
        if c in cross.won_at:
            last_win = c
        if c in cross.won_at or c in cross.tied_at:
            last_held = c
    span = level_ranges(common)
    if not cross.won_at and cross.tied_at:
        cross.status = "never_won"
        cross.text = (
            f"{profile} on {host} never beats {baseline} beyond the 95% half-widths at the "
            f"usable levels ({span}): tied at {level_runs(cross.tied_at, common)}"
            + (f", below at {level_runs(cross.lost_at, common)}" if cross.lost_at else "")
            + "; no crossover"
            + (f"; it stops paying (from tied to below) between C={cross.stops_paying[0]} and "
               f"C={cross.stops_paying[1]}" if cross.stops_paying else "")
        )
    elif not cross.won_at:
        cross.status = "never_won"
        cross.text = (
            f"{profile} on {host} never beats {baseline} at the usable levels ({span}): "
            "no crossover"
        )
    else:
        cross.status = "always_wins"
        cross.text = (
            f"{profile} on {host} stays at or above {baseline} at every usable level "
            f"({span}): no crossover within the sweep"
        ) + (f" (tied at {level_runs(cross.tied_at, common)}, within the 95% half-widths)"
             if cross.tied_at else "")
    return cross


def compute_crossover(levels: pd.DataFrame, baseline: str) -> list:
    result = []
    for host, host_rows in levels.groupby("host", sort=True):
        base = host_rows[host_rows["profile"] == baseline]
        for profile in profiles_in(host_rows, baseline):
            if profile != baseline:
                rows = host_rows[host_rows["profile"] == profile]
                result.append(_crossover_for(host, profile, baseline, rows, base))
    return result


def crossover_map(crossovers: list) -> dict:
    """{profile: {host: concurrency or None}}: the nested form the action returns."""
    out: dict = {}
    for cross in crossovers:
        out.setdefault(cross.profile, {})[cross.host] = cross.concurrency
    return out


def best_profile_segments(host_rows: pd.DataFrame, baseline: str) -> list:
    """Per measured level the profile with the highest usable output tok/s, grouped into runs."""
    segments: list = []
    for c, measured in host_rows.groupby("concurrency", sort=True):
        # A level where any profile's figure is unusable (client-limited, failed, error-heavy)
        # names no winner: the profiles left would "win" only because a rival was not measured.
        if not measured["usable"].all():
            continue
        at_level = measured
        # Highest output tok/s; an exact tie goes to the baseline (the simpler server to run),
        # and so does a tie within the two 95% half-widths (is_tie): a profile is named over
        # the baseline only where it beats it beyond the noise.
        ranked = at_level.assign(_is_base=at_level["profile"] == baseline)
        best = ranked.sort_values(
            ["output_tok_s", "_is_base"], ascending=False, kind="stable"
        ).iloc[0]
        base = at_level[at_level["profile"] == baseline]
        if not base.empty and best["profile"] != baseline and is_tie(
                best["output_tok_s"], _half(best), base["output_tok_s"].iloc[0],
                _half(base.iloc[0])):
            best = base.iloc[0]
        tied_by = [str(r["profile"]) for _i, r in at_level.iterrows()
                   if r["profile"] != best["profile"] and is_tie(
                       r["output_tok_s"], _half(r), best["output_tok_s"], _half(best))]
        speedup = (
            float(best["output_tok_s"]) / float(base["output_tok_s"].iloc[0])
            if not base.empty and best["profile"] != baseline
            else None
        )
        if segments and segments[-1].profile == best["profile"]:
            seg = segments[-1]
            seg.levels.append(int(c))
        else:
            seg = Segment(str(best["profile"]), [int(c)])
            segments.append(seg)
        seg.ties += [(int(c), rival) for rival in tied_by]
        if speedup is not None:
            seg.speedup_min = speedup if seg.speedup_min is None else min(seg.speedup_min, speedup)
            seg.speedup_max = speedup if seg.speedup_max is None else max(seg.speedup_max, speedup)
    return segments


def failing_profiles(levels: pd.DataFrame, records=()) -> dict:
    """{(host, profile): why it is not recommended} for every profile that failed on a host.

    A failed level (the server stopped serving: results/level_verdict.py) or a manifest record
    whose status is not `finished` (failed, or `started` and never finished: crashed or cut
    short). A record without a status says nothing. `records`: context.ProfileRecord, host "*"
    for a flat record, which applies to every host."""
    out: dict = {}
    if "verdict" in levels.columns:
        for _index, row in levels[levels["verdict"] == FAILED].iterrows():
            out.setdefault((str(row["host"]), str(row["profile"])),
                           f"it failed at C={int(row['concurrency'])}")
    hosts = sorted(set(levels["host"]))
    for rec in records:
        status = (rec.status or "").strip().lower()
        if not status or status == FINISHED:
            continue
        if status == "failed":
            why = "it failed" + (f" in '{rec.failed_task}'" if rec.failed_task else "")
        elif status in ("interrupted", "aborted"):       # the run's end (report/context.py)
            why = f"its sweep was {status} before it finished"
        else:
            why = f"its sweep did not finish (status {status})"
        for host in hosts if rec.host == "*" else [rec.host]:
            out.setdefault((host, rec.profile), why)
    return out


def _accept_length(row) -> float | None:
    metrics = row.get("server_metrics")
    value = metrics.get(SPEC_ACCEPT) if isinstance(metrics, dict) else None
    return _num(row.get(SPEC_ACCEPT) if value is None else value)


def speculative_profiles(levels: pd.DataFrame, records=()) -> set:
    """{(host, profile)} that ran with speculative decoding: their command line switches it on,
    or the server's /metrics reported an acceptance length (the simulator's speculative
    profiles are known this way: their command line names a simulator profile, not a flag)."""
    found = set()
    hosts = sorted(set(levels["host"]))
    for rec in records:
        if any(flag in (rec.cmdline or "") for flag in SPECULATIVE_FLAGS):
            found.update((host, rec.profile) for host in (hosts if rec.host == "*" else [rec.host]))
    for _index, row in levels.iterrows():
        accept = _accept_length(row)
        if accept is not None and accept > 0:
            found.add((str(row["host"]), str(row["profile"])))
    return found


def _segment_phrase(seg: Segment, baseline: str, last: bool, only: bool) -> str:
    if only:
        where = f"at every usable level ({level_ranges(seg.levels)})"
    elif last and len(seg.levels) > 1:
        where = f"from C={seg.levels[0]} to C={seg.levels[-1]} (the highest level compared)"
    elif last:
        where = f"from C={seg.levels[0]} up"
    else:
        where = f"at {level_ranges(seg.levels)}"
    phrase = f"{seg.profile} {where}"
    if seg.speedup_min is not None:
        lo, hi = seg.speedup_min, seg.speedup_max
        gain = f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}x"
        phrase += f" with {gain} {baseline}'s output tok/s"
    tied: dict = {}
    for c, rival in seg.ties:
        tied.setdefault(rival, []).append(c)
    if tied:
        phrase += ", where " + " and ".join(
            f"{rival} ties it at {level_runs(levels, seg.levels)}"
            for rival, levels in tied.items()) + " (within the 95% half-widths)"
    return phrase


def _nothing_to_serve(host_rows: pd.DataFrame, candidates: pd.DataFrame) -> str:
    """Why no profile is recommended on a host, in words that are true of every profile."""
    if not host_rows["usable"].any():
        return "no level is usable, so there is nothing to recommend"
    if not candidates["usable"].any():
        return ("no profile that ran without failing has a usable level, so there is nothing "
                "to recommend")
    spans = []
    for profile, rows in candidates.groupby("profile", sort=False):
        usable = sorted(int(c) for c in rows.loc[rows["usable"], "concurrency"])
        spans.append(f"{profile} at {level_ranges(usable) if usable else 'none'}")
    return (f"no level has usable results for every profile ({'; '.join(spans)}), so none can "
            "be recommended over another")


def _serve_phrase(segments: list, baseline: str, crossed: list) -> str:
    """'serve eagle3 at C=1-2 (...), then baseline from C=5 up (...)' for one host."""
    phrases = [
        _segment_phrase(s, baseline, i == len(segments) - 1, len(segments) == 1)
        for i, s in enumerate(segments)
    ]
    text = "serve " + ", then ".join(phrases)
    if crossed:
        text += "; " + "; ".join(
            f"{c.profile} falls below {c.baseline} between C={c.bracket[0]} and "
            f"C={c.bracket[1]} (est. C~{fmt_c(round(c.estimate, 1))})"
            for c in crossed
        )
    if len({s.profile for s in segments}) < len(segments):
        text += "; the lead changes back and forth, so check the confidence intervals"
    return text


def recommend(
    levels: pd.DataFrame,
    baseline: str,
    crossovers: list,
    failing: dict | None = None,
    speculative: set | None = None,
    records=(),
) -> tuple[list, str]:
    """Which profile to serve at which concurrency, per host, and one paragraph saying so.

    failing: failing_profiles(), never recommended; speculative: speculative_profiles(), the
    only ones the speculation advice is about."""
    failing = failing or {}
    speculative = speculative or set()
    per_host = []
    profiles = profiles_in(levels, baseline)
    for host, host_rows in levels.groupby("host", sort=True):
        out = {p: why for (h, p), why in failing.items() if h == host}
        candidates = host_rows[~host_rows["profile"].isin(list(out))]
        segments = best_profile_segments(candidates, baseline)
        crossed = [c for c in crossovers if c.host == host and c.status == "crossed"
                   and c.profile not in out and c.baseline not in out]
        text = (_serve_phrase(segments, baseline, crossed) if segments
                else _nothing_to_serve(host_rows, candidates))
        measured = set(host_rows["profile"])
        text += "".join(f"; {p} is not recommended: {why}" for p, why in out.items()
                        if p in measured)
        per_host.append(HostRecommendation(str(host), segments, text))

    if len(per_host) > 1 and len({r.text for r in per_host}) == 1:
        # Identical conclusions on every host: say it once instead of repeating it per host.
        sentences = [f"on every host ({', '.join(r.host for r in per_host)}) {per_host[0].text}"]
    else:
        sentences = [f"on {r.host} {r.text}" for r in per_host]
    if len(profiles) == 1:
        return per_host, (
            f"Only one profile ({profiles[0]}) was measured, so there is no speedup "
            f"or crossover to report: {'; '.join(sentences)}."
        )
    if baseline not in profiles:
        lead = (
            f"No results for the baseline profile `{baseline}` (profiles: {', '.join(profiles)}), "
            "so no speedup or crossover; by output tok/s alone, "
        )
    else:
        lead = "By output tok/s, "
    paragraph = lead + "; ".join(sentences) + "."
    paragraph += speculation_advice(crossovers, speculative, failing, records)
    if any(seg.ties for rec in per_host for seg in rec.segments if seg.profile == baseline):
        paragraph += (f" A profile that only ties {baseline} (a difference within the two 95% "
                      f"half-widths) is not named over it: {baseline} is the simpler server to "
                      "run.")
    if not levels["usable"].all():
        paragraph += " Levels marked failed, client-limited or error-heavy were left out."
    paragraph += " Check TTFT and TPOT in the table against your latency targets as well."
    return per_host, paragraph


# --------------------------------------------------------------------------------------------
# Figure data: pure functions the plots draw (plots.py) and the tests check.

# Why a level is not usable, in the few words a legend entry has room for (level_verdict.py).
EXCLUSION_WORDS = {FAILED: "failed", CLIENT_LIMITED: "client-limited", EXCLUDED: "too many errors"}


def exclusion_reason(row) -> str:
    """'failed', 'client-limited', 'too many errors' for a row that is not usable; '' if it is."""
    if bool(row.get("usable", True)):
        return ""
    return EXCLUSION_WORDS.get(str(row.get("verdict") or ""), "excluded")
