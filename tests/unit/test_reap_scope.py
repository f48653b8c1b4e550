"""The reaper against look-alikes, a real tmux server and side-effect deaths (no GPU needed).

What was seen: gpu_reap with the default patterns killed another user's look-alike process that
held no GPU, and a tmux server whose command line mentioned `vllm serve` with its unrelated
windows; a process that died as a side effect was in neither `killed` nor `survivors`.

Each test starts its own processes (stand-in device files in its scratch dir) and ends them by
PID. Where the default patterns are used, a check-mode pass first finds whatever else on this
machine they would take, and the real reap protects those PIDs: it never touches anything but
the test's own processes.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_reap_helpers import alive, wait_until  # noqa: E402
from test_reap_live import _fake_smi  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import ReapOptions, reap  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.cgroup import v2_root  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.select import DEFAULT_PATTERNS  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import read_cmdline, read_stat  # noqa: E402

NOBODY = 65534


def opts(sp, **kw) -> ReapOptions:
    """Confined to the test's device files, no GPU; the caller gives the patterns."""
    base = dict(device_glob=sp.device_glob, compute_device_glob=sp.compute_glob, patterns=[],
                grace=5.0, kill_timeout=10.0, gpu_backend="none")
    base.update(kw)
    return ReapOptions(**base)


def cuda(sp):
    return ["--hold", sp.dev("nvidia0"), "--map-only", sp.dev("nvidia-uvm")]


def by_pid(reports):
    return {r.pid: r for r in reports}


def spared(res):
    return {s["pid"]: s["reason"] for s in res.spared}


def strangers(sp, ours, **kw):
    """PIDs on this machine, not the test's, that a reap with these options would take (other
    engineers' servers, say): the real reap protects them."""
    plan = reap(opts(sp, check_mode=True, **kw))
    return sorted(r.pid for r in plan.would_kill if r.pid not in ours)


def end_by_pid(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# Look-alikes


def start_as_nobody(token: str) -> subprocess.Popen:
    """A CPU-only look-alike of another user: python sleeping, argv mentioning `vllm serve`."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a process as another user")
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable

    def become_nobody():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    # a script named `vllm` that nobody can read: the look-alike executes `vllm serve`
    where = tempfile.mkdtemp(prefix=token + "-", dir="/tmp")
    os.chmod(where, 0o755)
    script = os.path.join(where, "vllm")
    with open(script, "w") as fh:
        fh.write("import time\ntime.sleep(600)\n")
    os.chmod(script, 0o644)
    proc = subprocess.Popen([python, script, "serve", token], preexec_fn=become_nobody,
                            cwd="/", start_new_session=True)
    proc.script_dir = where

    def started():
        try:
            with open("/proc/%d/cmdline" % proc.pid, "rb") as fh:
                return token.encode() in fh.read()
        except OSError:
            return False
    try:
        wait_until(lambda: started() or proc.poll() is not None, what="the look-alike")
    except AssertionError:
        end_by_pid(proc)
        raise
    if proc.poll() is not None:
        pytest.skip("%s cannot run as uid %d here (exit %s)" % (python, NOBODY, proc.returncode))
    return proc


def test_another_users_lookalike_is_spared(sp):
    lookalike = start_as_nobody(sp.token)
    try:
        pats = [sp.token + r"-[^/ ]+/vllm\s+serve"]
        for scope in ("own_gpu", "own"):
            res = reap(opts(sp, patterns=pats, pattern_scope=scope))
            assert res.killed == [] and alive(lookalike.pid), scope
            why = spared(res)[lookalike.pid]
            assert "runs as uid %d, not as uid %d" % (NOBODY, os.geteuid()) in why, why
        # the old behaviour, now only on request
        res = reap(opts(sp, patterns=pats, pattern_scope="any"))
        assert [r.pid for r in res.killed] == [lookalike.pid]
        assert res.killed[0].found_by == "pattern"
        wait_until(lambda: lookalike.poll() is not None, what="the look-alike to exit")
    finally:
        end_by_pid(lookalike)
        shutil.rmtree(lookalike.script_dir, ignore_errors=True)


def test_own_lookalike_without_gpu_or_server_cgroup_is_spared_unless_widened(sp):
    lookalike = sp.start("notes", "vllm", "serve", "--child", sp.child("notes-child"))
    child = lookalike["children"][0]
    pats = [sp.token + "-notes$"]      # its script's subcommand: what it executes
    res = reap(opts(sp, patterns=pats))
    assert res.killed == [] and alive(lookalike["pid"])
    assert "holds no CUDA context and is in no servelab server cgroup" in \
        spared(res)[lookalike["pid"]]
    res = reap(opts(sp, patterns=pats, pattern_scope="own"))
    killed = by_pid(res.killed)
    assert killed[lookalike["pid"]].found_by == "pattern"
    assert killed[child["pid"]].found_by == "descendant"
    assert not alive(lookalike["pid"]) and not alive(child["pid"])


def test_own_match_in_a_servelab_server_cgroup_is_taken_by_default(sp):
    root = v2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy here")
    parent = os.path.join(root, "servelab")
    made_parent = not os.path.isdir(parent)
    cg = os.path.join(parent, "reaptest-" + uuid.uuid4().hex[:8])
    try:
        os.makedirs(cg)
    except OSError as exc:
        pytest.skip("cannot create a cgroup under %s: %s" % (parent, exc))
    try:
        # a CPU-only launcher llm_server started (in its server's cgroup), and the same name
        # outside any server cgroup
        launcher = sp.start("launcher", "--cgroup", cg)
        outside = sp.start("launcher")
        res = reap(opts(sp, patterns=[sp.token + "-launcher"]))
        killed = by_pid(res.killed)
        assert set(killed) == {launcher["pid"]}
        assert killed[launcher["pid"]].found_by == "pattern"
        assert "servelab server cgroup %s" % cg in killed[launcher["pid"]].detail
        assert alive(outside["pid"]) and "no servelab server cgroup" in spared(res)[outside["pid"]]
    finally:
        sp.cleanup()
        _rmdir_soon(cg)
        if made_parent:
            _rmdir_soon(parent, timeout=1)


# ---------------------------------------------------------------------------------------------
# A real tmux server


class Tmux:
    """A tmux server on its own socket; every pid it runs is ended by PID at the end."""

    def __init__(self, tmp_path) -> None:
        self.exe = shutil.which("tmux")
        if self.exe is None:
            pytest.skip("tmux not installed (apt-get install -y tmux)")
        self.sock = os.path.join(str(tmp_path), "tmux.sock")
        self.env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
        self.server_pid = None
        self.seen = {}                 # every pid of ours listed so far -> its start time

    def run(self, *args: str) -> str:
        return subprocess.run([self.exe, "-S", self.sock] + list(args), env=self.env,
                              capture_output=True, text=True, timeout=30, check=True).stdout

    def remember(self, pid: int) -> None:
        stat = read_stat(pid)
        if stat is not None:
            self.seen.setdefault(pid, stat.start_time)

    def pane_pids(self):
        pids = [int(x) for x in self.run("list-panes", "-a", "-F", "#{pane_pid}").split()]
        for pid in pids:
            self.remember(pid)
        return pids

    def close(self) -> None:
        try:
            self.pane_pids()
        except (subprocess.SubprocessError, OSError):
            pass
        for pid, start in sorted(self.seen.items()):
            stat = read_stat(pid)
            if stat is not None and stat.start_time == start and alive(pid):   # the same one
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_tmux_server_and_its_unrelated_windows_survive_a_default_reap(sp, tmp_path):
    tmux = Tmux(tmp_path)
    try:
        # started the way a user starts a server in tmux: its command line says `vllm serve`
        # (tmux renames the server's comm to "tmux: server" but keeps its argv)
        tmux.run("new-session", "-d", "-s", "srv" + sp.token, "-n", "vllm serve",
                 "sleep 1001")
        tmux.server_pid = int(tmux.run("display-message", "-p", "#{pid}").strip())
        tmux.remember(tmux.server_pid)
        tmux.run("new-window", "-t", "srv" + sp.token, "sleep 1002")
        # a GPU job in a third window, with a CPU helper child
        ready = os.path.join(str(tmp_path), "gpujob.ready")
        job_cmd = shlex.join([sys.executable, sp.script]
                             + sp.argv("gpujob", *cuda(sp), "--child", sp.child("helper"))
                             + ["--ready", ready])
        tmux.run("new-window", "-t", "srv" + sp.token, job_cmd)
        wait_until(lambda: os.path.exists(ready), what="the GPU job in tmux")
        with open(ready) as fh:
            job = json.load(fh)
        for pid in (job["pid"], job["children"][0]["pid"]):
            sp.pids[pid] = "gpujob"
        panes = tmux.pane_pids()
        # tmux runs a window's command through the user's shell: bash execs it (the pane's pid
        # is the job), dash does not (the pane's pid is a `sh -c` whose child is the job).
        job_pane = job["pid"] if job["pid"] in panes else read_stat(job["pid"]).ppid
        sleeps = [p for p in panes if p != job_pane]
        assert len(sleeps) == 2 and job_pane in panes, (panes, job)
        server_cmdline = read_cmdline(tmux.server_pid)
        assert any(re.search(p, server_cmdline) for p in DEFAULT_PATTERNS), \
            "the default patterns should match the tmux server's command line %r" % server_cmdline
        ours = {tmux.server_pid, job_pane, job["pid"], job["children"][0]["pid"]} | set(sleeps)

        for scope in ("any", "own_gpu"):       # any: even the old reach spares them now
            common = dict(patterns=list(DEFAULT_PATTERNS), pattern_scope=scope, grace=3.0)
            plan = reap(opts(sp, check_mode=True, **common))
            would = by_pid(plan.would_kill)
            assert tmux.server_pid not in would and not set(sleeps) & set(would), scope
            assert "terminal multiplexer or session manager (tmux: server)" in \
                spared(plan)[tmux.server_pid]
        res = reap(opts(sp, patterns=list(DEFAULT_PATTERNS), grace=3.0,
                        protect_pids=strangers(sp, ours, patterns=list(DEFAULT_PATTERNS))))
        killed = by_pid(res.killed)
        helper = job["children"][0]["pid"]
        # The helper is a target (the job's descendant) and ends either way: by our SIGTERM, or
        # first by the SIGHUP tmux sends the pane's process group once the job has died; on a
        # loaded machine the reaper can be preempted between the two sends. Either is reported.
        vanished = by_pid(res.vanished)
        assert set(killed) - {helper} == {job["pid"]} and not res.survivors
        assert helper in killed or vanished[helper].found_by == "descendant", (killed, vanished)
        assert not alive(helper)
        assert killed[job["pid"]].found_by == "device_fd"
        assert alive(tmux.server_pid), "the tmux server was killed"
        for pid in sleeps:
            assert alive(pid), "an unrelated tmux window (%d) was killed" % pid
        assert "tmux: server" in spared(res)[tmux.server_pid]
        assert tmux.run("list-windows", "-t", "srv" + sp.token).count("\n") >= 2
    finally:
        tmux.close()


# ---------------------------------------------------------------------------------------------
# Side effects: every process that disappeared during the reap is reported


def test_a_protected_child_that_dies_with_its_target_parent_is_vanished(sp):
    # the child dies when its parent exits (parent-death signal): no signal of ours reached it
    parent = sp.start("parent", *cuda(sp), "--child", sp.child("kid", "--pdeathsig"))
    kid = parent["children"][0]
    res = reap(opts(sp, protect_pids=[kid["pid"]]))
    assert [r.pid for r in res.killed] == [parent["pid"]]
    wait_until(lambda: not alive(kid["pid"]), what="the child to die with its parent")
    vanished = by_pid(res.vanished)
    assert kid["pid"] in vanished, "the side-effect death was not reported"
    rep = vanished[kid["pid"]]
    assert rep.side_effect is True and rep.signal is None
    assert rep.found_by == "descendant" and rep.seed_pid == parent["pid"]
    assert "not a target: protect_pids" in rep.detail
    assert not res.survivors


def test_a_spared_launcher_that_quits_when_its_worker_dies_is_vanished(sp):
    # a hand-started launcher (pattern match, no GPU: spared under own_gpu) that exits when its
    # GPU worker is killed, as vLLM's API server does when its engine dies
    launcher = sp.start("launcher", "--exit-with-children",
                        "--child", sp.child("engine", *cuda(sp)))
    engine = launcher["children"][0]
    # a GPU that keeps the dead engine's 3000 MiB for the whole memory wait (0.5 s): the
    # launcher, which quits milliseconds after its engine, is gone before the reap ends
    smi = _fake_smi(sp, ["%d:3000:stuck" % engine["pid"]])
    res = reap(opts(sp, patterns=[sp.token + "-launcher"], grace=5.0, gpu_backend="nvidia-smi",
                    nvidia_smi=smi, memory_timeout=0.5))
    assert [r.pid for r in res.killed] == [engine["pid"]]
    assert not alive(launcher["pid"])
    assert res.memory_clean is False
    rep = by_pid(res.vanished).get(launcher["pid"])
    assert rep is not None, "the launcher's exit was not reported"
    assert rep.side_effect and rep.found_by == "parent" and rep.seed_pid == engine["pid"]
    assert "holds no CUDA context" in rep.detail


def test_unrelated_processes_are_not_reported_vanished(sp):
    worker = sp.start("worker", *cuda(sp))
    bystander = sp.start("bystander", "--exit-after", "0.2")
    res = reap(opts(sp))
    assert [r.pid for r in res.killed] == [worker["pid"]]
    wait_until(lambda: not alive(bystander["pid"]), what="the bystander to leave")
    assert bystander["pid"] not in by_pid(res.vanished)


def _rmdir_soon(path: str, timeout: float = 30.0) -> None:
    """Best effort: a cgroup can be removed once its last zombie is reaped."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
