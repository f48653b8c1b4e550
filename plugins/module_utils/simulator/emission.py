"""How the server emits: chunks, stream ends, whole responses, errors and truth records (a
mixin of SimServer, which sets every attribute used here). Standard library only."""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict

from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import EXIT_DIE_AFTER
from ansible_collections.servelab.serving.plugins.module_utils.simulator.requests import SimRequest, _dumps, _error_obj
from ansible_collections.servelab.serving.plugins.module_utils.simulator.tokens import token_text


class Emission:
    """SimServer's emission methods (see the module docstring)."""

    def _emit(self, req: SimRequest, k: int) -> None:
        """Send k more tokens of req now (one chunk), then finish, fail or stall as planned."""
        if req.finished or k <= 0:
            return
        if self._health_waiters:
            for waiter in self._health_waiters:
                if not waiter.done():
                    waiter.set_result(True)
            self._health_waiters.clear()
        t = time.monotonic_ns()
        pos = req.emitted
        req.emitted = pos + k
        req.chunk_ns.append(t)
        req.chunk_tokens.append(k)
        if req.t_first_ns is None:
            req.t_first_ns = t
            if not req.internal:
                self.first_chunks += 1
        req.t_last_ns = t
        text = token_text(req.text_seed + pos, k)
        last = req.emitted >= req.target
        failing = 0 < req.fail_at <= req.emitted and not last
        if req.stream:
            payload = self._chunk_payload(req, text, pos == 0, last)
            if req.malformed_at and pos == 0:
                payload += (f'data: {{"id":"{req.id}","object":"broken","choices":[{{"index":0,'
                            f'"delta":{{"content":"').encode() + b"\n\n"
                req.malformed = 1
            if last:
                self._end_stream(req, payload)
            else:
                req.proto.stream_write(payload)
        else:
            req.pieces.append(text)
        if last:
            self._finish(req, sent=True)
        elif failing:
            self._finish_error(req, "simulated failure (--error-rate): stream aborted", send=True)
        elif req.stall_at and req.emitted >= req.stall_at and not req.stall_until:
            req.stall_until = self.loop.time() + self.cfg.stall_ms / 1000.0
        if (self.cfg.die_after and not req.internal and pos == 0
                and self.first_chunks >= self.cfg.die_after):
            self._die()

    def _chunk_payload(self, req: SimRequest, text: str, first: bool, last: bool) -> bytes:
        if req.api == "generate":
            req.pieces.append(text)
            meta = self._meta_info(req, last)
            return b"data: " + _dumps({"text": "".join(req.pieces), "meta_info": meta}
                                      ).encode() + b"\n\n"
        if req.continuous_usage:
            # the suffix ends with the chunk object's closing brace: put usage before it
            body = (req.prefix + text.encode() + req.suffix[:-3] + b',"usage":'
                    + _dumps(self._usage(req)).encode() + b"}\n\n")
        else:
            body = req.prefix + text.encode() + req.suffix
        if first and req.api == "chat":
            body = (req.prefix[:-len(b'"content":"')] + b'"role":"assistant","content":""'
                    + b'},"logprobs":null,"finish_reason":null}]}\n\n' + body)
        return body

    def _meta_info(self, req: SimRequest, last: bool) -> Dict[str, Any]:
        meta: Dict[str, Any] = {"id": req.id, "finish_reason": None,
                                "prompt_tokens": req.prompt_tokens,
                                "completion_tokens": req.emitted, "cached_tokens": 0}
        if self.p.speculative:
            meta["spec_verify_ct"] = req.verify_ct
        if last:
            meta["finish_reason"] = ({"type": "length", "length": req.emitted}
                                     if req.finish_reason == "length"
                                     else {"type": "stop", "matched": None})
            meta["e2e_latency"] = (time.monotonic_ns() - req.t_recv_ns) / 1e9
        return meta

    def _usage(self, req: SimRequest) -> Dict[str, int]:
        return {"prompt_tokens": req.prompt_tokens, "completion_tokens": req.emitted,
                "total_tokens": req.prompt_tokens + req.emitted}

    def _end_stream(self, req: SimRequest, payload: bytes) -> None:
        """Last content chunk + finish chunk (+ usage) + [DONE], one write."""
        tail = b""
        if req.api != "generate":
            base = {"id": req.id, "object": "chat.completion.chunk" if req.api == "chat"
                    else "text_completion", "created": req.created, "model": self.cfg.model_name}
            choice = ({"index": 0, "delta": {}, "logprobs": None,
                       "finish_reason": req.finish_reason} if req.api == "chat" else
                      {"index": 0, "text": "", "logprobs": None,
                       "finish_reason": req.finish_reason})
            tail += b"data: " + _dumps(dict(base, choices=[choice])).encode() + b"\n\n"
            if req.include_usage:
                tail += (b"data: " + _dumps(dict(base, choices=[], usage=self._usage(req)))
                         .encode() + b"\n\n")
        tail += b"data: [DONE]\n\n"
        req.proto.end_stream(payload + tail)

    def _finish(self, req: SimRequest, sent: bool = False) -> None:
        """Normal end: send what is left (non-stream body; stream tail unless `sent`)."""
        if req.finished:
            return
        req.finished = True
        if req.future is not None and not req.future.done():
            req.future.set_result(True)
        if req.internal:
            return
        self.inflight.discard(req)
        self.stats.num_requests_total += 1
        if req.stream and not sent:
            self._end_stream(req, b"")
        elif not req.stream:
            self._respond_whole(req)
        self._record(req)

    def _respond_whole(self, req: SimRequest) -> None:
        text = "".join(req.pieces)
        if req.api == "generate":
            obj = {"text": text, "meta_info": self._meta_info(req, True)}
        elif req.api == "chat":
            obj = {"id": req.id, "object": "chat.completion", "created": req.created,
                   "model": self.cfg.model_name,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": req.finish_reason}],
                   "usage": self._usage(req)}
        else:
            obj = {"id": req.id, "object": "text_completion", "created": req.created,
                   "model": self.cfg.model_name,
                   "choices": [{"index": 0, "text": text, "logprobs": None,
                                "finish_reason": req.finish_reason}],
                   "usage": self._usage(req)}
        req.proto.respond_json(200, obj, extra=f"X-Request-Id: {req.id}\r\n")

    def _finish_error(self, req: SimRequest, message: str, send: bool) -> None:
        if req.finished:
            return
        req.finished = True
        req.error = message
        if req.future is not None and not req.future.done():
            req.future.set_result(False)
        if req.internal:
            return
        self.inflight.discard(req)
        self.stats.requests_failed_total += 1
        proto = req.proto
        if send and proto is not None and not proto.closed:
            if req.stream and req.fail_at >= 0:
                err = {"error": {"message": message, "type": "InternalServerError", "code": 500}}
                proto.end_stream(b"data: " + _dumps(err).encode() + b"\n\ndata: [DONE]\n\n")
            else:
                proto.respond_json(500, _error_obj(500, message),
                                   extra=f"X-Request-Id: {req.id}\r\n")
        self._record(req)

    def _record(self, req: SimRequest) -> None:
        self.truth.add({
            "id": req.id, "api": req.api, "stream": req.stream, "t_recv_ns": req.t_recv_ns,
            "t_arrive_ns": req.t_recv_ns if req.t_arrive_ns is None else req.t_arrive_ns,
            "arrive_basis": "read" if req.t_arrive_ns is None else "kernel",
            "t_admit_ns": req.t_admit_ns, "t_first_ns": req.t_first_ns, "t_last_ns": req.t_last_ns,
            "chunk_ns": req.chunk_ns, "chunk_tokens": req.chunk_tokens,
            "prompt_tokens": req.prompt_tokens, "completion_tokens": req.emitted,
            "target_tokens": req.target,
            "finish_reason": None if req.error else req.finish_reason, "error": req.error,
            "malformed_chunks": req.malformed,
            "stalled_ms": self.cfg.stall_ms if req.stall_until else 0.0,
            "spec_verify_ct": req.verify_ct if self.p.speculative else None,
        })

    def _die(self) -> None:
        for req in list(self.inflight):
            req.finished = True
            req.error = "server died (--die-after)"
            self._record(req)
        self.truth.close()
        sys.stdout.flush()
        sys.stderr.write(f"servelab-simulator: --die-after {self.cfg.die_after} reached, "
                         f"exiting\n")
        sys.stderr.flush()
        os._exit(EXIT_DIE_AFTER)
