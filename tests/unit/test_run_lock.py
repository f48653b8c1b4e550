"""The run locks (plugins/module_utils/run/lock.py) and the controller's judgement of holders
(plugins/plugin_utils/run_locks.py): all-or-nothing acquisition, live / stale / foreign holders,
take-over by token, release by token, a race of many acquirers, the servers a reap must spare.

Live holders are real processes this test starts (and ends by pid); a dead holder is one of them
after it exited.
"""
from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import read_process
from ansible_collections.servelab.serving.plugins.module_utils.run import lock
from ansible_collections.servelab.serving.plugins.plugin_utils import run_locks


@pytest.fixture
def sleeper():
    """A live process that is not this test: the pid of another run's controller."""
    procs = []

    def start():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def controller_of(pid):
    return lock.Controller.of_pid(pid)


def dead_controller():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    me = controller_of(proc.pid)          # read while it may still run: its identity
    proc.wait(10)
    info = read_process(proc.pid, stat_only=True)
    assert info is None or info.start_time != me.start_time or info.state in ("Z", "X")
    return me


def resources(tmp_path, port=31001):
    lock_dir = str(tmp_path / "locks")
    return lock_dir, [lock.state_dir_resource(str(tmp_path / "servers")),
                      lock.port_resource(lock_dir, port)]


def test_acquire_writes_both_records_and_a_second_run_conflicts_on_each(tmp_path, sleeper):
    lock_dir, res = resources(tmp_path)
    first = controller_of(sleeper().pid)
    got = lock.acquire(lock_dir, res, "run-a", first, state_dir=str(tmp_path / "servers"),
                       port=31001)
    assert not got.conflicts and len(got.written) == 2
    record = json.loads((tmp_path / "servers" / lock.STATE_DIR_LOCK).read_text())
    assert record["run_id"] == "run-a" and record["controller"]["pid"] == first.pid
    assert record["controller"]["start_time"] == first.start_time and record["port"] == 31001
    second = lock.acquire(lock_dir, res, "run-b", controller_of(sleeper().pid))
    assert [c.holder.run_id for c in second.conflicts] == ["run-a", "run-a"]
    assert not second.acquired and not second.written


def test_all_or_nothing_a_free_resource_is_not_taken_when_another_is_held(tmp_path, sleeper):
    lock_dir, res = resources(tmp_path)
    lock.acquire(lock_dir, res[1:], "run-a", controller_of(sleeper().pid))   # the port only
    outcome = lock.acquire(lock_dir, res, "run-b", controller_of(sleeper().pid))
    assert [c.resource for c in outcome.conflicts] == ["port:31001"]
    assert not (tmp_path / "servers" / lock.STATE_DIR_LOCK).exists()


def test_the_same_run_and_process_acquiring_again_keeps_its_records(tmp_path, sleeper):
    lock_dir, res = resources(tmp_path)
    me = controller_of(sleeper().pid)
    first = lock.acquire(lock_dir, res, "run-a", me)
    again = lock.acquire(lock_dir, res, "run-a", me)
    assert not again.conflicts and not again.written
    assert {r.token for r in again.acquired} == {r.token for r in first.acquired}
    # The same run id from another process (a second `bench_resume` of it) is another run.
    other = lock.acquire(lock_dir, res, "run-a", controller_of(sleeper().pid))
    assert len(other.conflicts) == 2


def test_holder_states_live_stale_and_foreign(sleeper):
    me = controller_of(os.getpid())
    live = controller_of(sleeper().pid)
    assert lock.holder_state(live, me) == lock.LIVE
    assert lock.holder_state(dead_controller(), me) == lock.STALE
    # A reused pid is not the holder: same pid, another start time.
    assert lock.holder_state(dataclasses.replace(live, start_time=live.start_time + 1), me) == lock.STALE
    # After a reboot every holder of this machine is gone, whatever its pid.
    assert lock.holder_state(dataclasses.replace(live, boot_id="another-boot"), me) == lock.STALE
    assert lock.holder_state(dataclasses.replace(live, machine_id="elsewhere"), me) == lock.FOREIGN


def test_take_over_replaces_only_the_record_whose_token_was_judged(tmp_path, sleeper):
    lock_dir, res = resources(tmp_path)
    stale = lock.acquire(lock_dir, res, "run-old", dead_controller())
    me = controller_of(sleeper().pid)
    wrong = lock.acquire(lock_dir, res, "run-new", me, take_over=["not-the-token"])
    assert len(wrong.conflicts) == 2 and not wrong.written
    tokens = [r.token for r in stale.acquired]
    outcome = lock.acquire(lock_dir, res, "run-new", me, take_over=tokens)
    assert not outcome.conflicts and {r.run_id for r in outcome.taken_over} == {"run-old"}
    assert lock.read_record(res[1][1]).run_id == "run-new"


def test_release_removes_only_records_with_the_given_token(tmp_path, sleeper):
    lock_dir, res = resources(tmp_path)
    mine = lock.acquire(lock_dir, res, "run-a", controller_of(sleeper().pid)).acquired
    removed = lock.release(lock_dir, [(mine[0].path, "someone-else"), (mine[1].path, mine[1].token)])
    assert removed == [mine[1].path]
    assert os.path.exists(mine[0].path) and not os.path.exists(mine[1].path)


def _race(lock_dir, port, pid, queue):
    outcome = lock.acquire(lock_dir, [lock.port_resource(lock_dir, port)], "run-%d" % os.getpid(),
                           lock.Controller.of_pid(pid))
    queue.put(bool(outcome.written))


def test_of_many_runs_racing_for_a_free_port_exactly_one_wins(tmp_path, sleeper):
    lock_dir = str(tmp_path / "locks")
    pid = sleeper().pid
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(lock_dir, 31002, pid, queue)) for _i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    wins = [queue.get(timeout=5) for _proc in procs]
    assert wins.count(True) == 1


def test_a_torn_record_is_an_error_naming_the_file(tmp_path):
    lock_dir = str(tmp_path / "locks")
    name, path = lock.port_resource(lock_dir, 31003)
    os.makedirs(lock_dir)
    with open(path, "w") as fh:
        fh.write("{not json")
    with pytest.raises(lock.LockError, match="port-31003.json"):
        lock.acquire(lock_dir, [(name, path)], "run-a", controller_of(os.getpid()))


def _server_state(state_dir, name, pid, start_time, status="running"):
    d = os.path.join(state_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, lock.SERVER_STATE), "w") as fh:
        json.dump({"name": name, "pid": pid, "start_time": start_time, "status": status}, fh)


def test_judge_refuses_live_takes_over_stale_and_breaks_foreign_only_when_asked(tmp_path, sleeper):
    me = controller_of(os.getpid())
    live = lock.new_record("run-live", "port:31004", controller_of(sleeper().pid))
    stale = lock.new_record("run-stale", "port:31005", dead_controller())
    foreign = lock.new_record("run-far", "port:31006",
                              dataclasses.replace(controller_of(os.getpid()), machine_id="x",
                                                  host="ctl2"))
    decision = run_locks.judge([(r.resource, r) for r in (live, stale, foreign)], me, False, "gpu1")
    assert decision.take_over == [stale.token]
    assert len(decision.refusals) == 2
    assert "run-live" in decision.refusals[0] and str(live.controller.pid) in decision.refusals[0]
    assert "server port 31004 on gpu1" in decision.refusals[0]
    assert "bench_break_lock" in decision.refusals[1] and "ctl2" in decision.refusals[1]
    assert "run-stale" in decision.warnings[0]
    broken = run_locks.judge([(foreign.resource, foreign), (live.resource, live)], me, True, "gpu1")
    assert broken.take_over == [foreign.token] and len(broken.refusals) == 1   # never a live one
    # Both resources of one holding run: one refusal naming both.
    both = run_locks.judge([(live.resource, live), ("state_dir:/srv/s", live)], me, False, "gpu1")
    assert len(both.refusals) == 1
    assert "server port 31004 on gpu1 and the server state directory /srv/s on gpu1 are in use" \
        in both.refusals[0]


def test_protect_pids_names_the_servers_of_other_live_runs_only(tmp_path, sleeper):
    lock_dir = str(tmp_path / "locks")
    me = controller_of(os.getpid())
    dirs = {n: str(tmp_path / n) for n in ("other", "stale", "own")}
    servers = {}
    for name, d in dirs.items():
        servers[name] = sleeper()
        info = read_process(servers[name].pid, stat_only=True)
        _server_state(d, "servelab-baseline", servers[name].pid, info.start_time)
    lock.acquire(lock_dir, [lock.port_resource(lock_dir, 1)], "run-other",
                 controller_of(sleeper().pid), state_dir=lock.real_dir(dirs["other"]), port=1)
    lock.acquire(lock_dir, [lock.port_resource(lock_dir, 2)], "run-dead", dead_controller(),
                 state_dir=lock.real_dir(dirs["stale"]), port=2)
    lock.acquire(lock_dir, [lock.port_resource(lock_dir, 3)], "run-me", me,
                 state_dir=lock.real_dir(dirs["own"]), port=3)
    seen = lock.survey(lock_dir)
    records = [lock.LockRecord.from_dict(r, r["path"]) for r in seen["records"]]
    by_dir = {entry["state_dir"]: entry["servers"] for entry in seen["servers"]}
    assert by_dir[lock.real_dir(dirs["other"])][0]["alive"] is True
    assert len(by_dir) == 3
    # The live other run's server is spared; the dead run's (an orphan) and our own are not.
    pids = run_locks.protect_pids(records, seen["servers"], "run-me", me,
                                  [lock.real_dir(dirs["own"])])
    assert pids == [servers["other"].pid]
    # Once the other run's server is gone there is nothing to spare.
    servers["other"].kill()
    servers["other"].wait(10)
    seen = lock.survey(lock_dir)
    assert run_locks.protect_pids(records, seen["servers"], "run-me", me) == []


# ---------------------------------------------------------------------------------------------
# One run, several GPU servers: two inventory hosts that share a machine (two hosts on one box,
# the fleet test's network namespaces) must keep their records, releases and reaps apart.


def test_two_hosts_of_one_run_on_one_machine_cannot_share_a_state_dir_or_port(tmp_path, sleeper):
    lock_dir, res = resources(tmp_path)
    me = controller_of(sleeper().pid)
    first = lock.acquire(lock_dir, res, "run-a", me, inventory_host="gpu-a")
    assert len(first.written) == 2 and {r.inventory_host for r in first.acquired} == {"gpu-a"}
    # gpu-a again: its own records, kept.
    again = lock.acquire(lock_dir, res, "run-a", me, inventory_host="gpu-a")
    assert not again.conflicts and not again.written
    # gpu-b of the very same run and controller process: a conflict, nothing written.
    other = lock.acquire(lock_dir, res, "run-a", me, inventory_host="gpu-b")
    assert [c.holder.inventory_host for c in other.conflicts] == ["gpu-a", "gpu-a"]
    assert not other.written
    decision = run_locks.judge([(c.resource, c.holder) for c in other.conflicts], me, False, "gpu-b")
    assert not decision.take_over and len(decision.refusals) == 1
    refusal = decision.refusals[0]
    assert "also used by gpu-a in this same run" in refusal
    assert "bench_state_dir" in refusal and "bench_server_port" in refusal
    # Not even bench_break_lock takes a live sibling's record.
    assert run_locks.judge([(c.resource, c.holder) for c in other.conflicts], me, True,
                           "gpu-b").refusals


def test_a_host_acts_on_its_own_records_and_spares_its_siblings_servers(tmp_path, sleeper):
    lock_dir = str(tmp_path / "locks")
    me = controller_of(os.getpid())
    dirs = {h: str(tmp_path / h) for h in ("gpu-a", "gpu-b")}
    servers = {}
    for port, (host, d) in enumerate(sorted(dirs.items()), start=1):
        servers[host] = sleeper()
        info = read_process(servers[host].pid, stat_only=True)
        _server_state(d, "servelab-baseline", servers[host].pid, info.start_time)
        lock.acquire(lock_dir, [lock.state_dir_resource(d), lock.port_resource(lock_dir, port)],
                     "run-me", me, state_dir=lock.real_dir(d), port=port, inventory_host=host)
    seen = lock.survey(lock_dir)
    records = [lock.LockRecord.from_dict(r, r["path"]) for r in seen["records"]]
    mine = [r for r in records if run_locks.ours(r, "run-me", me, "gpu-a")]
    assert {r.inventory_host for r in mine} == {"gpu-a"} and len(mine) == 2
    # Without a host (the whole run: the controller's view) every record is the run's.
    assert len([r for r in records if run_locks.ours(r, "run-me", me)]) == 4
    # gpu-a's reap spares gpu-b's server, and gpu-b's spares gpu-a's.
    own_a = [lock.real_dir(dirs["gpu-a"])]
    assert run_locks.protect_pids(records, seen["servers"], "run-me", me, own_a,
                                  "gpu-a") == [servers["gpu-b"].pid]
    assert run_locks.protect_pids(records, seen["servers"], "run-me", me,
                                  [lock.real_dir(dirs["gpu-b"])], "gpu-b") == [servers["gpu-a"].pid]
    # gpu-a releasing its records leaves gpu-b's in place.
    lock.release(lock_dir, [(r.path, r.token) for r in mine])
    left = [lock.LockRecord.from_dict(r, r["path"]) for r in lock.survey(lock_dir)["records"]]
    assert {r.inventory_host for r in left} == {"gpu-b"} and len(left) == 2


def test_the_guard_is_shared_by_every_user_of_the_machine(tmp_path, request):
    """The first user to lock creates the guard writable for all (not 0644 by the umask); a
    guard that another user left 0644 is still usable: flock needs no write access. Found when
    `make test` as a second user met root's /tmp/servelab-locks/.guard: Permission denied."""
    lock_dir = lock.prepare_lock_dir(str(tmp_path / "locks"))
    old = os.umask(0o022)
    try:
        with lock.guarded(lock_dir):
            pass
    finally:
        os.umask(old)
    assert os.stat(os.path.join(lock_dir, lock.GUARD)).st_mode & 0o777 == 0o666
    if os.geteuid() != 0:
        return
    # As root: a guard of root's at 0644, then another user locks (a child that drops to nobody),
    # in a directory nobody can reach (pytest's own temporary tree is root's alone).
    shared = tempfile.mkdtemp(prefix="servelab-test-guard-", dir="/tmp")
    request.addfinalizer(lambda: shutil.rmtree(shared, ignore_errors=True))
    os.chmod(shared, 0o755)
    lock_dir = lock.prepare_lock_dir(os.path.join(shared, "locks"))
    with lock.guarded(lock_dir):
        pass
    os.chmod(os.path.join(lock_dir, lock.GUARD), 0o644)
    # Everything imported first: the interpreter may live where nobody cannot read.
    code = ("import os, sys; sys.path[:0] = %r\n"
            "import collection_link; collection_link.importable()\n"
            "from ansible_collections.servelab.serving.plugins.module_utils.run import lock\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "with lock.guarded(%r, timeout=5):\n    print('locked')\n" % (sys.path, lock_dir))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=60)
    assert done.returncode == 0 and "locked" in done.stdout, done.stdout + done.stderr


def _task(tmp_path, run_id, me, host="gpu1", check_mode=False, **options):
    """The bench_lock task as the action runs it (run_locks.bench_lock_task), with the module's
    side (lock.run_task) called in-process instead of over Ansible."""
    args = dict(run_id=run_id, state="acquired", state_dir=str(tmp_path / "servers"),
                port=31001, extra_ports=[], lock_dir=str(tmp_path / "locks"), break_lock=False)
    args.update(options)
    base = {k: args[k] for k in ("run_id", "state_dir", "port", "extra_ports", "lock_dir")
            if args.get(k) is not None}

    def call(**extra):
        params = dict(dict(base, inventory_host=host, controller=None, take_over=[], release=[]),
                      **extra)
        return lock.run_task(params, check_mode, dict(changed=False, acquired=[],
                                                      taken_over=[], conflicts=[], released=[]))

    return run_locks.bench_lock_task(call, args, me, host, check_mode)


def test_the_task_takes_refuses_checks_takes_over_and_releases(tmp_path, sleeper):
    mine = controller_of(os.getpid())
    first = _task(tmp_path, "run-1", mine)
    assert first["held"] and first["changed"] and first["ports"] == [31001]
    assert first["state_dirs"] == [lock.real_dir(str(tmp_path / "servers"))]
    assert _task(tmp_path, "run-1", mine, state="held")["held"]
    other = controller_of(sleeper().pid)
    with pytest.raises(run_locks.LockRefused, match="run run-2 refused: .*in use by run run-1"):
        _task(tmp_path, "run-2", other)
    with pytest.raises(run_locks.LockRefused, match="needs state_dir or port"):
        _task(tmp_path, "run-2", other, state_dir=None, port=None)
    # run-1's ansible-playbook is gone: run-3 takes its records over, with a warning
    dead = dead_controller()
    _task(tmp_path, "run-4", dead, lock_dir=str(tmp_path / "locks2"),
          state_dir=str(tmp_path / "servers2"))
    taken = _task(tmp_path, "run-3", mine, lock_dir=str(tmp_path / "locks2"),
                  state_dir=str(tmp_path / "servers2"))
    assert len(taken["taken_over"]) == 2 and "took over" in taken["warnings"][0]
    with pytest.raises(run_locks.LockRefused, match="no longer holds"):
        _task(tmp_path, "run-4", dead, state="held", lock_dir=str(tmp_path / "locks2"),
              state_dir=str(tmp_path / "servers2"))
    released = _task(tmp_path, "run-1", mine, state="released", state_dir=None, port=None)
    assert len(released["released"]) == 2 and not released["held"]
    assert not os.listdir(str(tmp_path / "servers"))


def test_a_refusal_names_an_extra_port_by_what_binds_it_and_the_variable_that_moves_it(sleeper):
    # The router's halves are bench_server_port + 1 and + 2; any other extra port is rank 0's
    # dist-init port: its refusal must not call it a server port, and names bench_dist_init_port.
    me = controller_of(os.getpid())
    live = controller_of(sleeper().pid)
    half = lock.new_record("run-live", "port:31005", live)
    dist = lock.new_record("run-live", "port:50000", live)
    decision = run_locks.judge([(r.resource, r) for r in (half, dist)], me, False, "gpu1",
                               server_port=31004)
    assert len(decision.refusals) == 1
    refusal = decision.refusals[0]
    assert "port 31005 on gpu1 (a router half: bench_server_port 31004 + 1)" in refusal
    assert "port 50000 on gpu1 (the multi-node dist-init port, bench_dist_init_port)" in refusal
    assert "server port 50000" not in refusal and "server port 31005" not in refusal
    assert refusal.endswith("bench_state_dir, bench_server_port and bench_dist_init_port")
    # The run's own server port is still called so.
    same = run_locks.judge([("port:31004", half)], me, False, "gpu1", server_port=31004)
    assert "server port 31004 on gpu1" in same.refusals[0]
    assert same.refusals[0].endswith("bench_state_dir and bench_server_port")


def test_share_run_takes_a_record_of_this_run_for_another_host_as_held_and_only_that(tmp_path, sleeper):
    # Two ranks of one multi-node profile on one machine bind one port number on two addresses:
    # rank 1's lock (taken from rank 0 in rank 1's name) finds rank 0's record of this run.
    lock_dir = str(tmp_path / "locks")
    me = controller_of(os.getpid())
    port = lock.port_resource(lock_dir, 31010)
    first = lock.acquire(lock_dir, [port], "run-a", me, port=31010, inventory_host="node-a")
    assert first.written
    plain = lock.acquire(lock_dir, [port], "run-a", me, port=31010, inventory_host="node-b")
    assert [c.holder.inventory_host for c in plain.conflicts] == ["node-a"]
    shared = lock.acquire(lock_dir, [port], "run-a", me, port=31010, inventory_host="node-b",
                          share_run=True)
    assert not shared.conflicts and not shared.written
    assert [r.inventory_host for r in shared.acquired] == ["node-a"]
    # ... never another run's, nor this run id's from another controller process
    other = lock.acquire(lock_dir, [port], "run-b", me, port=31010, inventory_host="node-b",
                         share_run=True)
    assert other.conflicts
    elsewhere = lock.acquire(lock_dir, [port], "run-a", controller_of(sleeper().pid), port=31010,
                             inventory_host="node-b", share_run=True)
    assert elsewhere.conflicts
