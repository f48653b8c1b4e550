"""Start a server detached from the caller, and stop it with everything it forked.

Start: its own session (setsid: no controlling terminal, its own process group, survives the
Ansible task that started it), stdin from /dev/null, stdout+stderr to a log file, its own cgroup
where the machine allows (joined between fork and exec, so not even the first fork escapes), and
an environment marker every descendant inherits.
Stop: SIGTERM to every member, a grace period, then SIGKILL (cgroup.kill where there is a
cgroup), repeated discovery so children forked during shutdown are caught too.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils.proc import cgroup as launcher_cgroup, tree as launcher_procs
from ansible_collections.servelab.serving.plugins.module_utils.proc.tree import MARKER_VAR


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
          cgroup: launcher_cgroup.CgroupChoice) -> Launched:
    env = dict(os.environ)
    env.update(env_add)
    env[MARKER_VAR] = marker
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
            launcher_cgroup.remove(cgroup_path, timeout=0)
            cgroup_path = None
            process = _popen(cmd, env, cwd, log, None)
        except OSError as exc:
            launcher_cgroup.remove(cgroup_path, timeout=0)
            raise LaunchError(f"could not execute {cmd[0]!r}: {exc.strerror or exc}") from exc
    info = launcher_procs.read_proc(process.pid)
    return Launched(pid=process.pid, start_time=info.start_time if info else None,
                    cgroup=cgroup_path, cgroup_reason=reason, marker=marker, log_path=log_path,
                    process=process)


def _popen(cmd, env, cwd, log, cgroup_path):
    # Runs in the child between fork and exec: the cgroup holds the server from its first fork.
    preexec = (lambda: launcher_cgroup.join(cgroup_path)) if cgroup_path else None
    try:
        return subprocess.Popen(list(cmd), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, close_fds=True,
                                start_new_session=True, preexec_fn=preexec)
    except FileNotFoundError as exc:
        raise OSError(exc.errno, f"{exc.strerror} (is it installed, is the path right?)") from exc


def _discover(pid, start_time, marker, cgroup):
    return launcher_procs.members(pid, start_time, marker, launcher_cgroup.pids(cgroup))


def stop_tree(pid: Optional[int], start_time: Optional[int], marker: Optional[str],
              cgroup: Optional[str], grace: float = 10.0, kill_timeout: float = 10.0,
              poll: float = 0.2) -> StopReport:
    """TERM, grace, KILL the whole server; returns what got which signal and who survived."""
    t0 = time.monotonic()
    report = StopReport()
    seen = {}
    last_signal = {}

    def round_of(sig):
        current = _discover(pid, start_time, marker, cgroup)
        fresh = [p for p in current if last_signal.get(p) != sig]
        for p in launcher_procs.signal_pids(fresh, sig):
            last_signal[p] = sig
            seen[p] = current[p].comm
        return current

    current = round_of(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while current and time.monotonic() < deadline:
        time.sleep(poll)
        launcher_procs.reap(list(seen))
        current = round_of(signal.SIGTERM)   # children forked during shutdown get TERM too
    if current:
        report.cgroup_kill = launcher_cgroup.kill_all(cgroup)
        current = round_of(signal.SIGKILL)
        deadline = time.monotonic() + kill_timeout
        while current and time.monotonic() < deadline:
            time.sleep(poll)
            launcher_procs.reap(list(seen))
            current = round_of(signal.SIGKILL)
    launcher_procs.reap(list(seen))
    survivors = _discover(pid, start_time, marker, cgroup)
    report.killed = [{"pid": p, "comm": seen[p],
                      "signal": launcher_procs.SIGNAL_NAMES.get(last_signal[p], str(last_signal[p]))}
                     for p in sorted(seen)]
    report.survivors = [{"pid": p, "comm": info.comm, "cmdline": launcher_procs.cmdline(p)}
                        for p, info in sorted(survivors.items())]
    if not survivors:
        launcher_cgroup.remove(cgroup)
    report.seconds = round(time.monotonic() - t0, 3)
    return report
