"""The report's verdict on a derived profile (report/schedule.py): reached the envelope within the
CIs, its share of the envelope per level, and the collapse flag.

The levels are the simulator's predictions (module_utils/simulator/predictor.py's discrete-event model) for
the two static profiles and the derived one, with a 2 % CI: the pathological schedule
(eagle3_thrash) must be flagged, the healthy one (eagle3_dynamic) must not. ~3 s.
"""
from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import (
    predict_level,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    SPLIT_ASSUMPTION,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report import schedule
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report, write_report

from test_report_wording import report_of, row

LEVELS = (1, 2, 5, 10, 30)


def predicted_rows(derived_sim_profile, derived_name):
    rows = []
    for c in LEVELS:
        for name, sim_profile in (("baseline", "baseline"), ("eagle3", "eagle3"),
                                  (derived_name, derived_sim_profile)):
            tok_s = predict_level(sim_profile, c).output_tok_s
            rows.append(row(name, c, tok_s, output_tok_s_ci95=0.02 * tok_s))
    return rows


def manifest_for(name, kind="schedule", **extra):
    marker = {"kind": kind, "source": "eagle3", "baseline": "baseline", "max_batch": 3, **extra}
    return {"profiles": {name: {"h1": {"status": "finished", "derived": marker}}}}


def test_the_pathological_schedule_is_flagged_as_a_collapse(tmp_path):
    report = report_of(tmp_path, predicted_rows("eagle3_thrash", "eagle3_schedule"),
                       manifest_for("eagle3_schedule"))
    [derived] = report.derived
    assert set(derived["collapse_at"]) >= {5, 10, 30}
    assert 1 not in derived["collapse_at"] and 2 not in derived["collapse_at"]
    assert "COLLAPSE at" in derived["summary"]


def test_the_healthy_schedule_reaches_the_envelope_and_collapses_nowhere(tmp_path):
    report = report_of(tmp_path, predicted_rows("eagle3_dynamic", "eagle3_schedule"),
                       manifest_for("eagle3_schedule"))
    [derived] = report.derived
    assert derived["collapse_at"] == []
    assert all(level["reached"] for level in derived["levels"])
    assert all(level["envelope_ratio"] > 0.97 for level in derived["levels"])
    assert "reached the better static profile within the CIs at 5 of 5 levels" in derived["summary"]


def test_a_derived_level_inside_the_cis_of_both_is_neither_collapse_nor_miss():
    d = row("x", 4, 95.0, output_tok_s_ci95=3.0, usable=True, note="")
    s = row("eagle3", 4, 100.0, output_tok_s_ci95=3.0, usable=True, note="")
    b = row("baseline", 4, 98.0, output_tok_s_ci95=3.0, usable=True, note="")
    level = schedule.compare_level(4, d, s, b, "eagle3", "baseline")
    assert level.reached and not level.collapse          # 5 below, CIs 6 together
    d["output_tok_s"] = 90.0                               # 8 below the baseline, 10 below eagle3
    level = schedule.compare_level(4, d, s, b, "eagle3", "baseline")
    assert not level.reached and level.collapse


def test_an_unusable_level_concludes_nothing():
    d = row("x", 4, 10.0, usable=False, note="client-limited")
    s = row("eagle3", 4, 100.0, usable=True, note="")
    b = row("baseline", 4, 98.0, usable=True, note="")
    level = schedule.compare_level(4, d, s, b, "eagle3", "baseline")
    assert level.reached is None and not level.collapse and "client-limited" in level.note


def test_the_report_states_the_split_assumption_and_draws_the_envelope(tmp_path):
    rows = predicted_rows("eagle3_dynamic", "eagle3_router")
    report_of(tmp_path, rows, manifest_for(
        "eagle3_router", kind="router", gpu_split="4 GPUs speculative, 4 GPUs baseline",
        assumption=SPLIT_ASSUMPTION, setting="use_backend spec if { be_conn(spec) lt 3 }"))
    report = build_report(str(tmp_path), with_plots=True)
    write_report(report)
    summary = (tmp_path / "summary.md").read_text()
    assert "## Derived profile: speculation by load" in summary
    assert "ASSUMPTION, not a field fit: assumed, not fitted" in summary
    assert "GPU split 4 GPUs speculative, 4 GPUs baseline" in summary
    assert (tmp_path / "plots" / "derived.png").stat().st_size > 10_000
    assert "Derived profile (speculation by load) beside the static ones" in (
        tmp_path / "report.html").read_text()


@pytest.mark.parametrize("manifest", [None, {"profiles": {"eagle3": {"h1": {"status": "finished"}}}}])
def test_a_run_without_a_derived_profile_has_no_such_section(tmp_path, manifest):
    report = report_of(tmp_path, predicted_rows("eagle3", "other"), manifest)
    assert report.derived == []


def test_a_stale_derived_plot_is_removed_when_the_run_has_no_derived_profile(tmp_path):
    report_of(tmp_path, predicted_rows("eagle3", "other"), None)
    stale = tmp_path / "plots" / "derived.png"
    stale.parent.mkdir(exist_ok=True)
    stale.write_bytes(b"an earlier report's plot")
    write_report(build_report(str(tmp_path), with_plots=True))
    assert not stale.exists()
