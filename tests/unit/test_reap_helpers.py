"""Helpers for the reaper tests: real processes that hold stand-in device files.

Not a test module (it holds no tests); the reaper test modules import it. Every process the
tests start is recorded by PID (children and detached grandchildren report theirs through ready
files) and killed by PID at teardown, whatever happened in the test.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Dict, List, Optional
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime

# The stand-in process. Options (all optional):
#   --hold PATH        keep PATH open (repeatable)
#   --map-only PATH    mmap PATH, then close the fd (only the mapping remains)
#   --ignore-term      ignore SIGTERM (needs SIGKILL)
#   --exit-after SECS  exit by itself SECS after it is ready
#   --child ARGS       spawn a child running this script with ARGS (a JSON list; repeatable)
#   --double-fork ARGS fork, setsid, fork again, exec this script with ARGS in the grandchild
#   --cgroup DIR       move itself into the cgroup DIR before anything else
#   --ready FILE       write {"pid", "pgid", "sid", "children": [...], "detached": [...]} there
#   --setsid           start a new session first
#   --pdeathsig        die (SIGKILL) when the parent exits, as workers of some launchers do
#   --exit-with-children  exit as soon as one of its children exits (a launcher that quits
#                      when a worker dies)
# Anything else (the token, a role name) only lands in the command line, for patterns.
HOLDER = r'''
import json, mmap, os, signal, subprocess, sys, time
args = sys.argv[1:]
def take(flag):
    vals = []
    while flag in args:
        i = args.index(flag)
        vals.append(args[i + 1]); del args[i:i + 2]
    return vals
def flag(name):
    if name in args:
        args.remove(name); return True
    return False
holds, maps, kids, dfs = take("--hold"), take("--map-only"), take("--child"), take("--double-fork")
cgroups, ready, exit_after = take("--cgroup"), take("--ready"), take("--exit-after")
if flag("--setsid"):
    os.setsid()
if flag("--pdeathsig"):
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
    if os.getppid() == 1:                           # the parent was gone already
        raise SystemExit("parent gone before PR_SET_PDEATHSIG")
exit_with_children = flag("--exit-with-children")
for cg in cgroups:
    with open(os.path.join(cg, "cgroup.procs"), "w") as fh:
        fh.write(str(os.getpid()))
if flag("--ignore-term"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
files = [open(p, "rb") for p in holds]
mappings = []
if maps:
    # Python's mmap keeps a dup of the fd; map through libc so only the mapping remains
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
for p in maps:
    fd = os.open(p, os.O_RDONLY)
    addr = libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise SystemExit("mmap failed: %d" % ctypes.get_errno())
    os.close(fd)
    mappings.append(addr)
me = [sys.executable, os.path.abspath(__file__)]
children, detached = [], []
def wait_ready(path):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(path) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            time.sleep(0.02)
    raise SystemExit("child not ready: " + path)
for i, spec in enumerate(kids):
    cargs = json.loads(spec)
    cready = ready[0] + ".child%d" % i
    proc = subprocess.Popen(me + cargs + ["--ready", cready])
    info = wait_ready(cready)
    children.append(info)
for i, spec in enumerate(dfs):
    cargs = json.loads(spec)
    cready = ready[0] + ".detached%d" % i
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, me + cargs + ["--ready", cready])
        os._exit(0)
    os.waitpid(pid, 0)
    detached.append(wait_ready(cready))
if ready:
    tmp = ready[0] + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                   "children": children, "detached": detached}, fh)
    os.rename(tmp, ready[0])
if exit_after:
    time.sleep(float(exit_after[0]))
    sys.exit(0)
if exit_with_children and children:
    os.wait()
    sys.exit(0)
while True:
    time.sleep(3600)
'''


def all_pids(info: dict) -> List[int]:
    """The pid of a ready record and of everything it started, recursively."""
    out = [info["pid"]]
    for sub in info.get("children", []) + info.get("detached", []):
        out.extend(all_pids(sub))
    return out


alive = lifetime.is_alive          # running and not a zombie: the code's own rule


def wait_until(cond, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(0.02)


class Spawner:
    """Starts stand-in processes in a scratch dir and guarantees they end."""

    def __init__(self, tmp_path) -> None:
        self.dir = str(tmp_path)
        self.token = "srvlabtest" + uuid.uuid4().hex[:10]
        self.script = os.path.join(self.dir, "holder.py")
        with open(self.script, "w") as fh:
            fh.write(HOLDER)
        self.devdir = os.path.join(self.dir, "dev")
        os.makedirs(self.devdir)
        self.device_glob = os.path.join(self.devdir, "nvidia*")
        self.compute_glob = os.path.join(self.devdir, "nvidia-uvm")
        for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "other0"):
            with open(os.path.join(self.devdir, name), "wb") as fh:
                fh.write(b"\0" * 4096)
        self.popens: List[subprocess.Popen] = []
        self.pids: Dict[int, str] = {}        # pid -> role, for cleanup and messages
        self._n = 0

    def dev(self, name: str = "nvidia0") -> str:
        return os.path.join(self.devdir, name)

    def argv(self, role: str, *args: str) -> List[str]:
        """Arguments for a (child) holder: the token and role land in its command line."""
        return ["%s-%s" % (self.token, role)] + list(args)

    def child(self, role: str, *args: str) -> str:
        return json.dumps(self.argv(role, *args))

    def start(self, role: str, *args: str, new_session: bool = True) -> dict:
        self._n += 1
        ready = os.path.join(self.dir, "ready%d" % self._n)
        cmd = [sys.executable, self.script] + self.argv(role, *args) + ["--ready", ready]
        proc = subprocess.Popen(cmd, start_new_session=new_session)
        self.popens.append(proc)
        self.pids[proc.pid] = role

        def ready_or_dead():
            return os.path.exists(ready) or proc.poll() is not None
        wait_until(ready_or_dead, what="%s to be ready" % role)
        if not os.path.exists(ready):
            raise AssertionError("%s exited early with %s" % (role, proc.returncode))
        with open(ready) as fh:
            info = json.load(fh)
        for pid in all_pids(info):
            self.pids.setdefault(pid, role)
        info["popen"] = proc
        return info

    def cleanup(self) -> None:
        for pid in list(self.pids):
            if alive(pid) and self._ours(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for proc in self.popens:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def _ours(self, pid: int) -> bool:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                return self.token.encode() in fh.read()
        except OSError:
            return False


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_playbook(playbook: str, tmp_path, extra_env: Optional[dict] = None) -> dict:
    """Run ansible-playbook on localhost with the json callback; return the parsed output."""
    root = repo_root()
    bindir = os.path.dirname(sys.executable)
    env = dict(os.environ)
    env.update({
        "ANSIBLE_CONFIG": os.path.join(root, "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCAL_TEMP": os.path.join(str(tmp_path), "ansible-local"),
        "ANSIBLE_REMOTE_TEMP": os.path.join(str(tmp_path), "ansible-remote"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": bindir + os.pathsep + env.get("PATH", ""),
    })
    env.update(extra_env or {})
    path = os.path.join(str(tmp_path), "play.yml")
    with open(path, "w") as fh:
        fh.write(playbook)
    proc = subprocess.run(
        [os.path.join(bindir, "ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=%s" % sys.executable, path],
        cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    try:
        return json.loads(proc.stdout[proc.stdout.index("{"):])
    except ValueError:
        raise AssertionError("ansible-playbook printed no JSON (rc %d):\n%s\n%s"
                             % (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])) from None


def task_results(out: dict) -> Dict[str, dict]:
    """Task name -> its localhost result, from the json callback's output."""
    return task_results_for(out, "localhost")


def task_results_for(out: dict, host: str) -> Dict[str, dict]:
    """Task name -> the result of `host`, from the json callback's output."""
    res = {}
    for play in out["plays"]:
        for task in play["tasks"]:
            if host in task["hosts"]:
                res[task["task"]["name"]] = task["hosts"][host]
    return res
