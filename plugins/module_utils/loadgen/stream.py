"""The HTTP/1.1 response and SSE stream parser of one keep-alive connection: StreamConnection,
an asyncio protocol that times every chunk of a streamed LLM answer. Stdlib only.

Written as an asyncio.Protocol rather than streams, because the cost per streamed token is what
limits a Python client: the bytes of a read are handled in one callback, with `bytes.find` and
no coroutine switch per chunk. The clock is read once per socket read: every chunk in that read
arrived at that moment (or at the kernel's receive stamp, through http.RxStampTransport).
Connections are opened by http.open_connection / http.adopt_socket; the timing rules and the
APIs' chunk formats are described in http.py.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Callable, Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.apis import API_OPENAI_CHAT, API_SGLANG_GENERATE
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    RequestTiming, TOKENS_CHUNKS, TOKENS_SERVER,
)

_monotonic_ns = time.monotonic_ns
_COMPLETION_TOKENS = b'"completion_tokens":'
_CT_VALUE = re.compile(rb'"completion_tokens":\s*(\d+)')
_MAX_ERROR_BODY = 4096

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
