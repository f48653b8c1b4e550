"""The open loop's sender process (loadgen/sender.py), driven step by step on a fake clock against
a loopback listener: what it sends, on which connection, and what it tells the client. No timing
assertions: the clock is the test's."""
from __future__ import annotations

import asyncio
import random
import select
import socket

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import sender as sd
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (
    RxStampTransport, new_socket,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.stream import StreamConnection
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.client import _Client
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import RX_USER


class Clock:
    def __init__(self):
        self.now = 1_000_000_000

    def __call__(self):
        return self.now


@pytest.fixture()
def rig():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    client_end, sender_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    clock = Clock()
    schedule = sd.ArrivalSchedule(100.0, "constant", random.Random(1), clock.now)
    stop = []
    sender = sd.Sender(sender_end, schedule, 2,
                       lambda: new_socket(socket.AF_INET, None, RX_USER),
                       listener.getsockname(), lambda i: b"request %d\n" % i,
                       lambda: bool(stop), 5.0, clock=clock)
    yield sender, client_end, listener, clock, stop
    sender.close()
    for s in (listener, client_end, sender_end):
        s.close()


def messages(sock):
    """Every message waiting on the client's end: (kind, t_sched, t_send, fds or text)."""
    got = []
    while True:
        try:
            message, fds = sd.receive_message(sock)
        except BlockingIOError:
            return got
        times = sd._TIMES.unpack_from(message, 1) if message[:1] in (sd.SENT, sd.FAILED) else ()
        got.append((message[:1],) + tuple(times) + (fds or message[17:].decode(),))


def served(listener, count):
    """Accept `count` connections; what arrived on those with something to read."""
    peers = [listener.accept()[0] for _i in range(count)]
    readable, _w, _x = select.select(peers, [], [], 5)
    lines = [p.recv(100) for p in readable]
    for p in peers:
        p.close()
    return lines


def test_arrival_sent_on_a_spare_connection_and_handed_over_with_its_times(rig):
    sender, client_end, listener, clock, _stop = rig
    sender.top_up()                       # spare connections within the cap (2)
    assert len(sender.idle) + len(sender.connecting) == 2
    due = sender.schedule.advance()
    clock.now = due + 250_000             # the sender woke 0.25 ms late
    sender.arrive(due)
    (kind, t_sched, t_send, fds), = messages(client_end)
    assert kind == sd.SENT and t_sched == due and t_send == clock.now and len(fds) == 1
    handed = socket.socket(fileno=fds[0])
    assert handed.getpeername() == listener.getsockname()
    assert sender.out == 1
    # The server got the first request's bytes on one of the connections.
    assert b"request 0\n" in served(listener, 2)
    handed.close()


def test_idle_connection_handed_back_is_reused_and_the_cap_queues_arrivals(rig):
    sender, client_end, listener, clock, _stop = rig
    sender.arrive(sender.schedule.advance())
    sender.arrive(sender.schedule.advance())
    first, second = messages(client_end)
    assert sender.out == 2 and not sender.idle
    late_due = sender.schedule.advance()
    clock.now = late_due
    sender.arrive(late_due)               # cap 2 reached: it waits, its due time kept
    assert list(sender.backlog) == [late_due] and messages(client_end) == []
    # The client hands the first connection back: the queued arrival goes out on it at once.
    back = socket.socket(fileno=first[3][0])
    sd.send_message(client_end, sd.BACK, back.fileno())
    back.close()
    clock.now = late_due + 3_000_000
    sender.receive()
    (kind, t_sched, t_send, fds), = messages(client_end)
    assert kind == sd.SENT and t_sched == late_due and t_send == late_due + 3_000_000
    reused = socket.socket(fileno=fds[0])
    peers = [listener.accept()[0] for _i in range(2)]
    local = {reused.getsockname()}
    assert any(p.getpeername() in local for p in peers)    # the same connection, reused
    assert sender.out == 2 and not sender.backlog
    for s in peers + [reused, socket.socket(fileno=second[3][0])]:
        s.close()


def test_closed_connection_frees_its_slot_and_a_failed_connect_is_reported(rig):
    sender, client_end, listener, clock, _stop = rig
    sender.cap = 1
    sender.arrive(sender.schedule.advance())
    (_kind, _t, _s, fds), = messages(client_end)
    socket.socket(fileno=fds[0]).close()
    sd.send_message(client_end, sd.CLOSED)
    sender.receive()
    assert sender.out == 0
    listener.close()                      # nothing listens any more: connects fail
    due = sender.schedule.advance()
    sender.arrive(due)
    (kind, t_sched, _t_send, text), = messages(client_end)
    assert kind == sd.FAILED and t_sched == due and text.startswith("connect failed")
    assert sender.out == 0


def test_sender_loop_ends_at_the_stop_flag_and_when_the_client_is_gone(rig):
    sender, client_end, _listener, _clock, stop = rig
    stop.append(1)
    sender.run()                          # returns at once: the level is over
    assert sender.idle == [] and sender.connecting == []
    stop.clear()
    client_end.close()
    sender.receive()
    assert sender.client_gone


def test_schedule_constant_and_interleaved():
    sch = sd.ArrivalSchedule(50.0, "constant", random.Random(1), 7)
    assert [sch.advance() for _i in range(3)] == [7, 7 + 20_000_000, 7 + 40_000_000]


def test_tls_endpoints_keep_the_in_loop_sender():
    def client(url):
        cfg = LevelConfig(base_url=url, model="m", load_mode="rate", request_rate=10.0)
        return _Client(cfg, 0, 1, [], [b"x"], None)
    assert client("http://127.0.0.1:9")._uses_sender()
    assert not client("https://127.0.0.1:9")._uses_sender()


def test_detached_transport_leaves_the_socket_open_without_connection_lost():
    loop = asyncio.new_event_loop()
    a, b = socket.socketpair()
    try:
        lost = []
        conn = StreamConnection("openai_chat", lambda c, r: None, lost.append)
        transport = RxStampTransport(loop, a, conn)
        assert transport.detach() is a
        loop.run_until_complete(asyncio.sleep(0))
        assert lost == [] and a.fileno() >= 0
        b.send(b"x")
        assert a.recv(1) == b"x"          # still connected, ours to hand on
    finally:
        a.close()
        b.close()
        loop.close()


def test_outbox_never_waits_for_a_client_that_does_not_read():
    """The pair takes what its send buffer holds (a few hundred unread messages): the rest wait
    in the outbox, sockets open, and go in order once the other end reads."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    outbox = sd.Outbox(mine)
    count = 400                 # more than the 278 the default send buffer holds
    handed = [socket.socket() for _i in range(count)]
    try:
        for i, sock in enumerate(handed):
            outbox.put(sd.SENT + b"%d" % i, sock)     # returns at once, however many
        assert outbox.queue                           # more than the pair would take
        got = []
        while len(got) < count:
            try:
                message, fds = sd.receive_message(theirs)
            except BlockingIOError:
                outbox.flush()
                continue
            got.append(message)
            for fd in fds:
                socket.socket(fileno=fd).close()
        assert got == [sd.SENT + b"%d" % i for i in range(count)] and not outbox.queue
        assert all(s.fileno() == -1 for s in handed)    # closed once handed over
    finally:
        for s in handed + [mine, theirs]:
            s.close()
