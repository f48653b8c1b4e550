"""The vLLM `bench sweep` export bench_report writes beside report.html (peer_export.py): one
vllm_sweep/SERVE-...-BENCH-.../summary.json per level, each a list of one flat run record with
the keys `vllm bench sweep plot` and `plot_pareto` read, in vLLM's units (ms, tok/s, request/s),
equal to servelab's own figures."""
from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.report import peer_export
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report, write_report

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_report_export import make_run  # noqa: E402

# What vLLM 0.33.0's plotters read from a record: plot's default axes, plot_pareto's throughput
# and user count, and the keys `vllm bench serve --save-result --percentile-metrics
# ttft,tpot,itl,e2el` writes that servelab measures.
VLLM_KEYS = {
    "total_token_throughput", "median_ttft_ms", "output_throughput", "max_concurrency",
    "request_throughput", "duration", "completed", "failed", "num_prompts",
    "total_input_tokens", "total_output_tokens", "request_rate", "burstiness", "model_id",
    "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms",
    "run_number", "mean_e2el_ms", "std_ttft_ms", "std_tpot_ms", "std_itl_ms", "std_e2el_ms",
    "date",
}
# vLLM key -> servelab level column: the same figure in the same unit.
SAME = {
    "output_throughput": "output_tok_s", "total_token_throughput": "total_tok_s",
    "request_throughput": "request_s", "duration": "window_s",
    "mean_ttft_ms": "ttft_mean_ms", "median_ttft_ms": "ttft_p50_ms",
    "p90_ttft_ms": "ttft_p90_ms", "p99_ttft_ms": "ttft_p99_ms",
    "mean_tpot_ms": "tpot_mean_ms", "median_tpot_ms": "tpot_p50_ms",
    "p99_tpot_ms": "tpot_p99_ms", "mean_itl_ms": "itl_mean_ms", "median_itl_ms": "itl_p50_ms",
    "p99_itl_ms": "itl_p99_ms", "median_e2el_ms": "e2e_p50_ms", "p99_e2el_ms": "e2e_p99_ms",
    "mean_e2el_ms": "e2e_mean_ms", "std_ttft_ms": "ttft_std_ms", "std_tpot_ms": "tpot_std_ms",
    "std_itl_ms": "itl_std_ms", "std_e2el_ms": "e2e_std_ms", "date": "date",
    "max_concurrency": "concurrency", "profile": "profile", "host": "host",
    "gpu_count": "gpu_count", "model_id": "model", "engine": "engine",
}


def sweep_records(run):
    """Every record under vllm_sweep/, as vLLM's plotters gather them (rglob **/summary.json)."""
    found = {}
    for path in sorted(pathlib.Path(run, peer_export.PEER_DIR).rglob("**/summary.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert isinstance(data, list) and len(data) == 1
        found[path.relative_to(run).as_posix()] = data[0]
    return found


def test_each_level_is_a_vllm_sweep_summary_with_servelab_figures(tmp_path):
    run = make_run(tmp_path)
    changed = write_report(build_report(str(run)))
    records = sweep_records(run)
    expected = {
        "vllm_sweep/SERVE--host=gpu1-profile=%s-BENCH--max_concurrency=%d/summary.json" % (p, c)
        for p in ("baseline", "eagle3") for c in (1, 2, 4)
    }
    assert set(records) == expected
    assert expected <= set(changed)
    levels = json.loads((run / "levels.json").read_text())["levels"]
    by_level = {(lv["profile"], lv["concurrency"]): lv for lv in levels}
    for record in records.values():
        assert VLLM_KEYS <= set(record)
        level = by_level[(record["profile"], record["max_concurrency"])]
        for key, name in SAME.items():
            want = level[name]
            assert record[key] == (pytest.approx(want) if isinstance(want, float) else want), key
        assert record["completed"] == level["requests"] - level["errors"]
        assert record["failed"] == level["errors"] and record["num_prompts"] == level["requests"]
        assert record["total_output_tokens"] == round(level["output_tok_s"] * level["window_s"])
        prompt = round((level["total_tok_s"] - level["output_tok_s"]) * level["window_s"])
        assert record["total_input_tokens"] == (prompt if prompt >= 0 else None)
        assert record["request_rate"] == "inf"            # closed loop, as vLLM writes it
        assert record["run_id"] == "run-x" and record["time_scale"] == 20.0
        assert record["gpu_name"] == "NVIDIA H200" and record["run_number"] == 0
        assert record["request_goodput"] is None          # no SLO given: none, as vLLM writes
        assert record["mean_e2el_ms"] is not None and record["std_ttft_ms"] is not None
    baseline_4 = records[
        "vllm_sweep/SERVE--host=gpu1-profile=baseline-BENCH--max_concurrency=4/summary.json"]
    assert baseline_4["output_throughput"] == pytest.approx(400.0)
    assert baseline_4["tokens_source"] == "server" and baseline_4["client_limited"] is False


def test_a_rebuild_writes_no_peer_file_again(tmp_path):
    run = make_run(tmp_path, profiles=("baseline",))
    first = write_report(build_report(str(run)))
    assert any(rel.startswith(peer_export.PEER_DIR + os.sep) for rel in first)
    again = write_report(build_report(str(run)))
    assert not [rel for rel in again if rel.startswith(peer_export.PEER_DIR)]
    text = next(iter(sweep_records(run)))
    raw = (run / text).read_text(encoding="utf-8")
    assert list(json.loads(raw)[0]) == sorted(json.loads(raw)[0])    # sorted keys


def row(**extra):
    base = {"host": "h1", "profile": "p", "concurrency": 8, "requests": 10, "errors": 1,
            "window_s": 2.0, "output_tok_s": 50.0, "total_tok_s": 75.0, "request_s": 5.0,
            "ttft_p50_ms": 12.5, "ttft_p99_ms": float("nan"), "load_mode": "concurrency",
            "output_tok_s_ci95": float("nan")}
    base.update(extra)
    return base


def test_open_loop_levels_carry_their_rate_and_unmeasured_levels_are_left_out():
    files = peer_export.peer_files(
        [row(load_mode="rate", request_rate=20.0), row(load_mode="rate", request_rate=40.0),
         row(concurrency=16, output_tok_s=None)],
        [], {}, "r1")
    assert sorted(files) == [
        os.path.join("vllm_sweep", "SERVE--host=h1-profile=p-BENCH--max_concurrency=8-"
                     "request_rate=%s" % rate, "summary.json") for rate in ("20.0", "40.0")]
    record = json.loads(files[sorted(files)[0]])[0]
    assert record["request_rate"] == 20.0 and record["max_concurrency"] == 8
    assert record["p99_ttft_ms"] is None and record["output_tok_s_ci95"] is None   # NaN: null
    assert record["median_ttft_ms"] == 12.5 and record["completed"] == 9
    assert record["total_output_tokens"] == 100 and record["total_input_tokens"] == 50
    assert record["engine"] is None and record["run_id"] == "r1"


def test_a_slash_in_a_name_does_not_make_a_directory():
    files = peer_export.peer_files([row(profile="a/../b")], [], {}, "r1")
    assert len(files) == 1
    path = next(iter(files))
    assert path.count(os.sep) == 2 and ".." not in path
