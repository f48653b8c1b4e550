"""The report of a run over several GPU servers (plugins/plugin_utils/report/fleet.py, hooked into
build/render): the fleet table (per host and summed), hosts that disagree, the hosts that failed,
and per-host panels in the plots and tables.

The runs are written as llm_bench writes them (part files from real request records, a manifest
as bench.yml writes it), with chosen output tok/s per host so that the sums and disagreements
are known in advance.
"""
from __future__ import annotations

import io
import json
import math
import os
import struct

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    level_row, reduce_requests, request_row,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    MANIFEST, PARTS_DIR, PLOTS_DIR, REPORT_HTML, SUMMARY, atomic_write_json,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import row_dict
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import write_level_files
from ansible_collections.servelab.serving.plugins.plugin_utils.report import fleet
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report, write_report
from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import load_run

from reportrun import WALL_OFFSET_NS, WINDOW, level_requests

LEVELS = (1, 2, 4)


def make_fleet_run(tmp_path, hosts, gpu_servers=None, failed=(), statuses=None):
    """hosts: {host: {profile: f(C) -> output tok/s}} (the host's own profile list); failed:
    {(host, profile, C)} written as a level whose requests all failed. The CI95 is 5% of the
    figure. statuses: {(profile, host): manifest record} over the default 'finished'."""
    run = tmp_path / "fleet-run"
    parts = run / PARTS_DIR
    os.makedirs(parts)
    ws, we = WINDOW
    for host, profiles in hosts.items():
        for p, (profile, tok_s) in enumerate(profiles.items()):
            for c in LEVELS:
                reqs = level_requests(p, c, failed=False)
                if (host, profile, c) in failed:
                    reqs = [dataclass_with_error(r) for r in reqs]
                row = row_dict(level_row(host, profile, c, reduce_requests(reqs, ws, we, 5, {}), {}))
                if (host, profile, c) not in failed:
                    row["output_tok_s"] = tok_s(c)
                    row["output_tok_s_ci95"] = tok_s(c) / 20
                    row["request_s"] = c / 2
                records = []
                for r in reqs:
                    rec = request_row(r, ws, we, WALL_OFFSET_NS)
                    rec.update(host=host, profile=profile, concurrency=c)
                    records.append(rec)
                write_level_files(str(parts), row, records)
    statuses = statuses or {}
    atomic_write_json(str(run / MANIFEST), {
        "run_id": "fleet-run",
        "gpu_servers": list(gpu_servers or hosts),
        "bench": {"concurrency": list(LEVELS)},
        "hosts": {h: {"gpu_facts": {"gpus": [{"name": "NVIDIA H200"}]},
                      "bench": {"engine": "simulator", "profiles": list(profiles)}}
                  for h, profiles in hosts.items()},
        "profiles": {profile: {h: statuses.get((profile, h), {"engine": "simulator",
                                                              "status": "finished"})
                               for h, profiles in hosts.items() if profile in profiles}
                     for profile in {p for profiles in hosts.values() for p in profiles}},
    })
    return run


def dataclass_with_error(timing):
    from dataclasses import replace
    return replace(timing, error="connect failed: [Errno 111] refused", t_first=None,
                   t_last=None, completion_tokens=0, chunks=0, chunk_times=None,
                   chunk_tokens=None)


def same(c):
    return 100.0 * c


def faster(c):
    return 160.0 * c          # 60% above `same`: far outside two 5% half-widths


HOSTS = {
    "gpu-a": {"baseline": same, "eagle3": lambda c: 150.0 + 30 * c},
    "gpu-b": {"baseline": lambda c: 103.0 * c},      # within the CIs of gpu-a (5% each)
    "gpu-c": {"baseline": faster},
}


@pytest.fixture
def fleet_run(tmp_path):
    return make_fleet_run(tmp_path, HOSTS, gpu_servers=list(HOSTS) + ["gpu-d"],
                          failed={("gpu-c", "baseline", 4)},
                          statuses={("baseline", "gpu-c"): {
                              "engine": "simulator", "status": "failed",
                              "failed_task": "servelab: sweep baseline",
                              "error": "llm_bench gpu-c/baseline: C=4: all requests failed"}})


def png_size(data: bytes) -> tuple:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_the_fleet_table_sums_the_usable_hosts_and_says_who_is_left_out(fleet_run):
    run = load_run(str(fleet_run))
    view = fleet.fleet_view(run.levels, run.manifest, "baseline")
    assert view.hosts == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    rows = {(r.profile, r.concurrency): r for r in view.rows}
    assert sorted(rows) == [("baseline", c) for c in LEVELS] + [("eagle3", c) for c in LEVELS]
    two = rows[("baseline", 2)]
    assert two.summed == ["gpu-a", "gpu-b", "gpu-c"] and two.left_out == []
    assert two.total_tok_s == pytest.approx(200 + 206 + 320)
    # The hosts' half-widths in quadrature (5% of each figure).
    assert two.total_ci95 == pytest.approx(math.sqrt(10.0 ** 2 + 10.3 ** 2 + 16.0 ** 2))
    assert two.total_request_s == pytest.approx(3 * 1.0)
    four = rows[("baseline", 4)]
    assert four.summed == ["gpu-a", "gpu-b"] and four.left_out == [("gpu-c", "failed")]
    assert four.total_tok_s == pytest.approx(400 + 412)
    # eagle3 is gpu-a's only (its own profile list): the others are not "missing" from its sum.
    assert [h.host for h in rows[("eagle3", 1)].hosts] == ["gpu-a"]
    assert rows[("eagle3", 1)].left_out == []


def test_hosts_outside_each_others_cis_are_called_out_and_the_others_are_not(fleet_run):
    run = load_run(str(fleet_run))
    view = fleet.fleet_view(run.levels, run.manifest, "baseline")
    pairs = {(d.profile, d.low_host, d.high_host): [c for c, *_r in d.levels]
             for d in view.disagreements}
    # gpu-c runs 60% faster than gpu-a and gpu-b wherever both are usable (its C=4 failed);
    # gpu-a and gpu-b differ by 3%, within their CIs.
    assert pairs == {("baseline", "gpu-a", "gpu-c"): [1, 2],
                     ("baseline", "gpu-b", "gpu-c"): [1, 2]}
    text = next(d for d in view.disagreements if d.low_host == "gpu-a").text()
    assert text.startswith("baseline: gpu-c is above gpu-a at C=1, 2 by 60.0%")
    assert "outside each other's 95% CIs" in text and "160.0 ± 8.0 vs gpu-a 100.0 ± 5.0" in text


def test_the_rule_is_the_two_half_widths_together():
    a = fleet.HostLevel("a", 100.0, 5.0, 1.0, True)
    just_inside = fleet.HostLevel("b", 110.0, 5.0, 1.0, True)
    just_outside = fleet.HostLevel("b", 110.5, 5.0, 1.0, True)
    no_ci = fleet.HostLevel("b", 300.0, None, 1.0, True)
    assert fleet._disagreements([fleet._fleet_row("p", 1, [a, just_inside])])[:2] == ([], 1)
    found, judged, _unjudged = fleet._disagreements([fleet._fleet_row("p", 1, [a, just_outside])])
    assert judged == 1 and [(d.low_host, d.high_host) for d in found] == [("a", "b")]
    # Without a CI a level is not judged, however far apart.
    assert fleet._disagreements([fleet._fleet_row("p", 1, [a, no_ci])]) == ([], 0, 1)


def test_host_status_names_the_failed_host_the_task_and_the_host_that_never_started(fleet_run):
    run = load_run(str(fleet_run))
    view = fleet.fleet_view(run.levels, run.manifest, "baseline")
    status = {s.host: s for s in view.statuses}
    assert status["gpu-a"].ok and status["gpu-b"].ok
    assert status["gpu-c"].failed == [("baseline", "servelab: sweep baseline",
                                       "llm_bench gpu-c/baseline: C=4: all requests failed")]
    assert (status["gpu-c"].usable_levels, status["gpu-c"].levels) == (2, 3)
    assert not status["gpu-d"].ok and status["gpu-d"].planned == []
    line = fleet.failed_hosts_line(view)
    assert "gpu-c: baseline failed in 'servelab: sweep baseline'" in line
    assert "gpu-d: no profile recorded" in line
    assert "The other hosts' results (gpu-a, gpu-b) are whole." in line


def test_the_report_files_carry_the_fleet_sections_and_per_host_panels(fleet_run, tmp_path):
    report = build_report(str(fleet_run))
    write_report(report)
    summary = (fleet_run / SUMMARY).read_text()
    assert "## Fleet: 4 GPU servers" in summary
    table = summary.split("## Fleet: output tok/s per host and summed", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in table.splitlines() if line.startswith("| profile"))
    assert header.split(" | ")[2:6] == ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    # gpu-d recorded nothing (it failed before its first profile); eagle3 is gpu-a's only.
    assert "| baseline | 2 | 200.0 ± 10.0 | 206.0 ± 10.3 | 320.0 ± 16.0 | (no profile recorded) |" \
        " 726.0 ± 21.5 | 3.00 | 3 of 3 |" in table
    assert "| baseline | 4 | 400.0 ± 20.0 | 412.0 ± 20.6 | (failed) | (no profile recorded) | " \
        "812.0 ± 28.7 | 4.00 | 2 of 3: without gpu-c (failed) |" in table
    assert "| eagle3 | 1 | 180.0 ± 9.0 | (not in its profiles) | (not in its profiles) |" in table
    disagree = summary.split("## Fleet: hosts that disagree", 1)[1].split("\n## ", 1)[0]
    assert "| baseline | gpu-c | gpu-a | 1 | +60.0% | 160.0 ± 8.0 | 100.0 ± 5.0 |" in disagree
    assert "| baseline | gpu-c | gpu-b | 2 | +55.3% | 320.0 ± 16.0 | 206.0 ± 10.3 |" in disagree
    assert "| gpu-b | gpu-a |" not in disagree and "| 4 |" not in disagree
    # Per host: a side-by-side table each, and one row of panels each in the plots.
    for host in ("gpu-a", "gpu-b", "gpu-c"):
        assert f"## Output tok/s per profile: {host}" in summary
    html = (fleet_run / REPORT_HTML).read_text()
    assert "<h2>Fleet: 4 GPU servers</h2>" in html and "<h2>Fleet: hosts that disagree</h2>" in html
    assert (fleet_run / PLOTS_DIR / fleet.FLEET_PLOT).is_file()
    assert "plots/fleet.png" in summary
    single = make_fleet_run(tmp_path / "one", {"gpu-a": HOSTS["gpu-a"]})
    one = build_report(str(single))
    # throughput.png and latency.png: a row of panels per host (3 measured hosts, not gpu-d).
    for name in ("throughput.png", "latency.png"):
        (_w3, h3), (_w1, h1) = png_size(report.files[os.path.join(PLOTS_DIR, name)]), \
            png_size(one.files[os.path.join(PLOTS_DIR, name)])
        assert h3 == pytest.approx(3 * h1, rel=0.05), name
    # What bench_report returns.
    result = report.as_result()
    assert result["fleet"]["hosts_failed"] == ["gpu-c", "gpu-d"]
    assert {(d["low_host"], d["high_host"]) for d in result["fleet"]["disagreements"]} == {
        ("gpu-a", "gpu-c"), ("gpu-b", "gpu-c")}
    json.dumps(result["fleet"])


def test_a_run_of_one_host_has_no_fleet_section(tmp_path):
    run = make_fleet_run(tmp_path, {"gpu-a": HOSTS["gpu-a"]})
    report = build_report(str(run))
    assert report.fleet is None
    assert "Fleet" not in report.files[SUMMARY].decode()
    assert os.path.join(PLOTS_DIR, fleet.FLEET_PLOT) not in report.files
    # A stale fleet.png of an earlier report of the same run is removed.
    os.makedirs(run / PLOTS_DIR, exist_ok=True)
    (run / PLOTS_DIR / fleet.FLEET_PLOT).write_bytes(b"old")
    assert os.path.join(PLOTS_DIR, fleet.FLEET_PLOT) in write_report(report)
    assert not (run / PLOTS_DIR / fleet.FLEET_PLOT).exists()


def test_the_fleet_plot_has_a_row_per_profile(fleet_run):
    run = load_run(str(fleet_run))
    view = fleet.fleet_view(run.levels, run.manifest, "baseline")
    two = png_size(fleet.plot_fleet(view))
    view.rows = [r for r in view.rows if r.profile == "baseline"]
    one = png_size(fleet.plot_fleet(view))
    assert two[1] == pytest.approx(2 * one[1], rel=0.05)
    assert fleet.plot_fleet(None) is None
    io.BytesIO(fleet.plot_fleet(view))


def test_a_secret_in_a_failed_hosts_error_is_masked_in_the_fleet_section(tmp_path):
    # The manifest is written redacted; a hand-made or older one may not be: the report masks
    # again (context.profile_records), the fleet section included.
    run = make_fleet_run(tmp_path, {"gpu-a": {"baseline": same}, "gpu-b": {"baseline": same}},
                         statuses={("baseline", "gpu-b"): {
                             "status": "failed", "failed_task": "Start the server for baseline",
                             "error": "server exited: --api-key sk-live-123456 rejected"}})
    summary = build_report(str(run)).files[SUMMARY].decode()
    fleet_part = summary.split("## Fleet", 1)[1]
    assert "baseline in 'Start the server for baseline'" in fleet_part
    assert "sk-live-123456" not in summary and "<redacted>" in fleet_part
