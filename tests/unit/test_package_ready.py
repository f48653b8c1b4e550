"""apt, dpkg and pip readiness (plugins/module_utils/apt/ready.py): the live holder of a lock named
by PID and command line, waited for, a pip on a venv found by what it executes, and an interrupted
dpkg read from its audit and journal, repaired only when allowed and nothing holds the locks."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.apt import ready as r
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import ProcInfo

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
if sys.argv[2] == "ofd":
    import struct
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("@hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0).ljust(32, b"\\0"))
else:
    fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(float(sys.argv[3]))
"""


@pytest.fixture
def holder(tmp_path):
    """Start a process holding a lock on a file in tmp_path; ended by PID when the test ends."""
    procs = []

    def start(kind="posix", seconds=60.0):
        path = tmp_path / ("lock-%d" % len(procs))
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), kind, str(seconds)], stdout=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return str(path), proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def no_run(argv):
    raise AssertionError("nothing should run: %s" % argv)


def test_a_lock_names_its_live_holder_and_dies_with_it(holder, tmp_path):
    path, proc = holder()
    assert r.lock_owner(path) == proc.pid
    found = r.lock_holders([path, str(tmp_path / "absent")])
    assert [(h.pid, h.holds) for h in found] == [(proc.pid, path)]
    assert "-c" in found[0].cmdline and path in found[0].cmdline
    assert "PID %d (" % proc.pid in found[0].label() and found[0].label().endswith("holds %s" % path)
    proc.kill()
    proc.wait()
    assert r.lock_owner(path) is None, "a lock is gone with its holder: a holder found is a live one"


@pytest.mark.skipif(not hasattr(fcntl, "F_OFD_SETLK"), reason="no open file description locks in this Python")
def test_a_lock_without_a_pid_is_put_to_the_processes_that_have_the_file_open(holder):
    path, proc = holder("ofd")
    assert r.lock_owner(path) == -1
    assert [h.pid for h in r.lock_holders([path])] == [proc.pid]


def test_the_wait_ends_when_the_holder_does(holder):
    path, proc = holder(seconds=1.0)
    checker = r.Checker(run=no_run, locks=[path], check_dpkg=False, poll=0.1)
    result = checker.check(timeout=30, repair=False)
    assert result.holders == [] and 0.5 < result.waited < 30
    assert [h.pid for h in result.waited_for] == [proc.pid]
    assert r.summary(result) == ""


def test_a_holder_past_the_timeout_is_named(holder):
    path, proc = holder()
    checker = r.Checker(run=no_run, locks=[path], check_dpkg=False, poll=0.1)
    started = time.monotonic()
    result = checker.check(timeout=1, repair=True)
    assert 1 <= time.monotonic() - started < 10
    assert [h.pid for h in result.holders] == [proc.pid]
    text = r.summary(result, "ct129")
    assert text.startswith("apt, dpkg or pip is busy on ct129 after 1 s of waiting: PID %d (" % proc.pid), text
    assert "holds %s" % path in text


def test_a_process_holding_several_locks_is_named_once():
    apt = "/usr/bin/apt-get -y install cuda-toolkit-13-0=13.0.1-1"
    dpkg = "/usr/bin/dpkg --configure --pending"
    holders = [r.Holder(3562, apt, "/var/lib/dpkg/lock-frontend"), r.Holder(3581, dpkg, "/var/lib/dpkg/lock"),
               r.Holder(3562, apt, "/var/cache/apt/archives/lock")]
    assert r.labels(holders) == [
        "PID 3562 (%s) holds /var/lib/dpkg/lock-frontend, /var/cache/apt/archives/lock" % apt,
        "PID 3581 (%s) holds /var/lib/dpkg/lock" % dpkg]


def info(pid, cmdline):
    return ProcInfo(pid=pid, ppid=1, pgid=pid, sid=pid, state="S", comm="python3", start_time=pid, cmdline=cmdline)


def test_pip_on_a_venv_is_found_by_what_it_runs(tmp_path):
    venvs = tmp_path / "venvs"
    (venvs / "new" / "bin").mkdir(parents=True)
    link = tmp_path / "venv"
    link.symlink_to(venvs / "new")
    new = str(venvs / "new")
    table = {
        10: info(10, "%s/bin/python %s/bin/pip install torch==2.14.1+cu130" % (new, new)),
        11: info(11, "/usr/bin/python3 -m venv %s/other" % venvs),
        12: info(12, "%s/bin/python -m pip install x" % link),
        13: info(13, "%s/bin/python -m sglang.launch_server --model-path /m" % link),   # a server, not pip
        14: info(14, "grep pip %s/bin/activate" % new),                                  # names pip, runs grep
        15: info(15, "/usr/bin/pip3 install --user something"),                          # pip, another place
        16: info(16, "%s/bin/python %s/bin/pip install y" % (new, new)),                 # ourselves: excluded
    }
    found = r.pip_holders([str(link), str(venvs)], table, exclude={16})
    assert [(h.pid, h.holds) for h in found] == [
        (10, "pip on %s" % new), (11, "pip on %s" % venvs), (12, "pip on %s" % link)]


def fake_dpkg(audits, repair_rc=0):
    """A dpkg that answers --audit from `audits` in turn and records what ran."""
    ran = []

    def run(argv):
        ran.append(list(argv))
        if argv[:2] == ["dpkg", "--audit"]:
            text = audits.pop(0) if audits else ""
            return (1 if text else 0), text, ""
        if list(argv) == list(r.REPAIR):
            return repair_rc, "Setting up cuda-toolkit-13-0 (13.0.1-1) ...\n", "" if repair_rc == 0 else "boom"
        raise AssertionError(argv)
    return run, ran


HALF = ("The following packages are only half configured, probably due to problems\n"
        "configuring them the first time.  The configuration should be retried using\n"
        "dpkg --configure <package> or the configure menu option in dselect:\n"
        " cuda-toolkit-13-0    CUDA Toolkit 13.0 meta-package\n")


def test_an_interrupted_dpkg_is_named_when_repair_is_not_allowed(tmp_path):
    run, ran = fake_dpkg([HALF])
    (tmp_path / "updates").mkdir()
    (tmp_path / "updates" / "0003").write_text("")
    (tmp_path / "updates" / "tmp.i").write_text("")
    result = r.Checker(run=run, locks=[], admindir=str(tmp_path)).check(timeout=0, repair=False)
    assert result.interrupted and result.broken and not result.repaired
    assert result.journal == ["0003"]
    assert ran == [["dpkg", "--audit"]]
    text = r.summary(result, "ct129")
    assert text.startswith("dpkg on ct129 was interrupted") and "cuda-toolkit-13-0" in text


def test_an_interrupted_dpkg_is_repaired_when_allowed_and_checked_again(tmp_path):
    run, ran = fake_dpkg([HALF, ""])
    result = r.Checker(run=run, locks=[], admindir=str(tmp_path)).check(timeout=0, repair=True)
    assert ran == [["dpkg", "--audit"], list(r.REPAIR), ["dpkg", "--audit"]]
    assert result.repaired and result.repair_rc == 0 and not result.broken
    assert "Setting up cuda-toolkit-13-0" in result.repair_output
    assert r.summary(result) == ""


def test_a_failed_repair_is_said(tmp_path):
    run, _ran = fake_dpkg([HALF], repair_rc=1)
    result = r.Checker(run=run, locks=[], admindir=str(tmp_path)).check(timeout=0, repair=True)
    assert result.broken
    assert "`dpkg --configure -a` did not repair it (rc 1)" in r.summary(result)


def test_no_repair_in_check_mode_nor_while_a_lock_is_held(holder, tmp_path):
    run, ran = fake_dpkg([HALF])
    result = r.Checker(run=run, locks=[], admindir=str(tmp_path)).check(timeout=0, repair=True, check_mode=True)
    assert ran == [["dpkg", "--audit"]] and result.broken
    path, proc = holder()
    run, ran = fake_dpkg([HALF])
    result = r.Checker(run=run, locks=[path], admindir=str(tmp_path), poll=0.1).check(timeout=0, repair=True)
    assert list(r.REPAIR) not in ran and [h.pid for h in result.holders] == [proc.pid]
    # While it is held, the holder is the news; whether dpkg is interrupted is read again once it is not.
    assert r.summary(result).startswith("apt, dpkg or pip is busy")


def test_a_clean_dpkg_is_ready(tmp_path):
    run, ran = fake_dpkg([""])
    result = r.Checker(run=run, locks=[], admindir=str(tmp_path)).check(timeout=0, repair=True)
    assert not result.interrupted and not result.broken and ran == [["dpkg", "--audit"]]
    assert r.summary(result) == "" and os.path.isdir(tmp_path)
