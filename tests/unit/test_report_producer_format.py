"""bench_report reads what llm_bench writes: its part files, and levels.csv for runs without them.

The producer writes booleans as true/false, None as empty cells, extra columns (load_mode,
itl_basis, tokens_source, window_complete, ...) and server_* columns; the report must take all of
that, keep open-loop rows apart, and still find the formula's crossover. From the typed parts it
must make the very report the CSV gives, and keep what the CSV cannot say.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVELS, PARTS_DIR, REQUESTS,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import LevelRow, row_dict
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    levels_csv, read_levels_csv, rebuild_run_files, write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report
from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import load_levels

SWEEP = [1, 2, 5, 10, 30]


def baseline(c):
    return 90.0 * c


def spec(c):
    return 180.0 + 40.0 * c


def row(profile, c, tok_s, **extra):
    values = dict(
        host="ct129",
        profile=profile,
        concurrency=c,
        requests=40,
        errors=0,
        window_s=10.0,
        output_tok_s=tok_s,
        output_tok_s_ci95=tok_s / 40,
        total_tok_s=tok_s * 2,
        request_s=c / 3.0,
        ttft_p50_ms=25.0 * c,
        ttft_p90_ms=None,
        ttft_p99_ms=60.0 * c,
        tpot_p50_ms=11.0,
        tpot_p90_ms=None,
        tpot_p99_ms=14.0,
        itl_p50_ms=10.0,
        itl_p99_ms=30.0,
        e2e_p50_ms=900.0,
        e2e_p99_ms=1500.0,
        goodput_request_s=None,
        client_limited=False,
        server_metrics={"server_spec_accept_length": 2.5},
    )
    values.update(extra)
    return row_dict(LevelRow(**values))


@pytest.fixture
def run_dir(tmp_path):
    rows = []
    for c in SWEEP:
        rows.append(row("baseline", c, baseline(c)))
        rows.append(row("eagle3", c, spec(c), itl_basis="chunk" if c == 1 else "token"))
    # An open-loop level at the same concurrency cap as a closed-loop one: must not collide.
    rows.append(row("baseline", 30, 1.0, load_mode="rate", request_rate=2.5))
    (tmp_path / LEVELS).write_text(levels_csv(rows))
    return str(tmp_path)


def test_producer_csv_gives_the_formula_crossover(run_dir):
    report = build_report(run_dir, with_plots=False)
    first_below = next(c for c in SWEEP if spec(c) < baseline(c))
    assert report.crossover == {"eagle3": {"ct129": first_below}}
    [detail] = report.crossover_details
    assert detail["estimate"] == pytest.approx(180.0 / (90.0 - 40.0))
    assert report.warnings == []


def test_open_loop_rows_are_reported_apart(run_dir):
    report = build_report(run_dir, with_plots=False)
    assert all(p["profile_tok_s"] != 1.0 and p["baseline_tok_s"] != 1.0 for p in report.speedup)
    summary = report.files["summary.md"].decode()
    section = summary.split("## Open-loop levels (request rate)", 1)[1]
    assert "| ct129 | baseline | 2.50 | 30 | 1.0" in section


def test_chunk_itl_is_labelled(run_dir):
    report = build_report(run_dir, with_plots=False)
    [line] = [t for t in report.table.splitlines() if t.startswith("| 1 | eagle3 |")]
    assert "ITL per chunk" in line


def test_request_errors_are_summarised_without_cancelled_tails(run_dir):
    records = [{"host": "ct129", "profile": "eagle3", "concurrency": 5, "error": "HTTP 503"}] * 3
    records += [
        {"host": "ct129", "profile": "eagle3", "concurrency": 5, "error": "cancelled: level over"}
    ] * 7
    records += [{"host": "ct129", "profile": "eagle3", "concurrency": 5, "error": None}] * 5
    with open(os.path.join(run_dir, "requests.jsonl"), "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in records)
    summary = build_report(run_dir, with_plots=False).files["summary.md"].decode()
    assert "eagle3 on ct129 at C=5: request errors: 3x HTTP 503" in summary
    assert "cancelled" not in summary


# --- the typed parts: what llm_bench writes first, and what the report reads -----------------


def parts_run(directory, rows, requests_by_level):
    """A run as llm_bench leaves it: part files, then levels.csv and requests.jsonl from them."""
    for row, records in zip(rows, requests_by_level):
        write_level_files(os.path.join(directory, PARTS_DIR), row, records)
    rebuild_run_files(str(directory))
    return str(directory)


def sweep_rows():
    rows = []
    for c in SWEEP:
        rows.append(row("baseline", c, baseline(c)))
        rows.append(row("eagle3", c, spec(c), itl_basis="chunk" if c == 1 else "token"))
    rows[3].update(client_limited=True)
    rows[5].update(errors=40, run_requests=40, run_errors=40, output_tok_s=None,
                   stop_reason="server failing", first_error="HTTP 503", window_complete=False)
    rows.append(row("baseline", 30, 1.0, load_mode="rate", request_rate=2.5))
    return rows


def records_for(r):
    failing = r["errors"] or 0
    return [{"host": r["host"], "profile": r["profile"], "concurrency": r["concurrency"],
             "error": "HTTP 503" if i < failing else None} for i in range(max(failing, 2))]


def test_report_from_parts_equals_report_from_levels_csv(tmp_path):
    rows = sweep_rows()
    run = parts_run(tmp_path / "a" / "run-1", rows, [records_for(r) for r in rows])
    csv_only = tmp_path / "b" / "run-1"      # the same run id, no parts (an older run)
    os.makedirs(csv_only)
    for name in (LEVELS, REQUESTS):
        shutil.copy(os.path.join(run, name), csv_only / name)
    from_parts = build_report(run)
    from_csv = build_report(str(csv_only))
    assert from_parts.files.keys() == from_csv.files.keys()
    for name, data in from_parts.files.items():
        assert data.replace(run.encode(), b"RUN") == from_csv.files[name].replace(
            str(csv_only).encode(), b"RUN"), name
    summary = from_parts.files["summary.md"].decode()
    assert "eagle3 on ct129 at C=5: request errors: 40x HTTP 503" in summary   # parts' .jsonl


def test_the_parts_are_read_before_a_stale_levels_csv(tmp_path):
    """levels.csv is rebuilt after each part; a rebuild that did not happen (lock timeout, a
    crash between the two writes) must not hide a finished level from the report."""
    rows = sweep_rows()
    run = parts_run(tmp_path, rows[:-3], [[] for _row in rows[:-3]])
    for r in rows[-3:]:
        write_level_files(os.path.join(run, PARTS_DIR), r, [])
    exported = {(r["profile"], r["concurrency"]) for r in read_levels_csv(
        os.path.join(run, LEVELS))}
    assert ("eagle3", 30) not in exported and ("baseline", 30) not in exported
    report = build_report(run, with_plots=False)
    lines = report.table.splitlines()
    assert any(line.startswith(f"| 30 | eagle3 | {spec(30):.1f}") for line in lines)
    assert any(line.startswith(f"| 30 | baseline | {baseline(30):.1f}") for line in lines)
    assert "## Open-loop levels" in report.files["summary.md"].decode()


def test_typed_values_survive_the_parts_path(tmp_path):
    rows = sweep_rows()
    run = parts_run(tmp_path, rows, [[] for _row in rows])
    frame, _notes = load_levels(run)
    failed = frame[(frame["profile"] == "eagle3") & (frame["concurrency"] == 5)].iloc[0]
    usable = frame[(frame["profile"] == "baseline") & (frame["concurrency"] == 1)].iloc[0]
    # Flags stay bools, text left unset stays None (not NaN, not ""), counts stay counts.
    assert failed["window_complete"] is False and usable["window_complete"] is True
    assert usable["first_error"] is None and failed["first_error"] == "HTTP 503"
    assert frame["client_limited"].dtype == bool and frame["requests"].dtype.kind == "i"
    assert usable["server_metrics"] == {"server_spec_accept_length": 2.5}
    assert failed["note"] == "failed: all 40 requests failed (first error: HTTP 503)"
