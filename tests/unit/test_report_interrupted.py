"""The report of an interrupted run says so, from the run's final status (issue 26).

What was seen: after Ctrl-C manifest.json said `status: interrupted` with the level in flight,
while summary.md and report.html said "finished not recorded" and "its sweep did not finish
(status started)"."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_report_wording import report_of, sweep  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (  # noqa: E402
    REPORT_HTML, SUMMARY,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import write_report  # noqa: E402

RESUME = "ansible-playbook --inventory inventory/local -e bench_resume=r1 bench.yml"


def interrupted(**extra):
    manifest = {
        "run_id": "r1", "status": "interrupted", "started_at": "2026-12-03T10:00:00Z",
        "interrupted_at": "2026-12-03T10:02:30Z", "interrupt_reason": "SIGINT",
        "level_in_flight": [{"host": "h1", "profile": "eagle3", "level": "C=4",
                             "concurrency": 4, "started_at": "2026-12-03T10:02:20Z",
                             "repeat": 1}],
        "resume_command": RESUME, "inventory": ["/srv/servelab/inventory/local"],
        "profiles": {"baseline": {"h1": {"status": "finished"}},
                     "eagle3": {"h1": {"status": "started"}}}}
    manifest.update(extra)
    return manifest


def summary_and_html(tmp_path, manifest):
    rows = [r for r in sweep(levels=[1, 2, 4]) if not (r["profile"] == "eagle3"
                                                       and r["concurrency"] == 4)]
    report = report_of(tmp_path, rows, manifest)
    write_report(report)
    return (tmp_path / SUMMARY).read_text(), (tmp_path / REPORT_HTML).read_text(), report


def test_summary_and_html_name_the_interruption_what_was_measured_and_the_resume_command(tmp_path):
    summary, page, report = summary_and_html(tmp_path, interrupted())
    for text in (summary, page):
        assert "finished not recorded" not in text
        assert "status started" not in text
        assert "interrupted (SIGINT) at 2026-12-03T10:02:30Z" in text
        assert "level in flight, not measured: eagle3 C=4 on h1" in text
        assert "measured: baseline on h1: C=1, C=2, C=4" in text
        assert "measured: eagle3 on h1: C=1, C=2" in text
        assert RESUME in text
    assert "## Run interrupted" in summary and "<h2>Run interrupted</h2>" in page
    assert "eagle3 on h1: interrupted (SIGINT) before its sweep finished" in summary
    assert "eagle3 is not recommended: its sweep was interrupted before it finished" in \
        report.recommendation


def test_without_a_recorded_command_the_resume_is_built_from_the_manifests_inventory(tmp_path):
    manifest = interrupted(resume_command=None, interrupt_reason="cleaned up by hand")
    summary, _page, _report = summary_and_html(tmp_path, manifest)
    assert "interrupted (cleaned up by hand)" in summary
    assert ("ansible-playbook -i /srv/servelab/inventory/local -e bench_resume=r1 bench.yml"
            in summary)


def test_a_finished_run_has_no_interruption_section(tmp_path):
    summary, _page, _report = summary_and_html(tmp_path, {
        "run_id": "r1", "status": "finished", "started_at": "a", "finished_at": "b",
        "profiles": {"baseline": {"h1": {"status": "finished"}},
                     "eagle3": {"h1": {"status": "finished"}}}})
    assert "## Run interrupted" not in summary and "bench_resume" not in summary
    assert "started a, finished b" in summary
