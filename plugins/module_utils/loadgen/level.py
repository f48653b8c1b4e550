"""The load generator: runs one load level and measures it (docs/architecture.md, 'Measurement'). Stdlib only.

Load modes
- concurrency (closed loop, default): C workers, each on its own keep-alive connection, each
  sending its next request the moment its last one finished (inside the same socket callback).
  Worker starts are spread over `ramp_seconds` (workers that start together stay in lockstep).
- rate (open loop): arrivals at `request_rate` per second, Poisson or constant, each sent on a
  free connection; at most `concurrency` in flight, later arrivals wait (their queue time is kept).
  Each client process's arrivals are sent by its own sender process (sender.py: it only sends, at
  real-time priority where allowed, and hands each socket to this process's loop, which reads
  the answer); TLS arrivals are sent from the loop itself.

The level, on the client's monotonic clock:
  start ── warmup ── ws ══════ window ══════ we ── tail ── stop
- warmup: the window opens (ws) once every worker finished `warmup_requests` requests (closed
  loop; default 1), so the synchronized start and cold caches are over; open loop, once
  warmup_requests x concurrency requests finished.
- window: closes (we) once it lasted `level_seconds` and at least `min_window_requests` were sent
  in it, or `max_requests` were sent in it, or half of `level_timeout` has passed (then the level
  is flagged `window_complete: false`). Requests sent inside [ws, we) are the window requests.
- tail: the load stays on (workers keep sending) until every window request finished, so each of
  them ran under the full load; then the tail requests still in flight are cancelled (recorded as
  `cancelled: ...`, not counted as errors) and the level ends.
- `level_timeout` bounds everything; window requests cut by it are errors.

Processes: `processes` forked client processes, each with its own event loop and a share of the
workers (or of the arrival rate). They share a few counters through an anonymous shared-memory
map; the parent process is only the controller: it decides ws/we/stop from those counters, samples
the server's `/metrics`, and merges the processes' partial results (metrics.LevelPart).
Client honesty: every process records its CPU time and its event-loop lag (probed every 10 ms);
the parent adds the kernel's account of the reaped processes, its own CPU and Ansible's on this
machine (loadgen/cpu.py). A level is `client_limited` when a client process used >= 90% of a core
over the window, or its loop-lag p99 over the window was >= 2 ms, or the bench side as a whole
(clients, this module, Ansible) used >= 90% of the CPUs it may run on: the client, not the server,
may have set the pace.

Processes: `processes: 0` (the default) picks them per level (auto_processes).
Samples: the window stays open until `min_latency_samples` requests were sent in it (bounded by
level_timeout); a level with fewer succeeded window requests says so (`latency_samples`).
"""
from __future__ import annotations

import asyncio
import gc
import math
import mmap
import multiprocessing
import os
import random
import socket
import struct
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils import netstamp
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.caller import caller_gone
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.cpu import (
    LevelCpu, mark_load_generator, usable_cpus,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (
    APIS, RX_KERNEL, RX_MODES, RX_USER, Endpoint, RxStats, adopt_socket, http_get, new_socket,
    open_connection, request_body,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    CANCELLED_PREFIX, LevelPart, LevelRow, NS_PER_S, RequestTiming, batch_means_ci95, level_row,
    percentile, reduce_requests, request_row,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.sender import (
    BACK, CLOSED, FAILED, PRIORITY, PRIORITY_REALTIME, SENT, ArrivalSchedule, Outbox, Sender,
    receive_message, sender_process,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.server_metrics import (
    MetricsSampler, window_figures,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import Workload
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    STOP_ABORTED, STOP_LEVEL_TIMEOUT, STOP_SERVER_FAILING, STOP_UNKNOWN, STOP_WINDOW_COMPLETE,
)

LOAD_MODES = ("concurrency", "rate")
ARRIVALS = ("poisson", "constant")

CLIENT_CPU_LIMIT = 0.90          # fraction of one core over the window
CLIENT_LAG_LIMIT_MS = 2.0        # event-loop lag p99 over the window

# Bytes read from one socket per loop iteration, shared out over the process's connections: small
# reads keep an iteration (the delay before any chunk is timestamped) short when every connection
# is busy (a firehose), large ones keep the syscall count low when few are.
READ_BUDGET = 128 * 1024
READ_MIN, READ_MAX = 4096, 65536

TICK_S = 0.010                   # client tick: lag sample, stop check, stall check
CONTROL_S = 0.010                # controller poll interval
CALLER_CHECK_TICKS = 50          # every 0.5 s: is Ansible still reading (loadgen/caller.py)?
ERROR_BACKOFF_S = 0.1            # a worker whose request failed waits this long (no hot loop)
ARRIVAL_SPIN_S = 0.00105         # open loop in the loop (TLS): the last stretch is polled
LATENESS_NOTE_MS = 1.0           # open loop: a send lateness p99 from here on is warned about
SENDER_EXIT_S = 2.0              # open loop: the sender process ends within this of the stop
_TIMES_AT = 1                    # sender messages: the kind byte, then (t_sched, t_send)
_SENDER_TIMES = struct.Struct("qq")

STOP_NONE, STOP_DONE, STOP_TIMEOUT, STOP_FAILING, STOP_ABORT = 0, 1, 2, 3, 4
STOP_REASONS = {STOP_DONE: STOP_WINDOW_COMPLETE, STOP_TIMEOUT: STOP_LEVEL_TIMEOUT,
                STOP_FAILING: STOP_SERVER_FAILING, STOP_ABORT: STOP_ABORTED}

# Shared counters (int64 slots): globals, then one block per client process.
G_WS, G_WE, G_STOP, G_T0 = 0, 1, 2, 3
G_SLOTS = 8
(C_COMPLETED, C_WARM, C_WIN_SENT, C_WIN_DONE, C_OK, C_ERRORS, C_TOKENS, C_ERR_STREAK,
 C_SYNCED_WE) = range(9)
C_SLOTS = 9


class LoadgenError(Exception):
    """Bad configuration or a client process that failed: the message says what to fix."""


@dataclass
class LevelConfig:
    base_url: str
    model: str = ""
    api: str = "openai_chat"
    concurrency: int = 1
    load_mode: str = "concurrency"
    request_rate: Optional[float] = None
    arrival: str = "poisson"
    max_tokens: int = 256
    ignore_eos: bool = False
    level_seconds: float = 30.0
    warmup_requests: Optional[int] = 1          # per worker (closed loop)
    min_window_requests: Optional[int] = None   # default: C (closed loop) or 10 (open loop)
    min_latency_samples: int = 30               # succeeded window requests behind percentiles
    max_requests: Optional[int] = None
    level_timeout: float = 600.0
    stall_timeout: float = 120.0
    connect_timeout: float = 10.0
    socket_rcvbuf: Optional[int] = 65536         # bytes; 0/None = the OS default
    ramp_seconds: float = 0.5                    # closed loop: worker starts spread over this
    slo: Dict[str, Optional[float]] = field(default_factory=dict)
    ci_batches: int = 10
    target_ci_pct: Optional[float] = None
    processes: int = 0              # 0: automatic (auto_processes), per level
    drain_timeout: float = 30.0     # s to wait for an idle server after the level; 0: no wait
    seed: int = 1
    extra_body: Dict[str, object] = field(default_factory=dict)
    api_key: Optional[str] = None
    per_chunk_usage: bool = True
    rx_timestamps: str = RX_KERNEL  # chunk arrival times: the kernel's (http.py), or at the read
    server_metrics: bool = True
    metrics_path: str = "/metrics"
    metrics_interval: float = 1.0
    host_label: str = "localhost"
    profile: str = "default"
    repeat: int = 1                 # which measurement of this level (llm_bench's repeats)
    keep_chunks: bool = False       # keep per-chunk arrival times in the request rows (tests)

    def validate(self) -> None:
        """Raise LoadgenError naming the field and the fix, before anything is sent."""
        def bad(name, msg):
            raise LoadgenError("%s: %s" % (name, msg))
        Endpoint(self.base_url, self.api)   # raises ValueError with the field named
        if self.api not in APIS:
            bad("api", "expected one of %s" % ", ".join(APIS))
        if self.api != "sglang_generate" and not self.model:
            bad("model", "required for the OpenAI APIs (the name the server serves, see "
                         "GET /v1/models)")
        if self.rx_timestamps not in RX_MODES:
            bad("rx_timestamps", "expected one of %s" % ", ".join(RX_MODES))
        if self.load_mode not in LOAD_MODES:
            bad("load_mode", "expected one of %s" % ", ".join(LOAD_MODES))
        if int(self.concurrency) < 1:
            bad("concurrency", "expected an integer >= 1, got %r" % self.concurrency)
        if int(self.repeat) < 1:
            bad("repeat", "expected an integer >= 1 (the first measurement of a level is 1), "
                          "got %r" % self.repeat)
        if self.load_mode == "rate":
            if not self.request_rate or float(self.request_rate) <= 0:
                bad("request_rate", "load_mode rate needs a request rate > 0 (requests/s)")
            if self.arrival not in ARRIVALS:
                bad("arrival", "expected one of %s" % ", ".join(ARRIVALS))
        if self.max_tokens < 1:
            bad("max_tokens", "expected an integer >= 1")
        if self.level_seconds <= 0:
            bad("level_seconds", "expected seconds > 0")
        if self.level_timeout <= self.level_seconds:
            bad("level_timeout", "must exceed level_seconds (%s): it bounds warmup + window + "
                                 "tail" % self.level_seconds)
        if self.ci_batches < 2:
            bad("ci_batches", "expected >= 2 batches for a confidence interval")
        if self.target_ci_pct is not None and self.target_ci_pct <= 0:
            bad("target_ci_pct", "expected a percentage > 0 (e.g. 2 for +-2%)")
        if self.min_latency_samples < 0:
            bad("min_latency_samples", "expected an integer >= 0 (0: no minimum)")
        if self.drain_timeout < 0:
            bad("drain_timeout", "expected seconds >= 0 (0: do not wait for an idle server)")
        if self.processes < 0:
            bad("processes", "expected >= 1 client processes, or 0 for automatic")
        if self.ramp_seconds < 0 or self.ramp_seconds >= self.level_timeout / 2:
            bad("ramp_seconds", "expected seconds >= 0 and well below level_timeout")
        if self.socket_rcvbuf is not None and self.socket_rcvbuf < 0:
            bad("socket_rcvbuf", "expected bytes >= 0 (0 = the OS default)")
        for key, value in (self.slo or {}).items():
            if key not in ("ttft_ms", "tpot_ms", "e2e_ms"):
                bad("slo.%s" % key, "unknown SLO; use ttft_ms, tpot_ms, e2e_ms")
            if value is not None and float(value) <= 0:
                bad("slo.%s" % key, "expected milliseconds > 0")
        for name in ("warmup_requests", "min_window_requests", "max_requests"):
            value = getattr(self, name)
            if value is not None and int(value) < (0 if name == "warmup_requests" else 1):
                bad(name, "expected a non-negative integer" if name == "warmup_requests"
                    else "expected an integer >= 1")


@dataclass
class LevelResult:
    row: LevelRow
    requests: List[dict]
    warnings: List[str] = field(default_factory=list)
    sender_priority: Optional[str] = None   # open loop: what the arrival sender ran at

    def row_dict(self) -> dict:
        return asdict(self.row)


# ------------------------------------------------------------------------------------------
# Client process


class _Worker:
    __slots__ = ("wid", "conn", "connecting", "done")

    def __init__(self, wid: int):
        self.wid = wid
        self.conn = None
        self.connecting = False
        self.done = 0           # requests finished (ok or not)


class _Client:
    """One client process: its event loop, its workers (or its share of the arrivals)."""

    def __init__(self, cfg: LevelConfig, index: int, nproc: int, worker_ids: List[int],
                 wires: List[bytes], shm):
        self.cfg = cfg
        self.index = index
        self.nproc = nproc
        self.worker_ids = worker_ids
        self.wires = wires
        self.shm = shm
        self.base = G_SLOTS + index * C_SLOTS
        self.endpoint = Endpoint(cfg.base_url, cfg.api, cfg.api_key)
        self.records: List[RequestTiming] = []
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
        self.lag_window: List[float] = []
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

    def _next_wire(self) -> bytes:
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
        finished = [(req, True) for req in self.records]
        running = [(c.req, False) for c in self.inflight if c.req is not None]
        for req, done in finished + running:
            inside = bool(ws) and req.t_send >= ws and (not we or req.t_send < we)
            if inside == req.in_window:
                continue
            req.in_window = inside
            step = 1 if inside else -1
            shm[b + C_WIN_SENT] += step
            if done:
                shm[b + C_WIN_DONE] += step
        self.synced = (ws, we)
        shm[b + C_SYNCED_WE] = we

    def _record(self, req: RequestTiming, worker_warm: bool):
        """Count a finished request; `worker_warm`: its worker has now finished its warmup."""
        self.records.append(req)
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
        wire = self._next_wire()
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

    # -- open loop --------------------------------------------------------------------------

    def _arrival_schedule(self) -> ArrivalSchedule:
        """This process's share of the arrivals: rate/processes, constant streams interleaved
        evenly, Poisson streams each from the level's start."""
        cfg = self.cfg
        first = self.shm[G_T0]
        if cfg.arrival == "constant":
            first += int(NS_PER_S / float(cfg.request_rate) * self.index)
        return ArrivalSchedule(float(cfg.request_rate) / self.nproc, cfg.arrival, self.rng,
                               first)

    def _uses_sender(self) -> bool:
        """Open loop sends from a sender process (sender.py) over plain TCP; a TLS session
        cannot be handed between processes, so TLS arrivals are sent from this loop."""
        return self.cfg.load_mode == "rate" and not self.endpoint.tls and hasattr(os, "fork")

    # The sender process (sender.py): it sends, this loop reads.

    def _start_sender(self):
        cfg, shm = self.cfg, self.shm
        infos = socket.getaddrinfo(self.endpoint.host, self.endpoint.port,
                                   type=socket.SOCK_STREAM)
        family, addr = infos[0][0], infos[0][4]
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        schedule = self._arrival_schedule()
        wires, order = self.wires, self.order

        def build() -> Sender:
            return Sender(theirs, schedule, self._cap(),
                          lambda: new_socket(family, cfg.socket_rcvbuf, cfg.rx_timestamps),
                          addr, lambda i: wires[order[i % len(order)]],
                          lambda: shm[G_STOP] != 0, cfg.connect_timeout)
        pid = os.fork()
        if pid == 0:        # pragma: no cover - the child never returns (sender_process exits)
            mine.close()
            sender_process(theirs, build)
        theirs.close()
        self.ctrl, self.outbox, self.sender_pid = mine, Outbox(mine), pid
        self.loop.add_reader(mine.fileno(), self._from_sender)

    def _from_sender(self):
        while True:
            try:
                message, fds = receive_message(self.ctrl)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                message, fds = b"", []
            if not message:
                self.loop.remove_reader(self.ctrl.fileno())
                if not self.stopping and not self.shm[G_STOP]:   # it ends when it sees the stop
                    self.sender_error = "the open-loop sender process ended before the level did"
                    self.shm[G_STOP] = self.shm[G_STOP] or STOP_ABORT
                return
            kind = message[:1]
            if kind == PRIORITY:
                self.sender_priority = message[1:].decode()
                continue
            t_sched, t_send = _SENDER_TIMES.unpack_from(message, _TIMES_AT)
            req = self._new_request(-1)
            req.t_sched, req.t_send = t_sched, t_send
            if kind == SENT and fds:
                self._adopt(socket.socket(fileno=fds[0]), req)
            elif kind == FAILED:
                req.error = message[_TIMES_AT + _SENDER_TIMES.size:].decode("utf-8", "replace")
                self._classify(req)
                self._record(req, False)

    def _adopt(self, sock: socket.socket, req: RequestTiming):
        """A request the sender wrote on `sock`: read its answer here."""
        conn = adopt_socket(self.loop, sock, self.cfg.api, self._on_done_open, self._on_lost,
                            self.rx_stats)
        conn.owner_data = "sender"
        conn.read_size = self.read_size
        self.inflight.add(conn)
        conn.adopt(req)
        self._classify(req)
        if self.stopping:   # sent after the stop, before the sender saw it: a tail request
            conn.abort(CANCELLED_PREFIX + " level over (tail request)")

    def _tell_sender(self, message: bytes, sock: Optional[socket.socket] = None):
        """To the sender, with `sock` handed over (and closed here) if given; what the pair
        cannot take now goes when it is writable (sender.Outbox)."""
        outbox = self.outbox
        if outbox is None or self.ctrl.fileno() < 0:
            if sock is not None:
                sock.close()
            return
        was_waiting = bool(outbox.queue)
        try:
            outbox.put(message, sock)
        except OSError:     # the sender has ended (the level is over): nothing to hand back
            outbox.drop()
            return
        if outbox.queue and not was_waiting:
            self.loop.add_writer(self.ctrl.fileno(), self._flush_sender)

    def _flush_sender(self):
        try:
            self.outbox.flush()
        except OSError:
            self.outbox.drop()
        if not self.outbox.queue:
            self.loop.remove_writer(self.ctrl.fileno())

    def _stop_sender(self):
        if self.outbox is not None:
            self.outbox.drop()
        if self.ctrl is not None:
            self.ctrl.close()
        if not self.sender_pid:
            return
        deadline = time.monotonic() + SENDER_EXIT_S
        while True:
            pid, _status = os.waitpid(self.sender_pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.kill(self.sender_pid, 9)
                os.waitpid(self.sender_pid, 0)
                break
            time.sleep(0.005)
        self.sender_pid = 0

    # Arrivals from this loop (TLS).

    def _schedule_first_arrival(self):
        self.schedule = self._arrival_schedule()
        self._arm_arrival()

    def _arm_arrival(self):
        """Wake for the next arrival. epoll rounds a timeout up to the next millisecond, so a
        timer alone sends up to 1 ms late: the timer is set ARRIVAL_SPIN_S early, and the last
        stretch is covered by re-queueing _arrive on every loop iteration (each one still serves
        the sockets, with a zero poll timeout), so the send is late by one iteration at most."""
        delay = (self.schedule.next_ns - time.monotonic_ns()) / NS_PER_S
        if delay > ARRIVAL_SPIN_S:
            self.loop.call_later(delay - ARRIVAL_SPIN_S, self._arrive)
        else:
            self.loop.call_soon(self._arrive)

    def _arrive(self):
        if self.stopping:
            return
        now = time.monotonic_ns()
        # Fire every arrival that is due (timers can be late; the schedule is not).
        while self.schedule.next_ns <= now:
            self._dispatch(self.schedule.advance())
        self._arm_arrival()

    def _cap(self) -> int:
        share, extra = divmod(int(self.cfg.concurrency), self.nproc)
        return max(1, share + (1 if self.index < extra else 0))

    def _dispatch(self, t_sched: int):
        if self.idle:
            self._send_open(self.idle.pop(), t_sched)
        elif self.conns < self._cap():
            self.conns += 1
            self.loop.create_task(self._connect_pool(t_sched))
        else:
            self.backlog.append(t_sched)

    async def _connect_pool(self, t_sched: int):
        try:
            conn = await open_connection(self.loop, self.endpoint, self.cfg.api,
                                         self._on_done_open, self._on_lost,
                                         self.cfg.connect_timeout, self.cfg.socket_rcvbuf,
                                         self.cfg.rx_timestamps, self.rx_stats)
        except (OSError, asyncio.TimeoutError) as exc:
            self.conns -= 1
            req = self._new_request(-1)
            req.t_sched = t_sched
            req.t_send = time.monotonic_ns()
            req.error = "connect failed: %s" % (exc or type(exc).__name__)
            self._classify(req)
            self._record(req, False)
            return
        conn.owner_data = "pool"
        conn.read_size = self.read_size
        if self.stopping:
            conn.transport.close()
            return
        self._send_open(conn, t_sched)

    def _send_open(self, conn, t_sched: int):
        req = self._new_request(-1)
        req.t_sched = t_sched
        self.inflight.add(conn)
        conn.send(req, self._next_wire())
        self._classify(req)

    def _on_done_open(self, conn, req: RequestTiming):
        self.inflight.discard(conn)
        self._record(req, False)
        if conn.owner_data == "sender":
            if (not self.stopping and req.error is None and conn.reusable
                    and not conn.closed):
                self._tell_sender(BACK, conn.transport.detach())   # idle: the sender's again
            elif not conn.closed:
                conn.transport.close()          # _on_lost tells the sender the slot is free
            return
        if self.stopping:
            return
        if req.error is not None or not conn.reusable or conn.closed:
            if not conn.closed:
                conn.transport.close()
            return          # _on_lost releases the slot
        if self.backlog:
            self._send_open(conn, self.backlog.pop(0))
        else:
            self.idle.append(conn)

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
        if self.cfg.target_ci_pct:
            # Tokens so far (finished + streaming), for the adaptive-precision rule.
            shm[self.base + C_TOKENS] = self.done_tokens + sum(
                c.tokens_seen for c in self.inflight if c.req is not None)
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
        part = reduce_requests(self.records, ws, we if we > ws else 0, self.cfg.ci_batches,
                               self.cfg.slo)
        rows = []
        wall_offset = netstamp.wall_offset_ns()
        for r in self.records:
            row = request_row(r, ws, we if we > ws else 0, wall_offset)
            if self.cfg.keep_chunks:
                row["chunk_times"] = list(r.chunk_times or ())
                row["chunk_tokens"] = None if r.chunk_tokens is None else list(r.chunk_tokens)
            rows.append(row)
        lag = sorted(self.lag_window)
        return {
            "part": part, "rows": rows,
            "cpu_total_ns": self.cpu_end - self.cpu_start,
            "cpu_window_ns": ((self.cpu_we or self.cpu_end) - self.cpu_ws
                              if self.cpu_ws is not None else None),
            "lag_p99_s": percentile(lag, 99) if lag else None,
            "lag_max_s": self.lag_max,
            "rx_reads": self.rx_stats.reads, "rx_kernel_reads": self.rx_stats.kernel_reads,
            "sender_priority": self.sender_priority,
        }


def _client_main(cfg, index, nproc, worker_ids, wires, shm_map, pipe):
    """Entry of a forked client process: run, send the result (or the error) to the parent."""
    try:
        os.dup2(2, 1)    # nothing a client process prints may reach the module's JSON on stdout
        shm = memoryview(shm_map).cast("q")
        result = _Client(cfg, index, nproc, worker_ids, wires, shm).run()
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        result = {"error": traceback.format_exc()}
    try:
        pipe.send(result)
    finally:
        pipe.close()


# ------------------------------------------------------------------------------------------
# Controller (the parent process)


class _Controller:
    def __init__(self, cfg: LevelConfig, shm, nproc: int):
        self.cfg = cfg
        self.shm = shm
        self.nproc = nproc
        self.closed_loop = cfg.load_mode == "concurrency"
        c = int(cfg.concurrency)
        per_worker = 1 if cfg.warmup_requests is None else int(cfg.warmup_requests)
        # Open loop has no workers: the same number of requests in total (per unit of the cap).
        self.warmup = per_worker if self.closed_loop else per_worker * c
        # The window stays open until enough requests were sent in it: the minimum asked for,
        # and the latency samples (each window request yields one once it succeeded).
        self.min_window = max(cfg.min_window_requests if cfg.min_window_requests is not None
                              else (c if self.closed_loop else 10), cfg.min_latency_samples)
        self.window_complete = True
        self.token_samples: List = []     # (t_ns, cumulative tokens) inside the window
        self.on_ws = None
        self.on_we = None

    def total(self, slot: int) -> int:
        shm = self.shm
        return sum(shm[G_SLOTS + i * C_SLOTS + slot] for i in range(self.nproc))

    def live_ci_pct(self, now: int) -> Optional[float]:
        """Batch-means CI (% of the mean) of output tok/s so far in the window, from the
        cumulative token counters (the final figure is recomputed exactly afterwards)."""
        samples = self.token_samples
        b = self.cfg.ci_batches
        if len(samples) < 2 * b:
            return None
        t_start, t_end = samples[0][0], samples[-1][0]
        edges = [t_start + (t_end - t_start) * i // b for i in range(b + 1)]
        values, j = [], 0
        for edge in edges:
            while j + 1 < len(samples) and samples[j + 1][0] <= edge:
                j += 1
            values.append(samples[j][1])
        dt = (t_end - t_start) / b / NS_PER_S
        rates = [(values[i + 1] - values[i]) / dt for i in range(b)]
        mean = sum(rates) / b
        half = batch_means_ci95(rates)
        if not mean or half is None:
            return None
        return 100.0 * half / mean

    def step(self, now: int) -> None:
        shm, cfg = self.shm, self.cfg
        if shm[G_STOP]:
            return
        t0 = shm[G_T0]
        if now - t0 >= cfg.level_timeout * NS_PER_S:
            shm[G_STOP] = STOP_TIMEOUT
            return
        ok = self.total(C_OK)
        errors = self.total(C_ERRORS)
        c = int(cfg.concurrency)
        failing_after = max(2 * c, 8)
        if (ok == 0 and errors >= c + 3) or self.total(C_ERR_STREAK) >= failing_after:
            shm[G_STOP] = STOP_FAILING
            return
        ws = shm[G_WS]
        if not ws:
            if self.closed_loop:
                # Every worker finished its warmup requests (0: no warmup, only a first success).
                warm = self.warmup == 0 or self.total(C_WARM) >= c
            else:
                warm = self.total(C_COMPLETED) >= self.warmup
            if warm and ok > 0:
                shm[G_WS] = now
                if self.on_ws:
                    self.on_ws()
            elif now - t0 >= cfg.level_timeout * NS_PER_S / 2:
                # No window possible in time: stop; the level reports whole-run figures only.
                self.window_complete = False
                shm[G_STOP] = STOP_TIMEOUT
            return
        we = shm[G_WE]
        if not we:
            sent = self.total(C_WIN_SENT)
            self.token_samples.append((now, self.total(C_TOKENS)))
            long_enough = now - ws >= cfg.level_seconds * NS_PER_S and sent >= self.min_window
            if long_enough and cfg.target_ci_pct:
                ci = self.live_ci_pct(now)
                long_enough = ci is not None and ci <= cfg.target_ci_pct
            capped = cfg.max_requests is not None and sent >= int(cfg.max_requests)
            late = now - t0 >= cfg.level_timeout * NS_PER_S / 2
            if long_enough or capped or late:
                if late and not (long_enough or capped):
                    self.window_complete = False
                shm[G_WE] = now
                if self.on_we:
                    self.on_we()
            return
        # Every process has settled its window requests against this we (_reconcile), so
        # the counters are exact, not the live guesses; then wait for the last to finish.
        synced = all(shm[G_SLOTS + i * C_SLOTS + C_SYNCED_WE] == we for i in range(self.nproc))
        if synced and self.total(C_WIN_DONE) >= self.total(C_WIN_SENT):
            shm[G_STOP] = STOP_DONE


def _fork_context():
    try:
        return multiprocessing.get_context("fork")
    except ValueError:  # pragma: no cover - platforms without fork
        raise LoadgenError("processes: the load generator needs fork() (Linux, macOS)") from None


def run_level(cfg: LevelConfig, workload: Workload) -> LevelResult:
    """Run one load level against the server and measure it."""
    try:
        cfg.validate()
    except ValueError as exc:
        raise LoadgenError(str(exc)) from None
    endpoint = Endpoint(cfg.base_url, cfg.api, cfg.api_key)
    wires = [endpoint.wire(request_body(cfg.api, cfg.model, p, p.max_tokens or cfg.max_tokens,
                                        p.ignore_eos or cfg.ignore_eos, cfg.extra_body,
                                        cfg.per_chunk_usage))
             for p in workload.prompts]
    if not wires:
        raise LoadgenError("workload: no prompts")
    c = int(cfg.concurrency)
    nproc = max(1, min(int(cfg.processes) or auto_processes(c), c))
    worker_sets = [list(range(i, c, nproc)) for i in range(nproc)]
    shm_map = mmap.mmap(-1, 8 * (G_SLOTS + C_SLOTS * nproc))
    shm = memoryview(shm_map).cast("q")
    ctx = _fork_context()
    mark_load_generator()   # before the fork: the client processes carry the name too
    controller = _Controller(cfg, shm, nproc)
    sampler = None
    warnings: List[str] = []
    cpu = LevelCpu()
    shm[G_T0] = time.monotonic_ns()
    procs, pipes = [], []
    results: Dict[int, dict] = {}
    try:
        for i in range(nproc):
            parent_end, child_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_client_main, name="servelab-loadgen-%d" % i,
                            args=(cfg, i, nproc, worker_sets[i], wires, shm_map, child_end),
                            daemon=True)
            p.start()
            child_end.close()
            procs.append(p)
            pipes.append(parent_end)
        if cfg.server_metrics:
            sampler = MetricsSampler(endpoint.url(cfg.metrics_path), http_get,
                                     interval=cfg.metrics_interval).start()
        controller.on_ws = _both(cpu.mark_ws, sampler.sample_now if sampler else None)
        controller.on_we = _both(cpu.mark_we, sampler.sample_now if sampler else None)
        grace_deadline = None
        ticks = 0
        orphaned = False
        while len(results) < nproc:
            now = time.monotonic_ns()
            controller.step(now)
            ticks += 1
            if not shm[G_STOP] and ticks % CALLER_CHECK_TICKS == 0 and caller_gone():
                # ansible-playbook was interrupted or killed: nobody will read this level; stop
                # loading the server now rather than at the end of the level.
                orphaned = True
                shm[G_STOP] = STOP_ABORT
            for i, pipe in enumerate(pipes):
                if i not in results and pipe.poll(0):
                    try:
                        results[i] = pipe.recv()
                    except EOFError:
                        results[i] = {"error": "client process %d exited without a result "
                                               "(exit code %s)" % (i, procs[i].exitcode)}
                    if "error" in results[i] and not shm[G_STOP]:
                        shm[G_STOP] = STOP_ABORT
            if shm[G_STOP] and grace_deadline is None:
                grace_deadline = now + 60 * NS_PER_S
            if grace_deadline is not None and now > grace_deadline:
                for i in range(len(procs)):
                    if i not in results:
                        results[i] = {"error": "client process %d did not finish within 60 s "
                                               "of the stop signal" % i}
                break
            for i, p in enumerate(procs):
                if i not in results and not p.is_alive() and not pipes[i].poll(0):
                    results[i] = {"error": "client process %d died (exit code %s)"
                                           % (i, p.exitcode)}
                    shm[G_STOP] = shm[G_STOP] or STOP_ABORT
            time.sleep(CONTROL_S)
    finally:
        if not shm[G_STOP]:
            shm[G_STOP] = STOP_ABORT
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
        cpu.finish()        # every client process was reaped (or terminated and reaped)
        samples = sampler.stop() if sampler else []
        for pipe in pipes:
            pipe.close()
    errors = [r["error"] for r in results.values() if "error" in r]
    if errors:
        raise LoadgenError("load generator failed:\n" + "\n".join(errors))
    stop = shm[G_STOP]
    ws, we = shm[G_WS], shm[G_WE]
    shm.release()
    shm_map.close()
    if we <= ws:
        ws = we = 0
    merged = LevelPart()
    for i in range(nproc):
        merged.merge(results[i]["part"])
    merged.ws, merged.we = ws, we
    row = level_row(cfg.host_label, cfg.profile, c, merged, cfg.slo)
    row.repeat = int(cfg.repeat)
    row.load_mode = cfg.load_mode
    row.request_rate = float(cfg.request_rate) if cfg.load_mode == "rate" else None
    if cfg.load_mode == "rate" and row.window_s:
        row.arrival_rate_s = round(row.requests / row.window_s, 4)
    row.min_latency_samples = int(cfg.min_latency_samples)
    row.stop_reason = STOP_REASONS.get(stop, STOP_UNKNOWN)
    row.window_complete = bool(ws and we and controller.window_complete)
    row.window_start_ns, row.window_end_ns = ws, we
    if ws and we:   # on the wall clock too, to join the GPU server's telemetry samples
        wall_offset = netstamp.wall_offset_ns()
        row.window_start_unix_ns, row.window_end_unix_ns = ws + wall_offset, we + wall_offset
    _client_honesty(row, [results[i] for i in range(nproc)], merged, nproc, cpu)
    reads = sum(results[i]["rx_reads"] for i in range(nproc))
    stamped = sum(results[i]["rx_kernel_reads"] for i in range(nproc))
    row.rx_timestamps = RX_KERNEL if reads and stamped == reads else RX_USER
    if samples:
        row.server_metrics = window_figures(samples, ws, we)
    elif sampler is not None and sampler.note:
        warnings.append(sampler.note)
    if not row.window_complete:
        warnings.append(
            "C=%d: window incomplete (%s; %d window requests, window %.1f s): raise "
            "level_timeout or lower min_window_requests" % (
                c, row.stop_reason, row.requests, row.window_s))
    if row.latency_samples < row.min_latency_samples:
        warnings.append(
            "C=%d: latency percentiles from %d window requests, fewer than min_latency_samples "
            "(%d): raise level_timeout (the window closed at half of it)" % (
                c, row.latency_samples, row.min_latency_samples))
    priorities = sorted({r["sender_priority"] for r in results.values()
                         if r.get("sender_priority")})
    late = row.send_lateness_p99_ms
    if late is not None and late >= LATENESS_NOTE_MS:
        if not priorities:
            why = "arrivals sent from the client's own loop (TLS)"
        elif priorities == [PRIORITY_REALTIME]:
            why = "arrival sender at real-time priority"
        else:
            why = ("arrival sender priority: %s; real-time priority (root or CAP_SYS_NICE) lets "
                   "it send on time on a busy machine" % ", ".join(priorities))
        warnings.append("C=%d: send lateness p99 %.2f ms (%s)" % (c, late, why))
    if orphaned:
        warnings.append("C=%d: aborted: the caller (Ansible) went away during the level" % c)
    if cpu.shared_with:
        warnings.append(
            "C=%d: the bench client ran %d other sweep(s) at the same time (other GPU servers "
            "benchmarked from it): they share its %d CPU(s); check client CPU and loop lag" % (
                c, cpu.shared_with, usable_cpus()))
    if row.client_limited:
        warnings.append(
            "C=%d: client-limited (client CPU %.0f%% of a core, loop lag p99 %s ms): add client "
            "processes or a faster bench client" % (
                c, 100 * (row.client_cpu_util or 0), row.loop_lag_p99_ms))
    rows = []
    for i in range(nproc):
        for r in results[i]["rows"]:
            r.update(host=cfg.host_label, profile=cfg.profile, concurrency=c,
                     repeat=int(cfg.repeat))
            rows.append(r)
    rows.sort(key=lambda r: r["t_send"])
    return LevelResult(row=row, requests=rows, warnings=warnings,
                       sender_priority=", ".join(priorities) or None)


def _both(first, second):
    if second is None:
        return first

    def call():
        first()
        second()
    return call


def _client_honesty(row: LevelRow, results: List[dict], part: LevelPart, nproc: int,
                    cpu: LevelCpu) -> None:
    reported = sum(r["cpu_total_ns"] for r in results)
    reaped = cpu.clients_ns()
    window_ns = part.we - part.ws if part.we > part.ws else 0
    row.client_processes = nproc
    # The kernel's account of the reaped client processes is complete (their own clocks stop
    # before the results are handed over); it can only be lower if something else reaped them.
    total_cpu = reaped if reaped is not None and reaped >= reported else reported
    row.client_cpu_s = round(total_cpu / NS_PER_S, 3)
    module_s, ansible_s = cpu.module_s(), cpu.ansible_s()
    row.module_cpu_s = None if module_s is None else round(module_s, 3)
    row.ansible_cpu_s = None if ansible_s is None else round(ansible_s, 3)
    util = cpu.host_window_util()
    row.host_cpu_util = None if util is None else round(util, 4)
    client_side = 0.0
    if window_ns:
        utils = [r["cpu_window_ns"] / window_ns for r in results if r["cpu_window_ns"]]
        cpu_window = sum(r["cpu_window_ns"] or 0 for r in results)
        row.client_cpu_util = round(max(utils), 4) if utils else None
        if part.window_output_tokens:
            row.client_cpu_us_per_token = round(cpu_window / 1e3 / part.window_output_tokens, 3)
        # Everything the bench side ran in the window (clients, this module, Ansible), in
        # CPUs: near all the CPUs it may use, it competes with itself whatever each part shows.
        client_side = (cpu_window + cpu.window_overhead_ns()) / window_ns
    lags = [r["lag_p99_s"] for r in results if r["lag_p99_s"] is not None]
    row.loop_lag_p99_ms = round(max(lags) * 1e3, 3) if lags else None
    row.loop_lag_max_ms = round(max(r["lag_max_s"] for r in results) * 1e3, 3)
    row.client_limited = bool(
        (row.client_cpu_util is not None and row.client_cpu_util >= CLIENT_CPU_LIMIT)
        or (row.loop_lag_p99_ms is not None and row.loop_lag_p99_ms >= CLIENT_LAG_LIMIT_MS)
        or client_side >= CLIENT_CPU_LIMIT * usable_cpus())


def auto_processes(concurrency: int, per_process: int = 128) -> int:
    """`processes: 0`: one client process per `per_process` workers, on at most all but one of
    the CPUs this process may use (that one is left to the controller, Ansible, and often the
    server itself). Measured on a 2-core machine serving the simulator locally (2026-12-02): at
    C=256 one process streams 21k tok/s at 56% of a core, not client-limited, and in the firehose
    one process sustained 200k events/s where two sharing the second core managed 150k."""
    spare = max(1, usable_cpus() - 1)
    return max(1, min(spare, math.ceil(concurrency / per_process)))
