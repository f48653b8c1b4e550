"""Read the process table from /proc, and find the processes that hold given device files.

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

PF_KTHREAD = 0x00200000          # task flag (stat field 9) of kernel threads
# Zombie, dead, and dead as older kernels (2.6.33-3.13) spell it: the process has exited.
GONE_STATES = ("Z", "X", "x")
_WILDCARDS = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class ProcInfo:
    """One process as /proc shows it at scan time.

    The fields up to starttime, and kernel_thread, come from /proc/<pid>/stat; cmdline, uid and
    nspid from further files, left at "", None and () by a stat-only read (read_process)."""
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str                    # R S D Z T t X I ...
    comm: str                     # kernel name, 15 chars max (setproctitle changes it too)
    cmdline: str                  # argv joined by spaces; "" for kernel threads and zombies
    starttime: int                # clock ticks after boot: (pid, starttime) identifies a process
    uid: Optional[int] = None
    nspid: Tuple[int, ...] = ()   # NSpid: this pid in each nested pid namespace, outermost first
    kernel_thread: bool = False

    @property
    def start_time(self) -> int:
        """starttime under the name the launcher and its saved server state use."""
        return self.starttime

    @property
    def gone(self) -> bool:
        """Zombie or dead: the process has exited; only its parent's wait() is missing, and
        when we are not its parent we cannot do that. Its memory and fds are already released."""
        return self.state in GONE_STATES

    @property
    def namespace_pid(self) -> int:
        """The pid inside its own (innermost) pid namespace, e.g. inside an LXC container."""
        return self.nspid[-1] if self.nspid else self.pid

    @property
    def namespace_init(self) -> bool:
        """PID 1 of a nested pid namespace (e.g. a container's init): never a target."""
        return len(self.nspid) > 1 and self.nspid[-1] == 1

    def label(self) -> str:
        return "%d %s" % (self.pid, self.cmdline or "[%s]" % self.comm)


def _read_bytes(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def parse_stat(text: str) -> Tuple[str, Dict[str, int], str]:
    """Parse /proc/<pid>/stat. The comm field is in parentheses and may itself contain spaces
    and parentheses, so split at the *last* ')'. Returns (comm, numeric fields, state)."""
    open_at = text.index("(")
    close_at = text.rindex(")")
    comm = text[open_at + 1:close_at]
    rest = text[close_at + 2:].split()
    # rest[0] is field 3 (state); field n is rest[n - 3]
    fields = {
        "ppid": int(rest[1]),
        "pgid": int(rest[2]),
        "sid": int(rest[3]),
        "flags": int(rest[6]),
        "starttime": int(rest[19]),
    }
    return comm, fields, rest[0]


def read_stat(pid: int, proc_root: str = "/proc") -> Optional[Tuple[str, Dict[str, int], str]]:
    """parse_stat of /proc/<pid>/stat, or None if the process has gone (or is unreadable)."""
    raw = _read_bytes("%s/%d/stat" % (proc_root, pid))
    if raw is None:
        return None
    try:
        return parse_stat(raw.decode("utf-8", "replace"))
    except (ValueError, IndexError):
        return None


def read_cmdline(pid: int, proc_root: str = "/proc") -> str:
    """argv joined by spaces; "" for kernel threads, zombies and processes gone meanwhile."""
    raw = _read_bytes("%s/%d/cmdline" % (proc_root, pid)) or b""
    # setproctitle pads the rewritten argv area with NULs or spaces: strip them.
    return raw.decode("utf-8", "replace").replace("\0", " ").strip()


def _read_ids(pid: int, proc_root: str) -> Tuple[Optional[int], Tuple[int, ...]]:
    """(real uid, NSpid) from /proc/<pid>/status; (None, ()) where unreadable."""
    uid = None
    nspid: Tuple[int, ...] = ()
    status = _read_bytes("%s/%d/status" % (proc_root, pid))
    if status:
        for line in status.decode("utf-8", "replace").splitlines():
            if line.startswith("Uid:"):
                try:
                    uid = int(line.split()[1])
                except (IndexError, ValueError):
                    pass
            elif line.startswith("NSpid:"):
                try:
                    nspid = tuple(int(x) for x in line.split()[1:])
                except ValueError:
                    pass
    return uid, nspid


def read_process(pid: int, proc_root: str = "/proc", stat_only: bool = False
                 ) -> Optional[ProcInfo]:
    """One process, or None if it has gone (or is unreadable) meanwhile. stat_only reads one
    file instead of three, for callers that need only ids, state and start time."""
    parsed = read_stat(pid, proc_root)
    if parsed is None:
        return None
    comm, fields, state = parsed
    cmdline = ""
    uid: Optional[int] = None
    nspid: Tuple[int, ...] = ()
    if not stat_only:
        cmdline = read_cmdline(pid, proc_root)
        uid, nspid = _read_ids(pid, proc_root)
    return ProcInfo(
        pid=pid, ppid=fields["ppid"], pgid=fields["pgid"], sid=fields["sid"], state=state,
        comm=comm, cmdline=cmdline, starttime=fields["starttime"], uid=uid, nspid=nspid,
        # by flag only: inside a container pid 2 is an ordinary process
        kernel_thread=bool(fields["flags"] & PF_KTHREAD),
    )


def list_pids(proc_root: str = "/proc") -> List[int]:
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def scan_processes(proc_root: str = "/proc", stat_only: bool = False) -> Dict[int, ProcInfo]:
    """The whole process table (thread-group leaders), keyed by pid."""
    table: Dict[int, ProcInfo] = {}
    for pid in list_pids(proc_root):
        info = read_process(pid, proc_root, stat_only)
        if info is not None:
            table[pid] = info
    return table


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


def descendants(pid: int, kids: Dict[int, List[int]]) -> List[int]:
    out: List[int] = []
    stack = list(kids.get(pid, ()))
    seen: Set[int] = set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        stack.extend(kids.get(p, ()))
    return out


def still_running(pid: int, starttime: Optional[int], proc_root: str = "/proc") -> bool:
    """True while the very process (pid + start time: a reused pid is another process) exists
    and is not a zombie. A zombie has released its memory and device files. starttime None:
    whichever process has this pid now."""
    parsed = read_stat(pid, proc_root)
    if parsed is None:
        return False
    _, fields, state = parsed
    return state not in GONE_STATES and starttime in (None, fields["starttime"])


# ---------------------------------------------------------------------------------------------
# Device holders


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
    def from_glob(cls, pattern: str) -> "DeviceMatcher":
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


def open_device_files(pid: int, matcher: DeviceMatcher, proc_root: str = "/proc") -> List[str]:
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


def mapped_device_files(pid: int, matcher: DeviceMatcher, proc_root: str = "/proc") -> List[str]:
    """Matching files the process has memory-mapped (a CUDA process maps /dev/nvidia*; a process
    may close the fd and keep the mapping, which still pins the GPU context)."""
    data = _read_bytes("%s/%d/maps" % (proc_root, pid))
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
                        proc_root: str = "/proc") -> Dict[int, DeviceHit]:
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
