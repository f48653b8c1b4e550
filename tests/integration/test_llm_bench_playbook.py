"""llm_bench (action + module) through real ansible-playbook runs against a real streaming server.

The server is the stdlib fake server of the unit tests (a subprocess ended by PID); the sweep's
files land in a temporary results root. Covered: the happy path (progress lines, parts,
levels.csv, requests.jsonl), a server that dies mid-sweep (finished levels kept, the sweep stops
with a clear message), Ctrl-C mid-sweep (finished levels kept), check mode and bad options (nothing
written).
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(REPO, "tests", "unit", "test_loadgen_fakeserver.py")
from ansible_collections.servelab.serving.plugins.module_utils.results import request_itl  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVEL_COLUMNS  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import FIXED_COLUMNS  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import level_verdict  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import level_line  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import read_parts  # noqa: E402
from simproc import ServerProcess  # noqa: E402

# The fast tier (make test) runs this module too: see pyproject.toml's markers.
pytestmark = pytest.mark.core

ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


@contextlib.contextmanager
def fake_server(*args):
    with ServerProcess(*args, script=FAKE) as srv:
        yield srv.url


def playbook(tmp_path, url, extra_args="", name="pb.yml"):
    text = textwrap.dedent("""\
        - hosts: localhost
          gather_facts: false
          tasks:
            - name: "servelab: sweep"
              servelab.serving.llm_bench:
                base_url: "{url}"
                model: m
                profile: baseline
                run_id: run1
                results_root: "{root}"
                max_tokens: 8
                level_seconds: 0.5
                level_timeout: 60
                server_metrics: false
        {extra}
              register: sweep
            - name: Show the levels
              ansible.builtin.debug:
                msg: "{{{{ sweep.levels | map(attribute='concurrency') | list }}}}"
        """).format(url=url, root=tmp_path / "results",
                    extra=textwrap.indent(textwrap.dedent(extra_args), " " * 8))
    path = tmp_path / name
    path.write_text(text)
    return path


def ansible_cmd(path, *extra):
    return [ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % sys.executable, str(path), *extra]


def run_playbook(path, *extra, timeout=300):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(ansible_cmd(path, *extra), capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=str(path.parent), check=False)


def read_levels(run_dir):
    with open(run_dir / "levels.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def part_rows(run_dir):
    """The level rows of the run's part files, in level order."""
    return [row for row, _path in read_parts(str(run_dir / "parts"))]


def test_sweep_writes_parts_levels_and_requests(tmp_path):
    with fake_server("--ttft-ms", "10", "--step-ms", "2") as url:
        proc = run_playbook(playbook(tmp_path, url, """\
            concurrency: [1, 3]
            slo: {ttft_ms: 500}
            percentiles: [99.9, "95"]
            workload: {kind: synthetic, input_tokens: 20, output_tokens: 6, count: 4}
            """))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "llm_bench localhost/baseline C=1: running" in out
    assert "llm_bench localhost/baseline C=3:" in out and "tok/s" in out
    run = tmp_path / "results" / "run1"
    assert sorted(os.listdir(run / "parts")) == [
        "localhost__baseline__c1.json", "localhost__baseline__c1.jsonl",
        "localhost__baseline__c3.json", "localhost__baseline__c3.jsonl"]
    with open(run / "levels.csv") as fh:
        header = fh.readline().strip().split(",")
    assert header[:len(LEVEL_COLUMNS)] == list(LEVEL_COLUMNS)
    # The chosen percentiles, after the fixed columns, by figure then q ("95" is a number to
    # Ansible's list of floats).
    assert header == list(FIXED_COLUMNS) + [
        "%s_p%s_ms" % (m, q) for m in ("ttft", "tpot", "itl", "e2e") for q in ("95", "99.9")]
    levels = read_levels(run)
    assert [lv["concurrency"] for lv in levels] == ["1", "3"]
    assert all(float(lv["itl_p99.9_ms"]) >= float(lv["itl_p95_ms"]) > 0 for lv in levels)
    for lv in levels:
        assert float(lv["output_tok_s"]) > 0 and lv["errors"] == "0"
        assert float(lv["goodput_request_s"]) > 0
    # One level per module call: the first drains the server before the next (server_metrics
    # false, so by probes), the sweep's last does not.
    assert levels[0]["drain_basis"] == "probe" and float(levels[0]["drain_s"]) >= 0
    assert levels[1]["drain_basis"] == "none" and levels[1]["drain_s"] == ""
    # Ansible runs on this machine: its own CPU is accounted beside the module's and the clients'.
    for lv in levels:
        assert lv["ansible_cpu_s"] != "" and float(lv["ansible_cpu_s"]) >= 0
        assert float(lv["module_cpu_s"]) > 0 and float(lv["client_cpu_s"]) > 0
        # Filled in: "kernel", or "user" where one read's stamp was refused (an age out of range
        # under a starved VM's clock: the level is then labelled conservatively; it read "user"
        # once in the no-reap tier). That plain TCP gets the kernel's stamps is
        # tests/unit/test_loadgen_rx_stamps.py's job.
        assert lv["rx_timestamps"] in ("kernel", "user") and int(lv["latency_samples"]) >= 1
    records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert {r["concurrency"] for r in records} == {1, 3}
    ok = [r for r in records if r["error"] is None]
    # synthetic output_tokens wins over max_tokens, and the count is the server's
    assert ok and all(r["completion_tokens"] == 6 and r["tokens_source"] == "server" for r in ok)
    # Each record carries its inter-token gaps: one per token-carrying chunk after the first,
    # their tokens adding up to the answer's (the first chunk's aside), per token.
    for r in ok:
        gaps = request_itl.decode(r["itl"])
        assert r["itl_basis"] == "token" and len(gaps) == r["chunks"] - 1
        assert sum(k for _gap, k in gaps) <= r["completion_tokens"] - 1
    for lv in levels:
        in_window = [r for r in records if r["in_window"] and r["concurrency"] == int(
            lv["concurrency"])]
        assert len(in_window) == int(lv["requests"])
    # The action's progress line and the servelab callback's line are one rendering of the row.
    for row in part_rows(run):
        assert "llm_bench " + level_line(row) in out
        assert "servelab |   " + level_line(row) in out


def test_server_dying_mid_sweep_keeps_finished_levels_and_stops(tmp_path):
    with fake_server("--ttft-ms", "5", "--step-ms", "2", "--exit-after", "14") as url:
        proc = run_playbook(playbook(tmp_path, url, """\
            concurrency: [1, 2, 4, 8]
            max_requests: 4
            """))
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "The sweep for this profile stopped" in out
    run = tmp_path / "results" / "run1"
    levels = read_levels(run)
    concs = [int(lv["concurrency"]) for lv in levels]
    assert concs[0] == 1 and levels[0]["errors"] == "0"
    assert 8 not in concs or len(concs) == 4       # stopped at the failing level
    last = levels[-1]
    assert int(last["run_errors"]) > 0             # the failing level is recorded, with errors
    assert "C=%d" % concs[-1] in out
    verdict = level_verdict(part_rows(run)[-1])    # the sweep stopped on the report's rule
    assert verdict.failed and "C=%d: %s" % (concs[-1], verdict.reason) in out


def test_check_mode_and_bad_options_write_nothing(tmp_path):
    with fake_server() as url:
        check = run_playbook(playbook(tmp_path, url, "concurrency: [1, 2]\n"), "--check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert not (tmp_path / "results").exists()
        bad = run_playbook(playbook(tmp_path, url, """\
            concurrency: [1, 0]
            """, name="bad.yml"))
        assert bad.returncode != 0
        assert "concurrency" in bad.stdout and "positive integer" in bad.stdout
        bad_slo = run_playbook(playbook(tmp_path, url, """\
            concurrency: [1]
            slo: {ttft: 100}
            """, name="bad2.yml"))
        assert bad_slo.returncode != 0 and "slo.ttft" in bad_slo.stdout
    assert not (tmp_path / "results").exists()


def test_ctrl_c_mid_sweep_keeps_finished_levels(tmp_path):
    with fake_server("--ttft-ms", "5", "--step-ms", "2") as url:
        path = playbook(tmp_path, url, """\
            concurrency: [1, 2]
            """)
        # The second level runs long, so the interrupt lands inside it.
        text = path.read_text().replace("level_timeout: 60", "level_timeout: 8\n"
                                        "        min_window_requests: 100000")
        path.write_text(text)
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
        proc = subprocess.Popen(ansible_cmd(path), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=str(tmp_path), start_new_session=True)
        part = tmp_path / "results" / "run1" / "parts" / "localhost__baseline__c1.json"
        try:
            deadline = time.monotonic() + 120
            # min_window_requests is huge, so level 1 ends at half its level_timeout (4 s):
            # wait for it, then interrupt level 2 as a terminal would (the whole group).
            while not part.exists() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.2)
            assert part.exists(), "level 1 never finished"
            time.sleep(1.0)
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    levels = read_levels(tmp_path / "results" / "run1")
    assert [lv["concurrency"] for lv in levels] == ["1"]
    assert levels[0]["window_complete"] == "false"   # ended by the time bound, and says so
