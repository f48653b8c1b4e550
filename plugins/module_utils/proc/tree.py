"""Processes as /proc shows them: identity, trees, sessions, and an inherited env marker.

A server is more than its first PID: SGLang forks a scheduler per TP rank, a detokenizer and
draft workers, and a child may double-fork out of the process group. Members are found by every
trace they leave: descendants of the launched PID, its process group and session, the cgroup
(launcher_cgroup.py), and an environment marker that children inherit even after setsid.
Standard library only (psutil is not on bare containers). /proc itself is read by procscan, the
one reader the reaper uses too.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Dict, Iterable, List, Optional, Set

from ansible_collections.servelab.serving.plugins.module_utils.proc.scan import (
    ProcInfo, children_map, read_cmdline, read_process, scan_processes, still_running,
)

PROC = "/proc"
MARKER_VAR = "SERVELAB_SERVER"


def read_proc(pid: int) -> Optional[ProcInfo]:
    """The process as its stat file shows it (ids, state, start_time, comm); None once gone.
    Stat only: discovery rereads the whole table every poll of a stop."""
    return read_process(pid, PROC, stat_only=True)


def all_procs() -> Dict[int, ProcInfo]:
    return scan_processes(PROC, stat_only=True)


def cmdline(pid: int) -> str:
    return read_cmdline(pid, PROC)


def has_marker(pid: int, marker: str) -> bool:
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as fh:
            return f"{MARKER_VAR}={marker}".encode() in fh.read().split(b"\0")
    except OSError:
        return False


def is_alive(pid: Optional[int], start_time: Optional[int] = None) -> bool:
    """True while the process exists, is not a zombie, and (if given) is the same process."""
    return bool(pid) and still_running(pid, start_time, PROC)


def protected_pids() -> Set[int]:
    """This process and its ancestors: never signalled, whatever matched."""
    protected = set()
    pid = os.getpid()
    while pid > 0 and pid not in protected:
        protected.add(pid)
        info = read_proc(pid)
        if info is None:
            break
        pid = info.ppid
    return protected


def members(root_pid: Optional[int], root_start: Optional[int], marker: Optional[str] = None,
            cgroup_pids: Iterable[int] = ()) -> Dict[int, ProcInfo]:
    """Live (non-zombie) processes that belong to the server started as `root_pid`."""
    procs = all_procs()
    protected = protected_pids()
    chosen: Set[int] = {p for p in cgroup_pids if p in procs}
    root = procs.get(root_pid) if root_pid else None
    same_root = root is not None and root_start in (None, root.starttime)
    if same_root:
        chosen.add(root.pid)
    if root_pid and (same_root or root is None):
        # The launcher made the root a session and group leader (setsid): pgid == sid == root.
        # With the root dead its group and session may live on (orphaned workers); Linux does
        # not reuse a PID while it names a group or session, so they are still the server's.
        chosen |= {p.pid for p in procs.values() if p.pgid == root_pid or p.sid == root_pid}
    if marker:
        chosen |= {pid for pid in procs if has_marker(pid, marker)}
    # Descendants of anything chosen so far (children that changed group or session).
    children = children_map(procs)
    stack = list(chosen)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in chosen:
                chosen.add(child)
                stack.append(child)
    return {pid: procs[pid] for pid in chosen
            if pid in procs and pid not in protected and not procs[pid].gone}


def signal_pids(pids: Iterable[int], sig: int) -> List[int]:
    sent = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except ProcessLookupError:
            pass
        except PermissionError:
            pass
    return sent


def reap(pids: Iterable[int]) -> None:
    """Collect those of `pids` that are exited children of this process, so they do not linger
    as zombies. Only named PIDs: waitpid(-1) would steal other Popen objects' exit codes."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def wait_until_gone(pids: Iterable[int], timeout: float, poll: float = 0.1) -> Set[int]:
    """Wait until none of `pids` is alive (zombies count as gone); return the survivors."""
    remaining = set(pids)
    deadline = time.monotonic() + timeout
    while remaining:
        reap(remaining)
        remaining = {pid for pid in remaining if is_alive(pid)}
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return remaining


SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGKILL: "SIGKILL"}
