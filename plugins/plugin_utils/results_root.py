"""Whether the controller can make its run directories under bench_results_root (the preflight).

What was seen (issue 26): a results root under a regular file, or in /proc, passed the preflight
and failed at "Open the run" with `cannot create the lock directory .../.locks: Not a
directory`, naming neither the variable nor the fix. This check only looks (stat, access, the
mount table): the preflight writes nothing.
"""
from __future__ import annotations

import os
from typing import Optional

# Kernel filesystems where no directory of ours can ever be made (mkdir fails or means nothing).
PSEUDO_FILESYSTEMS = frozenset((
    "proc", "sysfs", "devpts", "cgroup", "cgroup2", "securityfs", "debugfs", "tracefs",
    "pstore", "bpf", "configfs", "fusectl", "binfmt_misc", "mqueue", "hugetlbfs", "efivarfs",
))
FIX = ("set bench_results_root (-e bench_results_root=DIR, or SERVELAB_RESULTS_ROOT) to a "
       "directory this user can create and write")


def _filesystem(path: str, mountinfo: str = "/proc/self/mountinfo") -> Optional[str]:
    """The type of the filesystem `path` is on (the longest mount point above it), or None."""
    best, fstype = "", None
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                head, _sep, tail = line.partition(" - ")
                fields = head.split()
                if len(fields) < 5 or not tail:
                    continue
                point = fields[4].replace("\\040", " ")
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, fstype = point, tail.split()[0]
    except OSError:
        return None
    return fstype


def results_root_problem(root: str) -> Optional[str]:
    """The message (naming bench_results_root and the fix) when run directories cannot be made
    under `root`, else None."""
    path = os.path.abspath(os.path.expanduser(root))
    existing = path
    while not os.path.lexists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        what = "a file" if os.path.isfile(existing) else "not a directory"
        return ("bench_results_root: %s cannot be made: %s is %s; %s"
                % (path, existing, what, FIX))
    fstype = _filesystem(os.path.realpath(existing))
    if fstype in PSEUDO_FILESYSTEMS:
        return ("bench_results_root: %s is on the kernel's %s filesystem (%s), where no run "
                "directory can be made; %s" % (path, fstype, existing, FIX))
    if not os.access(existing, os.W_OK | os.X_OK):
        return ("bench_results_root: %s cannot be made: %s is not writable by uid %d; %s"
                % (path, existing, os.geteuid(), FIX))
    return None
