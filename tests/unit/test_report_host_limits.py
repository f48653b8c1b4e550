"""When the host or the server set the number (issue 28, item 3): a saturated bench client
machine, a full KV cache and a stalled server are flagged with their reason in the level's
verdict module and the report; a change outside the other run's range is never "within CI"."""

from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    level_flags,
    level_verdict,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import level_line
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report

from test_report_repeats import write_run

ROW = {"host": "h1", "profile": "p", "concurrency": 2, "requests": 40, "errors": 0,
       "run_requests": 40, "run_errors": 0, "output_tok_s": 30.9, "window_s": 10.0}


def test_a_saturated_host_is_flagged_with_its_cpu_and_stays_usable():
    row = dict(ROW, host_cpu_util=0.99)
    flags = level_flags(row)
    assert any(f.startswith("host saturated") and "99% busy" in f for f in flags), flags
    assert level_verdict(row).usable            # a fact for the reader, not an exclusion
    assert "host saturated" in level_line(dict(row, client_limited=False))
    assert not [f for f in level_flags(dict(ROW, host_cpu_util=0.6)) if "saturated" in f]


def test_memory_pressure_on_the_server_is_flagged():
    flags = level_flags(dict(ROW, server_token_usage_mean=0.97))
    assert any("server memory pressure" in f and "97%" in f for f in flags), flags
    assert not [f for f in level_flags(dict(ROW, server_token_usage_mean=0.5))
                if "pressure" in f]


@pytest.mark.parametrize("extra, words", [
    ({"first_error": "stalled: no data for 120 s (stall_timeout)"},
     "server stalled: no data for 120 s (stall_timeout)"),
    ({"server_running_reqs_mean": 4.0, "server_generation_tokens_s": 0.0},
     "server stalled: 4.0 requests running on average but no token generated"),
])
def test_a_stalled_server_is_flagged_with_the_reason(extra, words):
    flags = level_flags(dict(ROW, **extra))
    assert any(words in f for f in flags), flags
    assert not [f for f in level_flags(dict(ROW, server_running_reqs_mean=4.0,
                                            server_generation_tokens_s=90.0)) if "stalled" in f]


def test_the_report_flags_the_repeat_the_host_slowed(tmp_path):
    slowed = {("eagle3", 2, 2): {"output_tok_s": 30.9, "host_cpu_util": 0.99}}
    report = build_report(write_run(tmp_path / "run", 2, low_gain=1.0, overrides=slowed),
                          with_plots=False)
    summary = report.files["summary.md"].decode()
    assert "host saturated: the bench client machine's CPU was 99% busy" in summary


def test_a_change_outside_the_other_runs_range_is_never_within_ci(tmp_path):
    # The run: a repeat at C=2 fell from 161 to 30.9 tok/s (the host at 99% CPU); two
    # repeats give a half-width of ~825 tok/s, wider than any change. The earlier run saw
    # 160-162 tok/s there: a mean of 96 lies far outside that, whatever the half-widths say.
    now = {("eagle3", 2, 1): {"output_tok_s": 161.0, "output_tok_s_ci95": 0.8},
           ("eagle3", 2, 2): {"output_tok_s": 30.9, "output_tok_s_ci95": 0.8,
                              "host_cpu_util": 0.99}}
    then = {("eagle3", 2, 1): {"output_tok_s": 160.0, "output_tok_s_ci95": 0.8},
            ("eagle3", 2, 2): {"output_tok_s": 162.0, "output_tok_s_ci95": 0.8}}
    report = build_report(write_run(tmp_path / "now", 2, low_gain=1.0, overrides=now),
                          compare_to=write_run(tmp_path / "then", 2, low_gain=1.0,
                                               overrides=then), with_plots=False)
    point = next(p for p in report.comparison if p["profile"] == "eagle3"
                 and p["concurrency"] == 2)
    assert point["delta_pct"] == pytest.approx(100 * ((161 + 30.9) / 2 / 161 - 1))
    assert point["beyond_ci"] is True and point["outside_range"] is True
    summary = report.files["summary.md"].decode()
    change = "%+.1f%%" % point["delta_pct"]
    assert change + " (outside the other run's range)" in summary
    assert change + " (within CI)" not in summary
    # A level whose values lie in each other's range stays a tie as before.
    steady = next(p for p in report.comparison if p["profile"] == "baseline"
                  and p["concurrency"] == 4)
    assert steady["beyond_ci"] is False and steady["outside_range"] is False
