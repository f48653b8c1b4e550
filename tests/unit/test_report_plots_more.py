"""The report's Pareto plot, TTFT/ITL CDFs, speedup CI bands and time-scale badge (issue 13):
the figure data (pure functions) and the files, for a run built as test_report_export's is
(two profiles, parts with request records, a manifest with GPUs and time_scale 20)."""
from __future__ import annotations

import base64
import math
import os
import re

import pandas as pd
import pytest

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    PARTS_DIR, PLOTS_DIR, REPORT_HTML, SUMMARY,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report import analysis, distributions, figures, plots
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import SpeedupPoint
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (
    PLOT_FILES, build_report, write_report,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.context import ProfileRecord
from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import load_run
from ansible_collections.servelab.serving.plugins.plugin_utils.report.render import PLOT_TITLES
from reportrun import make_run  # tests/ (the root conftest puts it on sys.path)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NEW_PLOTS = ("pareto.png", "ttft_cdf.png", "itl_cdf.png")


def frame(rows):
    """A level frame as data.level_frame makes it, from (host, profile, C, tok/s, usable,
    verdict)."""
    return pd.DataFrame([
        {"host": h, "profile": p, "concurrency": c, "output_tok_s": t, "usable": u,
         "verdict": v, "note": "" if u else v, "output_tok_s_ci95": t / 10 if t else None}
        for h, p, c, t, u, v in rows])


# --- files --------------------------------------------------------------------------------


def test_new_plots_are_written_and_embedded(tmp_path):
    run = make_run(tmp_path)
    report = build_report(str(run))
    changed = write_report(report)
    for name in NEW_PLOTS + ("throughput.png", "latency.png", "speedup.png"):
        assert os.path.join(PLOTS_DIR, name) in changed
        assert (run / PLOTS_DIR / name).read_bytes()[:8] == PNG_MAGIC
        assert name in PLOT_FILES
    page = (run / REPORT_HTML).read_text(encoding="utf-8")
    images = dict(re.findall(r"<img alt='([^']*)' src='data:image/png;base64,([^']*)'", page))
    for name in NEW_PLOTS:
        title = PLOT_TITLES[name]
        assert title in images, name
        assert base64.b64decode(images[title]) == (run / PLOTS_DIR / name).read_bytes()
    assert "http://" not in page and "https://" not in page
    summary = (run / SUMMARY).read_text(encoding="utf-8")
    for name in NEW_PLOTS:
        assert f"plots/{name}" in summary
    assert "time-scaled simulator x20" in summary and "time-scaled simulator x20" in page


def test_no_request_records_no_cdf_plots(tmp_path):
    run = make_run(tmp_path)
    for name in os.listdir(run / PARTS_DIR):
        if name.endswith(".jsonl"):
            os.unlink(run / PARTS_DIR / name)
    report = build_report(str(run))
    assert os.path.join(PLOTS_DIR, "pareto.png") in report.files
    assert os.path.join(PLOTS_DIR, "ttft_cdf.png") not in report.files
    assert os.path.join(PLOTS_DIR, "itl_cdf.png") not in report.files


def test_an_unscaled_run_has_no_badge(tmp_path):
    run = make_run(tmp_path, time_scale=None)
    write_report(build_report(str(run)))
    assert "time-scaled" not in (run / SUMMARY).read_text(encoding="utf-8")
    assert "time-scaled" not in (run / REPORT_HTML).read_text(encoding="utf-8")


def test_cdf_levels_option_picks_the_levels(tmp_path):
    run = make_run(tmp_path)
    default = build_report(str(run))
    chosen = build_report(str(run), cdf_levels=[2, 8, 16])
    name = os.path.join(PLOTS_DIR, "ttft_cdf.png")
    assert chosen.files[name][:8] == PNG_MAGIC and chosen.files[name] != default.files[name]


# --- Pareto -------------------------------------------------------------------------------


def test_gpu_counts_from_the_manifest():
    manifest = {"hosts": {"a": {"gpu_facts": {"gpus": [{}, {}]}},
                          "b": {"gpu_facts": {"gpus": [], "reason": "no nvidia-smi"}},
                          "c": {"bench": {}}, "d": "odd"}}
    assert figures.gpu_counts(manifest) == {"a": 2}
    assert figures.gpu_counts({}) == {}


def test_pareto_frontier_keeps_the_undominated_points():
    points = [(10, 1), (5, 5), (1, 10), (4, 4), (5, 5), (0.5, 9), (10, 0.5)]
    assert figures.pareto_frontier(points) == [2, 1, 0]
    assert figures.pareto_frontier([]) == []


def test_pareto_points_per_gpu_per_user_and_the_frontier():
    levels = frame([
        ("h", "baseline", 1, 100.0, True, "usable"),
        ("h", "baseline", 4, 400.0, True, "usable"),
        ("h", "eagle3", 1, 180.0, True, "usable"),
        ("h", "eagle3", 4, 300.0, True, "usable"),
        ("h", "eagle3", 8, 900.0, False, "client_limited"),
    ])
    points = {(p.profile, p.concurrency): p for p in figures.pareto_points(levels, {"h": 4})}
    base4 = points[("baseline", 4)]
    assert base4.per_user == pytest.approx(100.0) and base4.per_unit == pytest.approx(100.0)
    assert base4.gpus == 4
    assert points[("eagle3", 1)].per_user == pytest.approx(180.0)
    assert points[("eagle3", 1)].per_unit == pytest.approx(45.0)
    # eagle3 C=1 (180/user, 45/GPU) and baseline C=4 (100/user, 100/GPU) are the frontier;
    # baseline C=1 and eagle3 C=4 are beaten by one of them on both; the excluded C=8 (which
    # would beat everything per GPU) stays off it.
    assert {k for k, p in points.items() if p.frontier} == {("eagle3", 1), ("baseline", 4)}
    assert not points[("eagle3", 8)].usable and points[("eagle3", 8)].reason == "client-limited"


def test_pareto_without_gpu_count_is_per_host_and_labelled_so():
    levels = frame([("h", "baseline", 2, 100.0, True, "usable"),
                    ("k", "baseline", 2, 300.0, True, "usable")])
    points = figures.pareto_points(levels, {})
    assert [p.per_unit for p in points] == [100.0, 300.0] and {p.gpus for p in points} == {None}
    # Per host figures of different machines do not compare: each host has its own frontier.
    assert all(p.frontier for p in points)
    x_label, y_label = plots.pareto_labels(points)
    assert "per host" in y_label and "GPU count" in y_label
    assert "per user" in x_label and "\u00f7 C" in x_label
    assert plots.pareto_labels(figures.pareto_points(levels, {"h": 1, "k": 2}))[1] == (
        "output tok/s per GPU")


# --- CDFs ---------------------------------------------------------------------------------


def test_cdf_levels_default_lowest_bracket_highest():
    levels = frame([("h", p, c, 1.0, True, "usable") for p in ("baseline", "eagle3")
                    for c in (1, 2, 4, 8, 16)])
    cross = analysis.Crossover("h", "eagle3", "baseline", "crossed", concurrency=8,
                               bracket=[4, 8], estimate=5.0)
    never = analysis.Crossover("h", "other", "baseline", "never_won")
    assert figures.cdf_levels_for(levels, [cross, never]) == {"h": [1, 4, 8, 16]}
    assert figures.cdf_levels_for(levels, [never]) == {"h": [1, 16]}
    assert figures.cdf_levels_for(levels, [cross], requested=[16, 2, 3]) == {"h": [2, 3, 16]}


def test_ecdf_sorted_and_weighted():
    x, y = figures.ecdf([3.0, 1.0, 2.0, 2.0])
    assert x == [1.0, 2.0, 3.0] and y == pytest.approx([0.25, 0.75, 1.0])
    x, y = figures.ecdf([2.0, 1.0], weights=[3.0, 1.0])
    assert x == [1.0, 2.0] and y == pytest.approx([0.25, 1.0])
    x, y = figures.ecdf([float(i) for i in range(10_000, 0, -1)], max_points=100)
    assert len(x) <= 100 and x == sorted(x) and x[0] == 1.0 and x[-1] == 10_000.0
    assert y[-1] == 1.0 and figures.ecdf([]) == ([], [])


def test_cdf_data_from_the_request_records(tmp_path):
    run = make_run(tmp_path, client_limited={("eagle3", 8)})
    report_levels = build_report(str(run), with_plots=False)
    assert report_levels.crossover_details[0]["bracket"] == [2, 4]
    loaded = load_run(str(run))
    crossovers = analysis.compute_crossover(loaded.levels, "baseline")
    chosen = figures.cdf_levels_for(loaded.levels, crossovers)
    assert chosen == {"gpu1": [1, 2, 4, 8]}
    chosen = figures.cdf_levels_for(loaded.levels, crossovers, [1, 8])
    wanted = distributions.wanted_levels(loaded.levels, chosen)
    assert wanted == {("gpu1", p, c) for p in ("baseline", "eagle3") for c in (1, 8)}
    samples, warnings = distributions.read_samples(loaded.records.request_files, wanted)
    assert warnings == [] and set(samples) == wanted
    # Window requests that succeeded only: the errored and the cancelled one are left out.
    window = sum(1 for i in range(30) if 100 <= 10 + 40 * i < 1100)
    assert all(s.ok == window and len(s.ttft_ms) == window for s in samples.values())
    series = distributions.cdf_series(loaded.levels, chosen, samples)
    ttft = {(s.profile, s.concurrency): s for s in series if s.metric == "ttft"}
    assert set(ttft) == {(p, c) for p in ("baseline", "eagle3") for c in (1, 8)}
    for s in ttft.values():
        assert s.x == sorted(s.x) and s.y[-1] == pytest.approx(1.0) and s.samples == window
    assert min(ttft[("baseline", 8)].x) > max(ttft[("baseline", 1)].x)  # TTFT grows with C
    # The excluded level is kept, marked with its reason (the plot draws it dotted).
    assert not ttft[("eagle3", 8)].usable and ttft[("eagle3", 8)].reason == "client-limited"
    assert ttft[("baseline", 8)].usable and ttft[("baseline", 8)].reason == ""
    itl = [s for s in series if s.metric == "itl"]
    # Each record carries its inter-token gaps (`itl`): ITL per token, not the TPOT proxy.
    assert {s.itl_basis for s in itl} == {distributions.ITL_TOKEN}
    b1 = next(s for s in itl if s.profile == "baseline" and s.concurrency == 1)
    assert b1.x == pytest.approx([3.0])  # gap 2 + C ms, every request alike
    assert b1.samples == 3 * window     # 4 one-token chunks: 3 gaps per request


def test_records_without_their_gaps_fall_back_to_the_tpot_proxy(tmp_path):
    run = make_run(tmp_path, without_gaps=True)   # records written before `itl` existed
    loaded = load_run(str(run))
    chosen = {"gpu1": [1]}
    samples, _warnings = distributions.read_samples(
        loaded.records.request_files, distributions.wanted_levels(loaded.levels, chosen))
    itl = [s for s in distributions.cdf_series(loaded.levels, chosen, samples)
           if s.metric == "itl"]
    # No gaps and no chunk times in the records: each request's TPOT is the inter-token proxy.
    assert {s.itl_basis for s in itl} == {distributions.ITL_TPOT}
    b1 = next(s for s in itl if s.profile == "baseline")
    assert b1.x == pytest.approx([3.0]) and b1.samples == samples[("gpu1", "baseline", 1)].ok
    assert "proxy" in plots.cdf_axis_label("itl", {distributions.ITL_TPOT})


def test_itl_from_chunk_times_when_present(tmp_path):
    run = make_run(tmp_path, keep_chunks=True)
    loaded = load_run(str(run))
    chosen = {"gpu1": [4]}
    samples, _warnings = distributions.read_samples(
        loaded.records.request_files, distributions.wanted_levels(loaded.levels, chosen))
    series = distributions.cdf_series(loaded.levels, chosen, samples)
    itl = [s for s in series if s.metric == "itl"]
    assert {s.itl_basis for s in itl} == {distributions.ITL_TOKEN}
    base = next(s for s in itl if s.profile == "baseline")
    assert base.x == pytest.approx([6.0]) and base.samples == 3 * samples[("gpu1", "baseline", 4)].ok
    assert "chunk arrival" in plots.cdf_axis_label("itl", {distributions.ITL_TOKEN})


def test_part_files_of_levels_not_drawn_are_not_opened(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    drawn = parts / "h__baseline__c1.jsonl"
    drawn.write_text('{"host": "h", "profile": "baseline", "concurrency": 1, "in_window": true,'
                     ' "error": null, "ttft_ms": 5.0, "tpot_ms": 1.0}\nnot json\n')
    other = parts / "h__baseline__c2.jsonl"
    other.write_text("never read\n")
    samples, warnings = distributions.read_samples(
        [str(drawn), str(other)], {("h", "baseline", 1)})
    assert list(samples[("h", "baseline", 1)].ttft_ms.values()) == [5.0]
    assert warnings == [f"{drawn}: 1 unreadable line(s) skipped"]


# --- speedup bands ------------------------------------------------------------------------


def test_speedup_band_propagates_both_cis():
    levels = frame([("h", "baseline", 1, 100.0, True, "usable"),
                    ("h", "eagle3", 1, 200.0, True, "usable"),
                    ("h", "baseline", 2, 100.0, False, "failed"),
                    ("h", "eagle3", 2, 150.0, True, "usable")])
    points = analysis.compute_speedup(levels, "baseline")
    bands = figures.speedup_bands(points, levels)
    # CI95 = 10% of each: dr = 2 * sqrt(0.1^2 + 0.1^2); the unusable C=2 has no band.
    assert len(bands) == 1
    host, profile, c, low, high = bands[0]
    assert (host, profile, c) == ("h", "eagle3", 1)
    assert high - 2.0 == pytest.approx(2.0 * math.sqrt(0.02)) and 2.0 - low == pytest.approx(
        high - 2.0)
    png = plots.plot_speedup(points, "baseline", levels, [], "badge")
    assert png[:8] == PNG_MAGIC


def test_speedup_plot_without_levels_still_draws():
    point = SpeedupPoint("h", "eagle3", "baseline", 1, 1.5, 150.0, 100.0, False, True)
    assert plots.plot_speedup([point], "baseline")[:8] == PNG_MAGIC


# --- badge --------------------------------------------------------------------------------


def record(profile, scale, host="h", engine="simulator"):
    return ProfileRecord(profile=profile, host=host, engine=engine, time_scale=scale)


def test_badge_text_for_a_scaled_run():
    records = [record("baseline", 20.0), record("eagle3", 20.0)]
    badge = figures.time_scale_badge(records, {("baseline", "h"), ("eagle3", "h")})
    assert badge.startswith("time-scaled simulator x20 | real-time equivalent")
    assert "tok/s \u00f7 20" in badge and "latencies \u00d7 20" in badge


def test_badge_names_each_factor_when_they_differ():
    records = [record("baseline", 20.0), record("eagle3", 10.0)]
    badge = figures.time_scale_badge(records, {("baseline", "h"), ("eagle3", "h")})
    assert "baseline x20" in badge and "eagle3 x10" in badge
    assert "ratios unchanged" not in badge


def test_no_badge_for_real_engines_or_an_unmeasured_scaled_profile():
    assert figures.time_scale_badge([record("baseline", None, engine="sglang")],
                                    {("baseline", "h")}) is None
    assert figures.time_scale_badge([record("baseline", 1.0)], {("baseline", "h")}) is None
    assert figures.time_scale_badge([record("other", 20.0)], {("baseline", "h")}) is None
    assert figures.time_scale_badge([], set()) is None
    flat = record("baseline", 20.0, host="*")
    assert "x20" in figures.time_scale_badge([flat], {("baseline", "h")})
