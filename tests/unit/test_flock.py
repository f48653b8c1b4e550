"""module_utils/flock.py: the one bounded wait for an exclusive flock (results lock, run locks,
the per-server lock)."""
from __future__ import annotations

import fcntl
import os
import time

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.flock import held, held_file, wait_exclusive


def test_a_held_lock_times_out_then_is_taken_once_released(tmp_path):
    path = str(tmp_path / "lock")
    holder = os.open(path, os.O_RDWR | os.O_CREAT)
    waiter = os.open(path, os.O_RDWR)       # a second open file description: flock conflicts
    try:
        assert wait_exclusive(holder, timeout=1.0)
        started = time.monotonic()
        assert not wait_exclusive(waiter, timeout=0.2, poll=0.01)
        assert 0.2 <= time.monotonic() - started < 2.0
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert wait_exclusive(waiter, timeout=1.0, poll=0.01)
    finally:
        os.close(holder)
        os.close(waiter)


def test_held_raises_the_callers_error_on_time_out_and_closes_the_file(tmp_path):
    """held_file is the one open-wait-close of the results lock, the run locks' guard and the
    per-server lock: a time-out raises the caller's own error, and the descriptor never leaks."""
    path = str(tmp_path / "lock")
    with held_file(path, timeout=1.0, poll=0.01, timed_out=lambda: AssertionError("unreached")):
        with pytest.raises(TimeoutError, match="held by the test"):
            with held_file(path, timeout=0.1, poll=0.01,
                           timed_out=lambda: TimeoutError("held by the test")):
                pass
    fd = os.open(path, os.O_RDWR)
    try:
        assert wait_exclusive(fd, timeout=0.5, poll=0.01)   # nothing holds it any more
    finally:
        os.close(fd)
    fd = os.open(path, os.O_RDWR)
    with held(fd, timeout=1.0, poll=0.01, timed_out=lambda: AssertionError("unreached")):
        pass
    with pytest.raises(OSError):
        os.fstat(fd)                                          # closed by held


def test_the_per_server_lock_waits_through_the_one_loop(tmp_path):
    from ansible_collections.servelab.serving.plugins.module_utils.server import state

    with state.locked(str(tmp_path), "srv"):
        with pytest.raises(TimeoutError, match="another task holds .*srv/.lock for more than 0 s"):
            with state.locked(str(tmp_path), "srv", timeout=0.1):
                pass
    with state.locked(str(tmp_path), "srv", timeout=0.1):
        pass
