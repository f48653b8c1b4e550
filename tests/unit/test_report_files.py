"""The files bench_report writes: summary.md, a self-contained report.html, PNG plots."""

from __future__ import annotations

import base64
import csv
import os
import pathlib
import re

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report, write_report
from ansible_collections.servelab.serving.plugins.plugin_utils.report.export import EXPORT_FILES
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVEL_COLUMNS,
    LEVELS,
    PLOTS_DIR,
    REPORT_HTML,
    SUMMARY,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LEVELS_SWEEP = [1, 2, 5, 10, 30]
# The plots of a two-profile run without request records (no TTFT/ITL CDF) or compare_to.
PLOTS = ("throughput.png", "latency.png", "speedup.png", "pareto.png")
# vLLM `bench sweep` results, one per level (peer_export.py).
PEER_FILES = {
    os.path.join("vllm_sweep", f"SERVE--host=h1-profile={p}-BENCH--max_concurrency={c}",
                 "summary.json")
    for p in ("baseline", "eagle3") for c in LEVELS_SWEEP
}


def write_levels(directory, profiles):
    """profiles: {name: f(C) -> output tok/s}; every other column derived from C."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, LEVELS), "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=LEVEL_COLUMNS)
        writer.writeheader()
        for name, tok_s in profiles.items():
            for c in LEVELS_SWEEP:
                value = tok_s(c)
                writer.writerow(
                    {
                        "host": "h1",
                        "profile": name,
                        "concurrency": c,
                        "requests": 100,
                        "errors": 0,
                        "window_s": 10,
                        "output_tok_s": value,
                        "output_tok_s_ci95": value / 50,
                        "total_tok_s": value * 3,
                        "request_s": c / 3,
                        "ttft_p50_ms": 30 * c,
                        "ttft_p90_ms": 40 * c,
                        "ttft_p99_ms": 50 * c,
                        "tpot_p50_ms": 10 + c / 2,
                        "tpot_p90_ms": 11 + c / 2,
                        "tpot_p99_ms": 12 + c / 2,
                        "itl_p50_ms": 9 + c / 2,
                        "itl_p99_ms": 20 + c,
                        "e2e_p50_ms": 900,
                        "e2e_p99_ms": 1500,
                        "goodput_request_s": c / 3,
                        "client_limited": False,
                    }
                )
    return str(directory)


@pytest.fixture
def run_dir(tmp_path):
    return write_levels(
        tmp_path / "run", {"baseline": lambda c: 90 * c, "eagle3": lambda c: 120 + 50 * c}
    )


def test_writes_summary_html_and_plots(run_dir):
    report = build_report(run_dir)
    changed = write_report(report)
    expected = {SUMMARY, REPORT_HTML} | {
        os.path.join(PLOTS_DIR, n) for n in PLOTS
    }
    assert set(changed) == expected | set(EXPORT_FILES) | PEER_FILES
    for rel in expected:
        assert os.path.isfile(os.path.join(run_dir, rel))
    for name in PLOTS:
        with open(os.path.join(run_dir, PLOTS_DIR, name), "rb") as fh:
            assert fh.read(8) == PNG_MAGIC
    assert sorted(report.as_result()["files"]) == sorted(
        os.path.join(report.results_dir, r) for r in expected | set(EXPORT_FILES) | PEER_FILES
    )
    # Atomic writes leave no temporary file behind.
    leftovers = [f for _root, _dirs, files in os.walk(run_dir) for f in files if f.startswith(".tmp-")]
    assert leftovers == []


def test_summary_has_table_crossover_and_recommendation(run_dir):
    report = build_report(run_dir, with_plots=False)
    write_report(report)
    with open(os.path.join(run_dir, SUMMARY), encoding="utf-8") as fh:
        summary = fh.read()
    assert report.table in summary
    for section in ("## Recommendation", "## Crossover", "## Levels side by side", "## Time scale"):
        assert section in summary
    assert report.recommendation in summary
    crossing = 120 / (90 - 50)  # the formulas' crossing: between C=2 and C=5
    d = report.crossover_details[0]
    assert d["bracket"] == [2, 5] and d["estimate"] == pytest.approx(crossing)


def test_html_is_self_contained(run_dir):
    write_report(build_report(run_dir))
    with open(os.path.join(run_dir, REPORT_HTML), encoding="utf-8") as fh:
        page = fh.read()
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|link|iframe|object|embed)\b", page, re.I)
    assert "@import" not in page and "url(" not in page
    sources = re.findall(r"<img[^>]*\ssrc='([^']*)'", page)
    assert len(sources) == len(PLOTS)
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)


def test_html_escapes_manifest_text(tmp_path):
    run = write_levels(tmp_path / "run", {"baseline": lambda c: 90 * c})
    with open(os.path.join(run, "manifest.json"), "w", encoding="utf-8") as fh:
        fh.write(
            '{"profiles": {"baseline": {"h1": {"status": "failed", "error": "<b>x</b>",'
            ' "log_tail": "<script>alert(1)</script>", "cmdline": "serve --x"}}}}'
        )
    write_report(build_report(run, with_plots=False))
    page = pathlib.Path(run, REPORT_HTML).read_text(encoding="utf-8")
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_second_write_changes_nothing(run_dir):
    write_report(build_report(run_dir))
    assert write_report(build_report(run_dir)) == []


def test_check_mode_writes_nothing(run_dir):
    changed = write_report(build_report(run_dir), check_mode=True)
    assert SUMMARY in changed
    assert sorted(os.listdir(run_dir)) == [LEVELS]


def test_stale_speedup_plot_is_removed(run_dir, tmp_path):
    write_report(build_report(run_dir))
    assert os.path.isfile(os.path.join(run_dir, PLOTS_DIR, "speedup.png"))
    # Same run reported against a baseline it does not have: no speedup plot any more.
    changed = write_report(build_report(run_dir, baseline="absent"))
    assert os.path.join(PLOTS_DIR, "speedup.png") in changed
    assert not os.path.exists(os.path.join(run_dir, PLOTS_DIR, "speedup.png"))


def test_compare_to_adds_a_section_and_a_plot(run_dir, tmp_path):
    earlier = write_levels(
        tmp_path / "earlier", {"baseline": lambda c: 80 * c, "eagle3": lambda c: 100 + 50 * c}
    )
    report = build_report(run_dir, compare_to=earlier)
    write_report(report)
    summary = pathlib.Path(run_dir, SUMMARY).read_text(encoding="utf-8")
    assert f"## Compared with {earlier}" in summary
    assert os.path.isfile(os.path.join(run_dir, PLOTS_DIR, "comparison.png"))
    base_1 = next(
        p for p in report.comparison if p["profile"] == "baseline" and p["concurrency"] == 1
    )
    assert base_1["delta_tok_s"] == pytest.approx(90 - 80)
