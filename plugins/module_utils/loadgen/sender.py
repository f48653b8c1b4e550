"""Open-loop arrivals from a dedicated sender process (docs/architecture.md, 5). Stdlib only.

Why a process of its own: an arrival is late when the process that should send it is not running
at its due time. In the client process that is (a) its event loop serving other streams' reads in
the iteration the arrival fell into, (b) the collector, and above all (c) the CPU scheduler: on a
machine the client shares (the server, Ansible, anything else), a busy process waits in the run
queue for milliseconds. Measured at 200 request/s Poisson on a shared 2-core VM (2026-12-02,
benchmarks/results/limit-openloop-2026-12-02.md): the client loop's select() returned 100+ ms
after its timeout, and send lateness p99 was 42 ms; the same client at real-time priority: 0.19 ms.
A real-time client process would take its CPU from the engine it measures, though: it reads every
token. So only the sending is split off into this process, which does almost nothing (a sleep,
one send(), one fd handover per arrival) and so may run at real-time priority without taking
anything measurable from anyone.

The sender keeps the idle keep-alive connections. At each arrival's due time it takes one (or
opens one, counted in the lateness, if none is idle), stamps t_send, writes the prebuilt request
bytes with one send(), and hands the socket to its client process over a SOCK_SEQPACKET pair
(SCM_RIGHTS) with (t_sched, t_send); the client adopts it and reads the answer with kernel
receive timestamps as usual (socket options travel with the socket). When the answer is complete
the client hands the socket back (or says it closed). Between arrivals the sender opens spare
connections ahead, so a burst finds one idle. Its waits are select()/clock_nanosleep with
microsecond timeouts (epoll's are whole milliseconds).

Messages, client <- sender: SENT (t_sched, t_send, 1 fd), FAILED (t_sched, t_send, error text),
PRIORITY (what the sender runs at); client -> sender: BACK (1 fd, idle and reusable), CLOSED (a
connection of the cap is gone).
"""
from __future__ import annotations

import errno
import gc
import math
import os
import select
import socket
import struct
import time
import traceback
from collections import deque
from typing import Callable, Deque, List, Optional, Tuple

NS_PER_S = 1_000_000_000
POISSON_BLOCK = 16               # gaps drawn stratified in blocks of this many
GAMMA_BLOCK = 256                # gamma gaps: drawn i.i.d. in blocks of this many (ArrivalSchedule)

SENT, FAILED, PRIORITY, BACK, CLOSED = b"S", b"F", b"P", b"B", b"C"
_TIMES = struct.Struct("qq")
MAX_MESSAGE = 1024

# The sender: within QUIET_NS of a due time it only sleeps (no housekeeping that could overrun);
# farther off it waits for messages and opens spare connections.
QUIET_NS = 2_000_000
STOP_POLL_S = 0.01               # the stop flag is checked at least this often
SPARE_CONNECTIONS = 8            # idle connections kept ready (within the cap) between arrivals

PRIORITY_REALTIME = "realtime"   # SCHED_FIFO 1: runs as soon as it wakes
PRIORITY_NICE = "nice"           # a raised CFS weight (nice -10)
PRIORITY_NORMAL = "normal"       # neither was allowed (needs CAP_SYS_NICE, or root)


_FD = struct.Struct("i")


def send_message(sock: socket.socket, message: bytes, fd: Optional[int] = None) -> None:
    """One message on the pair, with one descriptor (SCM_RIGHTS) or none."""
    ancillary = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _FD.pack(fd))]
    sock.sendmsg([message], ancillary)


def receive_message(sock: socket.socket) -> Tuple[bytes, List[int]]:
    """The next message and its descriptors, without waiting (BlockingIOError: none yet; an
    empty message: the other end closed). socket.recv_fds is not used: Python 3.11's ignores
    its flags, so it can block."""
    message, ancillary, _flags, _addr = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(_FD.size),
                                                     socket.MSG_DONTWAIT)
    fds = [_FD.unpack_from(data)[0] for level, kind, data in ancillary
           if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS and len(data) >= _FD.size]
    return message, fds


class Outbox:
    """Messages for the other end of the pair, never waited for. The pair holds what its send
    buffer takes (278 unread messages with the default 208 KiB, about 1.4 s of arrivals at 200/s);
    beyond that a send blocks, or on a non-blocking socket fails, and the other end may not read
    for a while (a client process waiting for a CPU). Measured before this (2026-12-02, shared
    2-core VM, CPU pressure 85%): a blocking handover held the sender up to 600 ms, send
    lateness p99 477 ms; with it, 0.31 ms. What cannot go now waits here, its socket kept open,
    until the pair is writable (flush)."""

    def __init__(self, sock: socket.socket):
        sock.setblocking(False)
        self.sock = sock
        self.queue: Deque[Tuple[bytes, Optional[socket.socket]]] = deque()

    def put(self, message: bytes, handed: Optional[socket.socket] = None) -> None:
        """Send `message` (with `handed`'s descriptor, closed here once it went) now or later.
        OSError: the other end is gone."""
        self.queue.append((message, handed))
        self.flush()

    def flush(self) -> None:
        while self.queue:
            message, handed = self.queue[0]
            try:
                send_message(self.sock, message, None if handed is None else handed.fileno())
            except (BlockingIOError, InterruptedError):
                return
            self.queue.popleft()
            if handed is not None:
                handed.close()

    def drop(self) -> None:
        for _message, handed in self.queue:
            if handed is not None:
                handed.close()
        self.queue.clear()


ARRIVAL_POISSON, ARRIVAL_CONSTANT, ARRIVAL_GAMMA = "poisson", "constant", "gamma"
# Gamma gaps (vLLM bench serve's --burstiness, guidellm's and aiperf's bursty arrivals): shape k =
# burstiness, mean 1/rate, so the coefficient of variation of the gaps is 1/sqrt(k): k < 1 is
# burstier than Poisson (clusters of arrivals, then lulls), k = 1 is Poisson, k > 1 is smoother,
# towards constant. Bounded so that a block's draws stay representable and meaningful.
BURSTINESS_MIN, BURSTINESS_MAX = 0.05, 100.0


def check_burstiness(arrival: str, burstiness: float) -> Optional[str]:
    """The message for a burstiness the gamma arrivals cannot use (None: fine). Only gamma
    reads it; another arrival with a burstiness other than 1 is a setting that does nothing."""
    if isinstance(burstiness, bool) or not isinstance(burstiness, (int, float)) \
            or not math.isfinite(burstiness):
        return "burstiness: %r is not a number" % (burstiness,)
    if arrival == ARRIVAL_GAMMA and not BURSTINESS_MIN <= burstiness <= BURSTINESS_MAX:
        return ("burstiness: %g is outside %g..%g (the gamma shape: < 1 burstier than Poisson, "
                "1 Poisson, > 1 smoother)" % (burstiness, BURSTINESS_MIN, BURSTINESS_MAX))
    if arrival != ARRIVAL_GAMMA and burstiness != 1:
        return ("burstiness: %g only shapes gamma arrivals; set arrival: gamma, or leave "
                "burstiness at 1" % burstiness)
    return None


class ArrivalSchedule:
    """Arrival times: constant gaps, or Poisson gaps drawn in blocks of POISSON_BLOCK, one from
    each of the block's equal-probability strata of the exponential distribution, in a shuffled
    order, and scaled so that the block lasts exactly POISSON_BLOCK/rate: each gap is (very
    nearly) exponential with mean 1/rate, as i.i.d. draws are, and the bursts within a block are
    Poisson's, but the offered rate over any window longer than a few blocks is the rate asked
    for (i.i.d. draws miss it by 1/sqrt(N): 3% over 1000 arrivals).

    Gamma gaps (`burstiness` the shape) are drawn i.i.d. in blocks of GAMMA_BLOCK and scaled the
    same way: the bursts are gamma's (one factor per block leaves the gaps' coefficient of
    variation as drawn), the offered rate over each block the one asked for. The block is longer
    than Poisson's: a bursty block's sum is off by about CV/sqrt(k), and a long block keeps the
    factor, and so the gaps' spread across blocks, close to 1."""

    def __init__(self, rate: float, arrival: str, rng, first_ns: int, burstiness: float = 1.0):
        problem = check_burstiness(arrival, burstiness)
        if problem:
            raise ValueError(problem)
        self.rate = rate
        self.constant = arrival == ARRIVAL_CONSTANT
        self.shape = float(burstiness) if arrival == ARRIVAL_GAMMA else None
        self.rng = rng
        self.gaps: List[float] = []
        self.next_ns = first_ns if self.constant else first_ns + int(self.gap() * NS_PER_S)

    def gap(self) -> float:
        if self.constant:
            return 1.0 / self.rate
        if not self.gaps:
            rng = self.rng
            if self.shape is not None:
                k = GAMMA_BLOCK
                gaps = [rng.gammavariate(self.shape, 1.0) for _draw in range(k)]
            else:
                k = POISSON_BLOCK
                gaps = [-math.log(1.0 - (i + rng.random()) / k) for i in range(k)]
            scale = k / self.rate / sum(gaps)
            self.gaps = [g * scale for g in gaps]
            rng.shuffle(self.gaps)
        return self.gaps.pop()

    def advance(self) -> int:
        """The arrival due now; the schedule moves on to the next one."""
        due = self.next_ns
        self.next_ns += int(self.gap() * NS_PER_S)
        return due


def raise_priority() -> str:
    """Real-time (SCHED_FIFO, lowest priority), else nice -10, else as it is: what was allowed."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        return PRIORITY_REALTIME
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
        return PRIORITY_NICE
    except (AttributeError, OSError):
        return PRIORITY_NORMAL


class Sender:
    """The sender process's loop. `make_socket()` returns a new non-blocking, not yet connected
    socket with the client's options set (receive buffer, timestamps); `addr` is the server's.
    `stopped()` reads the level's stop flag; `wire(i)` the request bytes of the i-th arrival."""

    def __init__(self, ctrl: socket.socket, schedule: ArrivalSchedule, cap: int,
                 make_socket: Callable[[], socket.socket], addr, wire: Callable[[int], bytes],
                 stopped: Callable[[], bool], connect_timeout: float,
                 clock: Callable[[], int] = time.monotonic_ns):
        self.ctrl = ctrl
        self.outbox = Outbox(ctrl)
        self.schedule = schedule
        self.cap = cap
        self.make_socket = make_socket
        self.addr = addr
        self.wire = wire
        self.stopped = stopped
        self.connect_timeout_ns = int(connect_timeout * NS_PER_S)
        self.clock = clock
        self.idle: List[socket.socket] = []
        self.connecting: List[Tuple[socket.socket, int]] = []   # (socket, deadline)
        self.out = 0             # connections handed to the client and not yet back
        self.backlog: Deque[int] = deque()     # arrivals due while `cap` were out
        self.count = 0
        self.client_gone = False

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        while not self.client_gone and not self.stopped():
            now = self.clock()
            due = self.schedule.next_ns
            if due <= now:
                self.arrive(self.schedule.advance())
                continue
            if due - now <= QUIET_NS:
                time.sleep((due - now) / NS_PER_S)      # clock_nanosleep: microseconds
                continue
            wait = min((due - now - QUIET_NS) / NS_PER_S, STOP_POLL_S)
            self.serve(wait)
        self.close()

    def serve(self, wait: float) -> None:
        """Wait up to `wait` s for the client's messages and connects finishing; handle them,
        then open spare connections."""
        writers = [s for s, _deadline in self.connecting]
        if self.outbox.queue:
            writers.append(self.ctrl)
        ready, done, _x = select.select([self.ctrl], writers, [], wait)
        if ready:
            self.receive()
        if self.ctrl in done:
            self.tell_later()
        if self.connecting:
            self.settle_connects(set(done))
        self.top_up()

    # -- arrivals ---------------------------------------------------------------------------

    def arrive(self, t_sched: int) -> None:
        """Send the arrival due now: on an idle connection; else on the oldest spare still
        connecting, or a new one, waited for (the wait is lateness); else (`cap` requests out)
        when the client hands one back."""
        if self.idle:
            sock = self.idle.pop()
        elif self.connecting:
            sock = self.finish_connect(*self.connecting.pop(0), t_sched)
        elif self.out < self.cap:
            sock = self.connect_now(t_sched)
        else:
            self.backlog.append(t_sched)
            return
        if sock is not None:
            self.send(sock, t_sched)

    def connect_now(self, t_sched: int) -> Optional[socket.socket]:
        try:
            sock = self.make_socket()
        except OSError as exc:
            self.fail(t_sched, "connect failed: %s" % exc)
            return None
        code = sock.connect_ex(self.addr)
        if code not in (0, errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
            sock.close()
            self.fail(t_sched, "connect failed: %s" % os.strerror(code))
            return None
        return self.finish_connect(sock, self.clock() + self.connect_timeout_ns, t_sched)

    def finish_connect(self, sock, deadline: int, t_sched: int) -> Optional[socket.socket]:
        left = max(0.0, (deadline - self.clock()) / NS_PER_S)
        _r, done, _x = select.select([], [sock], [], left)
        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if done else errno.ETIMEDOUT
        if code:
            sock.close()
            self.fail(t_sched, "connect failed: %s" % os.strerror(code))
            return None
        return sock

    def send(self, sock: socket.socket, t_sched: int) -> None:
        wire = self.wire(self.count)
        self.count += 1
        t_send = self.clock()
        try:
            sent = sock.send(wire)
            if sent < len(wire):            # a request larger than the socket's send buffer
                sock.setblocking(True)
                sock.sendall(wire[sent:])
                sock.setblocking(False)
        except OSError as exc:
            sock.close()
            self.fail(t_sched, "send failed: %s" % exc, t_send)
            return
        self.out += 1
        self.tell(SENT + _TIMES.pack(t_sched, t_send), sock)   # closed once handed over

    def fail(self, t_sched: int, error: str, t_send: Optional[int] = None) -> None:
        t_send = self.clock() if t_send is None else t_send
        self.tell(FAILED + _TIMES.pack(t_sched, t_send) + error.encode("utf-8", "replace")[:512])

    def tell(self, message: bytes, handed: Optional[socket.socket] = None) -> None:
        try:
            self.outbox.put(message, handed)
        except OSError:
            self.client_gone = True

    def tell_later(self) -> None:
        try:
            self.outbox.flush()
        except OSError:
            self.client_gone = True

    # -- the client's messages, spare connections --------------------------------------------

    def receive(self) -> None:
        while True:
            try:
                message, fds = receive_message(self.ctrl)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.client_gone = True
                return
            if not message:
                self.client_gone = True     # the client process ended
                return
            kind = message[:1]
            if kind == BACK and fds:
                self.out -= 1
                sock = socket.socket(fileno=fds[0])
                if self.backlog:
                    self.send(sock, self.backlog.popleft())
                else:
                    self.idle.append(sock)
            elif kind == CLOSED:
                self.out -= 1
                for fd in fds:
                    os.close(fd)
                if self.backlog:
                    t_sched = self.backlog.popleft()
                    sock = self.connect_now(t_sched)
                    if sock is not None:
                        self.send(sock, t_sched)

    def settle_connects(self, done) -> None:
        now = self.clock()
        still = []
        for sock, deadline in self.connecting:
            if sock in done:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    sock.close()            # a spare that failed: the next arrival will say why
                else:
                    self.idle.append(sock)
            elif now > deadline:
                sock.close()
            else:
                still.append((sock, deadline))
        self.connecting = still

    def top_up(self) -> None:
        """Open spare connections (non-blocking) up to SPARE_CONNECTIONS idle, within the cap."""
        while (len(self.idle) + len(self.connecting) < SPARE_CONNECTIONS
               and self.out + len(self.idle) + len(self.connecting) < self.cap):
            try:
                sock = self.make_socket()
            except OSError:
                return
            code = sock.connect_ex(self.addr)
            if code == 0:
                self.idle.append(sock)
            elif code in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
                self.connecting.append((sock, self.clock() + self.connect_timeout_ns))
            else:
                sock.close()
                return

    def close(self) -> None:
        self.outbox.drop()
        for sock in self.idle:
            sock.close()
        for sock, _deadline in self.connecting:
            sock.close()
        self.idle, self.connecting = [], []


def sender_process(ctrl: socket.socket, build: Callable[[], Sender]) -> None:
    """The forked sender's body: priority up, collector off (it allocates next to nothing), run.
    Never returns: the fork must not run the client's code on the way out."""
    code = 0
    try:
        priority = raise_priority()
        gc.collect()
        gc.freeze()
        gc.disable()
        sender = build()
        sender.tell(PRIORITY + priority.encode())
        sender.run()
    except BaseException:  # noqa: BLE001 - the client sees the pair close and reports it
        code = 1
        traceback.print_exc()       # on the client's stderr (the module's, never its stdout)
    finally:
        os._exit(code)
