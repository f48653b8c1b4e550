"""What a tune leaves for its user, in <run_dir>/tune/: every trial's row (trials.csv,
trials.json; failed trials with their reason), the best configuration as a profile that runs
unchanged in bench.yml (best.yml), and the goodput-vs-latency Pareto frontier over every level
the trials measured (pareto.csv). The report (report/tune_section.py) renders the same data.

Rewritten after every trial, so an interrupted tune has them for what finished.
Controller only, standard library only (and yaml for best.yml).
"""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    TUNE_DIR, atomic_write_text,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    level_verdict,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import state as st
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.objective import Objective

TRIALS_CSV = "trials.csv"
TRIALS_JSON = "trials.json"
BEST_YML = "best.yml"
PARETO_CSV = "pareto.csv"
BEST_PROFILE_NAME = "tuned"


def _flag_columns(trials: Sequence[st.Trial]) -> List[str]:
    flags: List[str] = []
    for t in trials:
        for f in t.flags:
            if f not in flags:
                flags.append(f)
    return flags


def trial_rows(state: st.TuneState) -> List[Dict[str, Any]]:
    """One row per trial, failed ones included: its flags, how it ended, its score beside the
    prediction it was proposed with, and what it cost."""
    objective = Objective.parse(state.settings["objective"])
    flags = _flag_columns(state.trials)
    rows = []
    for t in state.trials:
        out = t.outcome or {}
        pred = t.prediction or {}
        row: Dict[str, Any] = {"trial": t.name, "status": t.status}
        for f in flags:
            row[f[2:]] = t.flags.get(f)
        passed = out.get("passed_levels") or []
        row.update({
            "score": t.score, "score_ci95": t.score_ci95, "unit": objective.unit,
            # A lower bound: the capacity is at least `load` (the search ended first).
            "lower_bound": bool(t.lower_bound),
            "load": out.get("best_x"), "capacity_lo": out.get("lo"),
            "capacity_hi": out.get("hi"),
            "highest_load_met": max(passed) if passed else None,
            "predicted": _round(pred.get("score")),
            "predicted_sd_pct": _round(100 * pred["sd"]) if pred.get("sd") is not None else None,
            "prediction_error_pct": (_round(100 * (pred["score"] / t.score - 1))
                                     if pred.get("score") and t.score else None),
            "levels": t.levels, "short_levels": out.get("short_levels"),
            "full_levels": out.get("full_levels"), "measured_s": t.measured_s,
            "wall_s": t.wall_s, "attempts": t.attempts, "why": t.why, "reason": t.reason})
        rows.append(row)
    return rows


def _round(value, digits: int = 4):
    if value is None:
        return None
    try:
        return round(float(value), digits)
    except (TypeError, ValueError):
        return None


def best_document(state: st.TuneState, run_id: str) -> Optional[str]:
    """best.yml: the best trial as a bench.yml profile, with the settings it was measured
    under, ready for group_vars or `-e @best.yml`; None before any trial has a score."""
    best = state.best()
    if best is None:
        return None
    settings = state.settings
    objective = Objective.parse(settings["objective"])
    profile = dict(best.profile)
    profile["name"] = BEST_PROFILE_NAME
    profile.setdefault("engine", settings["engine"])
    out = best.outcome or {}
    axis = settings["axis"]
    doc: Dict[str, Any] = {"bench_profiles": [profile], "bench_report_baseline": BEST_PROFILE_NAME,
                           "bench_slo": dict(objective.slo)}
    load = out.get("best_x")
    if axis == "rate":
        doc.update(bench_load_mode="rate", bench_request_rate=[load],
                   bench_concurrency=[int(settings["concurrency_cap"])])
    else:
        doc.update(bench_load_mode="concurrency", bench_concurrency=[int(load)])
    counts = {s: sum(1 for t in state.trials if t.status == s) for s in st.ENDED}
    ci = (" +- %.3g" % best.score_ci95) if best.score_ci95 else ""
    where = "%s %s" % ("rate" if axis == "rate" else "concurrency",
                       "%g/s" % load if axis == "rate" else int(load))
    head = [
        "servelab tune %s: the best of %d trial(s) (%s)." % (
            run_id, len(state.trials), ", ".join("%d %s" % (n, s) for s, n in counts.items() if n)),
        "Objective: %s." % objective.describe(),
        "Measured: %.4g %s%s at %s (trial %s: %s); %s." % (
            best.score, objective.unit, ci, where, best.name, best.key,
            ("A LOWER BOUND: its capacity is at least %s, the search ended before it bracketed "
             "the capacity within the tolerance (%s)" % (where, best.reason)) if best.lower_bound
            else "its capacity lies in [%s, %s)" % (out.get("lo"), out.get("hi"))),
        "Paste bench_profiles into group_vars, or run it as measured:",
        "  ansible-playbook bench.yml -e @%s/%s/%s" % (run_id, TUNE_DIR, BEST_YML),
    ]
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    return "\n".join("# " + line for line in head) + "\n---\n" + body


def pareto_points(state: st.TuneState, rows_by_profile: Mapping[str, List[Mapping]]
                  ) -> List[Dict[str, Any]]:
    """Every usable level of every trial as (latency, goodput), the frontier marked: a level is
    on it when no other level has at least its goodput at a lower latency. Latency: the
    objective's percentile of TTFT."""
    objective = Objective.parse(state.settings["objective"])
    column = objective.slo_column("ttft_ms")
    points = []
    for t in state.trials:
        for row in rows_by_profile.get(t.name, ()):
            if not level_verdict(row).usable:
                continue
            latency, goodput = row.get(column), row.get("goodput_request_s")
            if latency is None or goodput is None:
                continue
            points.append({"trial": t.name, "flags": t.key, "status": t.status,
                           "load": row.get("request_rate") if row.get("load_mode") == "rate"
                           else row.get("concurrency"), "load_mode": row.get("load_mode"),
                           column: float(latency), "goodput_request_s": float(goodput),
                           "meets_slo": objective.judge(row).passed, "frontier": False})
    points.sort(key=lambda p: (p[column], -p["goodput_request_s"]))
    best = -1.0
    for p in points:
        if p["goodput_request_s"] > best:
            p["frontier"] = True
            best = p["goodput_request_s"]
    return points


def _csv(rows: List[Mapping]) -> str:
    if not rows:
        return ""
    columns: List[str] = []
    for r in rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r.get(k) is None else r.get(k) for k in columns})
    return buf.getvalue()


@dataclass
class Written:
    files: List[str]
    best: Optional[str]


def write_results(run_dir: str, state: st.TuneState,
                  rows_by_profile: Mapping[str, List[Mapping]]) -> Written:
    """tune/trials.csv, trials.json, pareto.csv, best.yml (when a trial has a score)."""
    directory = os.path.join(run_dir, TUNE_DIR)
    os.makedirs(directory, exist_ok=True)
    rows = trial_rows(state)
    files = []
    atomic_write_text(os.path.join(directory, TRIALS_CSV), _csv(rows))
    atomic_write_text(os.path.join(directory, TRIALS_JSON),
                      json.dumps(rows, indent=1, default=str) + "\n")
    atomic_write_text(os.path.join(directory, PARETO_CSV),
                      _csv(pareto_points(state, rows_by_profile)))
    files += [TRIALS_CSV, TRIALS_JSON, PARETO_CSV]
    best = best_document(state, os.path.basename(os.path.normpath(run_dir)))
    if best is not None:
        atomic_write_text(os.path.join(directory, BEST_YML), best)
        files.append(BEST_YML)
    return Written([os.path.join(TUNE_DIR, f) for f in files], best)
