"""Start a server detached from the caller, and stop it with everything it forked.

Start: its own session (setsid: no controlling terminal, its own process group, survives the
Ansible task that started it), stdin from /dev/null, stdout+stderr to a log file, its own cgroup
where the machine allows (joined between fork and exec, so not even the first fork escapes), and
an environment marker every descendant inherits.
Stop: the server's members (proc/tree.py: the launched process, its group and session, its
cgroup, the marker, their descendants) go to proc/terminate.py, which ends them (SIGTERM, grace,
SIGKILL or cgroup.kill) and keeps looking for members forked during shutdown.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils.proc import cgroup as proc_cgroup
from ansible_collections.servelab.serving.plugins.module_utils.proc import terminate as proc_terminate
from ansible_collections.servelab.serving.plugins.module_utils.proc import tree as proc_tree
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import ProcInfo, read_cmdline, read_process


class LaunchError(RuntimeError):
    pass


@dataclass
class Launched:
    pid: int
    start_time: Optional[int]
    cgroup: Optional[str]
    cgroup_reason: str
    marker: str
    log_path: str
    process: subprocess.Popen = field(repr=False, default=None)


@dataclass
class StopReport:
    killed: List[dict] = field(default_factory=list)   # [{pid, comm, signal}]
    survivors: List[dict] = field(default_factory=list)
    cgroup_kill: str = "none"
    seconds: float = 0.0


def rotate_log(log_path: str) -> None:
    """Keep the previous run's log as <log>.1: a failed restart should not erase the evidence."""
    if os.path.exists(log_path):
        os.replace(log_path, log_path + ".1")


def spawn(cmd: Sequence[str], env_add: Mapping[str, str], log_path: str, cwd: str, marker: str,
          cgroup: proc_cgroup.CgroupChoice) -> Launched:
    env = dict(os.environ)
    env.update(env_add)
    env[proc_tree.MARKER_VAR] = marker
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    rotate_log(log_path)
    cgroup_path, reason = cgroup.path, cgroup.reason
    with open(log_path, "ab") as log:
        try:
            process = _popen(cmd, env, cwd, log, cgroup_path)
        except subprocess.SubprocessError as exc:
            if cgroup_path is None:
                raise LaunchError(f"could not start {cmd[0]}: {exc}") from exc
            # Joining the cgroup failed in the child before exec: nothing ran; start without.
            reason = f"joining {cgroup_path} failed ({exc}); started without a cgroup"
            proc_cgroup.remove(cgroup_path, timeout=0)
            cgroup_path = None
            process = _popen(cmd, env, cwd, log, None)
        except OSError as exc:
            proc_cgroup.remove(cgroup_path, timeout=0)
            raise LaunchError(f"could not execute {cmd[0]!r}: {exc.strerror or exc}") from exc
    info = read_process(process.pid, stat_only=True)
    return Launched(pid=process.pid, start_time=info.start_time if info else None,
                    cgroup=cgroup_path, cgroup_reason=reason, marker=marker, log_path=log_path,
                    process=process)


def _popen(cmd, env, cwd, log, cgroup_path):
    # Runs in the child between fork and exec: the cgroup holds the server from its first fork.
    preexec = (lambda: proc_cgroup.join(cgroup_path)) if cgroup_path else None
    try:
        return subprocess.Popen(list(cmd), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                                start_new_session=True, preexec_fn=preexec)
    except FileNotFoundError as exc:
        raise OSError(exc.errno, f"{exc.strerror} (is it installed, is the path right?)") from exc


def members(pid: Optional[int], start_time: Optional[int], marker: Optional[str],
            cgroup: Optional[str]) -> Dict[int, ProcInfo]:
    """{pid: ProcInfo} of the live processes of the server started as `pid`."""
    return proc_tree.members(pid, start_time, marker, proc_cgroup.member_pids(cgroup))


def stop_tree(pid: Optional[int], start_time: Optional[int], marker: Optional[str],
              cgroup: Optional[str], grace: float = 10.0, kill_timeout: float = 10.0,
              poll: float = 0.2) -> StopReport:
    """TERM, grace, KILL the whole server; returns what got which signal and who survived.
    `poll`: how often members are looked for again (children forked during shutdown)."""
    started = time.monotonic()

    def discover():
        return members(pid, start_time, marker, cgroup).values()

    outcome = proc_terminate.terminate(proc_terminate.TerminationPlan(
        targets=list(discover()), cgroups=[cgroup] if cgroup else [], grace=grace,
        kill_timeout=kill_timeout, discover=discover, discover_interval=poll,
        # the server may be our own child (a start that failed its readiness wait): reap it,
        # or its zombie keeps the cgroup from being removed
        collect_children=True))
    report = StopReport()
    report.killed = [{"pid": o.pid, "comm": o.info.comm, "signal": o.signal}
                     for o in sorted(outcome.signalled, key=lambda o: o.pid)]
    report.survivors = [{"pid": o.pid, "comm": o.info.comm, "cmdline": read_cmdline(o.pid)}
                        for o in sorted(outcome.survivors, key=lambda o: o.pid)]
    used = [c.action for c in outcome.cgroups
            if c.action in (proc_terminate.CGROUP_KILLED, proc_terminate.CGROUP_PER_PROCESS)]
    report.cgroup_kill = used[0] if used else "none"
    if not outcome.survivors:
        proc_cgroup.remove(cgroup)
    report.seconds = round(time.monotonic() - started, 3)
    return report
