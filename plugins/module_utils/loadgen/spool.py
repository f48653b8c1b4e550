"""Where a level's request records go as they finish: to disk, not to memory. Stdlib only.

A record (metrics.RequestTiming) holds the arrival time of every chunk of its answer: ~25 kB for
512 tokens. Held until the level ended, they made the load generator's RSS grow with the level's
length (+55 MB/min at C=250, benchmarks/results/soak-2026-12-03.md). Now:

1. A client process hands each finished record to its RecordSpool, which appends it to the
   process's spool file at the next tick (flush(): outside the socket callback that finished
   it, where the next request of a closed-loop worker is sent), in the order they finished.
2. When the level is over, the process reads its spool back once, in that order (the order its
   in-memory list had), reduces it to its LevelPart (metrics.reduce_requests, whose latency
   samples go to files beside the spool: loadgen/samples.py) and writes each request's row to
   its rows file, as the part file will have it (RowsWriter; the spool is deleted then). It
   hands the controller a RowsIndex: the file, and each row's send time and place in it (16
   bytes per request).
3. The controller's RequestRows merges the processes' rows files by send time (as the sort of
   the rows in memory did: stable, process 0 first) and is what run_level returns as the level's
   requests: `lines()` streams them into the part file (results/parts.write_level_files),
   iterating gives the row dicts.

Nothing here decides whether a level finished: the part file is still written only after
run_level returned, by the caller, and the spool lives in a temporary directory of its own
(never in the parts directory), removed when the RequestRows is closed or collected.
"""
from __future__ import annotations

import heapq
import json
import marshal
import os
import shutil
import tempfile
import weakref
from array import array
from collections.abc import Sequence as SequenceBase
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import RequestTiming

SPOOL_PREFIX = "servelab-level-"


def spool_directory() -> str:
    """A fresh private directory for one level's spool and rows files."""
    return tempfile.mkdtemp(prefix="%s%d-" % (SPOOL_PREFIX, os.getpid()))


def _chunks(values: Optional[Sequence[int]]) -> Optional[bytes]:
    return None if values is None else array("q", values).tobytes()


def _unchunks(raw: Optional[bytes]) -> Optional[List[int]]:
    if raw is None:
        return None
    values = array("q")
    values.frombytes(raw)
    return values.tolist()


class RecordSpool:
    """One client process's finished records, appended to `path` in the order they finished."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fh = open(path, "wb", buffering=1 << 16)
        self.pending: List[RequestTiming] = []
        self.count = 0

    def add(self, req: RequestTiming) -> None:
        self.pending.append(req)

    def flush(self) -> None:
        """Write the records handed over since the last flush (called every client tick)."""
        if not self.pending:
            return
        dump, fh = marshal.dump, self._fh
        for r in self.pending:
            # `in_window` is not kept: the reader settles it against the final window.
            dump((r.worker, r.request_id, r.t_send, r.t_first, r.t_last, r.prompt_tokens,
                  r.completion_tokens, r.tokens_source, r.chunks, r.error, r.t_sched,
                  r.server_id, _chunks(r.chunk_times), _chunks(r.chunk_tokens)), fh)
        self.count += len(self.pending)
        self.pending.clear()

    def close(self) -> None:
        if not self._fh.closed:
            self.flush()
            self._fh.close()

    def records(self, ws: int, we: int) -> Iterator[RequestTiming]:
        """The records in the order they finished, each with its window membership settled by
        timestamp against the final window (ws <= t_send < we, or t_send >= ws while the window
        never closed), as the client's last reconcile settled the records it held."""
        self.close()
        with open(self.path, "rb") as fh:
            for _record in range(self.count):
                (worker, request_id, t_send, t_first, t_last, prompt_tokens, completion_tokens,
                 tokens_source, chunks, error, t_sched, server_id, times,
                 tokens) = marshal.load(fh)
                yield RequestTiming(
                    worker=worker, request_id=request_id, t_send=t_send, t_first=t_first,
                    t_last=t_last, prompt_tokens=prompt_tokens,
                    completion_tokens=completion_tokens, tokens_source=tokens_source,
                    chunks=chunks, error=error,
                    in_window=bool(ws) and t_send >= ws and (not we or t_send < we),
                    t_sched=t_sched, server_id=server_id, chunk_times=_unchunks(times),
                    chunk_tokens=_unchunks(tokens))

    def remove(self) -> None:
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@dataclass
class RowsIndex:
    """A client process's rows file: row i (in the order written) was sent at t_sends[i] and
    is the bytes offsets[i]:offsets[i + 1] of the file."""
    path: str
    t_sends: array
    offsets: array

    def __len__(self) -> int:
        return len(self.t_sends)


class RowsWriter:
    """Writes request rows as the part file's lines (results/parts: sorted keys, one a line)."""

    def __init__(self, path: str, extra: Dict[str, object]) -> None:
        self.path = path
        self.extra = extra
        self._fh = open(path, "w", encoding="utf-8", buffering=1 << 16)
        self._offset = 0
        self.index = RowsIndex(path, array("q"), array("q", [0]))

    def add(self, row: Dict[str, object]) -> None:
        row.update(self.extra)
        line = json.dumps(row, sort_keys=True, default=str) + "\n"
        self._fh.write(line)
        self._offset += len(line.encode("utf-8"))
        self.index.t_sends.append(row["t_send"])
        self.index.offsets.append(self._offset)

    def close(self) -> RowsIndex:
        self._fh.close()
        return self.index


def _by_send_time(p: int, t_sends: array) -> List[tuple]:
    return [(t_sends[i], p, i) for i in sorted(range(len(t_sends)), key=t_sends.__getitem__)]


class RequestRows(SequenceBase):
    """A level's request rows, merged from the client processes' rows files by send time.

    `lines()` streams them as the part file's lines; iterating yields the row dicts (as read
    back from those lines); indexing reads them all into memory once (for tests and small
    levels). The files' directory is removed by close(), or when this object is collected."""

    def __init__(self, files: List[RowsIndex], directory: Optional[str] = None) -> None:
        self._files = files
        self._cache: Optional[List[dict]] = None
        self._finalizer = (weakref.finalize(self, shutil.rmtree, directory, True)
                           if directory else None)

    def __len__(self) -> int:
        return sum(len(f) for f in self._files)

    def _order(self) -> Iterator[tuple]:
        # Each file sorted by send time (ties in the order written), then merged (ties: the
        # lower process first): the order a stable sort of the concatenated rows gives.
        return heapq.merge(*(_by_send_time(p, f.t_sends) for p, f in enumerate(self._files)))

    def lines(self) -> Iterator[str]:
        fds: Dict[int, int] = {}
        try:
            for _t, p, i in self._order():
                if p not in fds:
                    fds[p] = os.open(self._files[p].path, os.O_RDONLY)
                offsets = self._files[p].offsets
                start = offsets[i]
                yield os.pread(fds[p], offsets[i + 1] - start, start).decode("utf-8")
        finally:
            for fd in fds.values():
                os.close(fd)

    def __iter__(self) -> Iterator[dict]:
        if self._cache is not None:
            return iter(self._cache)
        return (json.loads(line) for line in self.lines())

    def __getitem__(self, index):
        if self._cache is None:
            self._cache = list(self)
        return self._cache[index]

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
