"""The report's table of the percentiles a run chose beyond p50/p90/p99 (bench_percentiles,
results/percentiles.py): one row per level, one cell per figure (TTFT, TPOT, ITL, E2E) holding
its chosen percentiles, ascending - "12.0 / 15.5" under "TTFT p95 / p99.9 ms". Shown only when a
level has them; levels.csv and the exports carry them as columns (<figure>_p<q>_ms)."""
from __future__ import annotations

from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import (
    cell_header, cell_text, level_label,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    FIELD, QUANTILES, Cell,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.percentiles import (
    PERCENTILE_METRICS, percentile_columns, percentile_parts,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table

TITLE = "Chosen percentiles"


def _cells(columns: list) -> list:
    """One QUANTILES cell per figure that has chosen percentiles, in PERCENTILE_METRICS' order."""
    cells = []
    for metric, _header, _vllm in PERCENTILE_METRICS:
        names = [c for c in columns if percentile_parts(c)[0] == metric]
        if names:
            cells.append(Cell(tuple(names), QUANTILES))
    return cells


def percentile_table(frames: list):
    """The Table of the chosen percentiles over the frames' rows (closed loop, then open loop);
    None when no row has one."""
    rows = [row for frame in frames if frame is not None and not frame.empty
            for _index, row in frame.iterrows()]
    columns = percentile_columns({name for frame in frames if frame is not None
                                  for name in frame.columns})
    if not columns:
        return None
    cells = _cells(columns)
    multi_host = len({str(row["host"]) for row in rows}) > 1
    headers = ([FIELD["host"].title] if multi_host else []) + [
        "level", FIELD["profile"].title] + [cell_header(cell) for cell in cells]
    body = []
    for row in rows:
        body.append(([str(row["host"])] if multi_host else [])
                    + [level_label(row), str(row["profile"])]
                    + [cell_text(cell, row) for cell in cells])
    return Table(headers, body, [
        "Percentiles asked for with bench_percentiles, beside p50, p90 and p99 (the tables "
        "above), over the window requests that succeeded (ITL per token), exact. A level "
        "measured more than once shows the mean of its repeats, as the tables above; each "
        "repeat's are in levels.csv and the exports."])


def sections(content) -> list:
    """[(title, Table)] for the report (render.py's ReportContent.sections)."""
    table = percentile_table([content.levels, content.rate_levels])
    return [(TITLE, table)] if table is not None else []
