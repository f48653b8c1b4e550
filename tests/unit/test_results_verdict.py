"""level_verdict (results/level_verdict.py): one rule for llm_bench's sweep and for the report."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import config
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import LevelResult
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import PARTS_DIR
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    CLIENT_LIMITED, EXCLUDED, FAILED, USABLE, level_verdict,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    row_dict,
    STOP_ABORTED, STOP_SERVER_FAILING, STOP_WINDOW_COMPLETE, LevelRow,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report


def level(profile="baseline", c=1, status=None, **extra) -> dict:
    """A finished level as llm_bench returns it: 40 window requests, 50 in the whole level
    (`status`: the optional column of a hand-made levels.csv)."""
    values = dict(host="h1", profile=profile, concurrency=c, requests=40, errors=0, window_s=10.0,
                  output_tok_s=100.0 * c, output_tok_s_ci95=1.0, total_tok_s=None,
                  request_s=None, ttft_p50_ms=20.0, ttft_p90_ms=None, ttft_p99_ms=30.0,
                  tpot_p50_ms=10.0, tpot_p90_ms=None, tpot_p99_ms=12.0, itl_p50_ms=10.0,
                  itl_p99_ms=14.0, e2e_p50_ms=None, e2e_p99_ms=None, goodput_request_s=None,
                  client_limited=False, run_requests=50, run_errors=0,
                  stop_reason=STOP_WINDOW_COMPLETE)
    values.update(extra)
    row = row_dict(LevelRow(**values))
    return row if status is None else dict(row, status=status)


ALL_FAILED = dict(requests=40, errors=40, run_requests=50, run_errors=50, output_tok_s=None,
                  output_tok_s_ci95=None, stop_reason=STOP_SERVER_FAILING,
                  first_error="HTTP 503 Service Unavailable")


@pytest.mark.parametrize("extra, status, reason", [
    ({}, USABLE, ""),
    (ALL_FAILED, FAILED, "all 50 requests failed (first error: HTTP 503 Service Unavailable)"),
    (dict(run_errors=7, errors=7, stop_reason=STOP_SERVER_FAILING, first_error="reset"), FAILED,
     "the server kept failing (7 errors; first: reset)"),
    (dict(requests=0, run_requests=0, output_tok_s=None, stop_reason=STOP_ABORTED), FAILED,
     "no request finished (stop reason: aborted)"),
    (dict(output_tok_s=None), FAILED, "no output measured"),
    (dict(errors=40, run_errors=40), FAILED, "all 40 requests errored"),
    (dict(client_limited=True, errors=30, run_errors=30), CLIENT_LIMITED, "client-limited"),
    (dict(errors=5, run_errors=5), EXCLUDED, "errors 12% > 10%"),
    (dict(errors=4, run_errors=4), USABLE, ""),
    (dict(status="failed"), FAILED, "status failed"),
])
def test_the_rules(extra, status, reason):
    verdict = level_verdict(level(**extra))
    assert (verdict.status, verdict.reason) == (status, reason)
    assert verdict.note == ("failed: " + reason if status == FAILED else reason)


def test_a_frame_row_gets_the_verdict_of_its_typed_row():
    rows = [level(), level(**ALL_FAILED), level(client_limited=True), level(errors=5)]
    frame = pd.DataFrame.from_records(rows)            # None -> NaN, ints -> floats
    for typed, (_index, framed) in zip(rows, frame.iterrows()):
        assert level_verdict(framed) == level_verdict(typed)


def test_an_older_csv_row_without_run_counts_is_judged_by_its_window():
    old = {"host": "h1", "profile": "p", "concurrency": 1, "requests": 200, "errors": 200,
           "output_tok_s": 10.0, "client_limited": False}
    assert level_verdict(old).reason == "all 200 requests errored"


def test_a_failed_level_stops_the_sweep_and_the_report_excludes_it_for_the_same_reason(
        monkeypatch, tmp_path):
    finished = {1: level(c=1), 2: level(c=2, **ALL_FAILED), 4: level(c=4)}
    monkeypatch.setattr(config, "run_level", lambda cfg, workload: LevelResult(
        row=LevelRow(**finished[cfg.concurrency]), requests=[]))
    outcome = config.run_levels([SimpleNamespace(concurrency=c) for c in (1, 2, 4)], None)
    assert [row["concurrency"] for row in outcome.levels] == [1, 2]     # C=4 never ran
    reason = level_verdict(finished[2]).reason
    assert outcome.failure == "C=2: " + reason
    assert "all 50 requests failed" in reason

    for row in outcome.levels:
        write_level_files(str(tmp_path / PARTS_DIR), row, [])
    report = build_report(str(tmp_path), with_plots=False)
    summary = report.files["summary.md"].decode()
    assert f"- baseline on h1 at C=2: failed: {reason}" in summary      # Excluded levels
    [line] = [t for t in report.table.splitlines() if t.startswith("| 2 | baseline |")]
    # A failed level's errors cell counts the whole level (its window may hold none of them).
    assert line.endswith(f"| 50/50 (whole level) | failed: {reason} (excluded) |")


def test_the_sweep_goes_on_past_a_level_the_report_only_leaves_out(monkeypatch):
    finished = {1: level(c=1, client_limited=True), 2: level(c=2, errors=20, run_errors=20)}
    monkeypatch.setattr(config, "run_level", lambda cfg, workload: LevelResult(
        row=LevelRow(**finished[cfg.concurrency]), requests=[]))
    outcome = config.run_levels([SimpleNamespace(concurrency=c) for c in (1, 2)], None)
    assert outcome.failure is None and len(outcome.levels) == 2
