"""A function called every few seconds from a thread while a block of an action plugin runs.

The action plugins wait on their module in the worker's main thread; what must happen meanwhile
(watching for a dead ansible-playbook, printing a level's figures so far) runs here, in a daemon
thread that the block's end stops and joins (briefly: a tick never holds the block up).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

JOIN_S = 1.0


@contextlib.contextmanager
def ticking(interval_s: float, tick: Callable[[], bool], name: str) -> Iterator[None]:
    """Call `tick()` every `interval_s` seconds while the block runs; a tick that returns False
    ends the calls (the block goes on)."""
    done = threading.Event()

    def run() -> None:
        while not done.wait(interval_s):
            if not tick():
                return

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(JOIN_S)
