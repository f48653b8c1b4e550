"""The level row's field table (results/levels.py): one definition per levels.csv column."""
from __future__ import annotations

import dataclasses

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.server_metrics import (
    COUNTERS, GAUGES, window_figures,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVEL_COLUMNS
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import (
    format_value,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    FIELD, FIELDS, SUMMARY_FIELDS, KIND_BOOL, KIND_FLOAT, KIND_INT, KIND_STR, LAYOUTS, ROW_COLUMNS, VIEW_CSV,
    VIEW_LINE, VIEW_RATE_TABLE, VIEW_REPEATS, VIEW_TABLE, FIXED_COLUMNS, LevelRow, csv_columns,
    row_dict,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    levels_csv, read_levels_csv,
)


def every_server_figure() -> dict:
    """What window_figures gives when the server exports every metric it knows."""
    names = [n for names in list(GAUGES.values()) + list(COUNTERS.values()) for n in names]
    names += ["vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total"]
    before = {n: 1.0 for n in names}
    after = {n: 5.0 for n in names}
    return window_figures([(0, before), (5, after), (10, after)], 1, 9)


def full_row(**extra) -> LevelRow:
    values = {}
    for f in dataclasses.fields(LevelRow):
        kind = FIELD[f.name].kind if f.name in FIELD else None
        values[f.name] = {KIND_STR: "x", KIND_INT: 3, KIND_FLOAT: 1.25, KIND_BOOL: True}.get(kind)
    values.update(host="h1", profile="eagle3", concurrency=4, load_mode="concurrency",
                  server_metrics=every_server_figure())
    values.update(extra)
    return LevelRow(**values)


def test_every_levels_csv_column_has_a_field_and_every_field_a_column():
    figures = every_server_figure()
    assert set(figures) == {f.name for f in FIELDS if f.server}   # the server figures, exactly
    header = levels_csv([row_dict(full_row())]).splitlines()[0].split(",")
    assert header == [f.name for f in FIELDS]
    # FIELD also defines the report's repeats summary figures, which are no levels.csv column.
    assert sorted(header + [f.name for f in SUMMARY_FIELDS]) == sorted(FIELD)
    assert not set(header) & {f.name for f in SUMMARY_FIELDS}
    # The row's own fields are LevelRow's, in its order; server_metrics is the server columns,
    # extra_percentiles the chosen percentiles' columns (results/percentiles.py).
    row_fields = [f.name for f in dataclasses.fields(LevelRow)
                  if f.name not in ("server_metrics", "extra_percentiles")]
    assert [f.name for f in FIELDS if not f.server] == row_fields


def test_the_contract_columns_come_first_in_their_order():
    assert ROW_COLUMNS[:len(LEVEL_COLUMNS)] == tuple(LEVEL_COLUMNS)
    assert csv_columns()[:len(LEVEL_COLUMNS)] == list(LEVEL_COLUMNS)
    # A server figure the field table does not know is kept (after the known ones), not dropped.
    assert csv_columns(["server_new_gauge", "server_requests_s"]) == list(FIXED_COLUMNS) + [
        "server_new_gauge"]


def test_one_column_set_whatever_the_run_measured():
    # Every known server figure is a column whether or not the server had /metrics.
    assert csv_columns() == csv_columns(["server_requests_s"]) == list(FIXED_COLUMNS)
    assert set(every_server_figure()) <= set(FIXED_COLUMNS)
    without = row_dict(full_row(server_metrics={}))
    bare = levels_csv([without]).splitlines()
    full = levels_csv([row_dict(full_row())]).splitlines()
    assert bare[0] == full[0] == ",".join(FIXED_COLUMNS)
    assert len(bare[1].split(",")) == len(FIXED_COLUMNS)     # not measured: an empty cell


def test_every_field_is_defined_and_formats_its_values():
    sample = {KIND_STR: "text", KIND_INT: 7, KIND_FLOAT: 2.5, KIND_BOOL: False}
    for f in FIELDS + SUMMARY_FIELDS:
        assert f.header and f.meaning, f.name
        assert f.title.endswith(f.unit) and f.title.startswith(f.header)
        assert format_value(f.name, sample[f.kind]) not in ("", "-"), f.name
        assert format_value(f.name, None) == "-" and format_value(f.name, float("nan")) == "-"
    assert format_value("client_cpu_util", 0.914) == "91%"
    assert format_value("tpot_p50_ms", 11.14567) == "11.1"
    assert format_value("requests", 40.0) == "40"      # a frame's float count is still a count


def test_views_say_where_a_field_is_shown():
    assert FIELD["output_tok_s"].views == (VIEW_CSV, VIEW_LINE, VIEW_TABLE, VIEW_RATE_TABLE,
                                           VIEW_REPEATS)
    assert FIELD["itl_p99_ms"].views == (VIEW_CSV, VIEW_TABLE)
    assert FIELD["e2e_p50_ms"].views == (VIEW_CSV,)
    assert FIELD["concurrency"].views == (VIEW_CSV, VIEW_LINE, VIEW_TABLE, VIEW_RATE_TABLE,
                                          VIEW_REPEATS)
    # The repeats summary's own figures are shown by its view only, never in levels.csv.
    assert FIELD["output_tok_s_sd"].views == (VIEW_REPEATS,)
    for view, cells in LAYOUTS.items():
        for cell in cells:
            assert all(view in FIELD[name].views for name in cell.fields)


def test_levels_csv_reads_back_typed(tmp_path):
    rows = [row_dict(full_row()),
            row_dict(full_row(concurrency=8, first_error=None, output_tok_s=None,
                              client_limited=False, window_complete=False,
                              server_metrics={}))]
    path = tmp_path / "levels.csv"
    path.write_text(levels_csv(rows), encoding="utf-8")
    assert read_levels_csv(str(path)) == rows


@pytest.mark.parametrize("cell, expected", [
    ("", None), ("nan", None), ("4", 4), ("4.0", 4), ("x", None),
])
def test_a_csv_count_reads_as_an_int_or_none(tmp_path, cell, expected):
    path = tmp_path / "levels.csv"
    path.write_text("host,profile,concurrency,requests,status\nh,p,1,%s,ok\n" % cell)
    [row] = read_levels_csv(str(path))
    assert row["requests"] == expected and row["status"] == "ok" and "errors" not in row
