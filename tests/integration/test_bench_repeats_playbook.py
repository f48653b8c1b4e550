"""bench.yml with bench_repeats: 2 on the embedded default (one simulator profile, two short
levels, no GPU telemetry: the playbook's own steps are most of the time): each level measured
twice, in rounds, the progress line naming the repeat, every repeat's part files and rows kept,
and the report's summary of the spread. Real processes (the simulator llm_server starts and
stops), loopback only. The report's conclusions on repeats (ties, crossover, recommendation) are
tests/unit/test_report_repeats.py's; the action's resume of a missing repeat is
tests/integration/test_llm_bench_repeats.py's."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from testports import free_port as _free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")

pytestmark = pytest.mark.slow

PROFILES = ("baseline",)
LEVELS = (1, 2)
REPEATS = 2
CLOCK = r"(?:\d+:)?\d\d:\d\d"


def _run(tmp_path):
    extravars = {
        "bench_profiles": [{"name": p, "simulator": {"profile": p, "time_scale": 20}}
                           for p in PROFILES],
        "bench_concurrency": list(LEVELS),
        "bench_repeats": REPEATS,
        "bench_level_seconds": 0.5,
        "bench_warmup_requests": 1,
        "bench_min_latency_samples": 0,
        "bench_server_port": _free_port(),
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": {"kind": "synthetic", "input_tokens": 64, "output_tokens": 16,
                           "count": 8},
        "bench_max_tokens": 16,
        "bench_gpu_telemetry": False,
    }
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(extravars))
    env = dict(os.environ,
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_NOCOLOR="1",
               SERVELAB_RESULTS_ROOT=str(tmp_path / "results"))
    return subprocess.run(
        [os.path.join(VENV_BIN, "ansible-playbook"), "-e", f"@{extra}",
         os.path.join(REPO, "bench.yml")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_bench_repeats_measures_every_level_twice_and_reports_the_spread(tmp_path):
    done = _run(tmp_path)
    out = done.stdout
    (tmp_path / "stdout.txt").write_text(out)   # to read when it fails
    assert done.returncode == 0, (out + done.stderr)[-6000:]

    # Rounds within each profile: C=1, C=2, then C=1, C=2 again, each line naming its repeat.
    progress = [line for line in out.splitlines() if line.startswith("llm_bench localhost: ")]
    expected = [(i, p, j, c, r) for i, p in enumerate(PROFILES, 1) for r in (1, 2)
                for j, c in enumerate(LEVELS, 1)]
    assert len(progress) == len(expected), progress
    for line, (i, profile, j, c, r) in zip(progress, expected, strict=True):
        pattern = (r"llm_bench localhost: profile %d/1 %s · level %d/2 C=%d · repeat %d/2 · "
                   r"%s elapsed · ETA ~?%s$" % (i, profile, j, c, r, CLOCK, CLOCK))
        assert re.match(pattern, line), (line, pattern)

    run_dir = (tmp_path / "results" / results.LATEST_LINK).resolve()
    parts = sorted(p.name for p in (run_dir / results.PARTS_DIR).glob("*.json"))
    assert parts == sorted("localhost__%s__c%d%s.json" % (p, c, "__rep2" if r == 2 else "")
                           for p in PROFILES for c in LEVELS for r in (1, 2))
    with open(run_dir / results.LEVELS, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted((r["profile"], int(r["concurrency"]), int(r["repeat"])) for r in rows) == sorted(
        (p, c, r) for p in PROFILES for c in LEVELS for r in (1, 2))
    assert all(int(r["errors"]) == 0 for r in rows)
    levels = json.loads((run_dir / "levels.json").read_text())["levels"]
    assert len(levels) == len(rows) and {lv["repeat"] for lv in levels} == {1, 2}
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert int(manifest["hosts"]["localhost"]["bench"]["repeats"]) == REPEATS

    # The report: one row per level in its tables, the spread of the two repeats beside it,
    # each repeat's own figure listed, as levels.csv has it.
    summary = (run_dir / results.SUMMARY).read_text()
    assert "## Repeats: each level's spread" in summary
    section = summary[summary.index("## Repeats"):]
    for profile in PROFILES:
        for c in LEVELS:
            mine = [r for r in rows if r["profile"] == profile and int(r["concurrency"]) == c]
            by_repeat = ", ".join("r%s %.1f" % (r["repeat"], float(r["output_tok_s"]))
                                  for r in sorted(mine, key=lambda r: int(r["repeat"])))
            assert "| C=%d | %s |" % (c, profile) in section
            assert by_repeat in section, (by_repeat, section[:2000])
    table = summary[summary.index("## Levels side by side"):summary.index("## Output tok/s")]
    assert sum(1 for line in table.splitlines() if re.match(r"\| \d+ \| ", line)) == len(LEVELS)
    # The end-of-run table of the progress callback: a row per repeat, its repeat named.
    end = out[out.index("servelab summary"):]
    assert re.search(r"host\s+profile\s+C\s+repeat", end), end[:2000]
