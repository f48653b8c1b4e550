"""bench_report reads levels.csv exactly as llm_bench writes it (loadgen_results.levels_csv).

The producer writes booleans as true/false, None as empty cells, extra columns (load_mode,
itl_basis, tokens_source, window_complete, ...) and server_* columns; the report must take all of
that, keep open-loop rows apart, and still find the formula's crossover.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.results.parts import levels_csv
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import LevelRow
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVELS

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
    return dataclasses.asdict(LevelRow(**values))


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
