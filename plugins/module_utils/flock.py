"""Exclusive flock with a deadline: the one wait loop the run's locks and the results lock use.

Non-blocking attempts with a short sleep between them, so a holder that never lets go costs the
caller `timeout` seconds and a clear error, never a hang.
"""
from __future__ import annotations

import errno
import fcntl
import time


def wait_exclusive(fd: int, timeout: float, poll: float = 0.05) -> bool:
    """Take an exclusive flock on `fd` within `timeout` seconds: True, or False on time-out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
