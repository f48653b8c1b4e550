"""Intervals that make sense (issue 28, item 4): error bars clipped at zero, and a warning where
2 repeats make the interval across them meaningless (report/intervals.py, repeats.py, plots.py)."""

from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.report import plots, repeats
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report
from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import load_levels
from ansible_collections.servelab.serving.plugins.plugin_utils.report.intervals import (
    clipped_yerr,
    few_repeats_warning,
)

from test_report_repeats import write_run

pd = pytest.importorskip("pandas")
matplotlib = pytest.importorskip("matplotlib")


def test_the_lower_arm_stops_at_zero_and_the_upper_arm_stays():
    # The level: 30.9 +- 827 tok/s (two repeats, t(1) = 12.7).
    lower, upper = clipped_yerr([30.9, 161.0, 50.0], [827.0, 5.0, None])
    assert lower == [pytest.approx(30.9), 5.0, 0.0]
    assert upper == [827.0, 5.0, 0.0]
    assert clipped_yerr([float("nan")], [3.0]) == [[0.0], [3.0]]


def _bars(monkeypatch, draw):
    """The (y, lower arm) pairs every errorbar call of `draw` was given."""
    seen = []
    original = matplotlib.axes.Axes.errorbar

    def spy(self, x, y, *args, yerr=None, **kw):
        y = list(y)
        arms = yerr if isinstance(yerr, list) and len(yerr) == 2 else [list(yerr)] * 2
        seen.extend(zip(y, arms[0], strict=True))
        return original(self, x, y, *args, yerr=yerr, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", spy)
    assert draw()
    return seen


def test_throughput_bars_never_reach_below_zero(monkeypatch, tmp_path):
    # Two repeats far apart: the half-width across them is far wider than the mean.
    wide = {("eagle3", 1, 1): {"output_tok_s": 161.0}, ("eagle3", 1, 2): {"output_tok_s": 30.9}}
    run = write_run(tmp_path / "run", 2, low_gain=1.0, overrides=wide)
    levels = repeats.summarise(load_levels(run)[0])
    level = levels[(levels["profile"] == "eagle3") & (levels["concurrency"] == 1)].iloc[0]
    assert level["output_tok_s_ci95"] > level["output_tok_s"]        # the bar would cross 0
    levels["usable"] = True
    bars = _bars(monkeypatch, lambda: plots.plot_throughput(levels, "baseline", []))
    assert bars and all(y - low >= 0 for y, low in bars), bars
    rate = levels.assign(load_mode="rate", request_rate=levels["concurrency"].astype(float),
                         ttft_p99_ms=levels["ttft_p50_ms"])
    bars = _bars(monkeypatch, lambda: plots.plot_rate(rate, "baseline"))
    assert bars and all(y - low >= 0 for y, low in bars), bars


def test_two_repeats_are_warned_of_in_the_report_and_its_result(tmp_path):
    report = build_report(write_run(tmp_path / "two", 2, low_gain=1.0), with_plots=False)
    warned = [w for w in report.warnings if "meaningless" in w]
    assert len(warned) == 1 and "bench_repeats: 3 or more" in warned[0], report.warnings
    summary = report.files["summary.md"].decode()
    assert warned[0] in summary            # the report's warnings, and the repeats table's note
    assert summary.count("bench_repeats: 3 or more") >= 2
    assert warned[0] in report.files["report.html"].decode()


@pytest.mark.parametrize("count", [1, 3])
def test_one_or_three_repeats_are_not_warned_of(tmp_path, count):
    report = build_report(write_run(tmp_path / "run", count, low_gain=1.0), with_plots=False)
    assert not [w for w in report.warnings if "meaningless" in w]


def test_the_warning_counts_the_levels_it_concerns():
    assert few_repeats_warning([1, 1, 3]) is None
    text = few_repeats_warning([2, 3, 2, 1])
    assert text.startswith("2 of 4 level(s) have only 2 counted repeats")
