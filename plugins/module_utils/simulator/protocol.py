"""HTTP/1.1 for the simulator server: parsing, keep-alive, chunked streams. Standard library
only."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Optional, Protocol, Set

from ansible_collections.servelab.serving.plugins.module_utils.simulator.listener import _StampedSocket
from ansible_collections.servelab.serving.plugins.module_utils.simulator.requests import SimRequest, _dumps, _error_obj


class RequestDispatcher(Protocol):
    """What a connection needs of the server (SimServer): the server imports this module, so the
    connection names only this interface, not the server, and the import graph stays a tree."""

    connections: Set[HttpProtocol]

    def client_gone(self, request: Optional[SimRequest]) -> None: ...

    def dispatch(self, conn: HttpProtocol, method: str, path: str, headers: Any, body: bytes,
                 t_recv_ns: int, t_arrive_ns: Optional[int] = None) -> None: ...


class HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; one request at a time per connection (pipelined requests wait
    in the buffer); chunked transfer encoding for streams."""

    MAX_HEAD = 64 * 1024
    MAX_BODY = 64 * 1024 * 1024

    def __init__(self, server: RequestDispatcher):
        self.server = server
        self.transport = None
        self.buf = bytearray()
        self.busy = False
        self.closed = False
        self.keep_alive = True
        self.paused = False
        self._resume: Optional[asyncio.Future] = None
        self.active: Optional[SimRequest] = None
        self._sent_continue = False
        self._rx_sock: Optional[_StampedSocket] = None
        self._rx_ns: Optional[int] = None   # the kernel stamp of the read being processed

    # asyncio callbacks
    def connection_made(self, transport):
        self.transport = transport
        self.server.connections.add(self)
        # The transport's socket wrapper keeps the accepted socket as _sock; anything else
        # (another event loop, a wrapper without it) leaves t_arrive_ns at the read time.
        raw = transport.get_extra_info("socket")
        raw = getattr(raw, "_sock", raw)
        self._rx_sock = raw if isinstance(raw, _StampedSocket) else None

    def connection_lost(self, exc):
        self.closed = True
        self.server.connections.discard(self)
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)
        if self.active is not None and not self.active.finished:
            self.server.client_gone(self.active)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)

    async def drain(self):
        if self.paused and not self.closed:
            self._resume = asyncio.get_running_loop().create_future()
            await self._resume

    def data_received(self, data):
        self.buf += data
        if self._rx_sock is not None:
            self._rx_ns = self._rx_sock.rx_ns
        if not self.busy:
            self._process()

    # parsing
    def _process(self):
        while not self.busy and not self.closed:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > self.MAX_HEAD:
                    self._plain_error(431, "request head too large")
                return
            try:
                head = self.buf[:end].decode("latin-1")
                lines = head.split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _colon, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0") or 0)
            except ValueError:
                self._plain_error(400, "malformed HTTP request")
                return
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._plain_error(501, "chunked request bodies are not supported; send "
                                       "Content-Length")
                return
            if length < 0 or length > self.MAX_BODY:
                self._plain_error(413, f"body must be 0..{self.MAX_BODY} bytes")
                return
            if len(self.buf) < end + 4 + length:
                if (headers.get("expect", "").lower() == "100-continue"
                        and not self._sent_continue):
                    self._sent_continue = True
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            t_recv_ns = time.monotonic_ns()
            # The stamp is this request's arrival only for the first request the read completed
            # (a pipelined one behind it, or one processed from the buffer later, has none).
            t_arrive_ns, self._rx_ns = self._rx_ns, None
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            self._sent_continue = False
            conn = headers.get("connection", "").lower()
            self.keep_alive = ("close" not in conn) if version == "HTTP/1.1" \
                else ("keep-alive" in conn)
            self.busy = True
            self.server.dispatch(self, method, target.split("?", 1)[0], headers, body, t_recv_ns,
                                 t_arrive_ns)

    # responses
    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def respond(self, status: int, body: bytes, content_type: str = "application/json",
                extra: str = "") -> None:
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}"
                f"Connection: {'keep-alive' if self.keep_alive else 'close'}\r\n\r\n")
        self.write(head.encode("latin-1") + body)
        self.done()

    def respond_json(self, status: int, obj: Any, extra: str = "") -> None:
        self.respond(status, _dumps(obj).encode("utf-8"), extra=extra)

    def start_stream(self, request_id: str) -> None:
        self.write(("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                    f"X-Request-Id: {request_id}\r\n"
                    f"Connection: {'keep-alive' if self.keep_alive else 'close'}\r\n\r\n"
                    ).encode("latin-1"))

    def stream_write(self, payload: bytes) -> None:
        if not self.closed:
            self.transport.write(b"%x\r\n%b\r\n" % (len(payload), payload))

    def end_stream(self, payload: bytes = b"") -> None:
        if not self.closed:
            if payload:
                self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(payload), payload))
            else:
                self.transport.write(b"0\r\n\r\n")
        self.done()

    def done(self) -> None:
        self.active = None
        self.busy = False
        if self.closed:
            return
        if not self.keep_alive:
            self.transport.close()
            return
        if self.buf:
            asyncio.get_running_loop().call_soon(self._process)

    def _plain_error(self, status: int, message: str) -> None:
        self.keep_alive = False
        self.busy = True
        self.respond_json(status, _error_obj(status, message))


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}
