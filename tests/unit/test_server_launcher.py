"""The launcher with real processes: detach, cgroup, and stopping a tree that escaped its group.

Every process a test starts is killed by PID in the fixture's finally, even when the test fails.
"""
import os
import signal
import sys
import time
import uuid

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.server import launcher
from ansible_collections.servelab.serving.plugins.module_utils.proc import cgroup as proc_cgroup, lifetime, tree as proc_tree
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import read_process

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]
TERM_IGNORER = [sys.executable, "-c",
                "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ignoring TERM', flush=True)\nwhile True: time.sleep(1)"]
# Parent stays (like an engine's main process); its child forks a grandchild into a new session
# and exits, so the grandchild has another process group, another session and parent PID 1.
DOUBLE_FORK = [sys.executable, "-c", """
import os, sys, time
pid_file = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(pid_file + '.tmp', 'w').write(str(os.getpid()))
        os.replace(pid_file + '.tmp', pid_file)
        while True: time.sleep(1)
    os._exit(0)
while True: time.sleep(1)
"""]


@pytest.fixture
def procs(tmp_path):
    """Tracks what a test started; kills leftovers by PID and removes cgroups at the end."""
    started = {"pids": set(), "pid_files": [], "cgroups": []}
    yield started
    pids = set(started["pids"])
    for pid_file in started["pid_files"]:
        try:
            pids.add(int(open(pid_file).read()))
        except (OSError, ValueError):
            pass
    for pid in pids:
        if lifetime.is_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    lifetime.collect_exited_children(pids)
    for path in started["cgroups"]:
        proc_cgroup.kill(path)
        proc_cgroup.remove(path, timeout=5)


def spawn(tmp_path, procs, cmd, cgroup="auto"):
    name = f"test-{uuid.uuid4().hex[:8]}"
    choice = proc_cgroup.prepare(name, cgroup)
    if choice.path:
        procs["cgroups"].append(choice.path)
    launched = launcher.spawn(cmd, {"SERVELAB_TEST": "1"}, str(tmp_path / "server.log"),
                              str(tmp_path), f"{name}:x", choice)
    procs["pids"].add(launched.pid)
    return launched


def wait_for_file(path, timeout=30):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)
    return int(open(path).read())


def need_cgroup():
    probe = proc_cgroup.prepare(f"probe-{uuid.uuid4().hex[:6]}")
    if not probe.path:
        pytest.skip(f"no writable cgroup v2 hierarchy on this machine ({probe.reason})")
    proc_cgroup.remove(probe.path)


def test_spawn_detaches_into_its_own_session_with_log_and_marker(tmp_path, procs):
    launched = spawn(tmp_path, procs, SLEEPER, cgroup="none")
    info = read_process(launched.pid)
    assert info.sid == launched.pid and info.pgid == launched.pid
    assert info.sid != os.getsid(0)
    assert launched.start_time == info.start_time
    assert proc_tree.has_marker(launched.pid, launched.marker)
    env = open(f"/proc/{launched.pid}/environ", "rb").read().split(b"\0")
    assert b"SERVELAB_TEST=1" in env
    assert os.path.exists(launched.log_path)


def test_spawn_joins_the_cgroup_before_exec(tmp_path, procs):
    need_cgroup()
    launched = spawn(tmp_path, procs, SLEEPER)
    assert launched.cgroup and launched.pid in proc_cgroup.member_pids(launched.cgroup)


def test_stop_kills_a_double_forked_grandchild_through_the_cgroup(tmp_path, procs):
    need_cgroup()
    pid_file = str(tmp_path / "grandchild.pid")
    procs["pid_files"].append(pid_file)
    launched = spawn(tmp_path, procs, DOUBLE_FORK + [pid_file])
    grandchild = wait_for_file(pid_file)
    info = read_process(grandchild)
    assert info.pgid != launched.pid and info.sid != launched.pid   # it really escaped
    report = launcher.stop_tree(launched.pid, launched.start_time, None, launched.cgroup,
                                grace=5, kill_timeout=5)
    assert not lifetime.is_alive(grandchild)
    assert not lifetime.is_alive(launched.pid)
    assert {grandchild, launched.pid} <= {k["pid"] for k in report.killed}
    assert report.survivors == []
    assert not os.path.exists(launched.cgroup)


def test_stop_kills_a_double_forked_grandchild_without_a_cgroup(tmp_path, procs):
    """No cgroup (cgroup v1-only host): the inherited environment marker still finds it."""
    pid_file = str(tmp_path / "grandchild.pid")
    procs["pid_files"].append(pid_file)
    launched = spawn(tmp_path, procs, DOUBLE_FORK + [pid_file], cgroup="none")
    assert launched.cgroup is None
    grandchild = wait_for_file(pid_file)
    report = launcher.stop_tree(launched.pid, launched.start_time, launched.marker, None,
                                grace=5, kill_timeout=5)
    assert not lifetime.is_alive(grandchild)
    assert grandchild in {k["pid"] for k in report.killed}


def test_a_process_group_kill_alone_misses_the_escapee(tmp_path, procs):
    """Why the launcher does more than `kill -- -PGID`."""
    pid_file = str(tmp_path / "grandchild.pid")
    procs["pid_files"].append(pid_file)
    launched = spawn(tmp_path, procs, DOUBLE_FORK + [pid_file], cgroup="none")
    grandchild = wait_for_file(pid_file)
    os.killpg(launched.pid, signal.SIGKILL)
    assert lifetime.wait_until_gone([launched.pid], timeout=10) == set()
    assert lifetime.is_alive(grandchild)


def test_a_server_ignoring_sigterm_gets_sigkill_after_the_grace(tmp_path, procs):
    launched = spawn(tmp_path, procs, TERM_IGNORER, cgroup="none")
    log = tmp_path / "server.log"
    deadline = time.monotonic() + 30
    while b"ignoring TERM" not in log.read_bytes():   # the handler is installed
        assert time.monotonic() < deadline
        time.sleep(0.05)
    report = launcher.stop_tree(launched.pid, launched.start_time, launched.marker, None,
                                grace=0.5, kill_timeout=10)
    assert not lifetime.is_alive(launched.pid)
    assert [k["signal"] for k in report.killed if k["pid"] == launched.pid] == ["SIGKILL"]


def test_a_cgroup_that_cannot_be_joined_falls_back_without_one(tmp_path, procs):
    bogus = proc_cgroup.CgroupChoice(str(tmp_path / "not-a-cgroup"), "test")
    launched = launcher.spawn(SLEEPER, {}, str(tmp_path / "server.log"), str(tmp_path), "m:x",
                              bogus)
    procs["pids"].add(launched.pid)
    assert launched.cgroup is None and "started without a cgroup" in launched.cgroup_reason
    assert lifetime.is_alive(launched.pid)


def test_a_missing_executable_is_a_launch_error(tmp_path):
    choice = proc_cgroup.CgroupChoice(None, "none")
    with pytest.raises(launcher.LaunchError) as err:
        launcher.spawn(["/nonexistent/engine", "serve"], {}, str(tmp_path / "log"),
                       str(tmp_path), "m:x", choice)
    assert "/nonexistent/engine" in str(err.value)


def test_members_never_include_the_caller_or_its_ancestors():
    found = proc_tree.members(os.getpid(), None)
    assert os.getpid() not in found and os.getppid() not in found


def test_a_reused_pid_is_not_the_same_process(tmp_path, procs):
    launched = spawn(tmp_path, procs, SLEEPER, cgroup="none")
    assert lifetime.is_alive(launched.pid, launched.start_time)
    assert not lifetime.is_alive(launched.pid, launched.start_time + 1)


def test_previous_log_is_kept(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("first run\n")
    launcher.rotate_log(str(log))
    assert (tmp_path / "server.log.1").read_text() == "first run\n" and not log.exists()


def test_orphans_of_a_dead_root_are_found_by_their_group(tmp_path, procs):
    """The first process died, its worker lives on in its group: no cgroup, no marker needed."""
    script = [sys.executable, "-c",
              "import os, sys, time\n"
              "if os.fork() == 0:\n"
              "    open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
              "    os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
              "    while True: time.sleep(1)\n"
              "time.sleep(600)\n"]
    pid_file = str(tmp_path / "worker.pid")
    procs["pid_files"].append(pid_file)
    launched = spawn(tmp_path, procs, script + [pid_file], cgroup="none")
    worker = wait_for_file(pid_file)
    os.kill(launched.pid, signal.SIGKILL)
    assert lifetime.wait_until_gone([launched.pid], timeout=10) == set()
    found = proc_tree.members(launched.pid, launched.start_time, marker=None)
    assert set(found) == {worker}
    report = launcher.stop_tree(launched.pid, launched.start_time, None, None, grace=5)
    assert not lifetime.is_alive(worker) and report.survivors == []
