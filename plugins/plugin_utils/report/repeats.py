"""Levels measured more than once (llm_bench's `repeats`, the bench role's `bench_repeats`): the
report's one row per level, and the spread of its repeats.

Every repeat stays a row of its own where the run is recorded and exported (the parts,
levels.csv, levels.json, the parquet files: a `repeat` column). The report's conclusions work on
one row per level: `summarise` makes that row, and the tables, plots, speedups, crossover,
recommendation and the comparison with an earlier run read it as they read a level measured once.

The summary row of a level with several repeats:

- Which repeats count: the usable ones (results/level_verdict.py); when none is usable, all of
  them (the row is then not usable, with their reasons). A repeat left out is named in the row's
  flags. A level with a failed repeat is failed: its server stopped serving under that load once,
  and a profile that does that is never recommended.
- Its figures are the mean over the counted repeats; the request counts (requests, errors, the
  whole level's, the cancelled tail) are summed over every repeat, so the errors cell counts
  every request the level sent.
- `output_tok_s_ci95` is the 95% half-width of that mean across the repeats, t(n-1) x SD /
  sqrt(n) (the t interval of the repeats' means, module_utils/loadgen/metrics.py
  batch_means_ci95), never less than the repeats' own batch-means half-widths combined
  (sqrt(sum ci^2) / n): two repeats that agree by chance claim no more precision than each
  window gave. With two repeats t(1) is 12.7, so the half-width is wide: two repeats rarely
  separate close profiles, three or more do.
- `repeats` (the counted ones), `output_tok_s_sd`, `_min` and `_max` (results/levels.py
  SUMMARY_FIELDS).

The tie rule is analysis.is_tie, the one behind the tables' `~`: a difference within the two
half-widths together is a tie, neither a win nor a loss, for the speedup table, the crossover and
the recommendation alike; with repeats the half-widths are those across the repeats.

A level measured once keeps its row as measured (repeats 1, its own CI95), so a run without
repeats is reported as it always was.

Controller only (pandas).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

# Controller requirements (requirements.txt), guarded like data.py's: bench_report names what is
# missing instead of failing to load.
try:
    import pandas as pd
except ImportError:  # pragma: no cover - checked by the action plugin
    pd = None

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    batch_means_ci95,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    FAILED,
    USABLE,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import (
    format_value,
    level_label,
    table_cells,
    view_headers,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    FIELD,
    VIEW_REPEATS,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    finite_number,
    profiles_in,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.intervals import (
    few_repeats_warning,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.render import Table

# The identity of a level (a repeat's row has `repeat` beside it).
LEVEL_KEY = ("host", "profile", "concurrency", "load_mode", "request_rate")
# Counts of what a level sent: summed over the repeats, not averaged.
SUMMED = ("requests", "errors", "run_requests", "run_errors", "cancelled_tail")
# Frame columns the summary row decides itself (the verdict of the level from its repeats'), and
# the repeat, which it has no single value of.
_STATE = ("usable", "verdict", "note", "flags", "repeat")
# The summary row's own columns besides SUMMARY_FIELDS: every repeat measured, and each one's
# output tok/s (repeat, tok/s, counted) for the repeats table.
MEASURED = "repeats_measured"
VALUES = "repeat_values"
TITLE = "Repeats: each level's spread"


@dataclass
class LevelSpread:
    """One level of a run with repeats, as the action returns it (ReportResult.repeats)."""

    host: str
    profile: str
    level: str                  # "C=5", "rate=2.00/s"
    repeats: int                # counted
    repeats_measured: int
    output_tok_s: float | None  # the mean of the counted repeats
    output_tok_s_ci95: float | None
    output_tok_s_sd: float | None
    output_tok_s_min: float | None
    output_tok_s_max: float | None
    by_repeat: dict = field(default_factory=dict)   # repeat -> output tok/s


def _key_columns(frame: pd.DataFrame) -> list:
    return [c for c in LEVEL_KEY if c in frame.columns]


def half_width(values: list, cis: list) -> float | None:
    """The 95% half-width of the mean of `values` (one per repeat) across them, at least the
    repeats' own half-widths `cis` combined (None entries: unknown, then only the spread
    counts)."""
    spread = batch_means_ci95(values) if len(values) >= 2 else None
    known = [c for c in cis if c is not None]
    within = (math.sqrt(sum(c * c for c in known)) / len(cis)
              if known and len(known) == len(cis) else None)
    candidates = [h for h in (spread, within) if h is not None]
    return max(candidates) if candidates else None


def _nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _mean(values: list):
    numbers = [v for v in (finite_number(x) for x in values) if v is not None]
    return sum(numbers) / len(numbers) if numbers else float("nan")


def _mean_metrics(dicts: list) -> dict:
    """The server's /metrics figures per name, averaged over the repeats that have them."""
    names = dict.fromkeys(k for d in dicts if isinstance(d, dict) for k in d)
    out = {}
    for name in names:
        mean = _mean([d.get(name) for d in dicts if isinstance(d, dict)])
        if not math.isnan(mean):
            out[name] = mean
    return out


def _grouped_notes(rows: list) -> str:
    """'client-limited (...) (repeats 1, 3)': each distinct note with the repeats it applies to."""
    by_note: dict = {}
    for row in rows:
        if row.get("note"):
            by_note.setdefault(row["note"], []).append(int(row["repeat"]))
    return "; ".join(f"{note} (repeat{'s' if len(r) > 1 else ''} {', '.join(map(str, r))})"
                     for note, r in by_note.items())


def _summary_row(rows: list, numeric: set, columns: list) -> dict:
    """The one row of a level measured len(rows) times (rows sorted by repeat); a level
    measured once keeps its row as it is."""
    if len(rows) == 1:
        row = rows[0]
        tok_s = finite_number(row.get("output_tok_s"))
        return dict({k: v for k, v in row.items() if k != "repeat"},
                    repeats=1, output_tok_s_sd=None, output_tok_s_min=tok_s,
                    output_tok_s_max=tok_s, **{MEASURED: 1, VALUES: [
                        (int(row["repeat"]), tok_s, True)]})
    failed = [r for r in rows if r.get("verdict") == FAILED]
    usable = [r for r in rows if bool(r.get("usable"))]
    counted = usable or rows
    out: dict = {}
    for name in columns:
        values = [r.get(name) for r in counted]
        if name in SUMMED:
            out[name] = sum(v for v in (finite_number(r.get(name)) for r in rows) if v is not None)
        elif name == "server_metrics":
            out[name] = _mean_metrics(values)
        elif name == "client_limited":
            out[name] = any(bool(v) for v in values)
        elif name == "window_complete":
            out[name] = all(bool(v) for v in values if v is not None and not _nan(v))
        elif name in numeric:
            out[name] = _mean(values)
        else:
            out[name] = counted[0].get(name)
    flags = list(dict.fromkeys(f for r in counted for f in str(r.get("flags") or "").split("; ")
                               if f))
    if failed:
        out.update(usable=False, verdict=FAILED, note=_grouped_notes(failed))
    elif usable:
        out.update(usable=True, verdict=USABLE, note="")
        left_out = [r for r in rows if not bool(r.get("usable"))]
        if left_out:
            flags.append(f"mean of {len(usable)} of {len(rows)} repeats, left out: "
                         + _grouped_notes(left_out))
    else:
        out.update(usable=False, verdict=rows[0].get("verdict"), note=_grouped_notes(rows))
    out["flags"] = "; ".join(flags)
    tok_s = [finite_number(r.get("output_tok_s")) for r in counted]
    known = [v for v in tok_s if v is not None]
    out["output_tok_s_ci95"] = (
        half_width(known, [finite_number(r.get("output_tok_s_ci95")) for r in counted])
        if len(counted) > 1 else finite_number(counted[0].get("output_tok_s_ci95")))
    out["repeats"] = len(counted)
    out["output_tok_s_sd"] = statistics.stdev(known) if len(known) > 1 else None
    out["output_tok_s_min"] = min(known) if known else None
    out["output_tok_s_max"] = max(known) if known else None
    out[MEASURED] = len(rows)
    out[VALUES] = [(int(r["repeat"]), finite_number(r.get("output_tok_s")),
                    any(r is c for c in counted)) for r in rows]
    return out


def summarise(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """One row per level (module docstring); None or an empty frame comes back as it is, with
    the summary columns."""
    if frame is None:
        return None
    summary_columns = [f.name for f in FIELD.values() if f.summary] + [MEASURED, VALUES]
    if frame.empty:
        return frame.drop(columns=["repeat"], errors="ignore").assign(
            **{name: pd.Series(dtype=object) for name in summary_columns})
    keys = _key_columns(frame)
    columns = [c for c in frame.columns if c not in _STATE]
    numeric = {c for c in columns if c not in keys and pd.api.types.is_numeric_dtype(frame[c])
               and not pd.api.types.is_bool_dtype(frame[c])}
    rows = []
    for _key, group in frame.groupby(keys, sort=False, dropna=False):
        records = group.sort_values("repeat").to_dict("records")
        rows.append(_summary_row(records, numeric, columns))
    out = pd.DataFrame(rows, columns=columns + [c for c in ("usable", "verdict", "note", "flags")
                                                if c in frame.columns] + summary_columns)
    for name in numeric | {"output_tok_s_ci95", "output_tok_s_sd", "output_tok_s_min",
                           "output_tok_s_max"}:
        if name in out.columns:
            out[name] = pd.to_numeric(out[name], errors="coerce")
    for name in ("usable", "client_limited"):
        if name in out.columns:
            out[name] = out[name].astype(bool)
    out["repeats"] = out["repeats"].astype(int)
    sort = [c for c in ("host", "profile", "request_rate", "concurrency") if c in out.columns]
    return out.sort_values(sort, kind="stable").reset_index(drop=True)


def summarise_run(run) -> None:
    """Replace a loaded run's (report/data.py RunData) level frames by their summaries; called
    after the GPU telemetry was joined to each repeat's row. The repeats' own rows stay in
    run.records (the exports write them)."""
    run.levels = summarise(run.levels)
    run.rate_levels = summarise(run.rate_levels)


def _frames(content) -> list:
    return [f for f in (content.levels, content.rate_levels) if f is not None and not f.empty]


def spreads(content) -> list:
    """LevelSpread per level of a run where some level has several repeats, else []."""
    frames = _frames(content)
    if not any((f[MEASURED] > 1).any() for f in frames if MEASURED in f.columns):
        return []
    out = []
    for frame in frames:
        for _key, row in frame.iterrows():
            out.append(LevelSpread(
                host=str(row["host"]), profile=str(row["profile"]), level=level_label(row),
                repeats=int(row["repeats"]), repeats_measured=int(row[MEASURED]),
                output_tok_s=finite_number(row["output_tok_s"]),
                output_tok_s_ci95=finite_number(row["output_tok_s_ci95"]),
                output_tok_s_sd=finite_number(row["output_tok_s_sd"]),
                output_tok_s_min=finite_number(row["output_tok_s_min"]),
                output_tok_s_max=finite_number(row["output_tok_s_max"]),
                by_repeat={r: v for r, v, _counted in row[VALUES]}))
    return out


def _by_repeat(values: list) -> str:
    cells = []
    for repeat, tok_s, counted in values:
        cell = f"r{repeat} {format_value('output_tok_s', tok_s)}"
        cells.append(cell if counted else cell + " (left out)")
    return ", ".join(cells)


def repeats_table(content) -> Table | None:
    """Per level of a run with repeats: the mean output tok/s and its 95% half-width, SD,
    min / max, TTFT and TPOT p50 means, the repeats counted ("2 of 3" when one was left out),
    and every repeat's output tok/s."""
    frames = _frames(content)
    if not spreads(content):
        return None
    multi_host = any(f["host"].nunique() > 1 for f in frames)
    level_h, profile_h = "level", FIELD["profile"].title
    headers = ([FIELD["host"].title] if multi_host else []) + [level_h, profile_h] + (
        view_headers(VIEW_REPEATS)[1:]) + [FIELD["repeats"].title, "by repeat", "notes"]
    rows = []
    for frame in frames:
        for host, host_rows in frame.groupby("host", sort=True):
            order = {p: i for i, p in enumerate(profiles_in(host_rows, content.baseline))}
            ranked = host_rows.assign(_order=host_rows["profile"].map(order))
            sort = [c for c in ("request_rate", "concurrency") if c in ranked.columns]
            for _key, row in ranked.sort_values(sort + ["_order"], kind="stable").iterrows():
                cells = table_cells(row, VIEW_REPEATS)
                figures = [cells[h] for h in view_headers(VIEW_REPEATS)]
                notes = "; ".join(n for n in (row["note"], row.get("flags", "")) if n)
                rows.append(([str(host)] if multi_host else []) + [
                    level_label(row), str(row["profile"])] + figures[1:] + [
                    f"{int(row['repeats'])} of {int(row[MEASURED])}"
                    if int(row["repeats"]) != int(row[MEASURED]) else str(int(row[MEASURED])),
                    _by_repeat(row[VALUES]), notes or ""])
    warning = repeats_warning(content)
    return Table(headers, rows, [footnote()] + ([warning] if warning else []))


def repeats_warning(content) -> str | None:
    """intervals.few_repeats_warning over the levels of a run with repeats (None without)."""
    if not spreads(content):
        return None
    return few_repeats_warning(int(n) for f in _frames(content) for n in f["repeats"])


def footnote() -> str:
    ci = FIELD["output_tok_s_ci95"].header
    return (
        f"Each level was measured several times, in rounds (every level once, then every level "
        f"again), so drift over the run shows in the spread. {FIELD['output_tok_s'].header}: the "
        f"mean of the repeats counted (the usable ones); {ci}: the 95% half-width of that mean "
        f"across them (t(n-1) x SD / sqrt(n), at least the repeats' own {ci}s combined); SD and "
        f"min / max over the same repeats. The other tables, the plots, the speedups, the "
        f"crossover and the recommendation use these means and half-widths: a difference within "
        f"the two half-widths together is a tie (`~`), counted as neither a win nor a loss. "
        f"Every repeat's figures are in levels.csv, levels.json and levels.parquet (column "
        f"`repeat`).")


def sections(content) -> list:
    """[(title, Table)] for the report (render.py's ReportContent.sections)."""
    table = repeats_table(content)
    return [(TITLE, table)] if table is not None else []
