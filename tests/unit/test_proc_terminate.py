"""proc.terminate.terminate against real child processes the tests start.

Every child is a Popen of this test; the fixture SIGKILLs what is left by PID and waits for it.
Children that must notice a SIGTERM write the signal number to their own file, so "never
signalled" is observed, not assumed.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import uuid

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.proc import cgroup as proc_cgroup
from ansible_collections.servelab.serving.plugins.module_utils.proc import terminate as proc_terminate
from ansible_collections.servelab.serving.plugins.module_utils.proc.lifetime import is_alive
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import read_process, read_stat
from ansible_collections.servelab.serving.plugins.module_utils.proc.terminate import (
    CGROUP_KILL, CGROUP_KILLED, CGROUP_PER_PROCESS, CGROUP_PROTECTED, ORIGIN_CGROUP,
    ORIGIN_DISCOVERED, SIGKILL, SIGTERM, TerminationPlan, terminate,
)

# argv: MODE LOG [PIDFILE]. Modes:
#   polite     SIGTERM is noted in LOG and ends it
#   recorder   SIGTERM is noted in LOG, it keeps running
#   stubborn   SIGTERM ignored (SIG_IGN): only SIGKILL ends it
#   leaves     SIGTERM ignored, exits by itself 0.5 s after it is ready
#   forks      on SIGTERM starts a sleeper in a new session, writes its pid to PIDFILE, exits
CHILD = r"""
import os, signal, subprocess, sys, time
mode, log = sys.argv[1], sys.argv[2]
def note(sig, frame):
    with open(log, "a") as fh:
        fh.write("%d\n" % sig)
    if mode == "polite":
        os._exit(0)
    if mode == "forks":
        kid = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
                               start_new_session=True)
        with open(sys.argv[3] + ".tmp", "w") as fh:
            fh.write(str(kid.pid))
        os.replace(sys.argv[3] + ".tmp", sys.argv[3])
        os._exit(0)
if mode in ("stubborn", "leaves"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, note)
print("ready", flush=True)
if mode == "leaves":
    time.sleep(0.5)
    sys.exit(0)
while True:
    time.sleep(1)
"""


class Kids:
    def __init__(self, tmp_path):
        self.dir = tmp_path
        self.popens = []
        self.extra_pids = []

    def start(self, mode: str, *extra: str) -> Kid:
        log = str(self.dir / ("%s-%s.log" % (mode, uuid.uuid4().hex[:6])))
        popen = subprocess.Popen([sys.executable, "-c", CHILD, mode, log, *extra],
                                 stdout=subprocess.PIPE, text=True)
        self.popens.append(popen)
        assert popen.stdout.readline().strip() == "ready", "%s child did not start" % mode
        return Kid(popen, log)

    def cleanup(self):
        for pid in self.extra_pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        for popen in self.popens:
            if popen.poll() is None:
                popen.kill()
            popen.wait(timeout=30)
            if popen.stdout is not None:
                popen.stdout.close()


class Kid:
    def __init__(self, popen, log):
        self.popen = popen
        self.pid = popen.pid
        self.log = log
        self.info = read_process(popen.pid)

    def signals_received(self):
        try:
            with open(self.log) as fh:
                return [int(line) for line in fh if line.strip()]
        except FileNotFoundError:
            return []


@pytest.fixture
def kids(tmp_path):
    k = Kids(tmp_path)
    try:
        yield k
    finally:
        k.cleanup()


def pids(outcomes):
    return {o.pid: o for o in outcomes}


def test_a_child_that_ignores_sigterm_gets_sigkill_after_the_grace(kids):
    stubborn = kids.start("stubborn")
    polite = kids.start("polite")
    result = terminate(TerminationPlan(targets=[stubborn.info, polite.info], grace=0.5,
                                       kill_timeout=10))
    killed = pids(result.killed)
    assert killed[stubborn.pid].signal == SIGKILL
    assert killed[polite.pid].signal == SIGTERM
    assert polite.signals_received() == [signal.SIGTERM]
    assert result.term_seconds >= 0.45, "SIGKILL came before the grace was over"
    assert result.survivors == [] and result.vanished == []
    assert not is_alive(stubborn.pid) and not is_alive(polite.pid)


def test_the_grace_wait_ends_as_soon_as_the_targets_have_exited(kids):
    polite = kids.start("polite")
    result = terminate(TerminationPlan(targets=[polite.info], grace=30, kill_timeout=30))
    assert [o.pid for o in result.killed] == [polite.pid]
    assert result.seconds < 10, "waited for the grace although the target had exited"


def test_a_protected_pid_in_the_target_list_is_never_signalled(kids):
    keep = kids.start("recorder")
    victim = kids.start("stubborn")
    result = terminate(TerminationPlan(targets=[keep.info, victim.info],
                                       protected={keep.pid: "the test protects it"},
                                       grace=0.2, kill_timeout=10))
    assert is_alive(keep.pid, keep.info.start_time)
    assert keep.signals_received() == []
    assert [(r.pid, r.reason) for r in result.refused] == [(keep.pid, "the test protects it")]
    assert keep.pid not in pids(result.killed + result.survivors + result.vanished)
    assert pids(result.killed)[victim.pid].signal == SIGKILL


def test_the_caller_is_protected_even_when_listed(kids, monkeypatch):
    received = []
    # Should the caller be signalled after all, this handler notes it instead of ending pytest.
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: received.append(sig))
    try:
        me = read_process(os.getpid())
        victim = kids.start("polite")
        result = terminate(TerminationPlan(targets=[me, victim.info], grace=5, kill_timeout=5))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert received == []
    assert os.getpid() in {r.pid for r in result.refused}
    assert [o.pid for o in result.killed] == [victim.pid]


def test_a_process_that_exits_by_itself_during_the_grace_is_vanished_not_killed(kids):
    leaves = kids.start("leaves")        # ignores SIGTERM, exits 0.5 s after starting
    result = terminate(TerminationPlan(targets=[leaves.info], grace=20, kill_timeout=5))
    assert [o.pid for o in result.vanished] == [leaves.pid]
    assert result.vanished[0].signal is None
    assert result.killed == [] and result.survivors == []
    assert result.term_seconds < 10, "the wait did not end when it left"


def test_a_target_gone_before_the_call_is_vanished(kids):
    gone = kids.start("polite")
    gone.popen.kill()
    gone.popen.wait(timeout=30)
    result = terminate(TerminationPlan(targets=[gone.info], grace=5, kill_timeout=5))
    assert [o.pid for o in result.vanished] == [gone.pid] and result.killed == []


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "start-time-only"])
def test_a_recycled_pid_is_never_signalled(kids, monkeypatch, pidfd):
    """The selection saw another process under this pid (another start time): the one that has
    the pid now is not a target."""
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    now = kids.start("recorder")
    selected = dataclasses.replace(now.info, start_time=now.info.start_time - 1)
    result = terminate(TerminationPlan(targets=[selected], grace=0.2, kill_timeout=2))
    assert is_alive(now.pid, now.info.start_time)
    assert now.signals_received() == []
    assert [o.pid for o in result.vanished] == [now.pid]
    assert result.killed == [] and result.survivors == []


def test_members_found_meanwhile_by_discover_get_sigterm_too(kids, tmp_path):
    pid_file = str(tmp_path / "forked.pid")
    parent = kids.start("forks", pid_file)

    def discover():
        try:
            pid = int(open(pid_file).read())
        except (OSError, ValueError):
            return []
        kids.extra_pids.append(pid)
        info = read_process(pid)
        return [info] if info else []

    result = terminate(TerminationPlan(targets=[parent.info], grace=10, kill_timeout=5,
                                       discover=discover, discover_interval=0.05))
    forked = int(open(pid_file).read())
    killed = pids(result.killed)
    assert killed[parent.pid].signal == SIGTERM
    assert killed[forked].signal == SIGTERM and killed[forked].origin == ORIGIN_DISCOVERED
    assert not is_alive(forked)


def test_a_protected_member_returned_by_discover_is_refused(kids):
    keep = kids.start("recorder")
    victim = kids.start("polite")
    result = terminate(TerminationPlan(targets=[victim.info], protected={keep.pid: "kept"},
                                       discover=lambda: [keep.info], grace=2, kill_timeout=2))
    assert keep.signals_received() == [] and is_alive(keep.pid)
    assert [r.pid for r in result.refused] == [keep.pid]


def test_our_own_exited_children_are_collected_only_when_asked(kids):
    left = kids.start("polite")
    result = terminate(TerminationPlan(targets=[left.info], grace=5, kill_timeout=5))
    assert [o.pid for o in result.killed] == [left.pid]
    assert read_stat(left.pid).state == "Z", "a zombie counts as gone, and is left to its parent"
    collected = kids.start("polite")
    terminate(TerminationPlan(targets=[collected.info], grace=5, kill_timeout=5,
                              collect_children=True))
    assert read_stat(collected.pid) is None, "the exited child was not reaped"


def _fake_cgroup(tmp_path, *members):
    """A directory that lists members like a cgroup without cgroup.kill (cgroup v1 or an old
    kernel): the per-process path."""
    path = tmp_path / ("cg-" + uuid.uuid4().hex[:6])
    path.mkdir()
    (path / "cgroup.procs").write_text("".join("%d\n" % m for m in members))
    return str(path)


def test_a_cgroup_without_cgroup_kill_has_its_members_killed_one_by_one(kids, tmp_path):
    target = kids.start("stubborn")
    member = kids.start("stubborn")          # not selected: only the cgroup lists it
    cg = _fake_cgroup(tmp_path, target.pid, member.pid)
    result = terminate(TerminationPlan(targets=[target.info], cgroups=[cg], grace=0.2,
                                       kill_timeout=10))
    killed = pids(result.killed)
    assert killed[target.pid].signal == SIGKILL
    assert killed[member.pid].signal == SIGKILL and killed[member.pid].origin == ORIGIN_CGROUP
    assert killed[member.pid].cgroup == cg
    assert [(c.path, c.action) for c in result.cgroups] == [(cg, CGROUP_PER_PROCESS)]
    assert "no cgroup.kill" in result.cgroups[0].note


def test_a_cgroup_with_a_protected_member_is_not_killed_whole(kids, tmp_path):
    keep = kids.start("recorder")
    target = kids.start("stubborn")
    member = kids.start("recorder")
    cg = _fake_cgroup(tmp_path, keep.pid, target.pid, member.pid)
    result = terminate(TerminationPlan(targets=[target.info], cgroups=[cg],
                                       protected={keep.pid: "kept"}, grace=0.2, kill_timeout=10))
    assert pids(result.killed)[target.pid].signal == SIGKILL
    assert is_alive(keep.pid) and keep.signals_received() == []
    # a member that was not selected may be the protected process's child: left alone
    assert is_alive(member.pid) and member.signals_received() == []
    assert result.cgroups[0].action == CGROUP_PROTECTED
    assert str(keep.pid) in result.cgroups[0].note


@pytest.fixture
def real_cgroup():
    root = proc_cgroup.v2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy here")
    path = os.path.join(root, "servelab-terminate-test-" + uuid.uuid4().hex[:8])
    try:
        os.mkdir(path)
    except OSError as exc:
        pytest.skip("cannot create a cgroup under %s: %s" % (root, exc))
    if not proc_cgroup.has_kill(path):
        os.rmdir(path)
        pytest.skip("no cgroup.kill (kernel < 5.14)")
    yield path
    proc_cgroup.kill(path)
    proc_cgroup.remove(path, timeout=10)


def _join(path, pid):
    with open(os.path.join(path, "cgroup.procs"), "w") as fh:
        fh.write(str(pid))


def test_cgroup_kill_takes_the_whole_cgroup_when_nothing_protected_is_inside(kids, real_cgroup):
    target = kids.start("stubborn")
    member = kids.start("stubborn")
    for kid in (target, member):
        _join(real_cgroup, kid.pid)
    result = terminate(TerminationPlan(targets=[target.info], cgroups=[real_cgroup], grace=0.2,
                                       kill_timeout=10))
    killed = pids(result.killed)
    assert killed[target.pid].signal == CGROUP_KILL
    assert killed[member.pid].signal == CGROUP_KILL and killed[member.pid].origin == ORIGIN_CGROUP
    assert [c.action for c in result.cgroups] == [CGROUP_KILLED]
    assert not is_alive(target.pid) and not is_alive(member.pid)


def test_cgroup_kill_is_not_used_with_a_protected_process_inside(kids, real_cgroup):
    keep = kids.start("recorder")
    target = kids.start("stubborn")
    for kid in (keep, target):
        _join(real_cgroup, kid.pid)
    result = terminate(TerminationPlan(targets=[target.info], cgroups=[real_cgroup],
                                       protected={keep.pid: "kept"}, grace=0.2, kill_timeout=10))
    assert pids(result.killed)[target.pid].signal == SIGKILL
    assert result.cgroups[0].action == CGROUP_PROTECTED
    assert is_alive(keep.pid) and keep.signals_received() == []


# ---------------------------------------------------------------------------------------------
# Both callers end processes through this one function


@pytest.fixture
def recorded_plans(monkeypatch):
    plans = []
    real = proc_terminate.terminate

    def recording(plan):
        plans.append(plan)
        return real(plan)

    monkeypatch.setattr(proc_terminate, "terminate", recording)
    return plans


def test_llm_server_stop_goes_through_terminate(kids, tmp_path, recorded_plans):
    from ansible_collections.servelab.serving.plugins.module_utils.server import launcher

    launched = launcher.spawn([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"],
                              {}, str(tmp_path / "server.log"), str(tmp_path),
                              "terminate-test:" + uuid.uuid4().hex[:8],
                              proc_cgroup.CgroupChoice(None, "none"))
    kids.popens.append(launched.process)
    report = launcher.stop_tree(launched.pid, launched.start_time, launched.marker, None,
                                grace=5, kill_timeout=5)
    assert len(recorded_plans) == 1
    assert [t.pid for t in recorded_plans[0].targets] == [launched.pid]
    assert recorded_plans[0].discover is not None
    assert [k["pid"] for k in report.killed] == [launched.pid]
    assert not is_alive(launched.pid)


def test_gpu_reap_goes_through_terminate(tmp_path, recorded_plans):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_reap_helpers import Spawner
    from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import ReapOptions, reap

    sp = Spawner(tmp_path)
    try:
        worker = sp.start("worker", "--hold", sp.dev("nvidia0"), "--map-only",
                          sp.dev("nvidia-uvm"))
        result = reap(ReapOptions(device_glob=sp.device_glob, compute_device_glob=sp.compute_glob,
                                  patterns=[], grace=5, kill_timeout=5, gpu_backend="none"))
        assert [t.pid for t in recorded_plans[0].targets] == [worker["pid"]]
        assert recorded_plans[0].protected.get(os.getpid()) == "the reaper itself"
        assert [r.pid for r in result.killed] == [worker["pid"]]
        assert not is_alive(worker["pid"])
    finally:
        sp.cleanup()


GROUP_LEADER = r"""
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(120)
"""


def test_end_group_ends_the_whole_group_not_only_its_leader():
    """The interrupt cleanup's child runs in its own session: end_group ends every member,
    a grandchild that ignores SIGTERM included (SIGKILL after the grace), where a killpg loop
    waiting on the leader alone stopped as soon as the leader had gone."""
    leader = subprocess.Popen([sys.executable, "-c", GROUP_LEADER], start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    grandchild = started = None
    try:
        grandchild = int(leader.stdout.readline())
        started = read_process(grandchild).start_time
        result = proc_terminate.end_group(leader.pid, grace=0.5, kill_timeout=5.0)
        assert not is_alive(leader.pid) and not is_alive(grandchild, started)
        by_pid = {o.pid: o.signal for o in result.killed}
        assert by_pid == {leader.pid: "SIGTERM", grandchild: "SIGKILL"}
        assert result.survivors == []
        assert proc_terminate.end_group(leader.pid, grace=0.1).killed == []   # nothing left
    finally:
        if grandchild is not None and is_alive(grandchild, started):
            os.kill(grandchild, signal.SIGKILL)
        if leader.poll() is None:
            leader.kill()
        leader.wait(10)


# ---------------------------------------------------------------------------------------------
# end_children: our own children, told to stop some other way


def test_end_children_signals_nothing_that_exits_by_itself(kids, recorded_plans):
    leaving = kids.start("leaves")          # ignores SIGTERM, exits 0.5 s after it is ready
    assert proc_terminate.end_children([leaving.pid], wait=10, grace=1, kill_timeout=5) is None
    assert recorded_plans == [] and leaving.signals_received() == []
    assert leaving.popen.poll() == 0        # reaped here: its exit code was collected


def test_end_children_ends_what_is_still_running_after_the_wait(kids, recorded_plans):
    stubborn = kids.start("stubborn")
    result = proc_terminate.end_children([stubborn.pid], wait=0.2, grace=0.2, kill_timeout=5)
    assert [t.pid for t in recorded_plans[0].targets] == [stubborn.pid]
    assert pids(result.killed)[stubborn.pid].signal == SIGKILL
    assert not is_alive(stubborn.pid)


def test_end_children_leaves_the_reaping_to_the_owner_when_asked(kids):
    polite = kids.start("polite")
    result = proc_terminate.end_children([polite.pid], wait=0, grace=5, kill_timeout=5,
                                         reap=False)
    assert pids(result.killed)[polite.pid].signal == SIGTERM
    assert read_stat(polite.pid).state == "Z"   # a zombie until its Popen collects it
    assert polite.popen.wait(timeout=5) == 0


def test_the_load_generator_stops_its_client_processes_through_terminate(monkeypatch,
                                                                         recorded_plans):
    """A client process that handed over its result but does not exit is ended, not left."""
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import level
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import (
        LevelConfig, LoadgenError,
    )
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load

    def stuck_client(cfg, index, nproc, worker_ids, wires, shm_map, pipe, spool_dir, *hooks):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pipe.send({"error": "stuck client %d" % os.getpid()})
        pipe.close()
        while True:
            signal.pause()

    monkeypatch.setattr(level, "_client_main", stuck_client)
    monkeypatch.setattr(level, "CLIENT_EXIT_S", 0.3)
    cfg = LevelConfig(base_url="http://127.0.0.1:9", model="m", concurrency=1,
                      server_metrics=False, processes=1)
    with pytest.raises(LoadgenError, match="stuck client") as failed:
        level.run_level(cfg, load({"kind": "synthetic", "input_tokens": 8, "output_tokens": 4}))
    pid = int(str(failed.value).split("stuck client ")[1].split()[0])
    assert [t.pid for t in recorded_plans[0].targets] == [pid]
    assert not is_alive(pid)
    # A failed level leaves no records behind (loadgen/spool.py).
    assert not [d for d in os.listdir(tempfile.gettempdir())
                if d.startswith("servelab-level-%d-" % os.getpid())]
