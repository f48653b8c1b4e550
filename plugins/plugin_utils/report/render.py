"""Render the report: the tables (as data), summary.md and a self-contained report.html.

Tables are built once as `Table` (header + rows of strings) and written both as Markdown and as
HTML, so the two files cannot disagree. Every level figure in them is titled and formatted from
results/levels.py's field table by results/level_views.py, as the live progress lines are. The
HTML has inline CSS and base64 PNGs only: no script, no link, no external URL, so it opens the
same offline, attached to a mail or from a share.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field

# Controller requirements (requirements.txt). Guarded so that the plugin loads without them and
# bench_report fails naming what is missing (plugins/action/bench_report.py), not an import error.
try:
    import pandas as pd
except ImportError:  # pragma: no cover - checked by the action plugin
    pd = None

from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import FAILED
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import (
    MISSING,
    cell_header,
    format_value,
    table_cells,
    view_headers,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    COUNT,
    FIELD,
    LAYOUTS,
    VIEW_RATE_TABLE,
    VIEW_TABLE,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    fmt_c,
    profiles_in,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.figures import time_scale_badge
from ansible_collections.servelab.serving.plugins.plugin_utils.report.context import RunContext, failed_records
from ansible_collections.servelab.serving.plugins.plugin_utils.report.interruption import (
    lines as interruption_lines,
)
# Table lives in the leaf report/table.py (the progress callback and the benchmarks use it too);
# imported here as render.Table, the name the report modules use.
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table  # noqa: F401
from ansible_collections.servelab.serving.plugins.plugin_utils.report import tune_section
from ansible_collections.servelab.serving.plugins.plugin_utils.report.schedule import (
    derived_lines,
    derived_rows,
)

# Plots in reading order, with their headings in the HTML.
PLOT_TITLES = {
    "tune_pareto.png": "Tune: goodput against TTFT over every trial's levels (Pareto frontier)",
    "throughput.png": "Output throughput vs concurrency",
    "speedup.png": "Speedup against the baseline",
    "latency.png": "TTFT and TPOT vs concurrency",
    "pareto.png": "Output tok/s per GPU against tok/s per user (Pareto frontier)",
    "ttft_cdf.png": "TTFT distribution (CDF) at chosen levels",
    "itl_cdf.png": "Inter-token latency distribution (CDF) at chosen levels",
    "gpu.png": "GPU telemetry: SM utilisation, power and tokens per joule vs concurrency",
    "rate.png": "Open loop: throughput and TTFT vs offered request rate",
    "derived.png": "Derived profile (speculation by load) beside the static ones and their envelope",
    "fleet.png": "Fleet: output tok/s per host, and summed over the hosts",
    "comparison.png": "Change against the earlier run",
}


@dataclass
class ReportContent:
    run_id: str
    results_dir: str
    baseline: str
    context: RunContext
    levels: pd.DataFrame
    planned_levels: list
    crossovers: list
    speedup: list
    recommendation: str
    notes: list  # sentences such as "single profile: no speedup"
    request_errors: dict
    comparison: list = field(default_factory=list)
    comparison_note: str = ""
    compare_to: str | None = None
    warnings: list = field(default_factory=list)
    plots: dict = field(default_factory=dict)  # file name -> PNG bytes
    rate_levels: pd.DataFrame | None = None  # open-loop rows, shown apart
    derived: list = field(default_factory=list)  # report/schedule.py DerivedProfile
    # [(title, Table)] sections other report modules add (repeats.py), after the level tables
    sections: list = field(default_factory=list)
    # A tune's view (report/tune_section.py): its summary and best profile open the report.
    tune: object = None


def _title(name: str) -> str:
    return FIELD[name].title


def _speedup_cell(point) -> str:
    if point is None:
        return ""
    if point.speedup is None:
        return MISSING
    cell = f"{point.speedup:.2f}x"
    if point.within_ci:
        cell += "~"
    if not point.usable:
        cell = f"({cell})"
    return cell


def _failed(row) -> bool:
    return row.get("verdict") == FAILED


def _whole_level_errors(row) -> str | None:
    """A failed level's errors: its window is often empty (the server failed before or during
    it), so the window's count says 0/0 while the level lost every request; the whole level's
    count (warmup, window and tail) is what failed it."""
    run_errors, run_requests = row.get("run_errors"), row.get("run_requests")
    shown = format_value("run_errors", run_errors), format_value("run_requests", run_requests)
    if not _failed(row) or MISSING in shown:
        return None
    window = row.get("errors")
    if window is not None and not pd.isna(window) and window >= run_errors:
        return None     # the window holds them all: its own cell says it
    return f"{shown[0]}/{shown[1]} (whole level)"


def level_cells(row, view: str) -> dict:
    """table_cells of a row, a failed level's errors counted over the whole level."""
    cells = table_cells(row, view)
    whole = _whole_level_errors(row)
    if whole is not None:
        for cell in LAYOUTS[view]:
            if cell.shape == COUNT and cell.fields[0] == "errors":
                cells[cell_header(cell)] = whole
    return cells


def all_levels(host_rows: pd.DataFrame, planned: list) -> list:
    """The host's measured levels plus those the run planned: a missing level shows as missing."""
    return sorted(set(host_rows["concurrency"].tolist()) | set(planned))


def level_table(content: ReportContent) -> Table:
    """The side-by-side table: per level every profile's throughput, speedup and latencies."""
    levels, baseline = content.levels, content.baseline
    speedups = {(p.host, p.profile, p.concurrency): p for p in content.speedup}
    crossed = {(c.host, c.profile): c.concurrency
               for c in content.crossovers if c.status == "crossed"}
    has_baseline = baseline in set(levels["profile"])
    vs = f"vs {baseline}"
    host_h, c_h, profile_h = _title("host"), _title("concurrency"), _title("profile")
    # The throughput cell first, then the speedup derived from it, then the other figures.
    figures = view_headers(VIEW_TABLE)
    headers = ([host_h] if levels["host"].nunique() > 1 else []) + [
        c_h, profile_h, figures[0]] + ([vs] if has_baseline else []) + figures[1:] + ["notes"]
    rows = []
    for host, host_rows in levels.groupby("host", sort=True):
        by_key = {(r["profile"], int(r["concurrency"])): r for _key, r in host_rows.iterrows()}
        for c in all_levels(host_rows, content.planned_levels):
            for profile in profiles_in(host_rows, baseline):
                cells = {host_h: str(host), c_h: format_value("concurrency", c),
                         profile_h: profile}
                row = by_key.get((profile, c))
                if row is None:
                    cells["notes"] = "missing: not measured (run cut short or profile failed)"
                    rows.append([cells.get(h, MISSING) for h in headers])
                    continue
                notes = []
                if row["note"]:
                    notes.append(f"{row['note']} (excluded)")
                elif not pd.isna(row["errors"]) and row["errors"] > 0:
                    notes.append(f"{int(row['errors'])} error(s)")
                if row.get("flags"):
                    notes.append(row["flags"])
                if crossed.get((host, profile)) == c:
                    notes.append(f"<- falls below {baseline}")
                cells.update(level_cells(row, VIEW_TABLE))
                cells.update({vs: _speedup_cell(speedups.get((host, profile, c))),
                              "notes": "; ".join(notes)})
                rows.append([cells[h] for h in headers])
    footnotes = []
    if has_baseline:
        footnotes.append(
            f"{vs}: output tok/s relative to {baseline} at the same level; `~` the difference "
            "is within the two 95% CIs (a tie: neither a win nor a loss for the crossover and "
            "the recommendation); in brackets: a level excluded from the crossover and the "
            "recommendation.")
    return Table(headers, rows, footnotes)


def side_by_side_table(content: ReportContent, host: str) -> Table:
    """Output tok/s only, one column per profile: the shape of the curves at a glance."""
    host_rows = content.levels[content.levels["host"] == host]
    profiles = profiles_in(host_rows, content.baseline)
    speedups = {(p.profile, p.concurrency): p for p in content.speedup if p.host == host}
    others = [p for p in profiles if p != content.baseline and content.baseline in profiles]
    headers = [_title("concurrency")] + profiles + [f"{p} vs {content.baseline}" for p in others]
    by_key = {(r["profile"], int(r["concurrency"])): r for _key, r in host_rows.iterrows()}
    rows = []
    for c in all_levels(host_rows, content.planned_levels):
        cells = [format_value("concurrency", c)]
        for profile in profiles:
            row = by_key.get((profile, c))
            cell = MISSING if row is None else format_value("output_tok_s", row["output_tok_s"])
            if row is not None and not row["usable"]:
                cell += " (failed)" if _failed(row) else " (excluded)"
            cells.append(cell)
        cells += [_speedup_cell(speedups.get((p, c))) or MISSING for p in others]
        rows.append(cells)
    return Table(headers, rows)


def compare_table(content: ReportContent) -> Table:
    multi_host = len({p.host for p in content.comparison}) > 1
    headers = ([_title("host")] if multi_host else []) + [
        _title("concurrency"),
        _title("profile"),
        _title("output_tok_s"),
        "earlier",
        "change",
        f"{_title('ttft_p50_ms')} (earlier)",
        f"{_title('tpot_p50_ms')} (earlier)",
    ]

    def now_and_then(name: str, now, then) -> str:
        return f"{format_value(name, now)} ({format_value(name, then)})"

    rows = []
    for p in content.comparison:
        change = MISSING if p.delta_pct is None else f"{p.delta_pct:+.1f}%"
        if p.delta_pct is not None:
            # A change is flagged only beyond both runs' CIs; inside them it is noise. A value
            # outside the other run's range is a change, however wide the CIs are.
            if p.outside_range:
                change += " (outside the other run's range)"
            else:
                change += {True: " (beyond CI)", False: " (within CI)"}.get(p.beyond_ci, "")
        rows.append(
            ([p.host] if multi_host else [])
            + [
                format_value("concurrency", p.concurrency),
                p.profile,
                format_value("output_tok_s", p.output_tok_s),
                format_value("output_tok_s", p.earlier_output_tok_s),
                change,
                now_and_then("ttft_p50_ms", p.ttft_p50_ms, p.earlier_ttft_p50_ms),
                now_and_then("tpot_p50_ms", p.tpot_p50_ms, p.earlier_tpot_p50_ms),
            ]
        )
    return Table(headers, rows)


def rate_table(content: ReportContent) -> Table | None:
    """Open-loop (request-rate) levels: shown as measured, outside the concurrency comparison."""
    rows_in = content.rate_levels
    if rows_in is None or rows_in.empty:
        return None
    headers = [_title("host"), _title("profile")] + view_headers(VIEW_RATE_TABLE) + ["notes"]
    rows = []
    for _key, row in rows_in.sort_values(["host", "profile", "request_rate"]).iterrows():
        notes = "; ".join(n for n in (row["note"], row.get("flags", "")) if n)
        rows.append(
            [str(row["host"]), str(row["profile"])]
            + list(level_cells(row, VIEW_RATE_TABLE).values())
            + [notes]
        )
    return Table(
        headers,
        rows,
        [
            f"{_title('concurrency')}: the cap on requests in flight. Open-loop levels are not "
            "part of the speedup, crossover or recommendation, which compare closed-loop "
            "concurrency levels."
        ],
    )


def to_markdown(table: Table) -> str:
    return table.to_markdown()


def to_html(table: Table) -> str:
    return table.to_html()


def crossover_lines(content: ReportContent) -> list:
    return [c.text for c in content.crossovers]


def _run_lines(content: ReportContent) -> list:
    ctx = content.context
    lines = [f"run: {content.run_id} ({content.results_dir})"]
    intr = ctx.interruption
    if intr is not None:
        lines.append(f"started {ctx.started_at or '?'}, {intr.status} ({intr.reason}) at "
                     f"{intr.at or 'a time not recorded'}")
    elif ctx.started_at or ctx.finished_at:
        lines.append(
            f"started {ctx.started_at or '?'}, finished {ctx.finished_at or 'not recorded'}"
        )
    if ctx.git_commit:
        lines.append(
            f"servelab commit {ctx.git_commit}"
            + (" (uncommitted changes)" if ctx.git_dirty else "")
        )
    for host, gpus in sorted(ctx.gpus.items()):
        lines.append(f"{host}: {gpus}")
    return lines


def _failure_lines(content: ReportContent) -> list:
    lines = []
    for rec in failed_records(content.context):
        where = "" if rec.host == "*" else f" on {rec.host}"
        status = (rec.status or "").lower()
        intr = content.context.interruption
        if status == "started":
            lines.append(f"{rec.profile}{where}: started but never finished (run cut short?)")
        elif intr is not None and status == intr.status:
            lines.append(f"{rec.profile}{where}: {status} ({intr.reason}) before its sweep "
                         "finished")
        else:
            lines.append(
                f"{rec.profile}{where} FAILED"
                + (f" in '{rec.failed_task}'" if rec.failed_task else "")
                + (f": {rec.error}" if rec.error else "")
            )
    for (host, profile, c), errors in sorted(content.request_errors.items(), key=str):
        top = "; ".join(f"{n}x {text}" for text, n in errors)
        lines.append(f"{profile} on {host} at C={c}: request errors: {top}")
    return lines


def _skipped_lines(content: ReportContent) -> list:
    return [
        f"{r.profile}"
        + ("" if r.host == "*" else f" on {r.host}")
        # Both kinds: what the server log says it skipped, and what servelab left out of the
        # command because the engine refuses it on these GPUs ("<feature>: not rendered: <why>").
        + f": a requested feature did not run (server log, or not rendered): {', '.join(r.features_skipped)}"
        for r in content.context.records
        if r.features_skipped
    ]


def _excluded_lines(content: ReportContent) -> list:
    bad = content.levels[~content.levels["usable"]]
    return [
        f"{r['profile']} on {r['host']} at C={int(r['concurrency'])}: {r['note']}"
        for _key, r in bad.iterrows()
    ]


def _plot_order(content: ReportContent) -> list:
    order = list(PLOT_TITLES)
    return sorted(content.plots, key=lambda n: (order.index(n) if n in order else len(order), n))


def _badge(content: ReportContent) -> str | None:
    """The time-scale badge the plots carry (None for a real-time run), said beside them."""
    measured = set(zip(content.levels["profile"], content.levels["host"], strict=True))
    if content.rate_levels is not None:
        measured |= set(zip(content.rate_levels["profile"], content.rate_levels["host"],
                            strict=True))
    return time_scale_badge(content.context.records, measured)


def summary_markdown(content: ReportContent) -> str:
    hosts = sorted(content.levels["host"].unique())
    out = [f"# servelab benchmark report: {content.run_id}", ""]
    out += [f"- {line}" for line in _run_lines(content)] + [""]
    intr = content.context.interruption
    if intr is not None:
        out += [f"## Run {intr.status}", ""]
        out += [f"- {line}" for line in interruption_lines(intr, content.levels)] + [""]
    if content.tune is not None:
        out += ["## Tune", ""]
        out += [f"- {line}" for line in tune_section.summary_lines(content.tune)] + [""]
        block = tune_section.best_block(content.tune)
        if block:
            out += ["### The best configuration", "", "```yaml", block.rstrip(), "```", ""]
    out += ["## Time scale", "", content.context.time_scale_text, ""]
    out += ["## Recommendation", "", content.recommendation, ""]
    out += ["## Crossover", ""]
    lines = crossover_lines(content) or content.notes or ["no profile to compare with the baseline"]
    out += [f"- {line}" for line in lines] + [""]
    if content.notes and crossover_lines(content):
        out += [f"- {note}" for note in content.notes] + [""]
    if content.derived:
        out += ["## Derived profile: speculation by load", ""]
        out += [f"- {line}" for line in derived_lines(content.derived)] + [""]
        out += [to_markdown(Table(*derived_rows(content.derived))), ""]
    out += ["## Levels side by side", "", to_markdown(level_table(content)), ""]
    for host in hosts:
        title = "## Output tok/s per profile" + (f": {host}" if len(hosts) > 1 else "")
        out += [title, "", to_markdown(side_by_side_table(content, host)), ""]
    rates = rate_table(content)
    if rates:
        out += ["## Open-loop levels (request rate)", "", to_markdown(rates), ""]
    for title, table in content.sections:
        out += [f"## {title}", "", to_markdown(table), ""]
    for title, lines in (
        ("Excluded levels", _excluded_lines(content)),
        ("Failures and errors", _failure_lines(content)),
        ("Skipped features", _skipped_lines(content)),
        ("Warnings", content.warnings),
    ):
        if lines:
            out += [f"## {title}", ""] + [f"- {line}" for line in lines] + [""]
    if content.compare_to:
        out += [f"## Compared with {content.compare_to}", ""]
        if content.comparison_note:
            out += [content.comparison_note, ""]
        if content.comparison:
            out += [to_markdown(compare_table(content)), ""]
    if content.plots:
        out += ["## Plots", ""]
        badge = _badge(content)
        if badge:
            out += [f"Every plot carries the badge: {badge}.", ""]
        out += [f"- plots/{name}: {PLOT_TITLES.get(name, name)}" for name in _plot_order(content)]
        out += [""]
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 80em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f0f0f0; }
td:nth-child(2), td:last-child { text-align: left; }
p.note { font-size: 0.85em; color: #555; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.8em; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.rec { background: #eef6ee; padding: 0.8em; border-left: 4px solid #4a4; }
"""


def _ul(lines: list) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in lines) + "</ul>"


def report_html(content: ReportContent) -> str:
    hosts = sorted(content.levels["host"].unique())
    esc = html.escape
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>servelab report {esc(content.run_id)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>servelab benchmark report: {esc(content.run_id)}</h1>",
        _ul(_run_lines(content)),
    ]
    intr = content.context.interruption
    if intr is not None:
        parts += [f"<h2>Run {esc(intr.status)}</h2>",
                  _ul(interruption_lines(intr, content.levels))]
    if content.tune is not None:
        parts += ["<h2>Tune</h2>", _ul(tune_section.summary_lines(content.tune))]
        block = tune_section.best_block(content.tune)
        if block:
            parts.append(f"<h3>The best configuration</h3><pre>{esc(block)}</pre>")
    parts += [
        "<h2>Time scale</h2>",
        f"<p>{esc(content.context.time_scale_text)}</p>",
        "<h2>Recommendation</h2>",
        f"<p class='rec'>{esc(content.recommendation)}</p>",
        "<h2>Crossover</h2>",
        _ul((crossover_lines(content) or []) + content.notes or ["no profile to compare"]),
    ]
    badge = _badge(content) if content.plots else None
    if badge:
        parts.append(f"<p class='note'>Every plot carries the badge: {esc(badge)}.</p>")
    for name in _plot_order(content):
        data = base64.b64encode(content.plots[name]).decode("ascii")
        title = PLOT_TITLES.get(name, name)
        parts.append(f"<h3>{esc(title)}</h3>"
                     f"<img alt='{esc(title)}' src='data:image/png;base64,{data}'>")
    if content.derived:
        parts += ["<h2>Derived profile: speculation by load</h2>",
                  _ul(derived_lines(content.derived)),
                  to_html(Table(*derived_rows(content.derived)))]
    parts += ["<h2>Levels side by side</h2>", to_html(level_table(content))]
    for host in hosts:
        parts += [
            f"<h2>Output tok/s per profile{': ' + esc(host) if len(hosts) > 1 else ''}</h2>",
            to_html(side_by_side_table(content, host)),
        ]
    rates = rate_table(content)
    if rates:
        parts += ["<h2>Open-loop levels (request rate)</h2>", to_html(rates)]
    for title, table in content.sections:
        parts += [f"<h2>{esc(title)}</h2>", to_html(table)]
    for title, lines in (
        ("Excluded levels", _excluded_lines(content)),
        ("Failures and errors", _failure_lines(content)),
        ("Skipped features", _skipped_lines(content)),
        ("Warnings", content.warnings),
    ):
        if lines:
            parts += [f"<h2>{esc(title)}</h2>", _ul(lines)]
    tails = [r for r in failed_records(content.context) if r.log_tail]
    for rec in tails:
        parts.append(
            f"<details><summary>log tail: {esc(rec.profile)} on {esc(rec.host)}</summary>"
            f"<pre>{esc(rec.log_tail)}</pre></details>"
        )
    if content.compare_to:
        parts.append(f"<h2>Compared with {esc(content.compare_to)}</h2>")
        if content.comparison_note:
            parts.append(f"<p>{esc(content.comparison_note)}</p>")
        if content.comparison:
            parts.append(to_html(compare_table(content)))
    commands = [r for r in content.context.records if r.cmdline]
    if commands:
        parts.append("<h2>Server command lines</h2>")
        for rec in commands:
            env = " ".join(f"{k}={v}" for k, v in sorted(rec.env.items()))
            parts.append(
                f"<details><summary>{esc(rec.profile)} on {esc(rec.host)} "
                f"({esc(rec.engine or 'engine?')})</summary>"
                f"<pre>{esc((env + ' ') if env else '')}{esc(rec.cmdline)}</pre></details>"
            )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def crossover_summary(content: ReportContent) -> str:
    """Short text for the action's `msg` and the callback: crossovers, then the recommendation."""
    lines = crossover_lines(content) or content.notes
    estimates = [c for c in content.crossovers if c.status == "crossed"]
    head = (
        "crossover: "
        + ", ".join(
            f"{c.profile}@{c.host} C={c.concurrency} (est. {fmt_c(round(c.estimate, 1))})"
            for c in estimates
        )
        if estimates
        else "crossover: none"
    )
    return head + "\n" + "\n".join(lines)
