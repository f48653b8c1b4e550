"""The server's listening socket with kernel receive stamps (the conversion is netstamp's).
Standard library only."""
from __future__ import annotations

import socket
import time
from typing import Optional

from ansible_collections.servelab.serving.plugins.module_utils import netstamp

# Kernel receive stamps for the truth's t_arrive_ns. The read time (t_recv_ns) includes however
# long a busy machine kept the server's loop from the socket; the kernel's stamp of the segment
# that completed a request is when the request reached the server, the truth a client's send
# lateness is measured against. asyncio's selector transport reads with its socket's recv(), so
# the listening socket hands out a socket whose recv() is a recvmsg() that keeps the stamp.


class _StampedSocket(socket.socket):
    """An accepted connection whose recv() records the kernel's receive time of the last
    segment it returned, on the monotonic clock (rx_ns; None where the kernel gave none)."""

    __slots__ = ("rx_ns",)

    def recv(self, bufsize, flags=0):
        data, ancdata, _flags, _addr = self.recvmsg(bufsize, netstamp.ANCILLARY, flags)
        self.rx_ns = netstamp.stamp_from_ancdata(ancdata, time.monotonic_ns())
        return data


class _StampingListener(socket.socket):
    """A listening socket (SO_TIMESTAMPNS on, which its connections inherit) whose accept()
    returns _StampedSocket connections."""

    __slots__ = ()

    def accept(self):
        fd, addr = self._accept()
        conn = _StampedSocket(self.family, self.type, self.proto, fileno=fd)
        conn.rx_ns = None
        # Streams are many small writes: never hold one back for an ACK (Nagle).
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr


def stamping_listener(host: str, port: int, backlog: int) -> Optional[socket.socket]:
    """A bound, listening _StampingListener for host:port, or None where the host resolves to
    more than one address or stamps are not possible (the caller then lets asyncio listen)."""
    if not netstamp.kernel_stamps_possible():
        return None
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addrs = {(fam, sa) for fam, _t, _p, _c, sa in infos}
    if len(addrs) != 1:
        return None
    family, sockaddr = addrs.pop()
    # proto IPPROTO_TCP, as asyncio's own listener has: asyncio sets TCP_NODELAY only on sockets
    # whose proto says TCP, and without it a stream of small writes waits for delayed ACKs.
    sock = _StampingListener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # On the listener, not only on each accepted socket: a segment is stamped when it
        # arrives only if some socket wants stamps by then (the kernel switches stamping on a
        # moment after the first socket asks), and a client's first request can arrive before
        # accept() returns. Accepted sockets inherit the option.
        netstamp.enable_rx_stamps(sock)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
