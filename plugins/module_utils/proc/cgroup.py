"""cgroup v2 directories: make one per server, find named ones, list their members, kill them whole.

Standard library only (runs on the target).

Why cgroups: a process-group or session kill misses a child that double-forks into a new
session; a cgroup does not let it out, and cgroup v2's `cgroup.kill` (kernel 5.14+) SIGKILLs all
of its members in one write, including those forked a moment ago. Whether that write is allowed
(nothing protected inside) is decided by proc/terminate.py, the one place that signals.

systemd is not PID 1 on these machines (no systemd-run), so the launcher makes the server's
cgroup itself, `<v2 root>/servelab/<name>`: on a cgroup v2 host the hierarchy is at
/sys/fs/cgroup, on a v1 "hybrid" host the v2 hierarchy is mounted at /sys/fs/cgroup/unified (no
controllers needed: membership and `cgroup.kill` are enough). Where neither is writable, the
launcher works without one.

For the Proxmox-host variant of the reaper, a container's processes are those in its cgroup,
`/sys/fs/cgroup/lxc/<vmid>` on PVE (or `.../<controller>/lxc/<vmid>` on v1 hierarchies).
"""
from __future__ import annotations

import errno
import glob
import os
import time
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Sequence, Set

CGROUP_FS = "/sys/fs/cgroup"
PARENT = "servelab"
MOUNTINFO = "/proc/self/mountinfo"
PREFERRED_MOUNTS = (CGROUP_FS, CGROUP_FS + "/unified")

# Where a container's cgroup lives, "{vmid}" replaced. PVE: lxc/<vmid> (the container's own
# processes are under lxc/<vmid>/ns, its monitor under lxc.monitor/<vmid>, which stays out).
# Plain LXC 4+: lxc.payload.<name>. v1 hierarchies put the same paths under each controller.
DEFAULT_CONTAINER_CGROUP_GLOBS = (
    "/sys/fs/cgroup/lxc/{vmid}",
    "/sys/fs/cgroup/*/lxc/{vmid}",
    "/sys/fs/cgroup/lxc.payload.{vmid}",
    "/sys/fs/cgroup/*/lxc.payload.{vmid}",
)


# ---------------------------------------------------------------------------------------------
# The hierarchy


def cgroup2_mounts(mountinfo: str = MOUNTINFO) -> List[str]:
    """Mount points of cgroup v2 hierarchies, the usual ones first."""
    mounts = []
    try:
        with open(mountinfo, encoding="utf-8") as fh:
            for line in fh:
                # "... mount_point options - fstype source super_options"
                left, _sep, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    mounts.append(left.split()[4].replace("\\040", " "))
    except OSError:
        pass
    preferred = [m for m in PREFERRED_MOUNTS if m in mounts]
    return preferred + [m for m in mounts if m not in preferred]


def v2_root(cgroup_fs: str = CGROUP_FS) -> Optional[str]:
    """The cgroup v2 mount where relative cgroup names are looked up: the unified hierarchy
    itself, or the hybrid layout's 'unified'."""
    if os.path.exists(os.path.join(cgroup_fs, "cgroup.controllers")):
        return cgroup_fs
    unified = os.path.join(cgroup_fs, "unified")
    if os.path.exists(os.path.join(unified, "cgroup.procs")):
        return unified
    return None


# ---------------------------------------------------------------------------------------------
# A server's own cgroup (the launcher)


@dataclass(frozen=True)
class CgroupChoice:
    path: Optional[str]      # the server's cgroup directory, or None
    reason: str              # why this one, or why none


def prepare(name: str, setting: str = "auto") -> CgroupChoice:
    """Create (or reuse) the server's cgroup. `setting`: auto | none | <parent directory>."""
    if setting == "none":
        return CgroupChoice(None, "disabled by cgroup: none")
    if setting == "auto":
        mounts = cgroup2_mounts()
        if not mounts:
            return CgroupChoice(None, "no cgroup v2 hierarchy mounted")
        parents = [os.path.join(m, PARENT) for m in mounts]
    else:
        parents = [setting]
    errors = []
    for parent in parents:
        path = os.path.join(parent, name)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            errors.append(f"{path}: {exc.strerror}")
            continue
        if os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
            return CgroupChoice(path, f"cgroup v2 at {path}")
        errors.append(f"{path}: cgroup.procs not writable")
        _rmdir_quietly(path)
    return CgroupChoice(None, "no writable cgroup v2 directory (" + "; ".join(errors) + ")")


def join(path: str) -> None:
    """Move the calling process into `path`. Runs in the child between fork and exec, so it does
    only a write: no imports, no allocation-heavy work."""
    fd = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY)
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)


def remove(path: Optional[str], timeout: float = 5.0) -> bool:
    """rmdir the (empty) cgroup; zombies keep it busy until they are reaped, hence the wait."""
    if not path:
        return True
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
        time.sleep(0.1)


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------
# Members and the whole-cgroup kill


def member_pids(path: Optional[str]) -> Set[int]:
    """Every process in the cgroup and in the cgroups below it; empty for None or a missing
    directory."""
    pids: Set[int] = set()
    if not path:
        return pids
    for dirpath, _dirs, files in os.walk(path):
        if "cgroup.procs" not in files:
            continue
        try:
            with open(os.path.join(dirpath, "cgroup.procs"), encoding="ascii") as fh:
                pids.update(int(line) for line in fh if line.strip().isdigit())
        except OSError:
            continue
    return pids


def has_kill(path: str) -> bool:
    """The cgroup offers `cgroup.kill` (cgroup v2, kernel 5.14+)."""
    return os.path.exists(os.path.join(path, "cgroup.kill"))


def kill(path: str) -> bool:
    """SIGKILL everything in the cgroup with one write to `cgroup.kill`. False if unsupported
    or refused. Callers check first that nothing protected is inside (proc/terminate.py)."""
    try:
        with open(os.path.join(path, "cgroup.kill"), "w", encoding="ascii") as fh:
            fh.write("1")
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------
# Cgroups named by the user (the reaper)


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
                                 can_kill=has_kill(path), pids=sorted(member_pids(path))))
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
