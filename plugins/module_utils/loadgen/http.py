"""One keep-alive HTTP/1.1 connection that streams LLM answers (SSE) and times every chunk.

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
import re
import socket
import struct
import sys
import time
from typing import Callable, List, Optional
from urllib.parse import urlsplit

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    RequestTiming, TOKENS_CHUNKS, TOKENS_SERVER,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import RX_KERNEL, RX_USER

API_OPENAI_CHAT = "openai_chat"
API_OPENAI_COMPLETIONS = "openai_completions"
API_SGLANG_GENERATE = "sglang_generate"
APIS = (API_OPENAI_CHAT, API_OPENAI_COMPLETIONS, API_SGLANG_GENERATE)

API_PATHS = {
    API_OPENAI_CHAT: "/v1/chat/completions",
    API_OPENAI_COMPLETIONS: "/v1/completions",
    API_SGLANG_GENERATE: "/generate",
}

_monotonic_ns = time.monotonic_ns
_realtime_ns = time.time_ns
NS_PER_S = 1_000_000_000

RX_MODES = (RX_KERNEL, RX_USER)             # the option's choices, in results.levels' words
# Linux's SO_TIMESTAMPNS (its control message type is the same number); Python does not export it.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("qq")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
MAX_STAMP_AGE_NS = 10 * NS_PER_S             # older (or negative): the clock was stepped
# A stamp up to this far in the future is clock skew, not a step: on a VM the kernel's stamp
# (taken on the CPU that received the segment) and the vDSO's CLOCK_REALTIME (read on ours) can
# disagree by microseconds, so a read made right after the segment arrived sees a small
# negative age. It is read as "arrived now" instead of losing the level's kernel label.
MAX_CLOCK_SKEW_NS = 1_000_000
_COMPLETION_TOKENS = b'"completion_tokens":'
_CT_VALUE = re.compile(rb'"completion_tokens":\s*(\d+)')
_MAX_ERROR_BODY = 4096


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


# Response parser states
_HEAD, _CHUNKED, _LENGTH, _EOF, _IDLE = range(5)


class StreamConnection(asyncio.BufferedProtocol):
    """A keep-alive connection that runs one streaming request at a time.

    `on_done(conn, request)` is called from inside `data_received` when a response is complete
    (so a closed-loop worker can send its next request in the same callback); `on_lost(conn)`
    when the connection closed. The request's `error` is set on failure."""

    def __init__(self, api: str, on_done: Callable, on_lost: Callable):
        self.api = api
        self.on_done = on_done
        self.on_lost = on_lost
        self.transport = None
        self.req: Optional[RequestTiming] = None
        self.closed = False
        self.reusable = True
        self.last_activity = 0
        self.owner_data = None      # the worker/driver that owns this connection
        self.tokens_seen = 0        # tokens of the request in flight so far (live progress)
        self._state = _IDLE
        if api == API_SGLANG_GENERATE:
            self._event = self._event_generate
            self._text_key = self._fast_key = None
        else:
            self._event = self._event_openai
            self._text_key = b'content":' if api == API_OPENAI_CHAT else b'"text":'
            self._fast_key = self._text_key
        self.read_size = 65536      # bytes per socket read; the owner lowers it at high C
        self._rbuf = None
        self._reset()

    # ---- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.closed = True
        req = self.req
        if req is not None:
            if self._state == _EOF and exc is None:
                self._finish(_monotonic_ns())  # body delimited by close
            else:
                self._fail("connection lost%s" % (": %s" % exc if exc else " (closed by server)"))
        self.on_lost(self)

    def get_buffer(self, sizehint: int):
        # A bounded read per socket per loop iteration: with many busy connections, a large read
        # would make the loop's iteration (and so every other connection's timestamps) late.
        if self._rbuf is None or len(self._rbuf) != self.read_size:
            self._rbuf = memoryview(bytearray(self.read_size))
        return self._rbuf

    def buffer_updated(self, nbytes: int):
        now = _monotonic_ns()
        self.last_activity = now
        data = self._rbuf[:nbytes].tobytes()
        if self._state == _CHUNKED:         # streaming: the common case, one call less
            self._feed_chunked(data, now)
        else:
            self._dispatch(data, now)

    def data_received(self, data: bytes):
        now = _monotonic_ns()
        self.last_activity = now
        self._dispatch(data, now)

    def buffer_updated_at(self, nbytes: int, stamp: int, now: int):
        """buffer_updated, with the arrival time given (RxStampTransport: the kernel's)."""
        self.last_activity = now
        data = self._rbuf[:nbytes].tobytes()
        if self._state == _CHUNKED:
            self._feed_chunked(data, stamp)
        else:
            self._dispatch(data, stamp)

    def _dispatch(self, data: bytes, now: int):
        state = self._state
        if state == _CHUNKED:
            self._feed_chunked(data, now)
        elif state == _HEAD:
            self._feed_head(data, now)
        elif state == _LENGTH:
            self._feed_length(data, now)
        elif state == _EOF:
            self._feed_sse(data, now)
        # _IDLE: stray bytes after a finished response (e.g. a late final CRLF): ignored.

    # ---- sending --------------------------------------------------------------------------

    def send(self, req: RequestTiming, wire: bytes) -> None:
        req.t_send = _monotonic_ns()
        self.adopt(req)
        self.transport.write(wire)

    def adopt(self, req: RequestTiming) -> None:
        """Expect the answer to `req`, whose bytes were written at req.t_send (by send, or by
        the open loop's sender process before it handed the socket over)."""
        self._reset()
        self.req = req
        self._state = _HEAD
        req.chunk_times = []
        req.chunk_tokens = []
        self.last_activity = req.t_send
        self.tokens_seen = 0

    def abort(self, error: str) -> None:
        """Give up the request in flight (level over, stall): record `error`, close."""
        if self.req is not None:
            self._fail(error)
        if self.transport is not None and not self.closed:
            self.transport.abort()

    # ---- response framing -----------------------------------------------------------------

    def _reset(self):
        self._head = b""
        self._cbuf = b""
        self._need = 0
        self._left = 0
        self._sbuf = b""
        self._sep = None
        self._status = 0
        self._error_body = None
        self._cum = 0
        self._per_chunk_ok = True
        self._usage_prompt = None
        self._usage_completion = None
        self._last_payload = None
        self._stream_error = None

    def _feed_head(self, data: bytes, now: int):
        buf = self._head + data if self._head else data
        if buf[:2] == b"\r\n":          # the final CRLF of the previous chunked body
            buf = buf.lstrip(b"\r\n")
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > 65536:
                self._fail("response head larger than 64 KiB")
                self.transport.abort()
                return
            self._head = buf
            return
        head = buf[:end].decode("latin-1")
        rest = buf[end + 4:]
        self._head = b""
        lines = head.split("\r\n")
        try:
            self._status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self._fail("malformed status line %r" % lines[0][:80])
            self.transport.abort()
            return
        chunked = False
        length = None
        for line in lines[1:]:
            name, _colon, value = line.partition(":")
            name = name.strip().lower()
            if name == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            elif name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                self.reusable = False
            elif name == "x-request-id" and self.req is not None:
                # The server's id (SGLang, vLLM, the simulator): joins a record to server logs.
                self.req.server_id = value.strip()
        if self._status != 200:
            self._error_body = []
        if chunked:
            self._state = _CHUNKED
            if rest:
                self._feed_chunked(rest, now)
        elif length is not None:
            self._state = _LENGTH
            self._left = length
            if length == 0:
                self._finish(now)
            elif rest:
                self._feed_length(rest, now)
        else:
            self._state = _EOF
            self.reusable = False
            if rest:
                self._feed_sse(rest, now)

    def _feed_length(self, data: bytes, now: int):
        take = data[:self._left]
        self._left -= len(take)
        self._feed_sse(take, now)
        if self._left <= 0 and self.req is not None:
            self._finish(now)

    def _feed_chunked(self, data: bytes, now: int):
        """HTTP chunked framing. A chunk that lies whole in this read (the common case: servers
        write one SSE event per chunk) is handled in place: a single content event right here
        (the hottest path of all), several events by _scan; partial chunks go through the SSE
        buffer."""
        buf = self._cbuf + data if self._cbuf else data
        self._cbuf = b""
        n = len(buf)
        pos = 0
        need = self._need
        find = buf.find
        fast = self._fast_key
        sep = self._sep
        seplen = len(sep) if sep else 0
        req = self.req
        got = 0
        while pos < n:
            if need:
                if got:
                    self._note_tokens(now, got)
                    got = 0
                take = n - pos if n - pos < need else need
                self._feed_sse(buf[pos:pos + take], now)
                pos += take
                need -= take
                if need or self.req is None:
                    break
                continue
            eol = find(b"\r\n", pos)
            if eol == pos:              # the CRLF that ends the previous chunk's data
                pos += 2
                continue
            if eol < 0:
                self._cbuf = buf[pos:]
                break
            try:
                size = int(buf[pos:eol], 16)
            except ValueError:
                line = buf[pos:eol]
                semi = line.find(b";")     # chunk extensions, practically never sent
                try:
                    size = int(line[:semi] if semi >= 0 else b"x", 16)
                except ValueError:
                    self._need = 0
                    self._fail("malformed chunked encoding")
                    self.transport.abort()
                    return
            if size == 0:
                self._need = 0
                if got:
                    self._note_tokens(now, got)
                if self.req is not None:
                    self._finish(now)
                return
            start = eol + 2
            stop = start + size
            if stop <= n and not self._sbuf and self._error_body is None:
                if (fast and sep and buf.startswith(b"data: ", start)
                        and find(sep, start, stop) == stop - seplen):
                    # exactly one event in this chunk: the content fast path, inline
                    i = find(fast, start + 6, stop)
                    if i >= 0:
                        j = i + len(fast)
                        c = buf[j]
                        if c == 32:
                            j += 1
                            c = buf[j]
                        if (c == 34 and buf[j + 1] != 34 and buf[stop - seplen - 1] == 125
                                and find(b'"usage":{', j, stop) < 0):
                            req.chunk_times.append(now)
                            req.chunk_tokens.append(0)
                            got += 1
                            pos = stop
                            continue
                if got:
                    self._note_tokens(now, got)
                    got = 0
                rest = self._scan(buf, start, stop, now)
                if rest < stop:
                    self._sbuf = buf[rest:stop]    # an event continues in the next chunk
                pos = stop
                if sep is None:
                    sep = self._sep
                    seplen = len(sep) if sep else 0
            else:
                pos = start
                need = size
        if got:
            self._note_tokens(now, got)
        self._need = need

    # ---- SSE events -----------------------------------------------------------------------

    def _feed_sse(self, data: bytes, now: int):
        """SSE bytes that may start or end mid-event: buffer, then scan whole events."""
        if self._error_body is not None:
            if sum(map(len, self._error_body)) < _MAX_ERROR_BODY:
                self._error_body.append(data)
            return
        buf = self._sbuf + data if self._sbuf else data
        rest = self._scan(buf, 0, len(buf), now)
        self._sbuf = buf[rest:] if rest < len(buf) else b""

    def _scan(self, buf: bytes, start: int, end: int, now: int) -> int:
        """Handle every complete SSE event in buf[start:end]; return where the unfinished tail
        begins. The hot loop: content chunks are recognised with bytes.find on the buffer itself
        (no copy, no JSON); anything else goes to the per-event handler."""
        sep = self._sep
        if sep is None:
            lf = buf.find(b"\n\n", start, end)
            crlf = buf.find(b"\r\n\r\n", start, end)
            if lf < 0 and crlf < 0:
                return start
            sep = b"\r\n\r\n" if (crlf >= 0 and (lf < 0 or crlf < lf)) else b"\n\n"
            self._sep = sep
        seplen = len(sep)
        req = self.req
        if req is None:
            return end
        times = req.chunk_times
        toks = req.chunk_tokens
        fast = self._fast_key
        keylen = len(fast) if fast else 0
        generate = self._event == self._event_generate
        got = 0                 # token-carrying chunks seen by the fast path, not yet noted
        seen = 0                # their tokens (1 per chunk where the count is unknown)
        find = buf.find
        while True:
            e = find(sep, start, end)
            if e < 0:
                break
            if buf.startswith(b"data: ", start):
                s = start + 6
                if fast:
                    i = find(fast, s, e)
                    if i >= 0:
                        j = i + keylen
                        c = buf[j]
                        if c == 32:
                            j += 1
                            c = buf[j]
                        if (c == 34 and buf[j + 1] != 34 and buf[e - 1] == 125
                                and find(b'"usage":{', j, e) < 0):
                            # a content chunk without usage: one chunk, token count unknown.
                            # (An event that does not end in '}' is broken JSON: slow path.)
                            times.append(now)
                            toks.append(0)
                            got += 1
                            seen += 1
                            start = e + seplen
                            continue
                elif generate:
                    j = buf.rfind(_COMPLETION_TOKENS, s, e) if buf[e - 1] == 125 else -1
                    m = _CT_VALUE.match(buf, j) if j >= 0 else None
                    if m is not None:
                        # SGLang /generate: cumulative completion_tokens in every chunk
                        self._last_payload = (buf, s, e)
                        cum = int(m.group(1))
                        if cum > self._cum:
                            times.append(now)
                            toks.append(cum - self._cum)
                            seen += cum - self._cum
                            self._cum = cum
                            got += 1
                        start = e + seplen
                        continue
                if got:
                    self._note_tokens(now, seen)
                    got = seen = 0
                self._event(buf[s:e], now)
                if self.req is None:           # the event ended the request
                    return e + seplen
            elif buf.startswith(b"data:", start):
                if got:
                    self._note_tokens(now, seen)
                    got = seen = 0
                self._event(buf[start + 5:e].lstrip(), now)
            else:
                if got:
                    self._note_tokens(now, seen)
                    got = seen = 0
                self._event_lines(buf[start:e], now)
            start = e + seplen
        if got:
            self._note_tokens(now, seen)
        return start

    def _note_tokens(self, now: int, tokens: int):
        """Bookkeeping for the token-carrying chunks the fast path appended (all at `now`)."""
        req = self.req
        if req.t_first is None:
            req.t_first = now
        req.t_last = now
        self.tokens_seen += tokens

    def _event_lines(self, ev: bytes, now: int):
        """An event with several lines (`event:`, `id:`, comments): join its data lines."""
        data = [line[5:].lstrip() for line in ev.replace(b"\r\n", b"\n").split(b"\n")
                if line.startswith(b"data:")]
        if data:
            self._event(b"\n".join(data), now)

    def _token_chunk(self, now: int, k: int):
        req = self.req
        if req.t_first is None:
            req.t_first = now
        req.t_last = now
        req.chunk_times.append(now)
        req.chunk_tokens.append(k)
        self.tokens_seen += k or 1

    def _event_openai(self, p: bytes, now: int):
        """One OpenAI event the fast path did not take: per-chunk usage, role/finish chunks,
        usage, errors, tool calls, [DONE]."""
        if p[:6] == b"[DONE]":
            return
        key = self._text_key
        i = p.find(key)
        if i >= 0 and p.find(b'"usage":{') >= 0:
            j = i + len(key)
            if p[j:j + 1] == b" ":
                j += 1
            if p[j:j + 1] == b'"' and p[j + 1:j + 2] != b'"':
                # content with per-chunk usage (continuous_usage_stats): cumulative count
                m = _CT_VALUE.match(p, max(0, p.rfind(_COMPLETION_TOKENS)))
                if m is not None:
                    cum = int(m.group(1))
                    self._token_chunk(now, cum - self._cum if cum > self._cum else 0)
                    self._cum = max(cum, self._cum)
                    self._usage_completion = self._cum
                    return
        self._event_openai_slow(p, now)

    def _event_openai_slow(self, p: bytes, now: int):
        try:
            obj = json.loads(p)
        except ValueError:
            self._stream_error = "malformed chunk: %r" % p[:120]
            return
        if not isinstance(obj, dict):
            self._stream_error = "unexpected chunk: %r" % p[:120]
            return
        if "error" in obj or obj.get("object") == "error":
            err = obj.get("error", obj)
            msg = err.get("message") if isinstance(err, dict) else err
            self._stream_error = "server error in stream: %s" % (msg or obj,)
            return
        usage = obj.get("usage")
        cum = None
        if isinstance(usage, dict):
            if usage.get("prompt_tokens") is not None:
                self._usage_prompt = int(usage["prompt_tokens"])
            if usage.get("completion_tokens") is not None:
                cum = int(usage["completion_tokens"])
                self._usage_completion = cum
        generated = False
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            if (delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
                    or choice.get("text")):
                generated = True
        if generated:
            grew = cum is not None and cum > self._cum
            self._token_chunk(now, cum - self._cum if grew else 0)
            if grew:
                self._cum = cum
        elif cum is not None and cum > self._cum > 0:
            # Per-chunk usage says tokens arrived with no text (bytes held back by the detokenizer).
            # The final usage-only chunk of a stream without per-chunk usage does not land here:
            # there self._cum stays 0.
            self._token_chunk(now, cum - self._cum)
            self._cum = cum

    def _event_generate(self, p: bytes, now: int):
        """A /generate event without completion_tokens (the fast path takes the others)."""
        if p[:6] == b"[DONE]":
            return
        try:
            obj = json.loads(p)
        except ValueError:
            self._stream_error = "malformed chunk: %r" % p[:120]
            return
        err = obj.get("error") if isinstance(obj, dict) else None
        self._stream_error = "server error in stream: %s" % (
            (err.get("message") if isinstance(err, dict) else err) or p[:200],)

    # ---- completion -----------------------------------------------------------------------

    def _finish(self, now: int):
        req = self.req
        self.req = None
        self._state = _IDLE
        if self._error_body is not None:
            body = b"".join(self._error_body)[:300].decode("utf-8", "replace")
            req.error = "HTTP %d: %s" % (self._status, body.strip() or "(no body)")
        elif self._stream_error is not None:
            req.error = self._stream_error
        elif req.t_first is None:
            req.error = "stream ended without generated tokens"
        self._settle_tokens(req)
        self.on_done(self, req)

    def _settle_tokens(self, req: RequestTiming):
        """Final token counts: the server's, else the labelled chunk-count fallback; keep
        per-chunk counts only when every token-carrying chunk had one."""
        times = req.chunk_times
        toks = req.chunk_tokens
        req.chunks = len(times)
        if self.api == API_SGLANG_GENERATE and self._last_payload is not None:
            buf, start, end = self._last_payload
            try:
                meta = json.loads(buf[start:end]).get("meta_info") or {}
                if meta.get("prompt_tokens") is not None:
                    self._usage_prompt = int(meta["prompt_tokens"])
                if meta.get("completion_tokens") is not None:
                    self._usage_completion = int(meta["completion_tokens"])
                finish = meta.get("finish_reason")
                if isinstance(finish, dict) and finish.get("type") == "abort" and not req.error:
                    req.error = "aborted by server: %s" % (finish.get("message") or finish)
            except (ValueError, AttributeError):
                pass
        req.prompt_tokens = self._usage_prompt
        per_chunk = bool(toks) and all(k > 0 for k in toks)
        if self._usage_completion is not None:
            req.completion_tokens = self._usage_completion
            req.tokens_source = TOKENS_SERVER
        elif times:
            req.completion_tokens = sum(toks) if per_chunk else len(times)
            req.tokens_source = TOKENS_SERVER if per_chunk else TOKENS_CHUNKS
        if not per_chunk:
            req.chunk_tokens = None

    def _fail(self, error: str):
        req = self.req
        if req is None:
            return
        self.req = None
        self._state = _IDLE
        self.reusable = False
        if req.error is None:
            req.error = error
        self._settle_tokens(req)
        self.on_done(self, req)


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


def stamp_from_age(now_ns: int, age_ns: int) -> Optional[int]:
    """A read's arrival on the monotonic clock from its kernel stamp's age (realtime now minus
    the stamp), or None where the age says the clock was stepped (the read time is used)."""
    if -MAX_CLOCK_SKEW_NS <= age_ns < MAX_STAMP_AGE_NS:
        return now_ns - max(age_ns, 0)
    return None


def kernel_stamps_possible() -> bool:
    return sys.platform.startswith("linux") and bool(_ANCILLARY)


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
                [protocol.get_buffer(-1)], _ANCILLARY)
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
        stamp = now
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                sec, nsec = _TIMESPEC.unpack_from(data)
                kernel_stamp = stamp_from_age(now, _realtime_ns() - (sec * NS_PER_S + nsec))
                if kernel_stamp is not None:
                    stamp = kernel_stamp
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
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _enable_stamps(sock: socket.socket) -> bool:
    """Kernel receive timestamps (and no Nagle, as asyncio's own transports set) on sock."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
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
