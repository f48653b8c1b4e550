"""Processes as /proc shows them: identity, trees, sessions, and an inherited env marker.

A server is more than its first PID: SGLang forks a scheduler per TP rank, a detokenizer and
draft workers, and a child may double-fork out of the process group. Members are found by every
trace they leave: descendants of the launched PID, its process group and session, the cgroup
(launcher_cgroup.py), and an environment marker that children inherit even after setsid.
Standard library only (psutil is not on bare containers).
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set

PROC = "/proc"
MARKER_VAR = "SERVELAB_SERVER"


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    start_time: int   # clock ticks since boot: with the PID, a process identity that survives reuse
    comm: str

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def read_proc(pid: int) -> Optional[ProcInfo]:
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    # comm is in parentheses and may itself contain spaces or parentheses.
    lpar, rpar = raw.find("("), raw.rfind(")")
    fields = raw[rpar + 2:].split()
    try:
        return ProcInfo(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), sid=int(fields[3]),
                        state=fields[0], start_time=int(fields[19]), comm=raw[lpar + 1:rpar])
    except (IndexError, ValueError):
        return None


def all_procs() -> Dict[int, ProcInfo]:
    found = {}
    for entry in os.listdir(PROC):
        if entry.isdigit():
            info = read_proc(int(entry))
            if info is not None:
                found[info.pid] = info
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def has_marker(pid: int, marker: str) -> bool:
    try:
        with open(f"{PROC}/{pid}/environ", "rb") as fh:
            return f"{MARKER_VAR}={marker}".encode() in fh.read().split(b"\0")
    except OSError:
        return False


def is_alive(pid: Optional[int], start_time: Optional[int] = None) -> bool:
    """True while the process exists, is not a zombie, and (if given) is the same process."""
    if not pid:
        return False
    info = read_proc(pid)
    if info is None or info.zombie:
        return False
    return start_time is None or info.start_time == start_time


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
    same_root = root is not None and (root_start is None or root.start_time == root_start)
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
    children: Dict[int, List[int]] = {}
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    stack = list(chosen)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in chosen:
                chosen.add(child)
                stack.append(child)
    return {pid: procs[pid] for pid in chosen
            if pid in procs and pid not in protected and not procs[pid].zombie}


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
