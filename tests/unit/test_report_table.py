"""plugin_utils/report/table.py: one Table written as Markdown (the report, the benchmarks) and
as aligned text (the progress callback, the benchmarks' terminal output)."""
from __future__ import annotations

from ansible_collections.servelab.serving.plugins.plugin_utils.report import render
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table


def test_to_text_aligns_columns_right_aligns_numbers_and_drops_trailing_spaces():
    table = Table(["host", "C", "note"], [["gpu1", "8", ""], ["a-long-host", "128", "capped"]])
    assert table.to_text(right=[False, True]).split("\n") == [
        "host           C  note",
        "-----------  ---  ------",
        "gpu1           8",
        "a-long-host  128  capped",
    ]


def test_to_text_puts_footnotes_after_a_blank_line():
    assert Table(["a"], [["1"]], ["* note"]).to_text() == "a\n-\n1\n\n* note"


def test_markdown_is_the_reports_and_escapes_pipes():
    table = Table(["a", "b"], [["x|y", "2"]], ["note"])
    assert table.to_markdown() == "| a | b |\n|---|---|\n| x\\|y | 2 |\n\nnote"
    assert render.to_markdown(table) == table.to_markdown()
    assert render.Table is Table
    assert "<td>x|y</td>" in render.to_html(table)


def test_padded_markdown_is_the_same_table_aligned_as_reap_bench_prints_it():
    table = Table(["method", "trials", "median s"], [["servelab", "5", "0.123"],
                                                     ["field", "12", "1.500"]])
    assert table.to_markdown(right=[False, True, True]).split("\n") == [
        "| method   | trials | median s |",
        "|----------|--------|----------|",
        "| servelab |      5 |    0.123 |",
        "| field    |     12 |    1.500 |",
    ]
