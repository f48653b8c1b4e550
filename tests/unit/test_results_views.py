"""One level row, three views: llm_bench's progress line, the callback's line, the report's table.

All three are rendered from results/levels.py's field table, so they show a level's figures with
the same digits; before, the progress line printed TPOT with two decimals, the callback with one
and "(±x)", and the report its own way.
"""
from __future__ import annotations

from types import SimpleNamespace

from ansible_collections.servelab.serving.plugins.callback import progress as servelab_callback
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import PARTS_DIR
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import (
    cell_header, format_value, level_line, table_cells, view_headers,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    row_dict,
    LAYOUTS, VIEW_LINE, VIEW_TABLE, LevelRow,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report

# Figures whose last digits a careless format would round differently.
FIGURES = dict(output_tok_s=1234.5678, output_tok_s_ci95=12.3456, ttft_p50_ms=25.4567,
               ttft_p99_ms=61.05, tpot_p50_ms=11.14567, tpot_p99_ms=14.96, itl_p50_ms=10.05,
               itl_p99_ms=30.449, requests=40, errors=3, window_s=10.04)


def level(profile="eagle3", c=4, **extra) -> dict:
    values = dict(host="ct129", profile=profile, concurrency=c, total_tok_s=None,
                  request_s=None, ttft_p90_ms=None, tpot_p90_ms=None, e2e_p50_ms=None,
                  e2e_p99_ms=None, goodput_request_s=None, client_limited=False,
                  run_requests=50, run_errors=3)
    values.update(FIGURES)
    values.update(extra)
    return row_dict(LevelRow(**values))


class Display:
    def __init__(self):
        self.lines = []

    def display(self, msg="", color=None, **kwargs):
        self.lines.append(str(msg))


def callback_lines(row: dict) -> list:
    display = Display()
    cb = servelab_callback.CallbackModule()
    cb._display = display
    task = SimpleNamespace(name="servelab: sweep", action="servelab.serving.llm_bench",
                           get_name=lambda: "servelab: sweep")
    cb.v2_runner_on_ok(SimpleNamespace(task=task, host=SimpleNamespace(name="ct129"),
                                       result={"levels": [row]}))
    return [line.split("servelab |   ", 1)[1] for line in display.lines if "|   " in line]


def report_row(tmp_path, row: dict) -> dict:
    """The report table's cells for `row` (with a baseline beside it, as in a real run)."""
    parts = tmp_path / PARTS_DIR
    write_level_files(str(parts), row, [])
    write_level_files(str(parts), level("baseline", output_tok_s=1000.0), [])
    table = build_report(str(tmp_path), with_plots=False).table.splitlines()
    headers = [h.strip() for h in table[0].strip("|").split("|")]
    [line] = [t for t in table if "| eagle3 |" in t]
    return dict(zip(headers, (c.strip() for c in line.strip("|").split("|"))))


def test_progress_line_callback_and_report_show_the_same_figures(tmp_path):
    row = level()
    line = level_line(row)
    assert callback_lines(row) == [line]          # the callback prints llm_bench's line
    cells = report_row(tmp_path, row)
    tok_s = f"{format_value('output_tok_s', 1234.5678)} ± {format_value('output_tok_s_ci95', 12.3456)}"
    assert tok_s == "1234.6 ± 12.3"
    assert cells["output tok/s ± CI95"] == tok_s and f"output {tok_s} tok/s" in line
    assert cells["TTFT p50 / p99 ms"] == "25.5 / 61.0" and "TTFT p50 25.5 ms" in line
    assert cells["TPOT p50 / p99 ms"] == "11.1 / 15.0" and "TPOT p50 11.1 ms" in line
    assert cells["errors/requests"] == "3/40" and "errors 3/40" in line
    # Every figure of the line is a figure of the table, formatted alike.
    table = table_cells(row, VIEW_TABLE)
    for cell in LAYOUTS[VIEW_LINE]:
        for name in cell.fields:
            if name != "window_s":
                assert any(format_value(name, row[name]) in text for text in table.values())


def test_the_line_says_what_the_report_will_say(tmp_path):
    row = level(client_limited=True, window_complete=False, stop_reason="level_timeout reached")
    line = level_line(row)
    cells = report_row(tmp_path, row)
    assert line.endswith("| client-limited; window incomplete (level_timeout reached)")
    assert cells["notes"].startswith("client-limited (excluded); window incomplete "
                                     "(level_timeout reached)")
    rate = level(load_mode="rate", request_rate=2.5)
    assert level_line(rate).startswith("ct129/eagle3 rate=2.50/s: output 1234.6 ± 12.3 tok/s")


def test_headers_come_from_the_fields():
    assert view_headers(VIEW_TABLE) == [
        "output tok/s ± CI95", "TTFT p50 / p99 ms", "TPOT p50 / p99 ms", "ITL p50 / p99 ms",
        "errors/requests"]
    assert [cell_header(c) for c in LAYOUTS[VIEW_LINE]][-1] == "window s"


def test_missing_figures_show_as_missing():
    partial = {"profile": "p", "concurrency": 2, "output_tok_s": None, "output_tok_s_ci95": 3.0}
    assert table_cells(partial, VIEW_TABLE)["output tok/s ± CI95"] == "-"   # never "- ± 3.0"
    assert table_cells(partial, VIEW_TABLE)["errors/requests"] == "-"
    line = level_line(partial)
    assert line.startswith("?/p C=2: output - tok/s, TTFT p50 - ms")
    assert "failed: no output measured" in line
