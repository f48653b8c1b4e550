"""How processes relate: parents, descendants, the caller's lineage, and a launched server's tree.

A server is more than its first PID: SGLang forks a scheduler per TP rank, a detokenizer and
draft workers, and a child may double-fork out of the process group. Its members are found by
every trace they leave: descendants of the launched PID, its process group and session, its
cgroup (proc/cgroup.py), and an environment marker that children inherit even after setsid.
All of it is computed over snapshots from proc/table.py.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Iterable, List, Optional, Set

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (
    PROC, ProcInfo, read_environ, read_process, scan_processes,
)

MARKER_VAR = "SERVELAB_SERVER"


def ancestors(pid: int, table: Dict[int, ProcInfo]) -> List[int]:
    """pid's parent, grandparent, ... up to the top of what the table shows."""
    chain: List[int] = []
    seen = {pid}
    cur = table.get(pid)
    while cur is not None and cur.ppid > 0 and cur.ppid not in seen:
        chain.append(cur.ppid)
        seen.add(cur.ppid)
        cur = table.get(cur.ppid)
    return chain


def children_map(table: Dict[int, ProcInfo]) -> Dict[int, List[int]]:
    kids: Dict[int, List[int]] = {}
    for info in table.values():
        kids.setdefault(info.ppid, []).append(info.pid)
    return kids


def descendants(pid: int, kids: Dict[int, List[int]],
                prune: Optional[Callable[[int], bool]] = None) -> List[int]:
    """Every descendant of pid; with `prune`, a descendant for which it is true is left out
    together with its own subtree."""
    out: List[int] = []
    stack = list(kids.get(pid, ()))
    seen: Set[int] = set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        if prune is not None and prune(p):
            continue
        out.append(p)
        stack.extend(kids.get(p, ()))
    return out


def caller_lineage(proc_root: str = PROC) -> Set[int]:
    """This process and its ancestors, read live: never signalled, whatever matched (killing
    the Ansible connection that runs us would fail the task and leave the job half done)."""
    lineage: Set[int] = set()
    pid = os.getpid()
    while pid > 0 and pid not in lineage:
        lineage.add(pid)
        info = read_process(pid, proc_root, stat_only=True)
        if info is None:
            break
        pid = info.ppid
    return lineage


def has_marker(pid: int, marker: str, proc_root: str = PROC) -> bool:
    """The process inherited the launcher's environment marker of this server."""
    return f"{MARKER_VAR}={marker}".encode() in read_environ(pid, proc_root)


def members(root_pid: Optional[int], root_start: Optional[int], marker: Optional[str] = None,
            cgroup_pids: Iterable[int] = (), proc_root: str = PROC) -> Dict[int, ProcInfo]:
    """Live (non-zombie) processes that belong to the server started as `root_pid`, never the
    caller or its ancestors. Stat-only snapshots: cmdline is not read."""
    procs = scan_processes(proc_root, stat_only=True)
    protected = caller_lineage(proc_root)
    chosen: Set[int] = {p for p in cgroup_pids if p in procs}
    root = procs.get(root_pid) if root_pid else None
    same_root = root is not None and root_start in (None, root.start_time)
    if same_root:
        chosen.add(root.pid)
    if root_pid and (same_root or root is None):
        # The launcher made the root a session and group leader (setsid): pgid == sid == root.
        # With the root dead its group and session may live on (orphaned workers); Linux does
        # not reuse a PID while it names a group or session, so they are still the server's.
        chosen |= {p.pid for p in procs.values() if p.pgid == root_pid or p.sid == root_pid}
    if marker:
        chosen |= {pid for pid in procs if has_marker(pid, marker, proc_root)}
    # Descendants of anything chosen so far (children that changed group or session).
    kids = children_map(procs)
    for pid in list(chosen):
        chosen.update(descendants(pid, kids))
    return {pid: procs[pid] for pid in sorted(chosen)
            if pid in procs and pid not in protected and not procs[pid].gone}
