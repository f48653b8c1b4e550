"""A load level's client processes: each runs its own event loop and its share of the workers
(closed loop) or of the arrivals (open loop, loadgen/openloop.py). Stdlib only.

Load modes
- concurrency (closed loop, default): C workers, each on its own keep-alive connection, each
  sending its next request the moment its last one finished (inside the same socket callback).
  Worker starts are spread over `ramp_seconds` (workers that start together stay in lockstep).
- rate (open loop): arrivals at `request_rate` per second, Poisson or constant, each sent on a
  free connection; at most `concurrency` in flight, later arrivals wait (their queue time is kept).
  Each client process's arrivals are sent by its own sender process (sender.py: it only sends, at
  real-time priority where allowed, and hands each socket to this process's loop, which reads
  the answer); TLS arrivals are sent from the loop itself.

A client process reads the window and the stop from the shared counters (loadgen/counters.py),
writes its own block of them, records its CPU time and its event-loop lag (probed every 10 ms,
judged by loadgen/honesty.py), streams its finished requests to its spool (loadgen/spool.py) and,
when the level is over, hands the controller (loadgen/level.py) its LevelPart (its latency
samples in files: loadgen/samples.py) and its rows file.
"""
from __future__ import annotations

import asyncio
import gc
import os
import random
import socket
import time
import traceback
from array import array
from typing import List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils import netstamp
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.counters import (
    C_COMPLETED, C_ERR_STREAK, C_ERRORS, C_OK, C_SLOTS, C_SYNCED_WE, C_TOKENS, C_WARM,
    C_WIN_DONE, C_WIN_SENT, G_SLOTS, G_STOP, G_WE, G_WS, STOP_TIMEOUT,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.generated import (
    ConversationOrder,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (
    Endpoint, RxStats, open_connection,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    CANCELLED_PREFIX, NS_PER_S, LevelPart, RequestTiming, percentile, reduce_requests, request_row,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.openloop import OpenLoop
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.sender import CLOSED, ArrivalSchedule, Outbox
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig, LoadgenError
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spool import (
    RecordSpool, RowsIndex, RowsWriter,
)

# Bytes read from one socket per loop iteration, shared out over the process's connections: small
# reads keep an iteration (the delay before any chunk is timestamped) short when every connection
# is busy (a firehose), large ones keep the syscall count low when few are.
READ_BUDGET = 128 * 1024
READ_MIN, READ_MAX = 4096, 65536

TICK_S = 0.010                   # client tick: lag sample, stop check, stall check
ERROR_BACKOFF_S = 0.1            # a worker whose request failed waits this long (no hot loop)


class _Worker:
    __slots__ = ("wid", "conn", "connecting", "done")

    def __init__(self, wid: int):
        self.wid = wid
        self.conn = None
        self.connecting = False
        self.done = 0           # requests finished (ok or not)


class _Client(OpenLoop):
    """One client process: its event loop, its workers (or its share of the arrivals)."""

    def __init__(self, cfg: LevelConfig, index: int, nproc: int, worker_ids: List[int],
                 wires: List[bytes], shm, spool: Optional[RecordSpool] = None,
                 arrivals: Optional[List[float]] = None,
                 conversations: Optional[List[List[int]]] = None):
        self.cfg = cfg
        self.index = index
        self.nproc = nproc
        self.worker_ids = worker_ids
        self.wires = wires
        self.shm = shm
        self.base = G_SLOTS + index * C_SLOTS
        self.endpoint = Endpoint(cfg.base_url, cfg.api, cfg.api_key)
        # Finished records go to the spool (spool.py), not to a list: memory stays bounded.
        self.spool = spool
        # What _reconcile needs of the finished requests while a boundary can still move
        # them: their send times and live window guesses (9 bytes each, dropped once the
        # process has settled against we).
        self.done_t_send = array("q")
        self.done_in_window = bytearray()
        self.track_done = True
        # Per-token ITL needs per-chunk counts on every successful request (reduce_requests).
        self.any_ok = False
        self.all_ok_counted = True
        self.done_tokens = 0
        self.warmup = max(1, int(cfg.warmup_requests if cfg.warmup_requests is not None else 1))
        conns = len(worker_ids) if cfg.load_mode == "concurrency" else self._cap()
        self.read_size = max(READ_MIN, min(READ_MAX, READ_BUDGET // max(1, conns)))
        self.inflight = set()
        self.stopping = False
        self.seq = 0
        rng = random.Random(cfg.seed * 7919 + index)
        self.order = list(range(len(wires)))
        rng.shuffle(self.order)
        self.rng = rng
        # A trace (workload.arrivals_s): this process's share of its prompts, in time order, so
        # the i-th arrival sends the trace's own prompt (openloop.py's TraceSchedule times it).
        self.arrivals = arrivals
        if arrivals:
            self.order = list(range(index, len(wires), nproc))
        # Closed-loop multi-turn (workload.conversations): each worker its conversations, turns
        # in order; one index lookup per request.
        self.turns = ({wid: ConversationOrder(conversations, wid, int(cfg.concurrency))
                       for wid in worker_ids} if conversations else None)
        self.lag_window = array("d")     # seconds; 8 bytes a tick, not a float object
        self.lag_max = 0.0
        self.ticks = 0
        self.synced = (0, 0)        # the (ws, we) that _reconcile last settled
        self.rx_stats = RxStats()
        self.cpu_start = self.cpu_ws = self.cpu_we = self.cpu_end = None
        self.loop = None
        # open loop
        self.idle: List = []
        self.conns = 0
        self.backlog: List[int] = []
        self.schedule: Optional[ArrivalSchedule] = None
        self.ctrl: Optional[socket.socket] = None   # the pair to the sender process
        self.outbox: Optional[Outbox] = None
        self.sender_pid = 0
        self.sender_priority: Optional[str] = None
        self.sender_error: Optional[str] = None

    # -- helpers ----------------------------------------------------------------------------

    def _bump(self, slot: int, by: int = 1):
        self.shm[self.base + slot] += by

    def _new_request(self, wid: int) -> RequestTiming:
        seq = self.seq
        self.seq += 1
        return RequestTiming(worker=wid, request_id=self.index + self.nproc * seq, t_send=0)

    def _next_wire(self, wid: int = -1) -> bytes:
        if self.turns is not None and wid >= 0:
            return self.wires[self.turns[wid].next_index()]
        i = self.order[self.seq % len(self.order)]
        return self.wires[i]

    def _classify(self, req: RequestTiming):
        """The live guess of window membership, from the boundaries this process sees now.
        The controller takes a boundary's time and then stores it, so a request sent between
        the two (another process, another core) is guessed against the old view; _reconcile
        settles it by timestamp once the boundary is visible."""
        shm = self.shm
        ws = shm[G_WS]
        if ws and req.t_send >= ws:
            we = shm[G_WE]
            if not we or req.t_send < we:
                req.in_window = True
                self._bump(C_WIN_SENT)

    def _reconcile(self, ws: int, we: int) -> None:
        """Window membership by timestamp against the boundaries as published (ws <= t_send <
        we), for every request this process sent so far, with the window counters corrected to
        match. Run when this process first sees ws and again when it first sees we; after that
        every send is classified exactly (its t_send is later than the store it saw)."""
        shm, b = self.shm, self.base
        t_sends, guesses = self.done_t_send, self.done_in_window
        for i, t_send in enumerate(t_sends):
            inside = bool(ws) and t_send >= ws and (not we or t_send < we)
            if inside == bool(guesses[i]):
                continue
            guesses[i] = inside
            step = 1 if inside else -1
            shm[b + C_WIN_SENT] += step
            shm[b + C_WIN_DONE] += step
        for req in [c.req for c in self.inflight if c.req is not None]:
            inside = bool(ws) and req.t_send >= ws and (not we or req.t_send < we)
            if inside != req.in_window:
                req.in_window = inside
                shm[b + C_WIN_SENT] += 1 if inside else -1
        if we:
            # Settled against both boundaries: every later send is classified exactly.
            self.track_done = False
            self.done_t_send, self.done_in_window = array("q"), bytearray()
        elif ws:
            # Sent before ws: outside whatever we will be; only the window guesses can move.
            keep = [i for i, guess in enumerate(guesses) if guess]
            self.done_t_send = array("q", [t_sends[i] for i in keep])
            self.done_in_window = bytearray(b"\x01" * len(keep))
        self.synced = (ws, we)
        shm[b + C_SYNCED_WE] = we

    def _record(self, req: RequestTiming, worker_warm: bool):
        """Count a finished request; `worker_warm`: its worker has now finished its warmup."""
        if self.spool is not None:
            self.spool.add(req)
        if self.track_done:
            self.done_t_send.append(req.t_send)
            self.done_in_window.append(1 if req.in_window else 0)
        if req.ok:
            self.any_ok = True
            if req.chunk_tokens is None:
                self.all_ok_counted = False
        shm = self.shm
        b = self.base
        shm[b + C_COMPLETED] += 1
        if worker_warm:
            shm[b + C_WARM] += 1
        toks = req.chunk_tokens
        self.done_tokens += sum(toks) if toks else len(req.chunk_times or ())
        if req.error is None:
            shm[b + C_OK] += 1
            shm[b + C_ERR_STREAK] = 0
        elif not req.error.startswith(CANCELLED_PREFIX):
            shm[b + C_ERRORS] += 1
            shm[b + C_ERR_STREAK] += 1
        if req.in_window:
            shm[b + C_WIN_DONE] += 1

    # -- closed loop ------------------------------------------------------------------------

    def _send_closed(self, w: _Worker):
        req = self._new_request(w.wid)
        wire = self._next_wire(w.wid)
        self.inflight.add(w.conn)
        w.conn.send(req, wire)            # takes t_send right before the write
        self._classify(req)

    def _on_done_closed(self, conn, req: RequestTiming):
        w = conn.owner_data
        self.inflight.discard(conn)
        w.done += 1
        self._record(req, w.done == self.warmup)
        if self.stopping:
            return
        if req.error is not None or not conn.reusable or conn.closed:
            if not conn.closed:
                conn.transport.close()
            w.conn = None
            delay = ERROR_BACKOFF_S if req.error is not None else 0.0
            self.loop.call_later(delay, self._reconnect, w)
            return
        self._send_closed(w)

    def _on_lost(self, conn):
        self.inflight.discard(conn)
        w = conn.owner_data
        if isinstance(w, _Worker) and w.conn is conn:
            w.conn = None
            if not self.stopping and not w.connecting:
                self.loop.call_soon(self._reconnect, w)
        elif w == "sender":
            self._tell_sender(CLOSED)
        elif w == "pool":
            if conn in self.idle:
                self.idle.remove(conn)
            self.conns -= 1
            if self.backlog and not self.stopping:
                # The backlog would otherwise wait for the next arrival to open a connection.
                self.conns += 1
                self.loop.create_task(self._connect_pool(self.backlog.pop(0)))

    def _reconnect(self, w: _Worker):
        if self.stopping or w.connecting or w.conn is not None:
            return
        w.connecting = True
        self.loop.create_task(self._connect_worker(w))

    async def _connect_worker(self, w: _Worker):
        try:
            conn = await open_connection(self.loop, self.endpoint, self.cfg.api,
                                         self._on_done_closed, self._on_lost,
                                         self.cfg.connect_timeout, self.cfg.socket_rcvbuf,
                                         self.cfg.rx_timestamps, self.rx_stats)
        except (OSError, asyncio.TimeoutError) as exc:
            w.connecting = False
            req = self._new_request(w.wid)
            req.t_send = time.monotonic_ns()
            req.error = "connect failed: %s" % (exc or type(exc).__name__)
            self._classify(req)
            w.done += 1
            self._record(req, w.done == self.warmup)
            if not self.stopping:
                self.loop.call_later(ERROR_BACKOFF_S, self._reconnect, w)
            return
        w.connecting = False
        conn.owner_data = w
        conn.read_size = self.read_size
        if self.stopping:
            conn.transport.close()
            return
        w.conn = conn
        self._send_closed(w)

    # -- tick, shutdown ---------------------------------------------------------------------

    def _probe_start(self):
        self.loop.call_soon(self._probe_end, self.loop.time())

    def _probe_end(self, started: float):
        """Event-loop lag, probed every tick: two chained call_soon callbacks. The first runs at
        the head of an iteration's ready queue and queues the second behind every socket read
        of the next iteration, so the gap is one full iteration: the longest a read that became
        ready just after the loop polled waits before its timestamp is taken. (A timer's own
        lateness is not used: epoll rounds timeouts up to 1 ms.)"""
        lag = self.loop.time() - started
        shm = self.shm
        if shm[G_WS] and not shm[G_WE]:
            self.lag_window.append(lag)
        if lag > self.lag_max:
            self.lag_max = lag

    def _tick(self):
        loop = self.loop
        loop.call_soon(self._probe_start)
        shm = self.shm
        self.ticks += 1
        if self.spool is not None:
            self.spool.flush()      # the records finished since the last tick, to disk
        if self.cfg.target_ci_pct:
            # Tokens so far (finished + streaming), for the adaptive-precision rule.
            shm[self.base + C_TOKENS] = self.done_tokens + sum(
                c.tokens_seen for c in self.inflight if c.req is not None)
        else:
            # The finished requests' tokens, for the level's live figures (loadgen/live.py):
            # one store per tick, nothing per token.
            shm[self.base + C_TOKENS] = self.done_tokens
        ws, we = shm[G_WS], shm[G_WE]
        if ws and self.cpu_ws is None:
            self.cpu_ws = time.process_time_ns()
        if we and self.cpu_we is None:
            self.cpu_we = time.process_time_ns()
        if (ws, we) != self.synced:
            self._reconcile(ws, we)
        if shm[G_STOP]:
            self._shutdown(shm[G_STOP])
            return
        stall_ns = int(self.cfg.stall_timeout * NS_PER_S)
        if self.inflight and self.ticks % 50 == 0:      # every 0.5 s is plenty for stalls
            now_ns = time.monotonic_ns()
            for conn in [c for c in self.inflight if now_ns - c.last_activity > stall_ns]:
                conn.abort("stalled: no data for %.0f s (stall_timeout)" % self.cfg.stall_timeout)
        loop.call_later(TICK_S, self._tick)

    def _shutdown(self, reason: int):
        self.stopping = True
        for conn in list(self.inflight):
            req = conn.req
            if req is None:
                continue
            if reason == STOP_TIMEOUT and req.in_window:
                conn.abort("timeout: level_timeout reached before the request finished")
            else:
                conn.abort(CANCELLED_PREFIX + " level over (tail request)")
        for conn in self.idle:
            conn.transport.close()
        self.loop.call_later(0.05, self.loop.stop)

    # -- entry point ------------------------------------------------------------------------

    def run(self) -> dict:
        gc.collect()
        gc.freeze()         # fewer, shorter collector pauses inside the measurement
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        self.cpu_start = time.process_time_ns()
        if self._uses_sender():
            loop.call_soon(self._start_sender)
        elif self.cfg.load_mode == "rate":
            loop.call_soon(self._schedule_first_arrival)
        else:
            # Staggered starts: C workers that start together stay in lockstep when requests
            # take equal time, and every burst of C sends then lands on the server at once.
            c = int(self.cfg.concurrency)
            for wid in self.worker_ids:
                w = _Worker(wid)
                loop.call_later(self.cfg.ramp_seconds * wid / c, self._reconnect, w)
        loop.call_later(TICK_S, self._tick)
        try:
            loop.run_forever()
        finally:
            self.cpu_end = time.process_time_ns()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()
            self._stop_sender()
        if self.sender_error:
            raise LoadgenError(self.sender_error)
        ws, we = self.shm[G_WS], self.shm[G_WE]
        self._reconcile(ws, we)
        wall_offset = netstamp.wall_offset_ns()
        part, index = finish_records(self.spool, self.cfg, ws, we,
                                     self.any_ok and self.all_ok_counted, wall_offset)
        lag = sorted(self.lag_window)
        return {
            "part": part, "rows": index,
            "cpu_total_ns": self.cpu_end - self.cpu_start,
            "cpu_window_ns": ((self.cpu_we or self.cpu_end) - self.cpu_ws
                              if self.cpu_ws is not None else None),
            "lag_p99_s": percentile(lag, 99) if lag else None,
            "lag_max_s": self.lag_max,
            "rx_reads": self.rx_stats.reads, "rx_kernel_reads": self.rx_stats.kernel_reads,
            "sender_priority": self.sender_priority,
        }


def finish_records(spool: RecordSpool, cfg: LevelConfig, ws: int, we: int,
                   per_token_itl: bool, wall_offset: int) -> Tuple[LevelPart, RowsIndex]:
    """The end of a client process's level: one pass over its spool, in the order the requests
    finished, writing each record's row (the part file's line) as it goes by while the
    reduction sees the records as the in-memory list held them. The spool is then deleted."""
    we_ = we if we > ws else 0
    rows = RowsWriter(spool.path + ".rows",
                      dict(host=cfg.host_label, profile=cfg.profile,
                           concurrency=int(cfg.concurrency), repeat=int(cfg.repeat)))

    def finished():
        for r in spool.records(ws, we):
            row = request_row(r, ws, we_, wall_offset)
            if cfg.keep_chunks:
                row["chunk_times"] = list(r.chunk_times or ())
                row["chunk_tokens"] = None if r.chunk_tokens is None else list(r.chunk_tokens)
            rows.add(row)
            yield r
    # The latency samples go to files beside the spool (loadgen/samples.py), sealed into the
    # part: the controller takes the level's exact figures from them in bounded memory.
    part = reduce_requests(finished(), ws, we_, cfg.ci_batches, cfg.slo,
                           per_token_itl=per_token_itl, samples_path=spool.path)
    index = rows.close()
    spool.remove()
    return part, index


def _client_main(cfg, index, nproc, worker_ids, wires, shm_map, pipe, spool_dir, arrivals=None,
                 conversations=None):
    """Entry of a forked client process: run, send the result (or the error) to the parent."""
    try:
        os.dup2(2, 1)    # nothing a client process prints may reach the module's JSON on stdout
        shm = memoryview(shm_map).cast("q")
        spool = RecordSpool(os.path.join(spool_dir, "client-%d.spool" % index))
        result = _Client(cfg, index, nproc, worker_ids, wires, shm, spool, arrivals,
                         conversations).run()
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        result = {"error": traceback.format_exc()}
    try:
        pipe.send(result)
    finally:
        pipe.close()
