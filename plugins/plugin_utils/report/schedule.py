"""The derived profile against the two static ones: the envelope, per level, and the collapse.

A derived profile (bench_derived_profiles: vLLM's schedule, the simulator's dynamic mode, or the
router's two servers behind HAProxy) is built from a measured crossover between a speculative
profile and the baseline, and run in the same sweep. The manifest marks it:
profiles.<name>.<host>.derived = {kind, source, baseline, max_batch, setting, gpu_split,
assumption}. Per level where the three were measured and usable:

- envelope: the better of the two static profiles (higher output tok/s);
- reached: the derived profile is at or above it, or below it by no more than the two 95 %
  CIs together (the same tie rule as the speedup table's);
- envelope ratio: derived / envelope output tok/s;
- collapse: the derived profile falls below BOTH static profiles beyond the CIs (for each of
  them, the gap exceeds the two CIs together): switching made things worse than not switching
  either way, as vLLM issue #49548 reports for its schedule.
A level where any of the three is unusable (failed, client-limited, error-heavy) is listed with
the reason and concludes nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    finite_number,
    is_tie,
    level_ranges,
)

KINDS = {"schedule": "speculation schedule", "router": "two servers behind HAProxy"}


@dataclass
class DerivedLevel:
    concurrency: int
    derived_tok_s: float | None
    source_tok_s: float | None          # the speculative static profile
    baseline_tok_s: float | None
    envelope_profile: str | None
    envelope_tok_s: float | None
    envelope_ratio: float | None        # derived / envelope
    reached: bool | None                # at the envelope within the CIs
    collapse: bool                      # below both static profiles beyond the CIs
    note: str = ""


@dataclass
class DerivedProfile:
    host: str
    profile: str
    kind: str
    source: str
    baseline: str
    max_batch: int | None = None
    setting: str = ""
    gpu_split: str = ""
    assumption: str = ""
    levels: list = field(default_factory=list)

    @property
    def compared(self) -> list:
        return [lv for lv in self.levels if lv.envelope_ratio is not None]

    @property
    def collapsed_at(self) -> list:
        return [lv.concurrency for lv in self.levels if lv.collapse]

    def summary(self) -> str:
        head = (f"{self.profile} on {self.host} ({KINDS.get(self.kind, self.kind)} from "
                f"{self.source} and {self.baseline}")
        head += f", speculation up to batch {self.max_batch})" if self.max_batch else ")"
        done = self.compared
        if not done:
            return head + ": no level where it and both static profiles are usable"
        reached = [lv.concurrency for lv in done if lv.reached]
        missed = [lv.concurrency for lv in done if not lv.reached]
        ratios = [lv.envelope_ratio for lv in done]
        worst = min(done, key=lambda lv: lv.envelope_ratio)
        text = (f"{head}: reached the better static profile within the CIs at "
                f"{len(reached)} of {len(done)} levels"
                + (f" (not at {level_ranges(missed)})" if missed else "")
                + f"; {100 * sum(ratios) / len(ratios):.0f} % of the envelope on average, "
                f"{100 * worst.envelope_ratio:.0f} % at worst (C={worst.concurrency})")
        if self.collapsed_at:
            text += (f"; COLLAPSE at {level_ranges(self.collapsed_at)}: below both static "
                     f"profiles beyond the CIs")
        return text


def _rows(levels, host: str, profile: str) -> dict:
    rows = levels[(levels["host"] == host) & (levels["profile"] == profile)]
    return {int(r["concurrency"]): r for _i, r in rows.iterrows()}


def _beyond(gap_from, gap_to, ci_a, ci_b) -> bool:
    """gap_to is clearly below gap_from: lower and no tie by the report's one rule
    (analysis.is_tie; without a half-width the sign decides)."""
    return gap_to < gap_from and not is_tie(gap_to, ci_a, gap_from, ci_b)


def compare_level(c: int, d, s, b, source: str, baseline: str) -> DerivedLevel:
    """One level of the derived profile (row d) against the source (s) and baseline (b) rows."""
    missing = [name for name, row in (("derived", d), (source, s), (baseline, b)) if row is None]
    if missing:
        return DerivedLevel(c, None, None, None, None, None, None, None, False,
                            note=f"not measured: {', '.join(missing)}")
    unusable = [f"{name}: {row['note'] or 'unusable'}"
                for name, row in (("derived", d), (source, s), (baseline, b))
                if not bool(row["usable"])]
    tok = {k: finite_number(row["output_tok_s"]) for k, row in (("d", d), ("s", s), ("b", b))}
    ci = {k: finite_number(row["output_tok_s_ci95"]) for k, row in (("d", d), ("s", s), ("b", b))}
    if unusable or any(v is None for v in tok.values()):
        return DerivedLevel(c, tok["d"], tok["s"], tok["b"], None, None, None, None, False,
                            note="; ".join(unusable) or "no output tok/s")
    best = "s" if tok["s"] > tok["b"] else "b"
    envelope = tok[best]
    reached = not _beyond(envelope, tok["d"], ci["d"], ci[best])
    collapse = all(_beyond(tok[k], tok["d"], ci["d"], ci[k]) for k in ("s", "b"))
    ratio = tok["d"] / envelope if envelope and math.isfinite(envelope) else None
    return DerivedLevel(c, tok["d"], tok["s"], tok["b"], source if best == "s" else baseline,
                        envelope, ratio, reached, collapse)


def derived_markers(manifest: dict) -> dict:
    """{(host, profile): the manifest's `derived` record} for every derived profile."""
    out = {}
    for profile, per_host in ((manifest or {}).get("profiles") or {}).items():
        if not isinstance(per_host, dict):
            continue
        for host, record in per_host.items():
            derived = record.get("derived") if isinstance(record, dict) else None
            if isinstance(derived, dict) and derived.get("source"):
                out[(str(host), str(profile))] = derived
    return out


def analyse_derived(levels, manifest: dict) -> list:
    """Every derived profile of the run against its two static profiles, level by level."""
    results = []
    if levels is None or levels.empty:
        return results
    for (host, profile), marker in sorted(derived_markers(manifest).items()):
        source, baseline = str(marker["source"]), str(marker.get("baseline") or "baseline")
        d, s, b = (_rows(levels, host, p) for p in (profile, source, baseline))
        if not d:
            continue
        result = DerivedProfile(
            host=host, profile=profile, kind=str(marker.get("kind") or ""), source=source,
            baseline=baseline, max_batch=marker.get("max_batch"),
            setting=str(marker.get("setting") or ""), gpu_split=str(marker.get("gpu_split") or ""),
            assumption=str(marker.get("assumption") or ""))
        for c in sorted(set(d) | set(s) | set(b)):
            if c in d:
                result.levels.append(compare_level(c, d.get(c), s.get(c), b.get(c), source,
                                                   baseline))
        results.append(result)
    return results


def derived_lines(results: list) -> list:
    """The report's sentences: the summary, the setting, the split and its assumption."""
    lines = []
    for r in results:
        lines.append(r.summary())
        if r.setting:
            lines.append(f"{r.profile} on {r.host} ran with: {r.setting}")
        if r.gpu_split:
            lines.append(f"{r.profile} on {r.host}: GPU split {r.gpu_split}")
        if r.assumption:
            lines.append(f"{r.profile} on {r.host}: ASSUMPTION, not a field fit: {r.assumption}")
    return lines


def derived_rows(results: list) -> tuple:
    """(headers, rows of str) for the per-level table."""
    headers = ["host", "derived", "C", "derived tok/s", "static tok/s (source / baseline)",
               "envelope", "of envelope", "reached", "collapse", "note"]
    rows = []
    for r in results:
        for lv in r.levels:
            def f(v):
                return "" if v is None else f"{v:.1f}"
            rows.append([
                r.host, r.profile, str(lv.concurrency), f(lv.derived_tok_s),
                f"{f(lv.source_tok_s)} / {f(lv.baseline_tok_s)}", lv.envelope_profile or "",
                "" if lv.envelope_ratio is None else f"{100 * lv.envelope_ratio:.0f} %",
                "" if lv.reached is None else ("yes" if lv.reached else "no"),
                "COLLAPSE" if lv.collapse else "", lv.note])
    return headers, rows


def derived_result(results: list) -> list:
    """The action's return value: plain data per derived profile."""
    return [{
        "host": r.host, "profile": r.profile, "kind": r.kind, "source": r.source,
        "baseline": r.baseline, "max_batch": r.max_batch, "summary": r.summary(),
        "collapse_at": r.collapsed_at,
        "levels": [{"concurrency": lv.concurrency, "envelope_ratio": lv.envelope_ratio,
                    "reached": lv.reached, "collapse": lv.collapse} for lv in r.levels],
    } for r in results]
