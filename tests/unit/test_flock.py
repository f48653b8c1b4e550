"""module_utils/flock.py: the one bounded wait for an exclusive flock (results lock, run locks)."""
from __future__ import annotations

import fcntl
import os
import time

from ansible_collections.servelab.serving.plugins.module_utils.flock import wait_exclusive


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
