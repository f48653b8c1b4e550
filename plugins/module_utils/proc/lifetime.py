"""A process's lifetime: is it still the same process, signal it only while it is, wait for it.

A pid is reused once its process is reaped, so a pid noted a while ago may name another process
now. A PinnedProcess holds the identity read when it was selected (pid + start time) and a pidfd
where the kernel has them (Linux 5.3+, Python 3.9+): a signal through the pidfd can only reach
that very process. Elsewhere the start time is re-checked right before each signal, which leaves
a window of microseconds instead of the whole selection-to-signal interval.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Iterable, Optional, Set

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (
    GONE_STATES, PROC, ProcInfo, read_stat, read_status, still_running,
)


def is_alive(pid: Optional[int], start_time: Optional[int] = None, proc_root: str = PROC) -> bool:
    """True while the process exists, is not a zombie, and (if given) is the same process.

    This is servelab's one rule for "is that process gone" (the server manager, the reaper, the
    locks and the tests all ask it): gone means no /proc entry, or a zombie. Where PID 1 does not
    reap orphans (a container whose init is `sleep infinity`, `docker run` without --init), an
    exited process that we are not the parent of stays a zombie, and its /proc entry never goes."""
    return bool(pid) and still_running(pid, start_time, proc_root)


def running_start_time(pid: int, proc_root: str = PROC) -> Optional[int]:
    """The start time (stat field 22) of the process `pid` while it runs; None once it is gone
    (by is_alive's rule: an unreaped zombie is gone). With is_alive(pid, start) later, it tells
    whether that very process still runs."""
    stat = read_stat(pid, proc_root)
    if stat is None or stat.state in GONE_STATES:
        return None
    return stat.start_time


def collect_exited_children(pids: Iterable[int]) -> None:
    """Reap those of `pids` that are exited children of this process, so they do not linger as
    zombies (a zombie keeps its cgroup from being removed). Only named pids: waitpid(-1) would
    steal other Popen objects' exit codes."""
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
        collect_exited_children(remaining)
        remaining = {pid for pid in remaining if is_alive(pid)}
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return remaining


class PinnedProcess:
    """One process, by identity. `alive()` and `send()` never act on a recycled pid."""

    def __init__(self, info: ProcInfo, proc_root: str = PROC) -> None:
        self.info = info
        self.proc_root = proc_root
        self._pidfd: Optional[int] = None
        self._done = False
        open_pidfd = getattr(os, "pidfd_open", None)
        if open_pidfd is not None:
            try:
                self._pidfd = open_pidfd(info.pid)
            except OSError:
                self._pidfd = None
        # The pidfd names whatever has this pid now: make sure it is still the selected one.
        if not still_running(info.pid, info.start_time, proc_root):
            self._done = True
            self.close()

    @property
    def pid(self) -> int:
        return self.info.pid

    def alive(self) -> bool:
        """Still the selected process, and not a zombie. Once gone, it stays gone."""
        if not self._done and not still_running(self.info.pid, self.info.start_time,
                                                self.proc_root):
            self._done = True
        return not self._done

    def ignores(self, signum: int) -> bool:
        """The process has set `signum` to SIG_IGN: sending it cannot end the process."""
        status = read_status(self.info.pid, self.proc_root)
        return status is not None and status.ignores(signum)

    def send(self, signum: int) -> bool:
        """Signal the process if it is still the same one. True if the signal was delivered;
        False if it had gone (or a recycled pid stood in its place) or we may not signal it."""
        if not self.alive():
            return False
        try:
            if self._pidfd is not None and hasattr(signal, "pidfd_send_signal"):
                signal.pidfd_send_signal(self._pidfd, signum)
            else:
                os.kill(self.info.pid, signum)
            return True
        except ProcessLookupError:
            self._done = True
        except PermissionError:
            pass
        return False

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
