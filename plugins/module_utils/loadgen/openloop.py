"""The open loop of a client process (load_mode rate): arrivals on a schedule, sent by the
process's sender process (sender.py) over plain TCP, or from the loop itself for TLS; each
answer read by the process's loop. A mixin of client._Client, whose state it uses. Stdlib only.
"""
from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from typing import Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.counters import (
    G_STOP, G_T0, STOP_ABORT,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (
    adopt_socket, new_socket, open_connection,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    CANCELLED_PREFIX, NS_PER_S, RequestTiming,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.sender import (
    BACK, FAILED, PRIORITY, SENT, ArrivalSchedule, Outbox, Sender, receive_message,
    sender_process,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.trace import TraceSchedule
from ansible_collections.servelab.serving.plugins.module_utils.proc.terminate import end_children

ARRIVAL_SPIN_S = 0.00105         # open loop in the loop (TLS): the last stretch is polled
TRACE_LEAD_NS = 500_000_000      # a trace's first arrival, after the level's start (G_T0)
SENDER_EXIT_S = 2.0              # open loop: the sender process ends within this of the stop
_TIMES_AT = 1                    # sender messages: the kind byte, then (t_sched, t_send)
_SENDER_TIMES = struct.Struct("qq")


class OpenLoop:
    """Arrivals and the sender process, for client._Client."""

    def _arrival_schedule(self) -> ArrivalSchedule:
        """This process's share of the arrivals: rate/processes, constant streams interleaved
        evenly, Poisson streams each from the level's start."""
        cfg = self.cfg
        first = self.shm[G_T0]
        if self.arrivals:
            # G_T0 is taken before the fork: the trace starts a lead later, once every client
            # process is up, so its first arrivals are not sent late together.
            return TraceSchedule(self.arrivals, first + TRACE_LEAD_NS, self.index, self.nproc)
        if cfg.arrival == "constant":
            first += int(NS_PER_S / float(cfg.request_rate) * self.index)
        return ArrivalSchedule(float(cfg.request_rate) / self.nproc, cfg.arrival, self.rng,
                               first, cfg.burstiness)

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
        # It ends by itself once it sees the stop; one that does not is killed (and reaped).
        end_children([self.sender_pid], SENDER_EXIT_S, grace=0.0, kill_timeout=SENDER_EXIT_S)
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
