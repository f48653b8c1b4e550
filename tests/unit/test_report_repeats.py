"""The report on levels measured more than once (report/repeats.py, analysis.is_tie).

Runs are written as part files (the format llm_bench writes), their throughputs from formulas:
a baseline curve, a speculative profile around it, and per-repeat deviations. Expected figures
(means, SDs, half-widths) and expected verdicts (win, tie, loss) are computed here from the same
formulas with the statistics module, independently of the code under test.
"""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import t975
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVEL_COLUMNS
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import FAILED
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    part_stem,
    rebuild_run_files,
    write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report import repeats
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import is_tie
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (
    build_report,
    write_report,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import load_levels

LEVELS = [1, 2, 4, 8]
CI_FRACTION = 0.005      # each repeat's own batch-means CI95, as a fraction of its tok/s
# Per-repeat deviations from a profile's curve. The baseline is steady; the speculative
# profile's repeats scatter by a few percent, as real engines' windows do.
BASE_NOISE = (0.0, 0.004, -0.004)
SPEC_NOISE = (0.03, -0.025, 0.005)


def base_tps(c):
    return 500.0 + 50.0 * c


def spec_factor(c, low_gain):
    """The speculative profile's mean throughput over the baseline's: `low_gain` at C <= 2,
    0.8 from C=4 (it clearly loses there)."""
    return low_gain if c <= 2 else 0.8


def row(profile, c, repeat, tok_s, **extra):
    out = {col: None for col in LEVEL_COLUMNS}
    out.update(host="h1", profile=profile, concurrency=c, repeat=repeat, requests=100, errors=0,
               window_s=10.0, output_tok_s=tok_s, output_tok_s_ci95=tok_s * CI_FRACTION,
               ttft_p50_ms=20.0 * c, tpot_p50_ms=10.0 + c, client_limited=False,
               load_mode="concurrency")
    out.update(extra)
    return out


def tok_s(profile, c, repeat, low_gain):
    if profile == "baseline":
        return base_tps(c) * (1 + BASE_NOISE[repeat - 1])
    return base_tps(c) * spec_factor(c, low_gain) * (1 + SPEC_NOISE[repeat - 1])


def write_run(directory, repeat_count, low_gain, overrides=None):
    """A run of baseline and eagle3 at LEVELS, each level measured `repeat_count` times, as
    part files; overrides: {(profile, C, repeat): {column: value}}."""
    parts = os.path.join(directory, "parts")
    os.makedirs(parts, exist_ok=True)
    for repeat in range(1, repeat_count + 1):
        for c in LEVELS:
            for profile in ("baseline", "eagle3"):
                extra = (overrides or {}).get((profile, c, repeat), {})
                write_level_files(parts, row(profile, c, repeat,
                                             tok_s(profile, c, repeat, low_gain), **extra),
                                  [{"host": "h1", "profile": profile, "concurrency": c,
                                    "repeat": repeat, "in_window": True, "error": None,
                                    "ttft_ms": 20.0 * c, "tpot_ms": 10.0 + c}])
    rebuild_run_files(str(directory))
    return str(directory)


def expected_half(values, cis):
    """What the report must give as a level's 95% half-width across its repeats."""
    spread = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    within = math.sqrt(sum(ci * ci for ci in cis)) / len(values)
    return max(spread, within)


def expected_call(c, low_gain, repeat_count):
    """win / tie / loss of eagle3 against the baseline at C, by the rule the report states."""
    spec = [tok_s("eagle3", c, r, low_gain) for r in range(1, repeat_count + 1)]
    base = [tok_s("baseline", c, r, low_gain) for r in range(1, repeat_count + 1)]
    if repeat_count == 1:
        half_s, half_b = spec[0] * CI_FRACTION, base[0] * CI_FRACTION
    else:
        half_s = expected_half(spec, [v * CI_FRACTION for v in spec])
        half_b = expected_half(base, [v * CI_FRACTION for v in base])
    diff = statistics.fmean(spec) - statistics.fmean(base)
    if abs(diff) <= half_s + half_b:
        return "tie"
    return "win" if diff > 0 else "loss"


# ---------------------------------------------------------------------------------------------
# The tie rule


def test_is_tie_is_the_difference_within_the_two_half_widths():
    assert is_tie(100.0, 3.0, 105.0, 2.0) is True      # 5 <= 3 + 2
    assert is_tie(100.0, 3.0, 105.1, 2.0) is False
    assert is_tie(100.0, None, 105.0, 2.0) is None     # unknown: the sign decides
    assert is_tie(100.0, float("nan"), 105.0, 2.0) is None


# ---------------------------------------------------------------------------------------------
# The summary row


def test_the_summary_row_is_the_mean_and_spread_of_the_repeats(tmp_path):
    run = write_run(tmp_path / "run", 3, low_gain=1.0)
    frame, warnings = load_levels(run)
    assert not warnings and len(frame) == 3 * 2 * len(LEVELS)   # every repeat is a row
    summary = repeats.summarise(frame)
    assert len(summary) == 2 * len(LEVELS) and "repeat" not in summary.columns
    for _key, level in summary.iterrows():
        profile, c = level["profile"], int(level["concurrency"])
        values = [tok_s(profile, c, r, 1.0) for r in (1, 2, 3)]
        assert level["repeats"] == 3 and level[repeats.MEASURED] == 3
        assert level["output_tok_s"] == pytest.approx(statistics.fmean(values))
        assert level["output_tok_s_sd"] == pytest.approx(statistics.stdev(values))
        assert level["output_tok_s_min"] == pytest.approx(min(values))
        assert level["output_tok_s_max"] == pytest.approx(max(values))
        assert level["output_tok_s_ci95"] == pytest.approx(
            expected_half(values, [v * CI_FRACTION for v in values]))
        assert level["requests"] == 300 and level["errors"] == 0      # counts are summed
        assert level["ttft_p50_ms"] == pytest.approx(20.0 * c)        # figures are means
        assert [v[0] for v in level[repeats.VALUES]] == [1, 2, 3]


def test_repeats_that_agree_by_chance_keep_their_own_half_widths(tmp_path):
    """Two identical repeats have no spread; the mean is no more precise than their windows."""
    same = {("baseline", c, r): {"output_tok_s": base_tps(c),
                                 "output_tok_s_ci95": base_tps(c) * CI_FRACTION}
            for c in LEVELS for r in (1, 2)}
    run = write_run(tmp_path / "run", 2, low_gain=1.0, overrides=same)
    summary = repeats.summarise(load_levels(run)[0])
    level = summary[(summary["profile"] == "baseline") & (summary["concurrency"] == 4)].iloc[0]
    assert level["output_tok_s_sd"] == 0
    ci = base_tps(4) * CI_FRACTION
    assert level["output_tok_s_ci95"] == pytest.approx(math.sqrt(2 * ci * ci) / 2)


def test_a_level_measured_once_is_reported_as_measured(tmp_path):
    run = write_run(tmp_path / "run", 1, low_gain=1.2)
    frame = load_levels(run)[0]
    summary = repeats.summarise(frame)
    for column in ("output_tok_s", "output_tok_s_ci95", "requests", "usable", "note"):
        assert summary[column].tolist() == frame[column].tolist(), column
    assert set(summary["repeats"]) == {1}
    report = build_report(run, with_plots=False)
    assert report.repeats == []                               # no repeats section
    assert b"Repeats" not in report.files["summary.md"]


def test_an_unusable_repeat_is_left_out_of_the_mean_and_named(tmp_path):
    # Repeat 2 of eagle3 at C=8 was client-limited: the mean is of repeats 1 and 3.
    run = write_run(tmp_path / "run", 3, low_gain=1.0,
                    overrides={("eagle3", 8, 2): {"client_limited": True}})
    summary = repeats.summarise(load_levels(run)[0])
    level = summary[(summary["profile"] == "eagle3") & (summary["concurrency"] == 8)].iloc[0]
    counted = [tok_s("eagle3", 8, r, 1.0) for r in (1, 3)]
    assert bool(level["usable"]) and level["repeats"] == 2 and level[repeats.MEASURED] == 3
    assert level["output_tok_s"] == pytest.approx(statistics.fmean(counted))
    assert level["requests"] == 300            # every request the level sent
    assert "mean of 2 of 3 repeats, left out: client-limited" in level["flags"]
    assert "(repeat 2)" in level["flags"]
    assert [counted_flag for _r, _v, counted_flag in level[repeats.VALUES]] == [True, False, True]


def test_a_failed_repeat_fails_the_level(tmp_path):
    run = write_run(tmp_path / "run", 3, low_gain=1.0,
                    overrides={("eagle3", 4, 3): {"output_tok_s": 0.0, "requests": 10,
                                                  "errors": 10, "first_error": "HTTP 500"}})
    summary = repeats.summarise(load_levels(run)[0])
    level = summary[(summary["profile"] == "eagle3") & (summary["concurrency"] == 4)].iloc[0]
    assert not level["usable"] and level["verdict"] == FAILED
    assert "(repeat 3)" in level["note"]
    assert level["errors"] == 10 and level["requests"] == 210


# ---------------------------------------------------------------------------------------------
# Ties, crossover and recommendation on the means


def test_a_single_run_win_that_the_repeats_show_to_be_a_tie(tmp_path):
    """Repeat 1 alone: eagle3 beats the baseline at C=1-2 beyond its windows' CIs and falls
    below from C=4, a crossover. All three repeats: at C=1-2 the difference is inside the spread,
    a tie; eagle3 never beats the baseline, and the baseline is recommended everywhere."""
    assert [expected_call(c, 1.0, 1) for c in LEVELS] == ["win", "win", "loss", "loss"]
    assert [expected_call(c, 1.0, 3) for c in LEVELS] == ["tie", "tie", "loss", "loss"]

    once = build_report(write_run(tmp_path / "once", 1, low_gain=1.0), with_plots=False)
    [cross] = once.crossover_details
    assert cross["status"] == "crossed" and cross["bracket"] == [2, 4]
    assert "serve eagle3 at C=1-2" in once.recommendation

    run = write_run(tmp_path / "thrice", 3, low_gain=1.0)
    report = build_report(run, with_plots=False)
    [cross] = report.crossover_details
    assert cross["status"] == "never_won" and cross["tied_at"] == [1, 2]
    assert cross["lost_at"] == [4, 8] and cross["concurrency"] is None
    assert "tied at C=1-2, below at C=4-8" in cross["text"]
    assert report.crossover == {"eagle3": {"h1": None}}
    assert "serve baseline at every usable level (C=1-8), where eagle3 ties it at C=1-2" in (
        report.recommendation)
    ties = {p["concurrency"]: p["within_ci"] for p in report.speedup}
    assert ties == {1: True, 2: True, 4: False, 8: False}
    assert "| 1 | eagle3 |" in report.table and "x~ |" in report.table


def test_repeats_that_confirm_a_win_keep_the_crossover(tmp_path):
    assert [expected_call(c, 1.2, 3) for c in LEVELS] == ["win", "win", "loss", "loss"]
    report = build_report(write_run(tmp_path / "run", 3, low_gain=1.2), with_plots=False)
    [cross] = report.crossover_details
    assert cross["status"] == "crossed" and cross["concurrency"] == 4
    assert cross["bracket"] == [2, 4] and cross["tied_at"] == []
    # The estimate from the means: where the interpolated difference crosses zero.
    mean = {(p, c): statistics.fmean(tok_s(p, c, r, 1.2) for r in (1, 2, 3))
            for p in ("baseline", "eagle3") for c in (2, 4)}
    d2 = mean["eagle3", 2] - mean["baseline", 2]
    d4 = mean["eagle3", 4] - mean["baseline", 4]
    assert cross["estimate"] == pytest.approx(2 + 2 * d2 / (d2 - d4))
    assert "serve eagle3 at C=1-2" in report.recommendation
    assert not any(p["within_ci"] for p in report.speedup)
    spread = {(s["profile"], s["level"]): s for s in report.repeats}
    assert spread["eagle3", "C=1"]["by_repeat"] == {
        r: pytest.approx(tok_s("eagle3", 1, r, 1.2)) for r in (1, 2, 3)}


def test_a_tie_between_a_win_and_a_loss_widens_the_bracket(tmp_path):
    """Clear win at C=1, tie at C=2, clear loss from C=4: the crossing lies between the last
    win and the first loss, and the text says C=2 was tied."""
    overrides = {("eagle3", 2, r): {"output_tok_s": base_tps(2) * (1 + SPEC_NOISE[r - 1])}
                 for r in (1, 2, 3)}
    report = build_report(write_run(tmp_path / "run", 3, low_gain=1.2, overrides=overrides),
                          with_plots=False)
    [cross] = report.crossover_details
    assert cross["status"] == "crossed" and cross["bracket"] == [1, 4]
    assert cross["tied_at"] == [2] and "C=2 in between: tied" in cross["text"]


# ---------------------------------------------------------------------------------------------
# The files


def test_report_files_show_the_spread_and_keep_every_repeat(tmp_path):
    run = write_run(tmp_path / "run", 3, low_gain=1.0)
    report = build_report(run)
    write_report(report)
    summary = open(os.path.join(run, "summary.md"), encoding="utf-8").read()
    assert "## Repeats: each level's spread" in summary
    values = [tok_s("eagle3", 1, r, 1.0) for r in (1, 2, 3)]
    by_repeat = ", ".join(f"r{r} {v:.1f}" for r, v in zip((1, 2, 3), values, strict=True))
    assert by_repeat in summary
    html = open(os.path.join(run, "report.html"), encoding="utf-8").read()
    assert "Repeats: each level&#x27;s spread" in html and by_repeat in html
    # Every repeat stays a row of its own in the exports, with its repeat.
    levels = json.load(open(os.path.join(run, "levels.json"), encoding="utf-8"))["levels"]
    assert sorted((lv["profile"], lv["concurrency"], lv["repeat"]) for lv in levels) == sorted(
        (p, c, r) for p in ("baseline", "eagle3") for c in LEVELS for r in (1, 2, 3))
    pd = pytest.importorskip("pandas")
    parquet = pd.read_parquet(os.path.join(run, "levels.parquet"))
    assert str(parquet["repeat"].dtype) == "Int64" and len(parquet) == 24
    requests = pd.read_parquet(os.path.join(run, "requests.parquet"))
    assert sorted(requests["repeat"].unique().tolist()) == [1, 2, 3]
    # vLLM's sweep format: one combination's runs listed together, numbered from 0.
    stem = "SERVE--host=h1-profile=eagle3-BENCH--max_concurrency=1"
    runs = json.load(open(os.path.join(run, "vllm_sweep", stem, "summary.json"), encoding="utf-8"))
    assert [(r["run_number"], r["output_throughput"]) for r in runs] == [
        (r - 1, pytest.approx(v)) for r, v in zip((1, 2, 3), values, strict=True)]
    # The CDFs read every repeat's requests (the part file names carry the repeat).
    assert part_stem({"host": "h1", "profile": "eagle3", "concurrency": 1, "repeat": 2}) == (
        "h1__eagle3__c1__rep2")
    assert "plots/ttft_cdf.png" in summary


def test_a_derived_profile_is_derived_from_the_crossover_of_the_means(tmp_path):
    """bench_derive reads the run's crossover as the report finds it: on each level's mean."""
    from ansible_collections.servelab.serving.plugins.plugin_utils.derive import measured_crossover

    cross = measured_crossover(write_run(tmp_path / "run", 3, low_gain=1.2), "h1", "baseline",
                               "eagle3")
    assert cross.status == "crossed" and cross.bracket == [2, 4]
    cross = measured_crossover(write_run(tmp_path / "tie", 3, low_gain=1.0), "h1", "baseline",
                               "eagle3")
    assert cross.status == "never_won" and cross.tied_at == [1, 2]


def test_a_profile_that_only_ties_then_loses_still_says_where_it_stops_paying(tmp_path):
    """Tied at C=1-2 (the repeats' spread), below from C=4: no crossover, but speculation stops
    paying between C=2 and C=4, and bench_derive builds its schedule from that."""
    from ansible_collections.servelab.serving.plugins.plugin_utils.derive import derive

    run = write_run(tmp_path / "tie", 3, low_gain=1.0)
    report = build_report(run, with_plots=False)
    [cross] = report.crossover_details
    assert cross["status"] == "never_won" and cross["stops_paying"] == [2, 4]
    assert "it stops paying (from tied to below) between C=2 and C=4" in cross["text"]
    profiles = [{"name": "eagle3", "simulator": {"profile": "eagle3"}},
                {"name": "baseline", "simulator": {"profile": "baseline"}}]
    derived = derive(run, "h1", "schedule", "simulator", profiles, "eagle3", "baseline")
    assert derived.skipped == "" and derived.max_batch == 2
    crossed = build_report(write_run(tmp_path / "won", 3, low_gain=1.2), with_plots=False)
    assert crossed.crossover_details[0]["stops_paying"] == [2, 4]


def test_a_profile_that_never_falls_below_has_nothing_to_derive(tmp_path):
    from ansible_collections.servelab.serving.plugins.plugin_utils.derive import derive

    run = write_run(tmp_path / "win", 1, low_gain=1.2)
    profiles = [{"name": "eagle3", "simulator": {"profile": "eagle3"}},
                {"name": "baseline", "simulator": {"profile": "baseline"}}]
    derived = derive(run, "h1", "schedule", "simulator", profiles, "baseline", "eagle3")
    assert derived.skipped and "no load to switch speculation at" in derived.skipped
