"""Which processes hold given device files open or mapped (GPU users, by /proc/<pid>/fd and maps).

Standard library only: this runs on the target host (often a bare container with python3).

Why /proc and not NVML: inside an LXC container NVML and nvidia-smi report *host* PIDs (the
driver is not PID-namespace aware), so they cannot say which container process holds a GPU.
A process that uses a GPU holds open file descriptors on /dev/nvidia* (and usually maps them);
that is namespace-correct and is what `fuser -v /dev/nvidia*` looks at.
"""
from __future__ import annotations

import fnmatch
import glob
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import PROC, read_proc_file

_WILDCARDS = re.compile(r"[*?\[]")


@dataclass
class DeviceMatcher:
    """Decides whether an open file is one of the device files named by a glob.

    By name (the fd's link target matches the glob), and for character devices also by device
    number: from the Proxmox host, a container's /dev/nvidia0 may read back under another path,
    but its rdev is the same."""
    pattern: str
    rdevs: Set[int] = field(default_factory=set)
    literal_prefix: bytes = b""
    # Compare the device number of every open file, not only of those under /dev/: for the
    # host variant, where a container's bind-mounted node may read back under any path.
    stat_all: bool = False

    @classmethod
    def from_glob(cls, pattern: str) -> DeviceMatcher:
        rdevs: Set[int] = set()
        for path in glob.glob(pattern):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode):
                rdevs.add(st.st_rdev)
        m = _WILDCARDS.search(pattern)
        prefix = pattern[:m.start()] if m else pattern
        return cls(pattern=pattern, rdevs=rdevs, literal_prefix=prefix.encode())

    def matches_name(self, path: str) -> bool:
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        return fnmatch.fnmatchcase(path, self.pattern)

    def matches_fd(self, fd_path: str, target: str) -> bool:
        if self.matches_name(target):
            return True
        if self.rdevs and (self.stat_all or target.startswith("/dev/")):
            try:
                st = os.stat(fd_path)
            except OSError:
                return False
            return stat.S_ISCHR(st.st_mode) and st.st_rdev in self.rdevs
        return False


def open_device_files(pid: int, matcher: DeviceMatcher, proc_root: str = PROC) -> List[str]:
    """Paths of the matching device files the process holds open (one entry per path)."""
    fd_dir = "%s/%d/fd" % (proc_root, pid)
    try:
        fds = os.listdir(fd_dir)
    except OSError:            # gone, or not ours to read
        return []
    found: List[str] = []
    for fd in fds:
        fd_path = fd_dir + "/" + fd
        try:
            target = os.readlink(fd_path)
        except OSError:
            continue
        # sockets, pipes and anon inodes are never device files
        if not target.startswith("/"):
            continue
        if matcher.matches_fd(fd_path, target) and target not in found:
            found.append(target)
    return found


def mapped_device_files(pid: int, matcher: DeviceMatcher, proc_root: str = PROC) -> List[str]:
    """Matching files the process has memory-mapped (a CUDA process maps /dev/nvidia*; a process
    may close the fd and keep the mapping, which still pins the GPU context)."""
    data = read_proc_file(pid, "maps", proc_root)
    if not data or (matcher.literal_prefix and matcher.literal_prefix not in data):
        return []
    found: List[str] = []
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path = parts[5].strip()
            if matcher.matches_name(path) and path not in found:
                found.append(path)
    return found


@dataclass
class DeviceHit:
    how: str                      # "device_fd" or "device_mmap"
    paths: List[str]


def find_device_holders(pids: Iterable[int], matcher: DeviceMatcher, scan_maps: bool = True,
                        proc_root: str = PROC) -> Dict[int, DeviceHit]:
    holders: Dict[int, DeviceHit] = {}
    for pid in pids:
        paths = open_device_files(pid, matcher, proc_root)
        if paths:
            holders[pid] = DeviceHit("device_fd", paths)
            continue
        if scan_maps:
            paths = mapped_device_files(pid, matcher, proc_root)
            if paths:
                holders[pid] = DeviceHit("device_mmap", paths)
    return holders


def split_compute_holders(holders: Dict[int, DeviceHit],
                          compute_matcher: Optional[DeviceMatcher], proc_root: str = PROC
                          ) -> Tuple[Dict[int, DeviceHit], Dict[int, DeviceHit]]:
    """(holders with a CUDA context, the others). What tells a context from an NVML client
    is the mapping of the compute device (/dev/nvidia-uvm), not the open file: nvidia-smi and
    DCGM open the same nodes, uvm included, but map none of it. No compute_matcher: every
    holder counts (as with fuser)."""
    if compute_matcher is None:
        return dict(holders), {}
    compute: Dict[int, DeviceHit] = {}
    others: Dict[int, DeviceHit] = {}
    for pid, hit in holders.items():
        if mapped_device_files(pid, compute_matcher, proc_root):
            compute[pid] = hit
        else:
            others[pid] = hit
    return compute, others


def holds_cuda_context(pid: int, matcher: DeviceMatcher,
                       compute_matcher: Optional[DeviceMatcher], scan_maps: bool = True,
                       proc_root: str = PROC) -> bool:
    """The one process holds a device file of `matcher` and (with a compute_matcher) maps the
    compute device: what find_device_holders + split_compute_holders decide for a whole table,
    for one pid (the reaper asks it about the pids NVML lists)."""
    if pid not in find_device_holders([pid], matcher, scan_maps, proc_root):
        return False
    return compute_matcher is None or bool(mapped_device_files(pid, compute_matcher, proc_root))
