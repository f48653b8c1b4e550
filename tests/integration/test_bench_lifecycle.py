"""bench.yml's run lifecycle on the embedded default (inventory/local, the simulator engine):
one run at a time per state directory and port, interruption (SIGINT, SIGTERM, Ctrl-C to the
process group), resuming, and the exit status of a run in which a profile failed.

Every run is a real ansible-playbook started in its own process group (as a terminal would) with
a marker in its environment. Every process of the run inherits it (workers, modules, the servers
llm_server starts), so "nothing of the run is left" is checked by scanning /proc for the marker,
besides the server pid in its state file and the port.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from playbookproc import PlaybookProcess  # tests/ (conftest.py)
from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import level_verdict
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import read_parts
from ansible_collections.servelab.serving.plugins.module_utils.run import lock
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime
from ansible_collections.servelab.serving.plugins.module_utils.server import ports
from testports import free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
MARK = "SERVELAB_TEST_RUN_MARK"

pytestmark = pytest.mark.slow


def port_is_free(port: int) -> bool:
    """Nothing listens on `port`. Not a plain bind: a connection of the killed server left in
    TIME_WAIT, or another test's client that the kernel gave this number as its ephemeral port,
    makes a bind without SO_REUSEADDR fail while no process holds the port (seen on a loaded CI
    machine); a server binds with SO_REUSEADDR, so only a listener stops the next run."""
    return not ports.is_listening(port)


def processes_with(mark: str) -> list:
    """Live processes whose environment carries `mark` (zombies are gone already)."""
    found = []
    needle = ("%s=%s" % (MARK, mark)).encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as fh:
                env = fh.read()
            with open("/proc/%s/stat" % name, "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            with open("/proc/%s/cmdline" % name, "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in env.split(b"\0") and state not in (b"Z", b"X"):
            found.append("%s %s" % (name, cmdline[:200]))
    return found


def settings(tmp_path, **overrides):
    extra = {
        "bench_profiles": [{"name": "baseline",
                            "simulator": {"profile": "baseline", "time_scale": 20}}],
        "bench_concurrency": [1, 2],
        "bench_level_seconds": 2,
        "bench_warmup_requests": 1,
        "bench_server_port": free_port(),
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": {"kind": "synthetic", "input_tokens": 256, "output_tokens": 64,
                           "count": 16},
        "bench_max_tokens": 64,
    }
    extra.update(overrides)
    return extra


class Run(PlaybookProcess):
    """One ansible-playbook bench.yml, in its own process group, its output collected."""

    def __init__(self, tmp_path, extra, *cli, results_root=None):
        self.mark = uuid.uuid4().hex
        self.results_root = results_root or tmp_path / "results"
        varsfile = tmp_path / ("vars-%s.json" % self.mark[:8])
        varsfile.write_text(json.dumps(extra))
        self.varsfile = varsfile
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
                   SERVELAB_RESULTS_ROOT=str(self.results_root), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1", **{MARK: self.mark})
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        super().__init__([ANSIBLE_PLAYBOOK, "-i", os.path.join(REPO, "inventory", "local"),
                          "-e", "@%s" % varsfile, *cli, os.path.join(REPO, "bench.yml")],
                         env, REPO)


@contextlib.contextmanager
def bench(tmp_path, extra, *cli, **kw):
    run = Run(tmp_path, extra, *cli, **kw)
    try:
        yield run
    finally:
        run.kill()


def run_dir_of(root, run_id):
    return root / run_id


def level_rows(run_dir):
    return {(row["profile"], int(row["concurrency"])): row
            for row, _jsonl in read_parts(str(run_dir / results.PARTS_DIR))}


def server_state(state_dir, name="servelab-baseline"):
    return json.loads((state_dir / name / "state.json").read_text())


def test_a_second_run_on_the_same_state_dir_and_port_is_refused_and_the_first_is_untouched(tmp_path):
    extra = settings(tmp_path, bench_run_id="first-run", bench_level_seconds=3)
    with bench(tmp_path, extra) as first:
        first.wait_for_line(r"llm_bench localhost/baseline C=1: running")
        second_extra = dict(extra, bench_run_id="second-run")
        started = time.monotonic()
        with bench(tmp_path, second_extra) as second:
            rc2 = second.wait(120)
        refused_in = time.monotonic() - started
        rc1 = first.wait(600)
    assert rc2 != 0, second.output[-3000:]
    assert "first-run" in second.output and "refused" in second.output, second.output[-3000:]
    # Refused before anything started: no run directory, results/latest still the first run.
    root = tmp_path / "results"
    assert not (root / "second-run").exists()
    assert os.readlink(root / results.LATEST_LINK) == "first-run"
    assert refused_in < 60, refused_in
    # The first run went on undisturbed: every level measured and usable.
    assert rc1 == 0, first.output[-5000:]
    rows = level_rows(root / "first-run")
    assert sorted(rows) == [("baseline", 1), ("baseline", 2)]
    for row in rows.values():
        assert not level_verdict(row).failed and int(row["errors"]) == 0, row
    manifest = json.loads((root / "first-run" / results.MANIFEST).read_text())
    assert manifest["status"] == "finished"
    assert manifest["profiles"]["baseline"]["localhost"]["status"] == "finished"
    assert processes_with(first.mark) == [] and processes_with(second.mark) == []


def test_two_runs_with_their_own_state_dirs_and_ports_never_reap_each_other(tmp_path):
    # A reap pattern that matches the simulators of both runs (and nothing outside this test):
    # without the lock registry's protect_pids the second run's first reap kills the first
    # run's server mid-sweep.
    pattern = re.escape(str(tmp_path)) + r"/[^ ]+/servelab_simulator\.pyz?"
    one = settings(tmp_path, bench_run_id="run-one", bench_level_seconds=5,
                   bench_concurrency=[1, 2, 3, 4],
                   bench_state_dir=str(tmp_path / "servers-one"), bench_reap_patterns=[pattern])
    two = settings(tmp_path, bench_run_id="run-two", bench_concurrency=[1],
                   bench_state_dir=str(tmp_path / "servers-two"), bench_reap_patterns=[pattern])
    with bench(tmp_path, one) as first:
        first.wait_for_line(r"llm_bench localhost/baseline C=1: running")
        with bench(tmp_path, two) as second:
            # The second run's first reap is over once it starts its own server.
            second.wait_for_line(r"TASK \[.*Start the server for baseline\]", timeout=300)
            overlapped = not any("Mark the profile finished" in line for line in first.lines)
            rc2 = second.wait(300)
        rc1 = first.wait(600)
    assert overlapped, "the second run reaped only after the first run's sweep: nothing shown"
    assert rc2 == 0, second.output[-5000:]
    assert rc1 == 0, first.output[-5000:]
    # The first run's server lived through the second run's reaps: every level is good.
    rows = level_rows(tmp_path / "results" / "run-one")
    assert sorted(rows) == [("baseline", c) for c in (1, 2, 3, 4)]
    for row in rows.values():
        assert not level_verdict(row).failed and int(row["errors"]) == 0, row


def _interrupt(run, how):
    if how == "group":
        os.killpg(run.proc.pid, signal.SIGINT)      # what a terminal's Ctrl-C does
    else:
        os.kill(run.proc.pid, getattr(signal, how))


@pytest.mark.parametrize("how", [pytest.param("SIGINT", marks=pytest.mark.core), "SIGTERM", "group"])
def test_an_interrupt_stops_everything_records_the_level_in_flight_and_resume_finishes(tmp_path, how):
    run_id = "interrupted-" + how.lower()
    extra = settings(tmp_path, bench_run_id=run_id, bench_level_seconds=3)
    root = tmp_path / "results"
    with bench(tmp_path, extra) as run:
        run.wait_for_line(r"llm_bench localhost/baseline C=2: running")
        time.sleep(1.0)
        _interrupt(run, how)
        if how == "group":
            # An impatient second Ctrl-C while the cleanup runs: it must not cut it short.
            run.wait_for_line(r"servelab: cleaning up run %s" % run_id, timeout=120)
            _interrupt(run, how)
        rc = run.wait(300)
    assert rc != 0, run.output[-5000:]
    if how == "group":
        assert "SIGINT again: still cleaning up" in run.output, run.output[-3000:]
    # Nothing of the run is left: its server (by the pid it recorded), the port, any process.
    state = server_state(tmp_path / "servers")
    assert not lifetime.is_alive(state["pid"], state["start_time"]), run.output[-3000:]
    assert port_is_free(extra["bench_server_port"])
    assert processes_with(run.mark) == [], run.output[-3000:]
    run_dir = root / run_id
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert manifest["status"] == "interrupted", run.output[-3000:]
    assert manifest["interrupt_reason"] == ("SIGINT" if how == "group" else how)
    assert [(lv["profile"], lv["level"]) for lv in manifest["level_in_flight"]] == [
        ("baseline", "C=2")]
    # The report of what finished, and only of that.
    assert sorted(level_rows(run_dir)) == [("baseline", 1)]
    # ... which says it was interrupted, what it measured and the command that resumes it
    summary = (run_dir / results.SUMMARY).read_text()
    assert "## Run interrupted" in summary and "finished not recorded" not in summary
    assert ("level in flight, not measured: baseline C=2 on localhost" in summary
            and "measured: baseline on localhost: C=1" in summary), summary
    resume = manifest["resume_command"]
    assert resume in summary and resume.endswith(
        "-e bench_resume=%s %s" % (run_id, os.path.join(REPO, "bench.yml"))), resume
    assert "--extra-vars @%s" % run.varsfile in resume, resume
    with open(run_dir / results.LEVELS, newline="") as fh:
        assert [int(r["concurrency"]) for r in csv.DictReader(fh)] == [1]
    part = run_dir / results.PARTS_DIR / "localhost__baseline__c1.json"
    before = (part.read_bytes(), part.with_suffix(".jsonl").read_bytes())

    # The run id again without bench_resume: refused before anything starts.
    with bench(tmp_path, dict(extra, bench_run_id=run_id)) as reuse:
        assert reuse.wait(120) != 0
    assert "bench_resume=%s" % run_id in reuse.output, reuse.output[-3000:]
    assert json.loads((run_dir / results.MANIFEST).read_text())["status"] == "interrupted"

    # bench_resume finishes it: the finished level is kept byte for byte, the rest measured.
    resumed_extra = {k: v for k, v in extra.items() if k != "bench_run_id"}
    resumed_extra["bench_resume"] = run_id
    with bench(tmp_path, resumed_extra) as resumed:
        rc = resumed.wait(600)
    assert rc == 0, resumed.output[-5000:]
    assert "C=1: measured earlier in this run, kept" in resumed.output
    assert (part.read_bytes(), part.with_suffix(".jsonl").read_bytes()) == before
    assert sorted(level_rows(run_dir)) == [("baseline", 1), ("baseline", 2)]
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert manifest["status"] == "finished" and manifest["resumed_at"]
    with open(run_dir / results.LEVELS, newline="") as fh:
        assert sorted(int(r["concurrency"]) for r in csv.DictReader(fh)) == [1, 2]
    assert processes_with(resumed.mark) == []


@pytest.mark.parametrize("keep_going", [False, True])
def test_a_failed_profile_fails_the_run_after_the_report_unless_asked_not_to(tmp_path, keep_going):
    profiles = [
        {"name": "baseline", "simulator": {"profile": "baseline", "time_scale": 20}},
        {"name": "eagle3", "simulator": {"profile": "eagle3", "time_scale": 20, "die_after": 3}},
    ]
    extra = settings(tmp_path, bench_profiles=profiles, bench_run_id="with-a-failure",
                     bench_concurrency=[1, 2])
    if keep_going:
        extra["bench_continue_on_profile_failure"] = True
    with bench(tmp_path, extra) as run:
        rc = run.wait(600)
    run_dir = tmp_path / "results" / "with-a-failure"
    assert (run_dir / results.SUMMARY).is_file(), run.output[-5000:]
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert manifest["profiles"]["eagle3"]["localhost"]["status"] == "failed"
    assert manifest["status"] == "finished"
    if keep_going:
        assert rc == 0, run.output[-5000:]
    else:
        assert rc != 0, run.output[-5000:]
        assert "eagle3" in run.output.rsplit("Fail the run", maxsplit=1)[-1], run.output[-3000:]


def test_after_a_sigkill_the_cleanup_by_hand_stops_the_server_and_closes_the_run(tmp_path):
    # SIGKILL leaves no chance to clean up: the server (its own session) keeps the port, the
    # manifest stays `started`. playbooks/bench_interrupted.yml, run by hand, finishes the job:
    # the locks' holder is gone, so the run's locks are stale and its own to act on.
    run_id = "killed-run"
    extra = settings(tmp_path, bench_run_id=run_id, bench_level_seconds=3)
    with bench(tmp_path, extra) as run:
        run.wait_for_line(r"llm_bench localhost/baseline C=2: running")
        os.kill(run.proc.pid, signal.SIGKILL)
        run.wait(60)
        state = server_state(tmp_path / "servers")
        # Its workers end on their own once their task is done; only the server stays.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and [
                p for p in processes_with(run.mark) if not p.startswith("%d " % state["pid"])]:
            time.sleep(0.5)
    assert lifetime.is_alive(state["pid"], state["start_time"])
    assert json.loads((tmp_path / "results" / run_id / results.MANIFEST).read_text())[
        "status"] == "started"

    varsfile = tmp_path / "cleanup-vars.json"
    varsfile.write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               SERVELAB_RESULTS_ROOT=str(tmp_path / "results"), ANSIBLE_NOCOLOR="1")
    cleanup = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", os.path.join(REPO, "inventory", "local"), "-e", "@%s" % varsfile,
         os.path.join(REPO, "playbooks", "bench_interrupted.yml")],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert cleanup.returncode == 0, cleanup.stdout[-5000:]
    assert not lifetime.is_alive(state["pid"], state["start_time"])
    assert port_is_free(extra["bench_server_port"])
    assert processes_with(run.mark) == []
    run_dir = tmp_path / "results" / run_id
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert manifest["status"] == "interrupted"
    assert manifest["interrupt_reason"] == "cleaned up by hand"
    assert ("baseline", 1) in level_rows(run_dir)
    assert (run_dir / results.SUMMARY).is_file()
    # Every lock of the run is gone: a new run may take the state directory and port.
    assert not (tmp_path / "servers" / "run.lock.json").exists()
    _name, port_lock = lock.port_resource(lock.default_lock_dir(), extra["bench_server_port"])
    assert not os.path.exists(port_lock)
