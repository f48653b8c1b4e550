"""bench.yml's live progress on the embedded default: the llm_bench action's line before each
level (profile i/n, level j/m with its label, elapsed, ETA), the progress callback's per-task
lines for the role's servelab tasks, its heartbeat while a server starts, and its table of every
measured level at the end of the playbook.

Two profiles, two short levels each; the second profile's simulator takes 2 s to become ready,
and the heartbeat's interval is made small (SERVELAB_HEARTBEAT_INTERVAL), so the heartbeat has
something to say. Real processes, ended by the playbook (llm_server stopped) and loopback only.
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import read_parts
from ansible_collections.servelab.serving.plugins.plugin_utils.progress import levels_table
from testports import free_port as _free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")

pytestmark = pytest.mark.slow

PROFILES = ("baseline", "eagle3")
LEVELS = (1, 2)
CLOCK = r"(?:\d+:)?\d\d:\d\d"


def _run(tmp_path):
    extravars = {
        "bench_profiles": [
            {"name": "baseline", "simulator": {"profile": "baseline", "time_scale": 20}},
            {"name": "eagle3", "simulator": {"profile": "eagle3", "time_scale": 20,
                                             "startup_delay": 2}},
        ],
        "bench_concurrency": list(LEVELS),
        "bench_level_seconds": 1,
        "bench_warmup_requests": 1,
        "bench_server_port": _free_port(),
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": {"kind": "synthetic", "input_tokens": 128, "output_tokens": 32,
                           "count": 8},
        "bench_max_tokens": 32,
    }
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(extravars))
    env = dict(os.environ,
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_NOCOLOR="1",
               SERVELAB_HEARTBEAT_INTERVAL="0.5",
               SERVELAB_RESULTS_ROOT=str(tmp_path / "results"))
    return subprocess.run(
        [os.path.join(VENV_BIN, "ansible-playbook"), "-e", f"@{extra}",
         os.path.join(REPO, "bench.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)


def test_progress_lines_heartbeat_and_final_table(tmp_path):
    done = _run(tmp_path)
    out = done.stdout
    (tmp_path / "stdout.txt").write_text(out)   # to read when it fails
    assert done.returncode == 0, (out + done.stderr)[-6000:]
    lines = out.splitlines()

    # Before each level: where the run stands, how long it took, how long it will take.
    progress = [line for line in lines if line.startswith("llm_bench localhost: ")]
    assert len(progress) == len(PROFILES) * len(LEVELS), progress
    expected = [(i, p, j, c) for i, p in enumerate(PROFILES, 1) for j, c in enumerate(LEVELS, 1)]
    for line, (i, profile, j, c) in zip(progress, expected):
        pattern = (r"llm_bench localhost: profile %d/2 %s · level %d/2 C=%d · %s elapsed · "
                   r"ETA (~?)%s$" % (i, profile, j, c, CLOCK, CLOCK))
        match = re.match(pattern, line)
        assert match, (line, pattern)
        # the first level of the run has nothing measured yet: a labelled guess; then measured
        assert (match.group(1) == "~") == ((i, j) == (1, 1)), line
    # The level's own lines are still there, in order: progress, running, the figures.
    at = out.index(progress[0])
    assert out.index("llm_bench localhost/baseline C=1: running", at) > at

    # The role's servelab tasks are reported live (the task-name match sees past "bench : ").
    for profile in PROFILES:
        assert "servelab | localhost | servelab: sweep %s | started" % profile in out
        assert "servelab | localhost | servelab: sweep %s | changed" % profile in out

    # The heartbeat while eagle3's server starts (2 s to ready, a line every 0.5 s).
    beats = [line for line in lines
             if re.match(r"servelab \| localhost eagle3: server starting, %s elapsed" % CLOCK, line)]
    assert beats, out[-6000:]

    # The table at the end: one row per (profile, level), the figures level_views renders.
    run_dir = (tmp_path / "results" / results.LATEST_LINK).resolve()
    rows = [row for row, _path in read_parts(str(run_dir / results.PARTS_DIR))]
    assert {(r["profile"], r["concurrency"]) for r in rows} == {
        (p, c) for p in PROFILES for c in LEVELS}
    rows.sort(key=lambda r: (PROFILES.index(r["profile"]), r["concurrency"]))
    summary = out[out.index("servelab summary"):]
    assert "levels of run %s (4, %s):" % (run_dir.name, run_dir) in summary
    table = levels_table(rows)
    assert len(table) == 2 + len(rows)
    for line in table:
        assert "  " + line in summary.splitlines(), (line, summary[:3000])
