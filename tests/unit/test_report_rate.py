"""A rate sweep in the report: its own table and plot (plots/rate.png), and a run of open-loop
levels only is reported (it used to be refused), with no speedup, crossover or recommendation."""
from __future__ import annotations

import json
import os

from ansible_collections.servelab.serving.plugins.module_utils.results.parts import read_parts, write_level_files
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (
    OPEN_LOOP_ONLY, build_report, write_report,
)
from test_report_export import make_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def as_rate_levels(run, rates_for=("baseline",)):
    """Turn the run's levels of `rates_for` into open-loop levels at rate = their C, cap 8."""
    parts = str(run / "parts")
    for row, jsonl in read_parts(parts):
        if row["profile"] not in rates_for:
            continue
        with open(jsonl, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        os.unlink(jsonl)
        os.unlink(jsonl[:-len(".jsonl")] + ".json")
        row.update(load_mode="rate", request_rate=float(row["concurrency"]), concurrency=8)
        for record in records:
            record["concurrency"] = 8
        write_level_files(parts, row, records)


def test_a_run_of_open_loop_levels_only_is_reported(tmp_path):
    run = make_run(tmp_path, profiles=("baseline",))
    as_rate_levels(run)
    report = build_report(str(run))
    changed = write_report(report)
    assert "plots/rate.png" in changed
    assert (run / "plots" / "rate.png").read_bytes()[:8] == PNG_MAGIC
    assert report.recommendation == OPEN_LOOP_ONLY and OPEN_LOOP_ONLY in report.notes
    assert report.crossover == {} or all(not v for v in report.crossover.values())
    html = (run / "report.html").read_text()
    assert "Open loop: throughput and TTFT vs offered request rate" in html
    assert "open-loop levels are not part of the speedup" in html.lower()
    # The time-scaled simulator's badge is said for a rate-only run too.
    assert "time-scaled simulator x20" in html


def test_a_mixed_run_keeps_its_comparison_and_adds_the_rate_plot(tmp_path):
    run = make_run(tmp_path, profiles=("baseline", "eagle3", "probe"))
    as_rate_levels(run, rates_for=("probe",))
    report = build_report(str(run))
    changed = write_report(report)
    assert {"plots/rate.png", "plots/throughput.png", "plots/speedup.png"} <= set(changed)
    assert report.recommendation != OPEN_LOOP_ONLY
