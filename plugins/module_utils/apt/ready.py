"""Whether apt, dpkg and pip may be used now: no live holder of their locks (or of a venv), and
no interrupted dpkg. What a killed run leaves behind.

When the controller dies mid-run (SIGKILL, a lost connection), the apt-get, dpkg or pip it started
in the container are the container's processes: they go on to their end and hold the locks while
they do. A container that crashed instead leaves dpkg interrupted: a package half-configured
(`iF`), dpkg's journal in /var/lib/dpkg/updates, and every apt-get after it failing with "dpkg
was interrupted, you must manually run 'dpkg --configure -a'". So, before any change:

- the holders of the apt/dpkg locks: the process that holds the fcntl lock (F_GETLK answers with
  its PID; a lock dies with its holder, so a holder found this way is alive), with its command line;
- pip (or `python -m venv`, ensurepip) working on one of the given venvs: a process whose command
  line executes pip and names a path under one of them (pip takes no lock);
- waited for until `timeout`, then named;
- `dpkg --audit` and dpkg's journal: an interrupted dpkg is repaired with `dpkg --configure -a`
  (once nobody holds the locks) when allowed, else named with the command to run.

Standard library only (AnsiballZ ships it to bare containers); the module is
plugins/modules/package_ready.py, the tests tests/unit/test_package_ready.py.
"""
from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import struct
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.proc.executes import executed_argv
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (PROC, ProcInfo,
                                                                                  pids_with_open_file,
                                                                                  read_cmdline, scan_processes)
from ansible_collections.servelab.serving.plugins.module_utils.proc.tree import caller_lineage

# apt's and dpkg's locks, in the order they take them (apt-get: lock-frontend, then lock, archives,
# lists; dpkg run by apt takes lock itself, apt keeping lock-frontend).
LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/cache/apt/archives/lock",
         "/var/lib/apt/lists/lock")
DPKG_ADMINDIR = "/var/lib/dpkg"
REPAIR = ("dpkg", "--configure", "-a")
# struct flock on 64-bit Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid.
_FLOCK = "@hhqqi"
_FLOCK_SIZE = 32
# pip and what builds a venv: `<venv>/bin/pip install`, `python -m pip`, `python -m venv <dir>`, ensurepip.
CMDLINE_SHOWN = 400              # characters of a holder's command line in the message
_PIP_PROGRAM = re.compile(r"^pip[0-9.]*$")
_PIP_MODULES = ("pip", "venv", "ensurepip")
_PYTHON = re.compile(r"^(python|pypy)(\d+(\.\d+)*)?[dmu]*$")


@dataclasses.dataclass(frozen=True)
class Holder:
    """A live process that apt, dpkg or pip would collide with."""
    pid: int
    cmdline: str
    holds: str                    # the lock file, or "pip on <venv>"

    def label(self) -> str:
        return "PID %d (%s) holds %s" % (self.pid, self.cmdline[:CMDLINE_SHOWN] or "?", self.holds)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def lock_owner(path: str) -> Optional[int]:
    """The PID holding a lock on `path` (fcntl F_GETLK), -1 for a lock without a PID (an open file
    description lock, or a holder outside this PID namespace), None when nobody holds one (or the
    file is not there)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0).ljust(_FLOCK_SIZE, b"\0")
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, query)
    except OSError:
        return None
    finally:
        os.close(fd)
    l_type, _whence, _start, _len, l_pid = struct.unpack(_FLOCK, answer[:struct.calcsize(_FLOCK)])
    if l_type == fcntl.F_UNLCK:
        return None
    return l_pid if l_pid > 0 else -1


def _openers(path: str, proc_root: str = PROC) -> List[int]:
    """Processes with `path` open (for a lock F_GETLK cannot put a PID to)."""
    try:
        target = os.stat(path)
    except OSError:
        return []

    def is_target(fd_path: str) -> bool:
        st = os.stat(fd_path)
        return (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino)

    return pids_with_open_file(is_target, proc_root)


def lock_holders(paths: Sequence[str] = LOCKS, proc_root: str = PROC,
                 owner: Callable[[str], Optional[int]] = lock_owner) -> List[Holder]:
    holders = []
    for path in paths:
        pid = owner(path)
        if pid is None:
            continue
        pids = [pid] if pid > 0 else _openers(path, proc_root)
        if not pids:
            holders.append(Holder(-1, "a process this container cannot see", path))
        for one in pids:
            holders.append(Holder(one, read_cmdline(one, proc_root), path))
    return holders


def _under(word: str, roots: Sequence[str]) -> Optional[str]:
    for root in roots:
        if word == root or word.startswith(root + "/"):
            return root
    return None


def runs_pip(cmdline: str) -> bool:
    """Whether a command line executes pip, `-m venv` or ensurepip (not merely names them): pip as
    the program, or as a Python interpreter's script or `-m` module."""
    view = executed_argv(cmdline)
    if not view:
        return False
    if _PIP_PROGRAM.match(os.path.basename(view[0])):
        return True
    if not _PYTHON.match(os.path.basename(view[0])):
        return False
    for i, word in enumerate(view[1:], start=1):
        if word == "-m":
            return i + 1 < len(view) and view[i + 1] in _PIP_MODULES
        if not word.startswith("-"):
            return bool(_PIP_PROGRAM.match(os.path.basename(word)))
    return False


def pip_holders(venvs: Iterable[str], table: Dict[int, ProcInfo], exclude: Set[int]) -> List[Holder]:
    """pip working on one of `venvs` (a directory, or a link to one): its command line runs pip
    and names a path under the venv (or under the directory the link ends in)."""
    roots: List[str] = []
    for venv in venvs:
        venv = (venv or "").rstrip("/")
        if venv:
            roots += [venv, os.path.realpath(venv)]
    roots = list(dict.fromkeys(roots))
    holders = []
    for pid, info in sorted(table.items()):
        if pid in exclude or info.gone or info.kernel_thread or not info.cmdline:
            continue
        if not runs_pip(info.cmdline):
            continue
        for word in info.cmdline.split():
            root = _under(word, roots)
            if root:
                holders.append(Holder(pid, info.cmdline, "pip on %s" % root))
                break
    return holders


def journal_pending(admindir: str = DPKG_ADMINDIR) -> List[str]:
    """dpkg's journal entries not yet folded into its status: apt's "dpkg was interrupted" test
    (apt-pkg/deb/debsystem.cc: any file of digits in <admindir>/updates)."""
    try:
        names = os.listdir(os.path.join(admindir, "updates"))
    except OSError:
        return []
    return sorted(name for name in names if name.isdigit())


@dataclasses.dataclass
class Readiness:
    holders: List[Holder]         # still there at the end of the wait
    waited: float                 # seconds waited for holders to end
    waited_for: List[Holder]      # the holders that were there at the start (ended or not)
    audit: str = ""               # `dpkg --audit` (empty: nothing half done)
    journal: List[str] = dataclasses.field(default_factory=list)
    repaired: bool = False
    repair_rc: Optional[int] = None
    repair_output: str = ""
    audit_after: str = ""

    @property
    def interrupted(self) -> bool:
        return bool(self.audit.strip() or self.journal)

    @property
    def broken(self) -> bool:
        """dpkg still needs a hand: interrupted and not (or not successfully) repaired."""
        if not self.interrupted:
            return False
        return not self.repaired or bool(self.audit_after.strip())

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["holders"] = [h.as_dict() for h in self.holders]
        data["waited_for"] = [h.as_dict() for h in self.waited_for]
        data["waited"] = round(self.waited, 1)
        data["interrupted"] = self.interrupted
        data["broken"] = self.broken
        return data


RunCommand = Callable[[Sequence[str]], Tuple[int, str, str]]


@dataclasses.dataclass
class Checker:
    """One readiness check. Everything that touches the host is a field, replaceable in tests."""
    run: RunCommand
    locks: Sequence[str] = LOCKS
    venvs: Sequence[str] = ()
    check_dpkg: bool = True
    proc_root: str = PROC
    admindir: str = DPKG_ADMINDIR
    owner: Callable[[str], Optional[int]] = lock_owner
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    poll: float = 1.0

    def holders(self) -> List[Holder]:
        found = lock_holders(self.locks, self.proc_root, self.owner)
        if self.venvs:
            exclude = caller_lineage(self.proc_root)
            found += pip_holders(self.venvs, scan_processes(self.proc_root), exclude)
        return found

    def wait(self, timeout: float) -> Tuple[List[Holder], float, List[Holder]]:
        start = self.clock()
        first = self.holders()
        now, seen = first, {(h.pid, h.holds): h for h in first}
        while now and self.clock() - start < timeout:
            self.sleep(min(self.poll, max(0.0, timeout - (self.clock() - start))))
            now = self.holders()
            for holder in now:
                seen.setdefault((holder.pid, holder.holds), holder)
        return now, self.clock() - start, list(seen.values())

    def audit(self) -> str:
        rc, out, err = self.run(["dpkg", "--audit"])
        text = (out or "").strip()
        if rc != 0 and not text:
            text = (err or "").strip()
        return text

    def check(self, timeout: float, repair: bool, check_mode: bool = False) -> Readiness:
        holders, waited, waited_for = self.wait(timeout)
        result = Readiness(holders=holders, waited=waited, waited_for=waited_for)
        if not self.check_dpkg:
            return result
        result.journal = journal_pending(self.admindir)
        result.audit = self.audit()
        if result.interrupted and repair and not holders and not check_mode:
            rc, out, err = self.run(list(REPAIR))
            result.repaired = True
            result.repair_rc = rc
            result.repair_output = ((out or "") + (err or "")).strip()[-2000:]
            result.audit_after = self.audit() if rc == 0 else (result.audit or "dpkg --configure -a failed")
            if rc == 0 and not result.audit_after.strip():
                result.journal = journal_pending(self.admindir)
        return result


def labels(holders: Sequence[Holder]) -> List[str]:
    """One phrase per process: 'PID 3562 (apt-get ...) holds /var/lib/dpkg/lock-frontend, /var/cache/...'."""
    by_pid: Dict[int, List[Holder]] = {}
    for holder in holders:
        by_pid.setdefault(holder.pid, []).append(holder)
    return ["PID %d (%s) holds %s" % (pid, held[0].cmdline[:CMDLINE_SHOWN] or "?", ", ".join(h.holds for h in held))
            for pid, held in by_pid.items()]


def summary(result: Readiness, host: str = "the host") -> str:
    """What is in the way, one sentence each; '' when nothing is."""
    parts = []
    if result.holders:
        parts.append("apt, dpkg or pip is busy on %s after %d s of waiting: %s" % (
            host, int(result.waited), "; ".join(labels(result.holders))))
    if result.broken:
        what = result.audit.strip() or "dpkg's journal has %d pending entries" % len(result.journal)
        if result.repaired:
            parts.append("dpkg on %s was interrupted and `dpkg --configure -a` did not repair it (rc %s): %s" % (
                host, result.repair_rc, (result.audit_after or result.repair_output)[-800:]))
        elif not result.holders:
            parts.append("dpkg on %s was interrupted (a run or a host that died mid-install): %s" % (host, what[-800:]))
    return " ".join(parts)
