"""A cgroup v2 directory per server: every process it ever forks stays findable and killable.

A process group kill misses a child that double-forks into a new session; a cgroup does not let
it out. systemd is not PID 1 on these machines (no systemd-run), so the launcher makes the cgroup
itself: on a cgroup v2 host the hierarchy is at /sys/fs/cgroup, on a v1 "hybrid" host the v2
hierarchy is mounted at /sys/fs/cgroup/unified (no controllers needed: membership and
`cgroup.kill` are enough). Where neither is writable, the launcher works without one.
"""
from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from typing import List, Optional

PARENT = "servelab"
MOUNTINFO = "/proc/self/mountinfo"
PREFERRED_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


@dataclass(frozen=True)
class CgroupChoice:
    path: Optional[str]      # the server's cgroup directory, or None
    reason: str              # why this one, or why none


def cgroup2_mounts(mountinfo: str = MOUNTINFO) -> List[str]:
    mounts = []
    try:
        with open(mountinfo, encoding="utf-8") as fh:
            for line in fh:
                # "... mount_point options - fstype source super_options"
                left, _, right = line.partition(" - ")
                if right.split(" ", 1)[0] == "cgroup2":
                    mounts.append(left.split()[4].replace("\\040", " "))
    except OSError:
        pass
    preferred = [m for m in PREFERRED_MOUNTS if m in mounts]
    return preferred + [m for m in mounts if m not in preferred]


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


def pids(path: Optional[str]) -> List[int]:
    if not path:
        return []
    try:
        with open(os.path.join(path, "cgroup.procs"), encoding="ascii") as fh:
            return [int(line) for line in fh if line.strip()]
    except OSError:
        return []


def kill_all(path: Optional[str]) -> str:
    """SIGKILL everything in the cgroup: `cgroup.kill` where the kernel has it (5.14+), else
    each listed PID, repeated while new ones appear. Returns how."""
    if not path or not os.path.isdir(path):
        return "none"
    kill_file = os.path.join(path, "cgroup.kill")
    if os.path.exists(kill_file):
        try:
            with open(kill_file, "w", encoding="ascii") as fh:
                fh.write("1")
            return "cgroup.kill"
        except OSError:
            pass
    for _ in range(50):
        listed = pids(path)
        if not listed:
            break
        for pid in listed:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    return "cgroup.procs"


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
