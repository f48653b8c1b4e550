"""The one /proc reader: parsers on fixed text, readers on this test's own process and a child."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (
    parse_status, read_environ, read_process, read_status, scan_processes, still_running,
)

STATUS = """Name:\tpython3
State:\tS (sleeping)
Uid:\t1000\t1000\t1000\t1000
NSpid:\t4242\t17
SigBlk:\t0000000000000000
SigIgn:\t0000000000004000
SigCgt:\t0000000180000002
"""


def test_parse_status_reads_uid_nspid_and_ignored_signals():
    status = parse_status(STATUS)
    assert status.uid == 1000 and status.nspid == (4242, 17)
    assert status.ignores(signal.SIGTERM)          # bit 14 = signal 15
    assert not status.ignores(signal.SIGINT)


def test_a_full_read_of_this_process_matches_what_the_os_says():
    me = read_process(os.getpid())
    assert (me.ppid, me.pgid, me.sid) == (os.getppid(), os.getpgid(0), os.getsid(0))
    assert me.uid == os.getuid() and os.path.basename(sys.executable)[:6] in me.cmdline
    assert not me.kernel_thread and not me.gone
    stat_only = read_process(os.getpid(), stat_only=True)
    assert stat_only.start_time == me.start_time and stat_only.cmdline == ""
    assert os.getpid() in scan_processes(stat_only=True)


def test_environ_and_ignored_signals_of_a_child():
    env = dict(os.environ, SERVELAB_TABLE_TEST="x1")
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, sys, time\n"
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                              "print('ready', flush=True)\ntime.sleep(60)"],
                             env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert b"SERVELAB_TABLE_TEST=x1" in read_environ(child.pid)
        assert read_status(child.pid).ignores(signal.SIGTERM)
        info = read_process(child.pid)
        assert still_running(child.pid, info.start_time)
        assert not still_running(child.pid, info.start_time + 1), "another start time is another process"
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    assert not still_running(child.pid, None)


def test_an_exited_process_nobody_reaps_is_gone_though_its_proc_entry_stays():
    """The one rule (proc/lifetime.is_alive): a zombie is gone. Under an init that never reaps
    (a container whose PID 1 is `sleep infinity`) an exited process keeps /proc/<pid> forever;
    here the test is that process's parent and simply does not wait for it yet."""
    from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while read_process(child.pid, stat_only=True).state != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert os.path.exists("/proc/%d" % child.pid)           # what a naive check looks at
        assert not lifetime.is_alive(child.pid)
        assert lifetime.running_start_time(child.pid) is None
        assert not still_running(child.pid, None)
    finally:
        child.wait()
    assert lifetime.running_start_time(os.getpid()) == read_process(os.getpid()).start_time
    assert lifetime.is_alive(os.getpid(), lifetime.running_start_time(os.getpid()))


def test_pids_with_open_file_finds_a_child_holding_a_file_and_skips_what_cannot_be_read(tmp_path):
    from ansible_collections.servelab.serving.plugins.module_utils.proc.table import pids_with_open_file

    held = tmp_path / "held"
    held.write_text("")
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nf = open(sys.argv[1])\n"
                              "print('open', flush=True)\ntime.sleep(600)", str(held)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "open"
        target = os.stat(held)

        def is_held(fd_path):
            st = os.stat(fd_path)
            return (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino)

        assert pids_with_open_file(is_held) == [child.pid]

        def unreadable(fd_path):
            raise PermissionError(fd_path)     # as /proc/<pid>/fd of another user reads

        assert pids_with_open_file(unreadable) == []
    finally:
        child.kill()
        child.wait(timeout=30)
        child.stdout.close()
    assert pids_with_open_file(is_held) == []
