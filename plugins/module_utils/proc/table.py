"""The process table as /proc shows it: the one reader of stat, cmdline, status and environ.

Standard library only: this runs on the target host (often a bare container with python3, no
psutil). Everything that looks at processes (the llm_server launcher, the GPU reaper, the port
check) reads them through this module, so there is one parser and one snapshot type, ProcInfo.

Identity: a pid alone is not a process, since Linux reuses pids. (pid, start_time) is: the start
time (clock ticks after boot, stat field 22) of a new process with a reused pid differs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

PROC = "/proc"
PF_KTHREAD = 0x00200000          # task flag (stat field 9) of kernel threads
# Zombie, dead, and dead as older kernels (2.6.33-3.13) spell it: the process has exited.
GONE_STATES = ("Z", "X", "x")


@dataclass(frozen=True)
class ProcInfo:
    """One process at the moment it was read.

    Everything up to start_time, and kernel_thread, comes from /proc/<pid>/stat; cmdline, uid and
    nspid come from further files and stay "", None and () after a stat-only read."""
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str                    # R S D Z T t X I ...
    comm: str                     # kernel name, 15 chars max (setproctitle changes it too)
    start_time: int               # clock ticks after boot: (pid, start_time) is the identity
    cmdline: str = ""             # argv joined by spaces; "" for kernel threads and zombies
    uid: Optional[int] = None     # real uid
    nspid: Tuple[int, ...] = ()   # NSpid: this pid in each nested pid namespace, outermost first
    kernel_thread: bool = False

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


@dataclass(frozen=True)
class StatFields:
    """The fields of /proc/<pid>/stat that servelab uses."""
    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    flags: int
    start_time: int
    cpu_ticks: int = 0            # utime + stime + cutime + cstime (waited-for children), clock ticks


@dataclass(frozen=True)
class StatusFields:
    """The lines of /proc/<pid>/status that servelab uses."""
    uid: Optional[int] = None
    nspid: Tuple[int, ...] = ()
    ignored_signals: int = 0      # SigIgn: bit n-1 set = signal n is ignored (SIG_IGN)

    def ignores(self, signum: int) -> bool:
        return bool(self.ignored_signals & (1 << (signum - 1)))


def read_proc_file(pid: int, name: str, proc_root: str = PROC) -> Optional[bytes]:
    """The raw bytes of /proc/<pid>/<name>; None if the process has gone or it is unreadable."""
    try:
        with open("%s/%d/%s" % (proc_root, pid, name), "rb") as fh:
            return fh.read()
    except OSError:
        return None


def parse_stat(text: str) -> StatFields:
    """Parse /proc/<pid>/stat. The comm field is in parentheses and may itself contain spaces
    and parentheses, so split at the *last* ')'."""
    open_at = text.index("(")
    close_at = text.rindex(")")
    rest = text[close_at + 2:].split()
    # rest[0] is field 3 (state); field n is rest[n - 3]
    return StatFields(comm=text[open_at + 1:close_at], state=rest[0], ppid=int(rest[1]),
                      pgid=int(rest[2]), sid=int(rest[3]), flags=int(rest[6]),
                      start_time=int(rest[19]),
                      cpu_ticks=int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14]))


def read_stat(pid: int, proc_root: str = PROC) -> Optional[StatFields]:
    """parse_stat of /proc/<pid>/stat, or None if the process has gone (or is unreadable)."""
    raw = read_proc_file(pid, "stat", proc_root)
    if raw is None:
        return None
    try:
        return parse_stat(raw.decode("utf-8", "replace"))
    except (ValueError, IndexError):
        return None


def read_cmdline(pid: int, proc_root: str = PROC) -> str:
    """argv joined by spaces; "" for kernel threads, zombies and processes gone meanwhile."""
    raw = read_proc_file(pid, "cmdline", proc_root) or b""
    # setproctitle pads the rewritten argv area with NULs or spaces: strip them.
    return raw.decode("utf-8", "replace").replace("\0", " ").strip()


def parse_status(text: str) -> StatusFields:
    uid: Optional[int] = None
    nspid: Tuple[int, ...] = ()
    ignored = 0
    for line in text.splitlines():
        key, _sep, value = line.partition(":")
        try:
            if key == "Uid":
                uid = int(value.split()[0])
            elif key == "NSpid":
                nspid = tuple(int(x) for x in value.split())
            elif key == "SigIgn":
                ignored = int(value.strip(), 16)
        except (IndexError, ValueError):
            continue
    return StatusFields(uid=uid, nspid=nspid, ignored_signals=ignored)


def read_status(pid: int, proc_root: str = PROC) -> Optional[StatusFields]:
    """parse_status of /proc/<pid>/status, or None where unreadable (gone)."""
    raw = read_proc_file(pid, "status", proc_root)
    return parse_status(raw.decode("utf-8", "replace")) if raw is not None else None


def read_environ(pid: int, proc_root: str = PROC) -> List[bytes]:
    """The process's initial environment as NAME=VALUE entries; [] where unreadable (another
    user's process without privileges, a kernel thread, gone)."""
    raw = read_proc_file(pid, "environ", proc_root)
    return [entry for entry in raw.split(b"\0") if entry] if raw else []


def read_process(pid: int, proc_root: str = PROC, stat_only: bool = False
                 ) -> Optional[ProcInfo]:
    """One process, or None if it has gone (or is unreadable) meanwhile. stat_only reads one
    file instead of three, for callers that need only ids, state and start time (a stop rereads
    the whole table every poll)."""
    stat = read_stat(pid, proc_root)
    if stat is None:
        return None
    cmdline = ""
    status = StatusFields()
    if not stat_only:
        cmdline = read_cmdline(pid, proc_root)
        status = read_status(pid, proc_root) or status
    return ProcInfo(
        pid=pid, ppid=stat.ppid, pgid=stat.pgid, sid=stat.sid, state=stat.state, comm=stat.comm,
        start_time=stat.start_time, cmdline=cmdline, uid=status.uid, nspid=status.nspid,
        # by flag only: inside a container pid 2 is an ordinary process
        kernel_thread=bool(stat.flags & PF_KTHREAD),
    )


def list_pids(proc_root: str = PROC) -> List[int]:
    try:
        names = os.listdir(proc_root)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def pids_with_open_file(matches: Callable[[str], bool], proc_root: str = PROC) -> List[int]:
    """The processes with an open file descriptor for which `matches(<proc_root>/<pid>/fd/<n>)`
    is true (the caller reads the link or stats it); a process or descriptor that goes away while
    it is read, or that this user may not read, is skipped. One place for the /proc fd walk: the
    port holders (server/ports.py) and the openers of a lock (apt/ready.py) both ask it."""
    found = []
    for pid in list_pids(proc_root):
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                if matches(os.path.join(fd_dir, fd)):
                    found.append(pid)
                    break
            except OSError:
                continue
    return found


def scan_processes(proc_root: str = PROC, stat_only: bool = False) -> Dict[int, ProcInfo]:
    """The whole process table (thread-group leaders), keyed by pid."""
    table: Dict[int, ProcInfo] = {}
    for pid in list_pids(proc_root):
        info = read_process(pid, proc_root, stat_only)
        if info is not None:
            table[pid] = info
    return table


def still_running(pid: int, start_time: Optional[int], proc_root: str = PROC) -> bool:
    """True while the very process (pid + start time: a reused pid is another process) exists
    and is not a zombie. A zombie has released its memory and device files. start_time None:
    whichever process has this pid now."""
    stat = read_stat(pid, proc_root)
    if stat is None:
        return False
    return stat.state not in GONE_STATES and start_time in (None, stat.start_time)
