"""What the server records: the truth log (one JSON line per finished request) and the
counters behind /metrics and /server_info. Standard library only."""
from __future__ import annotations

import os
from collections import deque
from typing import Any, List, Mapping, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.simulator.requests import _dumps


class TruthLog:
    """Buffered JSON lines; flushed by the server at least every second and at shutdown."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self._buf: List[str] = []
        self._fh = None
        if path:
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8")

    def add(self, record: Mapping[str, Any]) -> None:
        if self._fh is not None:
            self._buf.append(_dumps(record))

    def flush(self) -> None:
        if self._fh is not None and self._buf:
            self._fh.write("\n".join(self._buf) + "\n")
            self._buf.clear()
            self._fh.flush()

    def close(self) -> None:
        self.flush()
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class Stats:
    """Counters and gauges for /metrics and /server_info."""

    def __init__(self):
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_requests_total = 0          # finished generation requests
        self.requests_received_total = 0
        self.requests_failed_total = 0
        self.decode_steps_total = 0
        self.spec_switches_total = 0         # steps whose speculation differed from the last's
        self.spec_verify_total = 0           # request-steps that verified drafts
        self.spec_tokens_total = 0           # tokens those request-steps yielded
        self._buckets: deque = deque()       # [bucket(0.1 s), tokens, verifies, spec_tokens]
        self.last_gen_throughput = 0.0
        self.last_accept_length = 0.0

    def tokens(self, now: float, n: int, verifies: int = 0, spec_tokens: int = 0) -> None:
        self.generation_tokens_total += n
        self.spec_verify_total += verifies
        self.spec_tokens_total += spec_tokens
        b = int(now * 10)
        if self._buckets and self._buckets[-1][0] == b:
            last = self._buckets[-1]
            last[1] += n
            last[2] += verifies
            last[3] += spec_tokens
        else:
            self._buckets.append([b, n, verifies, spec_tokens])
            while self._buckets and self._buckets[0][0] < b - 100:
                self._buckets.popleft()

    def window(self, now: float, seconds: float = 5.0) -> Tuple[float, float]:
        """(tokens/s over the last `seconds`, mean accepted length over them)."""
        lo = int((now - seconds) * 10)
        toks = sum(x[1] for x in self._buckets if x[0] >= lo)
        ver = sum(x[2] for x in self._buckets if x[0] >= lo)
        stoks = sum(x[3] for x in self._buckets if x[0] >= lo)
        if toks:
            self.last_gen_throughput = toks / seconds
        if ver:
            self.last_accept_length = stoks / ver
        return self.last_gen_throughput, self.last_accept_length
