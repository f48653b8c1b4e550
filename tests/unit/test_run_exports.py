"""llm_bench writes levels.parquet and requests.parquet after each level (plugin_utils/
run_exports.py), the bytes bench_report writes; every run's exports have one column set, in one
order, whatever it measured; each level says when it was measured (`date`)."""
from __future__ import annotations

import io
import json
import shutil

import pytest

import reportrun  # tests/ (the root conftest puts it on sys.path)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVELS, PARTS_DIR,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import FIXED_COLUMNS
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    read_parts, rebuild_run_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils import run_exports

pd = pytest.importorskip("pandas", reason="the Parquet exports need pandas (requirements.txt)")
pytest.importorskip("pyarrow", reason="the Parquet exports need pyarrow (requirements.txt)")

# pylint: disable=wrong-import-position
from ansible_collections.servelab.serving.plugins.plugin_utils.report import export  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (  # noqa: E402
    build_report, write_report,
)

PARQUET = (export.LEVELS_PARQUET, export.REQUESTS_PARQUET)


def make_run(tmp_path, name="run-x", server_metrics=None):
    return reportrun.make_run(tmp_path, name=name, profiles=("baseline",), levels=(1, 2),
                              failed_request=False, server_metrics=server_metrics)


def test_llm_bench_alone_leaves_the_parquet_files_bench_report_writes(tmp_path):
    run = make_run(tmp_path)
    outcome = run_exports.write_parquet_exports(str(run))
    assert outcome.note is None and sorted(outcome.written) == sorted(PARQUET)
    alone = {rel: (run / rel).read_bytes() for rel in PARQUET}
    levels = pd.read_parquet(run / export.LEVELS_PARQUET)
    assert list(levels["concurrency"]) == [1, 2] and set(levels["run_id"]) == {"run-x"}
    assert len(pd.read_parquet(run / export.REQUESTS_PARQUET)) > 0
    # bench_report afterwards: the same bytes, nothing rewritten.
    changed = write_report(build_report(str(run)))
    assert not set(PARQUET) & set(changed)
    assert {rel: (run / rel).read_bytes() for rel in PARQUET} == alone
    # A second call with nothing new writes nothing.
    assert run_exports.write_parquet_exports(str(run)).written == []


def test_the_llm_bench_action_writes_them_with_levels_csv(tmp_path):
    from ansible_collections.servelab.serving.plugins.action.llm_bench import ActionModule
    source = make_run(tmp_path / "a")
    run = tmp_path / "b" / "run-x"
    (run / PARTS_DIR).mkdir(parents=True)
    shutil.copy(source / "manifest.json", run / "manifest.json")
    action = ActionModule.__new__(ActionModule)
    for row, jsonl in read_parts(str(source / PARTS_DIR)):
        with open(jsonl, encoding="utf-8") as fh:
            requests = [json.loads(line) for line in fh if line.strip()]
        outcome = action._record_level(str(run), str(run / PARTS_DIR), row, requests, [])
    assert outcome.note is None
    assert (run / LEVELS).is_file()
    assert list(pd.read_parquet(run / export.LEVELS_PARQUET)["concurrency"]) == [1, 2]


def test_without_pandas_or_pyarrow_it_says_why_and_writes_none(tmp_path):
    run = make_run(tmp_path)
    outcome = run_exports.write_parquet_exports(str(run), missing=lambda packages: ["pyarrow"])
    assert outcome.written == [] and not (run / export.LEVELS_PARQUET).exists()
    assert "levels.parquet and requests.parquet not written" in outcome.note
    assert "pyarrow" in outcome.note and "pip install" in outcome.note
    assert "levels.csv and requests.jsonl are written" in outcome.note


def _level_columns(run):
    files = export.export_files(*_inputs(run))
    frame = pd.read_parquet(io.BytesIO(files[export.LEVELS_PARQUET]))
    document = json.loads(files[export.LEVELS_JSON])
    return list(frame.columns), [c["name"] for c in document["columns"]]


def _inputs(run):
    parts = read_parts(str(run / PARTS_DIR))
    manifest = json.loads((run / "manifest.json").read_text())
    return [r for r, _j in parts], [j for _r, j in parts], manifest, "run-x"


def test_two_runs_export_the_same_columns_in_the_same_order(tmp_path):
    # One run with the server's /metrics and GPU telemetry on its rows, one with neither.
    full = make_run(tmp_path / "full", server_metrics=lambda c: {
        "server_running_reqs_mean": float(c), "server_requests_s": 2.0 * c})
    bare = make_run(tmp_path / "bare")
    rows, request_files, manifest, run_id = _inputs(full)
    for row in rows:
        row.update(gpu_power_w_mean=300.0, gpu_samples=10)
    full_files = export.export_files(rows, request_files, manifest, run_id)
    full_parquet = list(pd.read_parquet(
        io.BytesIO(full_files[export.LEVELS_PARQUET])).columns)
    bare_parquet, bare_json = _level_columns(bare)
    assert full_parquet == bare_parquet == bare_json
    assert [n for n, _k, _m in export.DESCRIBING] + list(FIXED_COLUMNS) == bare_parquet
    levels = pd.read_parquet(io.BytesIO(export.export_files(
        *_inputs(bare))[export.LEVELS_PARQUET]))
    assert levels["server_requests_s"].isna().all()     # not measured: null, still a column
    # levels.csv too (rebuilt from the parts by llm_bench).
    rebuild_run_files(str(full))
    rebuild_run_files(str(bare))
    assert (full / LEVELS).read_text().splitlines()[0] == (
        bare / LEVELS).read_text().splitlines()[0] == ",".join(FIXED_COLUMNS)


def test_the_exports_carry_date_and_the_vllm_e2e_mean(tmp_path):
    run = make_run(tmp_path)
    rows, request_files, manifest, run_id = _inputs(run)
    for row in rows:      # as llm_bench measures it; older rows have only the wall clock
        row["window_start_unix_ns"] = 1_700_000_000 * 10**9
        row.pop("date", None)
    files = export.export_files(rows, request_files, manifest, run_id)
    levels = json.loads(files[export.LEVELS_JSON])["levels"]
    assert {lv["date"] for lv in levels} == {"20231114-221320"}
    assert all(lv["e2e_mean_ms"] is not None and lv["ttft_std_ms"] is not None for lv in levels)
    peers = [json.loads(data)[0] for rel, data in files.items() if rel.endswith("summary.json")]
    assert len(peers) == 2
    for record, level in zip(sorted(peers, key=lambda r: r["max_concurrency"]), levels):
        assert record["date"] == "20231114-221320"
        assert record["mean_e2el_ms"] == pytest.approx(level["e2e_mean_ms"])
        assert record["std_e2el_ms"] == pytest.approx(level["e2e_std_ms"])
