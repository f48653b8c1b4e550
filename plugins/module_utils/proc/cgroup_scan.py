"""cgroups for the reaper: find cgroup directories, list their processes, kill them at once.

Standard library only (runs on the target).

Why cgroups: a process-group or session kill misses a double-forked `setsid` grandchild; a
cgroup holds every process started inside it, however it detached, and cgroup v2's
`cgroup.kill` SIGKILLs all of them in one write, including those forked a moment ago.
The llm_server launcher starts servers in `<cgroup v2 root>/servelab/<name>` where it can.
On hybrid hosts the v2 hierarchy is mounted at /sys/fs/cgroup/unified.

For the Proxmox-host variant a container's processes are those in its cgroup,
`/sys/fs/cgroup/lxc/<vmid>` on PVE (or `.../<controller>/lxc/<vmid>` on v1 hierarchies).
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Set

CGROUP_FS = "/sys/fs/cgroup"

# Where a container's cgroup lives, "{vmid}" replaced. PVE: lxc/<vmid> (the container's own
# processes are under lxc/<vmid>/ns, its monitor under lxc.monitor/<vmid>, which stays out).
# Plain LXC 4+: lxc.payload.<name>. v1 hierarchies put the same paths under each controller.
DEFAULT_CONTAINER_CGROUP_GLOBS = (
    "/sys/fs/cgroup/lxc/{vmid}",
    "/sys/fs/cgroup/*/lxc/{vmid}",
    "/sys/fs/cgroup/lxc.payload.{vmid}",
    "/sys/fs/cgroup/*/lxc.payload.{vmid}",
)


def v2_root(cgroup_fs: str = CGROUP_FS) -> Optional[str]:
    """The cgroup v2 mount: the unified hierarchy itself, or the hybrid layout's 'unified'."""
    if os.path.exists(os.path.join(cgroup_fs, "cgroup.controllers")):
        return cgroup_fs
    unified = os.path.join(cgroup_fs, "unified")
    if os.path.exists(os.path.join(unified, "cgroup.procs")):
        return unified
    return None


def cgroup_pids(path: str) -> Set[int]:
    """Every process in the cgroup and in the cgroups below it."""
    pids: Set[int] = set()
    for dirpath, _dirs, files in os.walk(path):
        if "cgroup.procs" not in files:
            continue
        try:
            with open(os.path.join(dirpath, "cgroup.procs")) as fh:
                for line in fh:
                    line = line.strip()
                    if line.isdigit():
                        pids.add(int(line))
        except OSError:
            continue
    return pids


def kill_cgroup(path: str) -> bool:
    """SIGKILL everything in the cgroup (v2 `cgroup.kill`, kernel 5.14+). False if unsupported."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as fh:
            fh.write("1")
        return True
    except OSError:
        return False


@dataclass
class CgroupDir:
    """A cgroup directory the user named, and what the reaper did with it."""
    requested: str
    path: str
    exists: bool
    can_kill: bool                               # has cgroup.kill (cgroup v2, kernel 5.14+)
    pids: List[int] = field(default_factory=list)
    killed_with_cgroup_kill: bool = False
    note: Optional[str] = None


def resolve_cgroup_dirs(entries: Sequence[str], bases: Sequence[str]) -> List[CgroupDir]:
    """Absolute entries are used as given (globs allowed); relative ones are looked up under
    each base (the v2 root normally; the container's cgroup dirs for the host variant)."""
    out: List[CgroupDir] = []
    for entry in entries:
        if os.path.isabs(entry):
            candidates = [entry]
        else:
            candidates = [os.path.join(b, entry) for b in bases]
        matched: List[str] = []
        for cand in candidates:
            hits = sorted(glob.glob(cand)) if any(c in cand for c in "*?[") else (
                [cand] if os.path.isdir(cand) else [])
            matched.extend(h for h in hits if os.path.isdir(h) and h not in matched)
        if not matched:
            out.append(CgroupDir(requested=entry, path=candidates[0] if candidates else entry,
                                 exists=False, can_kill=False,
                                 note="no such cgroup (server not started in one, or already "
                                      "removed)"))
            continue
        for path in matched:
            out.append(CgroupDir(requested=entry, path=path, exists=True,
                                 can_kill=os.path.exists(os.path.join(path, "cgroup.kill")),
                                 pids=sorted(cgroup_pids(path))))
    return out


def container_cgroup_dirs(vmid: str, globs: Iterable[str]) -> List[str]:
    dirs: List[str] = []
    for pattern in globs:
        for path in sorted(glob.glob(pattern.replace("{vmid}", str(vmid)))):
            if os.path.isdir(path) and path not in dirs:
                dirs.append(path)
    return dirs


def container_bases(container_dirs: Sequence[str]) -> List[str]:
    """Where a path the container itself sees as its cgroup root lies on the host: the
    container's cgroup dir, or its `ns` child on PVE (the container's cgroup namespace root)."""
    bases: List[str] = []
    for d in container_dirs:
        ns = os.path.join(d, "ns")
        bases.extend([ns, d] if os.path.isdir(ns) else [d])
    return bases
