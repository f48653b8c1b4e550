"""Percentiles chosen by the user (issue 28 item 6a; results/percentiles.py): llm_bench's
`percentiles` / bench_percentiles, checked before anything runs (the error names the option, and
the preflight the variable); each adds a column per figure, named as the fixed ones, after
FIXED_COLUMNS in one stable order, in levels.csv, levels.json (and its schema), levels.parquet,
the vLLM sweep export (vLLM's p<q>_<metric>_ms) and the report's table; exact, as the fixed
percentiles."""
from __future__ import annotations

import csv
import json

import jsonschema
import pandas as pd
import pytest

import reportrun  # tests/ (the root conftest puts it on sys.path)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    BenchOptionsError, level_configs,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    RequestTiming, level_row, percentile, reduce_requests,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVELS
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    FIXED_COLUMNS, csv_columns, field_of, row_dict,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    levels_csv, read_levels_csv, rebuild_run_files,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.percentiles import (
    check_percentiles, percentile_column, percentile_columns,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report import export, peer_export
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report, write_report
from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import load_run
from ansible_collections.servelab.serving.plugins.plugin_utils.report.percentile_table import (
    TITLE, percentile_table,
)

MS = 1_000_000


def options(**given):
    return dict(dict(base_url="http://127.0.0.1:9", model="m", concurrency=[1, 2]), **given)


@pytest.mark.parametrize("value, needle", [
    ([0], "percentiles: 0 is not strictly between 0 and 100"),
    ([100], "percentiles: 100 is not strictly between 0 and 100"),
    ([95, -1], "percentiles: -1 is not strictly between 0 and 100"),
    (["p95"], "percentiles: 'p95' is not a number"),
    ([True], "percentiles: True is not a number"),
    ([99, 99.0], "percentiles: 99.0 is given twice"),
    ("95", "percentiles: expected a list of numbers"),
])
def test_bad_percentiles_are_refused_naming_the_option(value, needle):
    with pytest.raises(BenchOptionsError) as exc:
        level_configs(options(percentiles=value), read_workload=False)
    assert needle in str(exc.value)


def test_good_percentiles_reach_every_level():
    configs, _workload = level_configs(options(percentiles=[99.9, 95]), read_workload=False)
    assert [c.percentiles for c in configs] == [[99.9, 95]] * 2
    assert check_percentiles(None) is None and check_percentiles([]) is None
    assert level_configs(options(), read_workload=False)[0][0].percentiles is None


def test_the_preflight_names_the_variable():
    from test_preflight import host, only, run      # tests/unit (on sys.path under pytest)
    msg = only(run(host(bench_percentiles=[95, 100])), "bench_percentiles")
    assert "100.0 is not strictly between 0 and 100" in msg and "fix bench_percentiles" in msg


def test_names_as_the_fixed_ones_and_as_vllm_writes_q():
    assert percentile_column("ttft", 95) == "ttft_p95_ms"
    assert percentile_column("itl", 99.9) == "itl_p99.9_ms"
    assert percentile_column("e2e", 95.0) == "e2e_p95_ms"
    assert field_of("itl_p99.9_ms").vllm == ("p99.9_itl_ms",)
    assert field_of("e2e_p95_ms").vllm == ("p95_e2el_ms",)      # vLLM's name for E2E
    assert field_of("ttft_p95_ms").unit == "ms" and field_of("ttft_p95_ms").header == "TTFT p95"
    # The fixed ones stay the table's own; non-canonical spellings are no chosen column.
    assert field_of("ttft_p99_ms").meaning.startswith("time to first token, p99")
    assert field_of("ttft_p95.0_ms") is None and field_of("ttft_p100_ms") is None


def test_a_stable_order_after_the_fixed_columns():
    names = ["e2e_p99.9_ms", "ttft_p99.9_ms", "ttft_p5_ms", "itl_p95_ms", "status",
             "ttft_p95_ms", "tpot_p95_ms", "ttft_p99_ms"]
    assert percentile_columns(names) == ["ttft_p5_ms", "ttft_p95_ms", "ttft_p99.9_ms",
                                         "tpot_p95_ms", "itl_p95_ms", "e2e_p99.9_ms"]
    # The fixed columns come first whatever the run chose; without a choice, only they.
    assert csv_columns((), names)[:len(FIXED_COLUMNS)] == list(FIXED_COLUMNS)
    assert csv_columns((), ["status"]) == list(FIXED_COLUMNS)


def _requests(n=200):
    out = []
    for i in range(n):
        send = (i + 1) * MS
        times = [send + (10 + i % 37) * MS + k * (3 + (i * k) % 7) * MS for k in range(6)]
        out.append(RequestTiming(worker=0, request_id=i, t_send=send, t_first=times[0],
                                 t_last=times[-1], prompt_tokens=5, completion_tokens=6,
                                 tokens_source="server", chunks=6, chunk_times=times,
                                 chunk_tokens=[1] * 6, in_window=True))
    return out


def test_the_level_row_has_them_exact_and_flattened():
    reqs = _requests()
    part = reduce_requests(reqs, 1, 10**12, 2, {})
    row = row_dict(level_row("h", "p", 1, part, {}, percentiles=[99.9, 95, 50]))
    ttft = sorted(r.t_first - r.t_send for r in reqs)
    assert row["ttft_p95_ms"] == round(percentile(ttft, 95) / MS, 5)
    assert row["ttft_p99.9_ms"] == round(percentile(ttft, 99.9) / MS, 5)
    # 50 is a fixed column already: no duplicate; every figure has its columns.
    assert "ttft_p50.0_ms" not in row and "ttft_p50_ms" in row
    assert percentile_columns(row) == [percentile_column(m, q) for m in ("ttft", "tpot", "itl", "e2e")
                                       for q in (95, 99.9)]
    assert "extra_percentiles" not in row
    # Without a choice the row has the fixed columns only.
    assert percentile_columns(row_dict(level_row("h", "p", 1, part, {}))) == []


def _run_with_percentiles(tmp_path, qs=(95, 99.9)):
    """reportrun's run, its level rows measured with `qs` chosen (levels.csv rebuilt)."""
    run = reportrun.make_run(tmp_path, profiles=("baseline",), levels=(1, 2))
    parts = run / "parts"
    for part in parts.glob("*.json"):
        doc = json.loads(part.read_text())
        c = doc["level"]["concurrency"]
        reqs = reportrun.level_requests(0, c)
        ws, we = reportrun.WINDOW
        fresh = row_dict(level_row("gpu1", "baseline", c, reduce_requests(reqs, ws, we, 5, {}),
                                   {}, percentiles=list(qs)))
        doc["level"].update({k: v for k, v in fresh.items() if k in percentile_columns(fresh)})
        part.write_text(json.dumps(doc))
    rebuild_run_files(str(run))
    return run


def test_levels_csv_and_the_exports_carry_them(tmp_path):
    run = _run_with_percentiles(tmp_path)
    extra = [percentile_column(m, q) for m in ("ttft", "tpot", "itl", "e2e") for q in (95, 99.9)]
    with open(run / LEVELS, newline="") as fh:
        header = next(csv.reader(fh))
    assert header == list(FIXED_COLUMNS) + extra
    rows = read_levels_csv(str(run / LEVELS))
    assert all(isinstance(r["itl_p99.9_ms"], float) for r in rows)     # read back typed
    assert levels_csv(rows).splitlines()[0].split(",") == header        # and written again
    write_report(build_report(str(run)))
    document = json.loads((run / export.LEVELS_JSON).read_text())
    jsonschema.validate(document, json.loads((run / export.LEVELS_SCHEMA).read_text()))
    names = [c["name"] for c in document["columns"]]
    assert names[names.index("ttft_p95_ms"):names.index("ttft_p95_ms") + len(extra)] == extra
    units = {c["name"]: (c["type"], c.get("unit")) for c in document["columns"]}
    assert units["e2e_p99.9_ms"] == ("number", "ms")
    levels = pd.read_parquet(run / export.LEVELS_PARQUET)
    assert str(levels["tpot_p95_ms"].dtype) == "float64"
    assert list(levels["ttft_p95_ms"]) == [r["ttft_p95_ms"] for r in rows]
    records = {rec["max_concurrency"]: rec
               for path in (run / peer_export.PEER_DIR).glob("*/summary.json")
               for rec in json.loads(path.read_text())}
    for row in rows:
        record = records[row["concurrency"]]
        assert record["p95_ttft_ms"] == row["ttft_p95_ms"]
        assert record["p99.9_e2el_ms"] == row["e2e_p99.9_ms"]
        assert record["p99.9_itl_ms"] == row["itl_p99.9_ms"]
        assert record["p95_tpot_ms"] == row["tpot_p95_ms"]


def test_the_report_shows_them_in_a_table_of_their_own(tmp_path):
    run = _run_with_percentiles(tmp_path)
    table = percentile_table([load_run(str(run)).levels])
    assert table.headers == ["level", "profile", "TTFT p95 / p99.9 ms", "TPOT p95 / p99.9 ms",
                             "ITL p95 / p99.9 ms", "E2E p95 / p99.9 ms"]
    rows = read_levels_csv(str(run / LEVELS))
    assert [row[:2] for row in table.rows] == [["C=1", "baseline"], ["C=2", "baseline"]]
    assert table.rows[0][2] == "%.1f / %.1f" % (rows[0]["ttft_p95_ms"], rows[0]["ttft_p99.9_ms"])
    write_report(build_report(str(run)))
    text = (run / "summary.md").read_text()
    assert "## %s" % TITLE in text and "| TTFT p95 / p99.9 ms |" in text
    # A run that chose none has no such table.
    plain = reportrun.make_run(tmp_path, name="plain", profiles=("baseline",), levels=(1,))
    assert percentile_table([load_run(str(plain)).levels]) is None
    write_report(build_report(str(plain)))
    assert TITLE not in (plain / "summary.md").read_text()
