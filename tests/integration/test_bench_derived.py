"""bench.yml's second phase (bench_derived_profiles) end to end on the embedded default.

One run, three levels: the static baseline and eagle3, then both derived profiles from the
crossover just measured: `schedule` with the simulator's pathological mode (thrash), which the
report must flag as a collapse, and `router`, two simulator halves behind a real HAProxy process
(the distribution's package; installed as root when missing, skipped otherwise, failed under CI).
About 2-3 minutes on 2 cores.
"""
from __future__ import annotations

import json

import pytest

from test_bench_playbook import TIME_SCALE, _base_vars, _profiles, _report_result, _run_bench

from haproxybin import haproxy_binary
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime

pytestmark = [pytest.mark.slow, pytest.mark.haproxy]


def test_derived_schedule_collapse_and_router_end_to_end(tmp_path):
    binary = haproxy_binary()
    extravars = _base_vars(tmp_path, _profiles())
    extravars.update(bench_derived_profiles=["schedule", "router"],
                     bench_derived_simulator_schedule="thrash", bench_haproxy_binary=binary)
    r = _run_bench(tmp_path, extravars)
    out = r.stdout.read()
    assert r.rc == 0, out[-6000:]
    run_dir = (tmp_path / "results" / "latest").resolve()
    manifest = json.loads((run_dir / "manifest.json").read_text())

    # No derived profile runs where the static sweep measured no crossover (on a starved machine
    # the levels come out client-limited): say so, with what the derive phase recorded.
    assert "eagle3_router" in manifest["profiles"], "\n".join(
        [line for line in out.splitlines() if "servelab: no derived" in line or "client-limited" in line]
        + [json.dumps(manifest.get("profiles"), default=str)[:3000]])
    router = manifest["profiles"]["eagle3_router"]["localhost"]
    assert router["status"] == "finished"
    assert "haproxy" in router["cmdline"] and "-db" in router["cmdline"]
    assert "be_conn(spec) lt" in router["router_config"]
    assert "--step-scale" in router["servers"]["spec"]
    assert router["derived"]["assumption"].startswith("assumed, not fitted")
    schedule = manifest["profiles"]["eagle3_schedule"]["localhost"]
    assert schedule["status"] == "finished" and "--spec-dynamic thrash" in schedule["cmdline"]

    report = _report_result(r)
    derived = {d["profile"]: d for d in report["derived"]}
    assert set(derived) == {"eagle3_schedule", "eagle3_router"}
    # The pathological schedule collapses above its threshold: below both static profiles.
    assert derived["eagle3_schedule"]["collapse_at"], derived["eagle3_schedule"]["summary"]
    assert all(lv["envelope_ratio"] is not None for lv in derived["eagle3_router"]["levels"])
    summary = (run_dir / "summary.md").read_text()
    assert "ASSUMPTION, not a field fit" in summary and "COLLAPSE at" in summary
    assert (run_dir / "plots" / "derived.png").is_file()
    # Nothing is left running: every server of the run was stopped by PID.
    servers = tmp_path / "servers"
    for state in servers.glob("*/state.json"):
        pid = json.loads(state.read_text()).get("pid")
        assert not lifetime.is_alive(pid), state
    assert TIME_SCALE
