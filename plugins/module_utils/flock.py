"""Exclusive flock with a deadline: the one wait loop every servelab lock uses (the run locks'
guard, the results lock, the per-server lock).

Non-blocking attempts with a short sleep between them, so a holder that never lets go costs the
caller `timeout` seconds and a clear error, never a hang.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from typing import Callable, Iterator


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


@contextlib.contextmanager
def held(fd: int, timeout: float, poll: float,
         timed_out: Callable[[], Exception]) -> Iterator[None]:
    """Hold an exclusive flock on `fd` for the block, then close `fd` (which lets go of the lock:
    the descriptor is not inherited, os.open's default). On time-out `timed_out()` is raised, its
    message naming the file and what to do; `fd` is closed either way."""
    try:
        if not wait_exclusive(fd, timeout, poll):
            raise timed_out()
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def held_file(path: str, timeout: float, poll: float,
              timed_out: Callable[[], Exception]) -> Iterator[None]:
    """held() on `path`, created 0644 when missing (its directory must exist)."""
    with held(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), timeout, poll, timed_out):
        yield
