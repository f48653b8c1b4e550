"""A level's figures so far, written for whoever watches it (llm_bench's action plugin). Stdlib only.

The level's controller (loadgen/level.py, the parent process: it sends no request) calls
`LiveFile.tick` on every poll; about once a `interval` it rewrites a small JSON file, atomically
(a temporary file renamed over it), with what the shared counters say: seconds since the level
started, its phase, the requests finished and failed, and the output tokens of the finished
requests. The client processes only keep one counter more up to date (C_TOKENS, once per tick:
loadgen/client.py), so nothing here runs per token or per request. A write that fails (a full
disk, a directory removed) turns the file off for the rest of the level: figures for a watcher
never stop a measurement.

The action plugin reads the file on the controller while the module runs (plugin_utils/
progress.py's `live_line` renders it): so only where the bench client is the controller (a local
connection); elsewhere the module is given no file and writes nothing.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Optional

NS_PER_S = 1_000_000_000
INTERVAL_S = 1.0
PHASE_WARMUP, PHASE_WINDOW, PHASE_TAIL = "warmup", "window", "tail"


@dataclass(frozen=True)
class LiveRecord:
    """One snapshot of a level in progress (the file's JSON object)."""
    concurrency: int
    elapsed_s: float            # since the level started (its clients' start)
    phase: str                  # warmup, window or tail
    window_s: float             # how long the window has been open (0 before it opens)
    level_seconds: float        # the window's planned length
    requests: int               # finished so far (succeeded or failed; cancelled tail ones too)
    errors: int
    tokens: int                 # output tokens of the finished requests
    request_rate: Optional[float] = None   # open loop: the level's arrival rate
    repeat: int = 1

    @property
    def tok_s(self) -> Optional[float]:
        """Output tokens per second since the level started (warm-up included)."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else None

    @classmethod
    def from_dict(cls, data: dict) -> LiveRecord:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})


class LiveFile:
    """Rewrites `path` about every `interval` seconds while a level runs."""

    def __init__(self, path: Optional[str], interval: float = INTERVAL_S):
        self.path = path
        self.interval_ns = int(interval * NS_PER_S)
        self.next_ns = 0

    def tick(self, now_ns: int, make_record) -> None:
        """`make_record()` (a LiveRecord) is called only when a write is due."""
        if self.path is None or now_ns < self.next_ns:
            return
        self.next_ns = now_ns + self.interval_ns
        self.write(make_record())

    def write(self, record: LiveRecord) -> None:
        if self.path is None:
            return
        tmp = "%s.%d.tmp" % (self.path, os.getpid())
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(asdict(record), fh)
            os.replace(tmp, self.path)
        except OSError:
            self.path = None
            try:
                os.unlink(tmp)
            except OSError:
                pass


def read_live(path: str) -> Optional[LiveRecord]:
    """The file's last snapshot; None when there is none yet (or it is not one)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return LiveRecord.from_dict(data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError):
        return None
