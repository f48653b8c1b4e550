"""Connections to the server being measured: the endpoint, the request body, connecting (the
stream parser that times every chunk of an answer, StreamConnection, is loadgen/stream.py).

Standard library only (it runs on bare bench clients). Written as an asyncio.Protocol rather than
streams, because the cost per streamed token is what limits a Python client: the bytes of a read
are handled in one callback, with `bytes.find` and no coroutine switch per chunk. The clock is read
once per socket read: every chunk in that read arrived at that moment.

Timing rules (docs/architecture.md, 'Measurement'): t_send is taken immediately before
`transport.write` (which, on an idle connection, hands the bytes to the kernel within the call);
t_first/t_last are the arrival of the first/last chunk that carried generated tokens.

Arrival times come from the kernel where it can give them (`rx_timestamps: kernel`, Linux, plain
TCP): the connection reads with recvmsg and SO_TIMESTAMPNS, and a read's time is when the kernel
received its last segment, not when the event loop got round to the socket. With C streams busy,
one loop iteration serves many sockets, and the wait for the turn (milliseconds at C=256 on a
shared core) was the largest part of the TTFT a client adds. The kernel's clock is
CLOCK_REALTIME; it is brought onto CLOCK_MONOTONIC by its age at the read (realtime now minus the
stamp), so a clock step between the two costs at most that read's stamp (an age out of range
falls back to the read time). TLS connections, other platforms and `rx_timestamps: user` take
the time at the read, as before.

APIs:
- openai_chat / openai_completions: `stream_options: {include_usage, continuous_usage_stats}`;
  per-chunk cumulative `usage.completion_tokens` (SGLang, vLLM) gives per-chunk token counts.
  Without it, chunks are counted and ITL is inter-chunk (labelled by metrics.py).
- sglang_generate: SGLang's native `/generate`; every chunk has `meta_info.completion_tokens`.
"""
from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import List, Optional
from urllib.parse import urlsplit

from ansible_collections.servelab.serving.plugins.module_utils.netstamp import (
    ANCILLARY, enable_rx_stamps, kernel_stamps_possible, stamp_from_ancdata,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import RX_KERNEL, RX_USER

# The APIs' names and paths (apis.py); re-exported: they were defined here first.
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.apis import (  # noqa: F401
    API_OPENAI_CHAT, API_OPENAI_COMPLETIONS, API_PATHS, API_SGLANG_GENERATE, APIS,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.stream import StreamConnection

_monotonic_ns = time.monotonic_ns

RX_MODES = (RX_KERNEL, RX_USER)             # the option's choices, in results.levels' words


class Endpoint:
    """Where requests go: host, port, TLS, the API path and fixed headers."""

    def __init__(self, base_url: str, api: str, api_key: Optional[str] = None):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "base_url %r: expected http://HOST:PORT (the server root, e.g. "
                "http://127.0.0.1:30000)" % (base_url,))
        if api not in APIS:
            raise ValueError("api %r: expected one of %s" % (api, ", ".join(APIS)))
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        root = parts.path.rstrip("/")
        # Accept ".../v1" as well as the root: the API paths add /v1 themselves.
        if root.endswith("/v1"):
            root = root[:-3]
        self.root = root
        self.api = api
        self.path = root + API_PATHS[api]
        host_header = self.host if parts.port is None else "%s:%d" % (self.host, self.port)
        auth = "Authorization: Bearer %s\r\n" % api_key if api_key else ""
        self._head_template = (
            "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            "Accept: text/event-stream\r\nConnection: keep-alive\r\n%s"
            "Content-Length: %%d\r\n\r\n" % (self.path, host_header, auth))

    def url(self, path: str) -> str:
        return "%s://%s:%d%s%s" % ("https" if self.tls else "http", self.host, self.port,
                                   self.root, path)

    def wire(self, body: bytes) -> bytes:
        """The full request bytes (head + body), built once per prompt."""
        return (self._head_template % len(body)).encode("latin-1") + body


def request_body(api: str, model: str, prompt, max_tokens: int, ignore_eos: bool,
                 extra_body: Optional[dict] = None, per_chunk_usage: bool = True) -> bytes:
    """JSON body of one streaming request. `prompt` has .messages (chat) and .text."""
    if api == API_SGLANG_GENERATE:
        sampling = {"max_new_tokens": int(max_tokens)}
        if ignore_eos:
            sampling["ignore_eos"] = True
        extra = dict(extra_body or {})
        sampling.update(extra.pop("sampling_params", {}) or {})
        body = {"text": prompt.text, "sampling_params": sampling, "stream": True}
        body.update(extra)
    else:
        # include_usage is OpenAI's; continuous_usage_stats (vLLM, SGLang) is sent only when
        # asked, so per_chunk_usage: false leaves a strict server nothing to refuse.
        options = {"include_usage": True}
        if per_chunk_usage:
            options["continuous_usage_stats"] = True
        body = {"model": model, "max_tokens": int(max_tokens), "stream": True,
                "stream_options": options}
        if api == API_OPENAI_CHAT:
            body["messages"] = prompt.messages
        else:
            body["prompt"] = prompt.text
        if ignore_eos:
            body["ignore_eos"] = True
        body.update(extra_body or {})
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


class RxStats:
    """Reads of one client process, and how many of them the kernel stamped."""
    __slots__ = ("reads", "kernel_reads")

    def __init__(self):
        self.reads = 0
        self.kernel_reads = 0

    @property
    def mode(self) -> str:
        """RX_KERNEL when every read had the kernel's stamp, else RX_USER."""
        return RX_KERNEL if self.reads and self.kernel_reads == self.reads else RX_USER


class RxStampTransport:
    """A plain-TCP asyncio transport for one StreamConnection that reads with recvmsg_into and
    hands each read to the protocol with the kernel's receive time of its last segment
    (`buffer_updated_at`). Writes go straight to the socket (requests are small; a partial write
    waits for writability). The surface the load generator uses: write, close, abort,
    is_closing, get_extra_info; connection_lost is called soon after a close, as asyncio does."""

    def __init__(self, loop, sock: socket.socket, protocol: StreamConnection,
                 stats: Optional[RxStats] = None):
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._stats = stats if stats is not None else RxStats()
        self._wbuf = bytearray()
        self._closing = False
        self._lost_scheduled = False
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._read_ready)

    # -- reading ----------------------------------------------------------------------------

    def _read_ready(self):
        protocol = self._protocol
        try:
            nbytes, ancdata, _flags, _addr = self._sock.recvmsg_into(
                [protocol.get_buffer(-1)], ANCILLARY)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        now = _monotonic_ns()
        if not nbytes:
            self._force_close(None)         # EOF: the protocol settles a close-framed body
            return
        stats = self._stats
        stats.reads += 1
        stamp = stamp_from_ancdata(ancdata, now)
        if stamp is None:
            stamp = now
        else:
            stats.kernel_reads += 1
        protocol.buffer_updated_at(nbytes, stamp, now)

    # -- writing ----------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._closing:
            return
        if not self._wbuf:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._force_close(exc)
                return
            if sent == len(data):
                return
            data = data[sent:]
            self._loop.add_writer(self._fd, self._write_ready)
        self._wbuf.extend(data)

    def _write_ready(self):
        try:
            sent = self._sock.send(self._wbuf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        del self._wbuf[:sent]
        if not self._wbuf:
            self._loop.remove_writer(self._fd)

    # -- closing ----------------------------------------------------------------------------

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._force_close(None)

    def abort(self) -> None:
        self._force_close(None)

    def detach(self) -> socket.socket:
        """Stop serving the socket and return it, open, without a connection_lost (the open
        loop hands an idle connection back to its sender process)."""
        self._stop_serving()
        return self._sock

    def _stop_serving(self) -> None:
        """No more reads or writes through this transport (a close, or a hand-back)."""
        self._closing = True
        self._lost_scheduled = True
        self._loop.remove_reader(self._fd)
        if self._wbuf:
            self._wbuf.clear()
            self._loop.remove_writer(self._fd)

    def _force_close(self, exc) -> None:
        if self._lost_scheduled:
            return
        self._stop_serving()
        self._loop.call_soon(self._connection_lost, exc)

    def _connection_lost(self, exc) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()

    def get_extra_info(self, name: str, default=None):
        if name == "socket":
            return self._sock
        if name == "peername":
            try:
                return self._sock.getpeername()
            except OSError:
                return default
        return default


async def open_connection(loop, endpoint: Endpoint, api: str, on_done, on_lost,
                          timeout: float, rcvbuf: Optional[int] = None,
                          rx_timestamps: str = RX_KERNEL,
                          rx_stats: Optional[RxStats] = None) -> StreamConnection:
    """Connect one StreamConnection. `rcvbuf` caps the socket's receive buffer (set before the
    connect, so the TCP window follows it): a flood of chunks then waits in the server, not in
    megabytes of kernel buffer between the server's emission and the client's timestamp.
    `rx_timestamps` kernel: plain TCP on Linux reads through RxStampTransport (module docstring);
    `rx_stats` counts its reads and stamped reads."""
    ssl_ctx = None
    if endpoint.tls:
        import ssl
        ssl_ctx = ssl.create_default_context()
    conn = StreamConnection(api, on_done, on_lost)
    stamped = rx_timestamps == RX_KERNEL and ssl_ctx is None and kernel_stamps_possible()

    async def connect():
        if not rcvbuf and not stamped:
            return await loop.create_connection(lambda: conn, endpoint.host, endpoint.port,
                                                ssl=ssl_ctx)
        infos = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
        family, kind, proto, _canonname, addr = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            if rcvbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(rcvbuf))
            sock.setblocking(False)
            await loop.sock_connect(sock, addr)
        except BaseException:
            sock.close()
            raise
        if stamped and _enable_stamps(sock):
            return RxStampTransport(loop, sock, conn, rx_stats), conn
        if rx_stats is not None:
            rx_stats.reads += 1     # a connection read at user time: the level is not "kernel"
        return await loop.create_connection(lambda: conn, sock=sock, ssl=ssl_ctx,
                                            server_hostname=endpoint.host if ssl_ctx else None)

    if not rcvbuf and not stamped and rx_stats is not None:
        rx_stats.reads += 1
    await asyncio.wait_for(connect(), timeout)
    return conn


def adopt_socket(loop, sock: socket.socket, api: str, on_done, on_lost,
                 rx_stats: Optional[RxStats] = None) -> StreamConnection:
    """A StreamConnection over a connected plain-TCP socket made elsewhere (the open loop's
    sender process, new_socket): read through RxStampTransport, with the kernel's stamps when
    the socket has them enabled (rx_stats counts which)."""
    conn = StreamConnection(api, on_done, on_lost)
    RxStampTransport(loop, sock, conn, rx_stats)
    return conn


def new_socket(addr_family: int, rcvbuf: Optional[int], rx_timestamps: str) -> socket.socket:
    """A non-blocking TCP socket set up as open_connection sets up its own (receive buffer
    before the connect; no Nagle; kernel receive stamps for `rx_timestamps: kernel`)."""
    sock = socket.socket(addr_family, socket.SOCK_STREAM)
    try:
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(rcvbuf))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if rx_timestamps == RX_KERNEL and kernel_stamps_possible():
            enable_rx_stamps(sock)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _enable_stamps(sock: socket.socket) -> bool:
    """Kernel receive timestamps (and no Nagle, as asyncio's own transports set) on sock."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        enable_rx_stamps(sock)
    except OSError:
        return False
    return True


def http_get(url: str, timeout: float = 5.0) -> str:
    """Small blocking GET (for /metrics scrapes from the controller process).

    Straight to the server, as the streaming connections go: no proxy from the environment, no
    redirects (the scrape must reach the server being measured). HTTP errors raise OSError.
    """
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL: %r" % url)
    factory = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = factory(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("GET", (parts.path or "/") + ("?" + parts.query if parts.query else ""))
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    if resp.status >= 400:
        raise OSError("GET %s: HTTP %d %s" % (url, resp.status, resp.reason))
    return body.decode("utf-8", "replace")


__all__: List[str] = [
    "Endpoint", "StreamConnection", "request_body", "open_connection", "http_get", "APIS",
    "RxStampTransport", "RxStats", "RX_KERNEL", "RX_USER", "RX_MODES",
    "API_OPENAI_CHAT", "API_OPENAI_COMPLETIONS", "API_SGLANG_GENERATE",
]
