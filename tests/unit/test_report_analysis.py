"""bench_report's conclusions from synthetic levels built from formulas (no hard-coded figures).

Each test writes a levels.csv whose throughput follows a formula, so the expected crossover is
computed from the same formula and the report has to find it.
"""

from __future__ import annotations

import csv
import json
import os

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import ReportError, build_report
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVEL_COLUMNS, LEVELS, MANIFEST

LEVELS_SWEEP = [1, 2, 4, 8, 16, 32]


# Linear throughput curves: baseline = A_B + S_B*C, speculative = A_S + S_S*C. They cross where
# the two are equal; linear interpolation between the bracketing levels recovers that exactly.
A_B, S_B = 0.0, 100.0
A_S, S_S = 250.0, 60.0
TRUE_CROSSING = (A_S - A_B) / (S_B - S_S)  # 6.25: between C=4 and C=8


def baseline_tps(c):
    return A_B + S_B * c


def spec_tps(c):
    return A_S + S_S * c


def level_row(host, profile, c, tok_s, **extra):
    row = {col: "" for col in LEVEL_COLUMNS}
    row.update(
        host=host,
        profile=profile,
        concurrency=c,
        requests=200,
        errors=0,
        window_s=10.0,
        output_tok_s=tok_s,
        output_tok_s_ci95=tok_s * 0.01,
        total_tok_s=tok_s * 2,
        request_s=c / 2.0,
        ttft_p50_ms=20.0 * c,
        ttft_p90_ms=30.0 * c,
        ttft_p99_ms=40.0 * c,
        tpot_p50_ms=10.0 + c,
        tpot_p90_ms=12.0 + c,
        tpot_p99_ms=15.0 + c,
        itl_p50_ms=10.0 + c,
        itl_p99_ms=20.0 + c,
        e2e_p50_ms=1000.0,
        e2e_p99_ms=2000.0,
        goodput_request_s=c / 2.0,
        client_limited=False,
    )
    row.update(extra)
    return row


def write_run(directory, rows, manifest=None):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, LEVELS), "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        writer.writeheader()
        writer.writerows(rows)
    if manifest is not None:
        with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh)
    return str(directory)


def two_profiles(host="h1", levels=None, overrides=None):
    """baseline and eagle3 rows from the formulas; overrides: {(profile, C): {column: value}}."""
    levels = LEVELS_SWEEP if levels is None else levels
    overrides = overrides or {}
    rows = []
    for c in levels:
        rows.append(
            level_row(host, "baseline", c, baseline_tps(c), **overrides.get(("baseline", c), {}))
        )
        rows.append(level_row(host, "eagle3", c, spec_tps(c), **overrides.get(("eagle3", c), {})))
    return rows


def expected_bracket(levels):
    """From the formula: the last level where spec >= baseline and the first where it is below."""
    below = [c for c in levels if spec_tps(c) < baseline_tps(c)]
    first_below = below[0]
    return max(c for c in levels if c < first_below), first_below


def details(report, profile="eagle3", host="h1"):
    [d] = [d for d in report.crossover_details if d["profile"] == profile and d["host"] == host]
    return d


def test_crossover_matches_the_formula(tmp_path):
    report = build_report(write_run(tmp_path, two_profiles()), with_plots=False)
    low, high = expected_bracket(LEVELS_SWEEP)
    d = details(report)
    assert d["status"] == "crossed"
    assert report.crossover == {"eagle3": {"h1": high}}
    assert d["bracket"] == [low, high]
    assert d["estimate"] == pytest.approx(TRUE_CROSSING, rel=1e-9)
    assert f"between C={low} and C={high}" in report.recommendation


def test_nonlinear_curves_estimate_lies_in_the_bracket(tmp_path):
    # Saturating curves: baseline keeps scaling, speculation saturates early.
    def base(c):
        return 800.0 * c / (c + 10.0)

    def spec(c):
        return 350.0 * c / (c + 1.5)

    rows = []
    for c in LEVELS_SWEEP:
        rows += [level_row("h1", "baseline", c, base(c)), level_row("h1", "eagle3", c, spec(c))]
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    first_below = next(c for c in LEVELS_SWEEP if spec(c) < base(c))
    previous = LEVELS_SWEEP[LEVELS_SWEEP.index(first_below) - 1]
    d = details(report)
    assert d["concurrency"] == first_below
    assert previous <= d["estimate"] <= first_below
    # And the estimate is where the chord between the two measured points crosses zero.
    d_a, d_b = spec(previous) - base(previous), spec(first_below) - base(first_below)
    assert d["estimate"] == pytest.approx(previous + (first_below - previous) * d_a / (d_a - d_b))


def test_speedup_is_the_ratio_at_every_level(tmp_path):
    report = build_report(write_run(tmp_path, two_profiles()), with_plots=False)
    by_c = {p["concurrency"]: p for p in report.speedup}
    assert sorted(by_c) == LEVELS_SWEEP
    for c in LEVELS_SWEEP:
        assert by_c[c]["speedup"] == pytest.approx(spec_tps(c) / baseline_tps(c))
        assert by_c[c]["usable"] is True


def test_client_limited_level_is_not_used_for_the_crossover(tmp_path):
    low, high = expected_bracket(LEVELS_SWEEP)
    # The first losing level is client-limited: the crossover must move to the next usable level.
    rows = two_profiles(overrides={("eagle3", high): {"client_limited": True}})
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    d = details(report)
    next_level = LEVELS_SWEEP[LEVELS_SWEEP.index(high) + 1]
    assert d["concurrency"] == next_level
    assert d["bracket"] == [low, next_level]
    assert high in d["excluded"]
    assert "excluded" in d["text"]
    point = next(p for p in report.speedup if p["concurrency"] == high)
    assert point["usable"] is False and "client-limited" in point["note"]
    assert "client-limited (excluded)" in report.table


def test_a_level_with_an_unusable_rival_names_no_winner(tmp_path):
    """Seen in a real run: baseline client-limited at the top levels made the recommendation
    say 'then eagle3 from C=70', although eagle3 lost everywhere it was compared."""
    levels = [1, 2, 4, 8, 16, 32]
    top = levels[-2:]
    rows = two_profiles(levels=levels,
                        overrides={("baseline", c): {"client_limited": True} for c in top})
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    after = report.recommendation.split("then", 1)[-1]
    assert "eagle3 from" not in after and "C=16" not in report.recommendation.split(";")[0]
    assert "baseline at" in report.recommendation or "baseline from" in report.recommendation


def test_failed_level_is_marked_and_skipped(tmp_path):
    low, high = expected_bracket(LEVELS_SWEEP)
    rows = two_profiles(overrides={("baseline", high): {"errors": 200, "requests": 200}})
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    d = details(report)
    assert d["concurrency"] != high
    assert high in d["excluded"]
    assert "all 200 requests errored" in report.table


def test_error_heavy_level_excluded_above_max_error_rate(tmp_path):
    low, high = expected_bracket(LEVELS_SWEEP)
    rows = two_profiles(overrides={("eagle3", high): {"errors": 50, "requests": 200}})
    strict = build_report(write_run(tmp_path / "a", rows), with_plots=False, max_error_rate=0.1)
    lenient = build_report(write_run(tmp_path / "b", rows), with_plots=False, max_error_rate=0.5)
    assert details(strict)["concurrency"] != high
    assert details(lenient)["concurrency"] == high


def test_status_column_failed_is_excluded(tmp_path):
    low, high = expected_bracket(LEVELS_SWEEP)
    rows = two_profiles()
    for row in rows:
        row["status"] = (
            "failed" if (row["profile"], row["concurrency"]) == ("eagle3", high) else "ok"
        )
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    assert high in details(report)["excluded"]


def test_run_cut_short_reports_what_it_has(tmp_path):
    low, high = expected_bracket(LEVELS_SWEEP)
    # The speculative profile stopped after `low`: no crossover can be seen yet.
    rows = [r for r in two_profiles() if not (r["profile"] == "eagle3" and r["concurrency"] > low)]
    report = build_report(
        write_run(tmp_path, rows, manifest={"bench": {"concurrency": LEVELS_SWEEP}}),
        with_plots=False,
    )
    d = details(report)
    assert d["status"] == "always_wins"
    assert report.crossover == {"eagle3": {"h1": None}}
    missing = [c for c in LEVELS_SWEEP if c > low]
    table_lines = [line for line in report.table.splitlines() if "| eagle3 |" in line]
    for c in missing:
        assert any(
            line.startswith(f"| {c} | eagle3 | -") and "missing" in line for line in table_lines
        )


def test_planned_levels_never_run_show_as_missing(tmp_path):
    measured = LEVELS_SWEEP[:3]
    planned = LEVELS_SWEEP + [64]
    report = build_report(
        write_run(
            tmp_path, two_profiles(levels=measured), manifest={"bench": {"concurrency": planned}}
        ),
        with_plots=False,
    )
    for c in set(planned) - set(measured):
        assert f"| {c} | baseline | - " in report.table


def test_single_profile_says_no_speedup(tmp_path):
    rows = [level_row("h1", "baseline", c, baseline_tps(c)) for c in LEVELS_SWEEP]
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    assert report.speedup == []
    assert report.crossover == {}
    assert any("Only one profile" in n and "no speedup" in n for n in report.notes)
    assert "Only one profile (baseline)" in report.recommendation


def test_missing_baseline_is_said_not_guessed(tmp_path):
    rows = [r for r in two_profiles() if r["profile"] != "baseline"]
    rows += [level_row("h1", "other", c, baseline_tps(c)) for c in LEVELS_SWEEP]
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    assert all(v is None for v in report.crossover["eagle3"].values())
    assert details(report)["status"] == "no_baseline"
    assert any("baseline profile `baseline` has no results" in n for n in report.notes)
    # Naming the right baseline makes it work.
    again = build_report(str(tmp_path), baseline="other", with_plots=False)
    assert again.crossover["eagle3"]["h1"] == expected_bracket(LEVELS_SWEEP)[1]


def test_never_wins_and_always_wins(tmp_path):
    rows = []
    for c in LEVELS_SWEEP:
        rows += [
            level_row("h1", "baseline", c, baseline_tps(c)),
            level_row("h1", "slow", c, baseline_tps(c) * 0.5),
            level_row("h1", "fast", c, baseline_tps(c) * 1.5),
        ]
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    assert details(report, "slow")["status"] == "never_won"
    assert details(report, "fast")["status"] == "always_wins"
    assert report.crossover == {"slow": {"h1": None}, "fast": {"h1": None}}
    span = f"C={LEVELS_SWEEP[0]}-{LEVELS_SWEEP[-1]}"
    assert f"serve fast at every usable level ({span})" in report.recommendation


def test_multi_host_keyed_by_host(tmp_path):
    # h2's speculative curve is shifted so it crosses one bracket later than h1's.
    rows = two_profiles("h1")
    for c in LEVELS_SWEEP:
        rows += [
            level_row("h2", "baseline", c, baseline_tps(c)),
            level_row("h2", "eagle3", c, spec_tps(c) + 200.0),
        ]
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    h2_cross = (A_S + 200.0 - A_B) / (S_B - S_S)
    h2_first_below = next(c for c in LEVELS_SWEEP if spec_tps(c) + 200.0 < baseline_tps(c))
    assert report.crossover["eagle3"] == {
        "h1": expected_bracket(LEVELS_SWEEP)[1],
        "h2": h2_first_below,
    }
    assert details(report, host="h2")["estimate"] == pytest.approx(h2_cross)
    assert "| host |" in report.table.splitlines()[0]
    assert "on h1 serve" in report.recommendation and "on h2 serve" in report.recommendation


def test_identical_hosts_are_summarised_once(tmp_path):
    rows = two_profiles("h1") + two_profiles("h2")
    report = build_report(write_run(tmp_path, rows), with_plots=False)
    assert "on every host (h1, h2)" in report.recommendation


def test_time_scale_from_manifest_is_stated(tmp_path):
    scale = 7.5
    manifest = {
        "profiles": {
            p: {"h1": {"engine": "simulator", "time_scale": scale}} for p in ("baseline", "eagle3")
        }
    }
    report = build_report(write_run(tmp_path, two_profiles(), manifest=manifest), with_plots=False)
    assert f"time_scale {scale:g}" in report.time_scale
    summary = report.files["summary.md"].decode()
    assert f"time_scale {scale:g}" in summary and "not rescaled" in summary


def test_time_scale_unknown_is_said(tmp_path):
    report = build_report(write_run(tmp_path, two_profiles()), with_plots=False)
    assert "not known" in report.time_scale


def test_failed_profile_from_manifest_is_reported(tmp_path):
    manifest = {
        "profiles": {
            "eagle3": {
                "h1": {
                    "status": "failed",
                    "failed_task": "Start",
                    "error": "server died",
                    "log_tail": "CUDA OOM",
                }
            }
        }
    }
    rows = [r for r in two_profiles() if r["profile"] == "baseline"]
    report = build_report(write_run(tmp_path, rows, manifest=manifest), with_plots=False)
    summary = report.files["summary.md"].decode()
    assert "eagle3 on h1 FAILED in 'Start': server died" in summary
    assert "CUDA OOM" in report.files["report.html"].decode()


def test_no_levels_csv_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="no levels.csv in"):
        build_report(str(tmp_path))


def test_no_levels_csv_error_names_recorded_failures(tmp_path):
    (tmp_path / MANIFEST).write_text(
        json.dumps(
            {
                "profiles": {
                    "eagle3": {"h1": {"status": "failed", "error": "server exited with code 1"}}
                }
            }
        )
    )
    with pytest.raises(ReportError, match="eagle3 on h1: server exited with code 1"):
        build_report(str(tmp_path))


def test_results_dir_missing_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="is not a directory"):
        build_report(str(tmp_path / "nope"))


def test_header_only_levels_csv_is_a_clear_error(tmp_path):
    (tmp_path / LEVELS).write_text(",".join(LEVEL_COLUMNS) + "\n")
    with pytest.raises(ReportError, match="no rows"):
        build_report(str(tmp_path))


def test_missing_required_column_is_named(tmp_path):
    (tmp_path / LEVELS).write_text("host,profile,concurrency\nh1,baseline,1\n")
    with pytest.raises(ReportError, match="output_tok_s"):
        build_report(str(tmp_path))


def test_compare_to_gives_per_level_delta(tmp_path):
    now = write_run(tmp_path / "now", two_profiles())
    factor = 0.8
    earlier_rows = two_profiles()
    for row in earlier_rows:
        row["output_tok_s"] = row["output_tok_s"] * factor
    earlier = write_run(tmp_path / "earlier", earlier_rows)
    report = build_report(now, compare_to=earlier, with_plots=False)
    assert len(report.comparison) == 2 * len(LEVELS_SWEEP)
    for point in report.comparison:
        assert point["delta_pct"] == pytest.approx(100.0 * (1 / factor - 1))


def test_compare_to_flags_a_change_only_beyond_both_runs_cis(tmp_path):
    rows_now, rows_then = two_profiles(), two_profiles()
    for now, then in zip(rows_now, rows_then):
        now["output_tok_s_ci95"] = then["output_tok_s_ci95"] = 0.05 * then["output_tok_s"]
        # baseline: +3% (inside sqrt(5%^2 + 5%^2) ~ 7%); eagle3: +20% (beyond it)
        now["output_tok_s"] = then["output_tok_s"] * (1.03 if now["profile"] == "baseline"
                                                      else 1.20)
    report = build_report(write_run(tmp_path / "now", rows_now),
                          compare_to=write_run(tmp_path / "then", rows_then), with_plots=False)
    flags = {(p["profile"], p["concurrency"]): p["beyond_ci"] for p in report.comparison}
    assert set(flags.values()) == {True, False}
    assert all(flags[("baseline", c)] is False and flags[("eagle3", c)] is True
               for c in LEVELS_SWEEP)
    summary = report.files["summary.md"].decode()
    assert "+3.0% (within CI)" in summary and "+20.0% (beyond CI)" in summary


def test_compare_to_matches_single_differently_named_hosts(tmp_path):
    now = write_run(tmp_path / "now", two_profiles("laptop"))
    earlier = write_run(tmp_path / "earlier", two_profiles("ct129"))
    report = build_report(now, compare_to=earlier, with_plots=False)
    assert len(report.comparison) == 2 * len(LEVELS_SWEEP)
    assert "hosts differ" in report.files["summary.md"].decode()


def test_compare_to_missing_dir_is_a_clear_error(tmp_path):
    now = write_run(tmp_path / "now", two_profiles())
    with pytest.raises(ReportError, match="compare_to"):
        build_report(now, compare_to=str(tmp_path / "nope"))


def test_exact_tie_goes_to_the_baseline(tmp_path):
    # Both orders of the profile names, so the tie-break cannot come from sorting by name.
    for spec_name in ("aaa_spec", "zzz_spec"):
        rows = []
        for c in LEVELS_SWEEP:
            rows += [
                level_row("h1", "baseline", c, baseline_tps(c)),
                level_row("h1", spec_name, c, baseline_tps(c)),
            ]
        report = build_report(write_run(tmp_path / spec_name, rows), with_plots=False)
        assert "serve baseline at every usable level" in report.recommendation
        assert details(report, spec_name)["status"] == "never_won"
