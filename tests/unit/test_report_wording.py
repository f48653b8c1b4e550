"""What the report's sentences may claim (issue "A run you can trust").

- a profile that crashed or failed is never recommended;
- "no level is usable" only when that holds for every profile;
- the speculation advice only for speculative profiles;
- a failed level shows its errors;
- finished_at is in the manifest before the report is written.

Synthetic runs: a levels.csv from linear throughput curves (the faster-at-low-C profile crosses
below the baseline between C=4 and C=8), plus a manifest where a rule needs one.
"""
from __future__ import annotations

import csv
import json
import os

import yaml

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVEL_COLUMNS,
    LEVELS,
    MANIFEST,
    REPORT_HTML,
    SUMMARY,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.advice import (
    SPECULATION_SENTENCE,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (
    build_report,
    write_report,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SWEEP = (1, 2, 4, 8, 16, 32)


def base_tps(c):
    return 100.0 * c


def fast_tps(c):
    # Above the baseline up to C=6.25, below it from there: a crossover between C=4 and C=8.
    return 250.0 + 60.0 * c


def row(profile, c, tok_s, **extra):
    out = {col: "" for col in LEVEL_COLUMNS}
    out.update(host="h1", profile=profile, concurrency=c, requests=200, errors=0, window_s=10.0,
               output_tok_s=tok_s, output_tok_s_ci95=tok_s * 0.01, total_tok_s=tok_s * 2,
               request_s=c / 2.0, ttft_p50_ms=20.0 * c, ttft_p90_ms=30.0 * c,
               ttft_p99_ms=40.0 * c, tpot_p50_ms=10.0 + c, tpot_p90_ms=12.0 + c,
               tpot_p99_ms=15.0 + c, itl_p50_ms=10.0 + c, itl_p99_ms=20.0 + c,
               e2e_p50_ms=1000.0, e2e_p99_ms=2000.0, goodput_request_s=c / 2.0,
               client_limited=False, run_requests=220, run_errors=0)
    out.update(extra)
    return out


def sweep(fast="eagle3", overrides=None, levels=SWEEP):
    """baseline and `fast` over the levels; overrides: {(profile, C): {column: value}}."""
    overrides = overrides or {}
    rows = []
    for c in levels:
        rows.append(row("baseline", c, base_tps(c), **overrides.get(("baseline", c), {})))
        rows.append(row(fast, c, fast_tps(c), **overrides.get((fast, c), {})))
    return rows


def report_of(directory, rows, manifest=None):
    os.makedirs(directory, exist_ok=True)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(os.path.join(directory, LEVELS), "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    if manifest is not None:
        with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh)
    return build_report(str(directory), with_plots=False)


# A level whose server stopped serving: nothing completed in the window, every request of the
# level failed (results/level_verdict.py: failed).
FAILED_LEVEL = {"requests": 0, "errors": 0, "run_requests": 13, "run_errors": 13,
                "output_tok_s": 0.0, "output_tok_s_ci95": "", "stop_reason": "server failing",
                "first_error": "connection lost (closed by server)"}


# --- a crashed or failing profile is never recommended ---------------------------------------

def test_a_profile_whose_server_failed_at_a_higher_level_is_not_recommended(tmp_path):
    # eagle3 wins clearly at C=1 and C=2, then its server fails at C=4 (the sweep stops there).
    rows = [r for r in sweep(overrides={("eagle3", 4): FAILED_LEVEL})
            if not (r["profile"] == "eagle3" and r["concurrency"] > 4)]
    report = report_of(tmp_path, rows)
    assert "serve eagle3" not in report.recommendation
    assert "eagle3 is not recommended: it failed at C=4" in report.recommendation
    assert f"serve baseline at every usable level (C={SWEEP[0]}-{SWEEP[-1]})" \
        in report.recommendation


def test_a_profile_the_manifest_records_as_failed_is_not_recommended(tmp_path):
    # Every measured level is fine, but the profile crashed afterwards (manifest: failed).
    manifest = {"profiles": {
        "baseline": {"h1": {"status": "finished"}},
        "eagle3": {"h1": {"status": "failed", "failed_task": "servelab: sweep eagle3",
                          "error": "server exited"}}}}
    report = report_of(tmp_path, sweep(levels=[1, 2]), manifest)
    assert "serve eagle3" not in report.recommendation
    assert "eagle3 is not recommended: it failed in 'servelab: sweep eagle3'" \
        in report.recommendation


def test_a_profile_that_never_finished_is_not_recommended(tmp_path):
    manifest = {"profiles": {"baseline": {"h1": {"status": "finished"}},
                             "eagle3": {"h1": {"status": "started"}}}}
    report = report_of(tmp_path, sweep(levels=[1, 2]), manifest)
    assert "serve eagle3" not in report.recommendation
    assert "eagle3 is not recommended: its sweep did not finish" in report.recommendation


def test_a_failing_profile_on_one_host_is_still_recommended_on_another(tmp_path):
    rows = sweep(levels=[1, 2])
    rows += [dict(r, host="h2") for r in sweep(levels=[1, 2])]
    manifest = {"profiles": {"eagle3": {"h1": {"status": "failed"}, "h2": {"status": "finished"}},
                             "baseline": {"h1": {"status": "finished"},
                                          "h2": {"status": "finished"}}}}
    report = report_of(tmp_path, rows, manifest)
    h1, h2 = report.recommendation.split("; on h2 ")
    assert "serve eagle3" not in h1 and "eagle3 is not recommended" in h1
    assert h2.startswith("serve eagle3")


# --- "no level is usable" only when it is true of every profile ----------------------------

def test_no_level_usable_is_not_said_when_one_profile_has_usable_levels(tmp_path):
    # eagle3 is client-limited everywhere: nothing can be compared, but baseline's levels are
    # usable, so "no level is usable" would be false.
    rows = sweep(overrides={("eagle3", c): {"client_limited": True} for c in SWEEP})
    report = report_of(tmp_path, rows)
    assert "no level is usable" not in report.recommendation
    assert (f"no level has usable results for every profile (baseline at "
            f"C={SWEEP[0]}-{SWEEP[-1]}; eagle3 at none)") in report.recommendation


def test_no_level_usable_is_said_when_it_is_true(tmp_path):
    limited = {"client_limited": True}
    rows = sweep(overrides={(p, c): limited for c in SWEEP for p in ("baseline", "eagle3")})
    report = report_of(tmp_path, rows)
    assert "no level is usable, so there is nothing to recommend" in report.recommendation


# --- the speculation sentence only for speculative profiles --------------------------------

def test_no_speculation_advice_when_the_crossing_profile_does_not_speculate(tmp_path):
    # tp4 crosses below the baseline like a speculative profile would, but it is not one.
    report = report_of(tmp_path, sweep(fast="tp4"))
    assert any(d["status"] == "crossed" for d in report.crossover_details)
    assert "speculation" not in report.recommendation
    assert SPECULATION_SENTENCE not in report.recommendation


def test_speculation_advice_when_the_server_reported_draft_acceptance(tmp_path):
    accept = {("eagle3", c): {"server_spec_accept_length_mean": 2.4} for c in SWEEP}
    accept.update({("baseline", c): {"server_spec_accept_length_mean": 0.0} for c in SWEEP})
    report = report_of(tmp_path, sweep(overrides=accept))
    assert report.recommendation.count(SPECULATION_SENTENCE.strip()) == 1


def test_speculation_advice_when_the_command_line_speculates(tmp_path):
    manifest = {"profiles": {"eagle3": {"h1": {
        "status": "finished", "engine": "sglang",
        "cmdline": "python -m sglang.launch_server --speculative-algorithm EAGLE3"}}}}
    report = report_of(tmp_path, sweep(), manifest)
    assert SPECULATION_SENTENCE.strip() in report.recommendation


# --- a failed level shows its errors --------------------------------------------------------

def test_a_failed_level_shows_the_errors_that_failed_it(tmp_path):
    rows = [r for r in sweep(overrides={("eagle3", 4): FAILED_LEVEL})
            if not (r["profile"] == "eagle3" and r["concurrency"] > 4)]
    report = report_of(tmp_path, rows)
    [line] = [ln for ln in report.table.splitlines() if ln.startswith("| 4 | eagle3 |")]
    # the window's 0/0 would hide that all 13 requests of the level failed
    assert "| 13/13 (whole level) |" in line
    assert "connection lost (closed by server)" in line
    write_report(report)
    assert "| 13/13 (whole level) |" in (tmp_path / SUMMARY).read_text()
    assert "<td>13/13 (whole level)</td>" in (tmp_path / REPORT_HTML).read_text()


# --- finished_at before the report ----------------------------------------------------------

def _tasks_in_order(tasks):
    for task in tasks or []:
        if "block" in task:
            yield from _tasks_in_order(task["block"])
            yield from _tasks_in_order(task.get("rescue"))
            yield from _tasks_in_order(task.get("always"))
        else:
            yield task


def test_finished_at_is_recorded_before_the_report_is_written():
    with open(os.path.join(REPO, "playbooks", "bench.yml"), encoding="utf-8") as fh:
        plays = yaml.safe_load(fh)
    [play] = [p for p in plays if any("servelab.serving.bench_report" in t
                                      for t in _tasks_in_order(p.get("tasks")))]
    order = list(_tasks_in_order(play["tasks"]))
    report = next(i for i, t in enumerate(order) if "servelab.serving.bench_report" in t)
    closes = [i for i, t in enumerate(order)
              if "finished_at" in (t.get("servelab.serving.bench_manifest") or {}).get("merge", {})]
    assert closes and closes[0] < report, "the report would say 'finished not recorded'"


def test_the_report_states_the_recorded_finish(tmp_path):
    manifest = {"started_at": "2026-01-01T10:00:00", "finished_at": "2026-01-01T10:30:00"}
    write_report(report_of(tmp_path, sweep(levels=[1]), manifest))
    assert "finished 2026-01-01T10:30:00" in (tmp_path / SUMMARY).read_text()


def vllm_schedule_is_valid(schedule):
    """vLLM 0.33.0's own rules for num_speculative_tokens_per_batch_size
    (vllm/v1/spec_decode/dynamic/utils.py validate_and_normalize_dynamic_sd_schedule)."""
    assert isinstance(schedule, list) and schedule
    previous_end = 0
    for start, end, k in sorted(schedule):
        assert 0 < start <= end and k >= 0 and start > previous_end
        previous_end = end
    assert sorted(schedule)[0][0] == 1


def test_a_vllm_speculative_profile_gets_the_exact_schedule_for_its_crossover(tmp_path):
    config = {"method": "eagle3", "model": "/m/draft", "num_speculative_tokens": 3}
    manifest = {"profiles": {"eagle3": {"h1": {
        "status": "finished", "engine": "vllm",
        "cmdline": "vllm serve /m --max-num-seqs 128 --speculative-config '%s'"
                   % json.dumps(config)}}}}
    report = report_of(tmp_path, sweep(), manifest)
    cross = next(d for d in report.crossover_details if d["status"] == "crossed")
    text = report.recommendation
    assert "vLLM 0.33.0 can switch eagle3's speculation off by load" in text
    assert SPECULATION_SENTENCE.strip() not in text          # that one is SGLang's
    setting = json.loads(text.split("--speculative-config '", 1)[1].split("'", 1)[0])
    schedule = setting.pop("num_speculative_tokens_per_batch_size")
    assert setting == config                                   # the profile's own config kept
    vllm_schedule_is_valid(schedule)
    keep = schedule[0][1]
    assert cross["bracket"][0] <= keep < cross["concurrency"]   # on up to the crossover
    assert schedule == [[1, keep, 3], [keep + 1, 128, 0]]       # off above it, to max-num-seqs
    # Next to it, what the measured profile did not show: vllm#49548 and vLLM 0.33.0's PIECEWISE override.
    assert "vllm-project/vllm#49548" in text and "PIECEWISE" in text and "vllm/config/vllm.py:1069-1086" in text


def test_a_sglang_speculative_profile_is_told_there_is_no_switch(tmp_path):
    manifest = {"profiles": {"eagle3": {"h1": {
        "status": "finished", "engine": "sglang",
        "cmdline": "python -m sglang.launch_server --speculative-algorithm EAGLE3"}}}}
    text = report_of(tmp_path, sweep(), manifest).recommendation
    assert SPECULATION_SENTENCE.strip() in text and "num_speculative_tokens_per_batch_size" not in text


def test_a_fusion_flag_left_out_of_the_command_is_listed_with_the_skipped_features(tmp_path):
    """llm_server's features_skipped also carries '<feature>: not rendered: <why>' (SGLang's fusion
    gate, module_utils/server/fusion_gate.py): the report must not call that a log line."""
    note = ("flashinfer_allreduce_fusion: not rendered: SGLang 0.5.23 refuses it (the server would fail at "
            "start) on SM 12.0")
    manifest = {"profiles": {"eagle3": {"h1": {"status": "finished", "engine": "sglang",
                                               "features_skipped": [note]}}}}
    write_report(report_of(tmp_path, sweep(), manifest))
    summary = (tmp_path / SUMMARY).read_text()
    assert "eagle3 on h1: a requested feature did not run (server log, or not rendered): " + note in summary
    assert "the server log says" not in summary
