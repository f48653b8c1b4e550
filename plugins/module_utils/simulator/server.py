"""The simulator server: lifecycle, routes, generation requests and the batched scheduler.
Standard library only."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import operator
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import List, Mapping, Optional

from ansible_collections.servelab.serving.plugins.module_utils.simulator.admission import plan_step
from ansible_collections.servelab.serving.plugins.module_utils.simulator.effects import StepModel
from ansible_collections.servelab.serving.plugins.module_utils.simulator.emission import Emission
from ansible_collections.servelab.serving.plugins.module_utils.simulator.listener import (
    stamping_listener,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    BYTES_PER_TOKEN, DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, PROFILES, VERSION, SimProfile,
    speculation_on, switch_ms,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.protocol import HttpProtocol
from ansible_collections.servelab.serving.plugins.module_utils.simulator.requests import (
    SimRequest, _Draws, _dumps, _error_obj, _Fail, _parse_generate, _parse_openai,
    overhead_factor,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.tokens import (
    _hash_unit, natural_output_tokens, token_text,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.truth import Stats, TruthLog

# The admission rule's view of a request (admission.plan_step): its prompt, whether it ended
# while queued, its prompt tokens still to prefill, and what it holds of the KV pool (its prompt
# and the whole output it will generate).
_prompt_tokens = operator.attrgetter("prompt_tokens")
_finished = operator.attrgetter("finished")
_prefill_left = operator.attrgetter("prefill_left")


def _kv_need(req: SimRequest) -> int:
    return req.prompt_tokens + req.target


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    profile: SimProfile = field(default_factory=lambda: PROFILES["baseline"])
    time_scale: float = 1.0
    model_name: str = "servelab-sim"
    seed: int = 0
    truth_log: Optional[str] = None
    die_after: int = 0
    error_rate: float = 0.0
    stall_every: int = 0
    stall_ms: float = 0.0
    malformed_every: int = 0
    startup_delay: float = 0.0
    health_timeout: float = 20.0
    abort_delay_ms: float = 0.0      # a disconnected client's request runs on this long (wall ms)


class SimServer(Emission):
    def __init__(self, config: ServerConfig):
        self.cfg = config
        self.p = config.profile
        self.ts = config.time_scale
        self.stats = Stats()
        self.truth = TruthLog(config.truth_log)
        self.connections: set = set()
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.started_at = 0.0
        self.ready_at = 0.0
        self.counter = 0                   # generation requests received (faults count these)
        self.first_chunks = 0              # generation requests that sent their first chunk
        self.inflight: set = set()           # client requests not finished yet
        self.ids = 0
        self.model_json = _dumps(config.model_name)
        self.queue: deque = deque()
        self.running: List[SimRequest] = []      # decoding
        self.prefilling: List[SimRequest] = []   # admitted, prompt partly prefilled (chunked)
        self.model = StepModel(self.p) if self.p.mode == "batched" else None
        self._wake: Optional[asyncio.Event] = None
        self._stop: Optional[asyncio.Event] = None
        self._tasks: List[asyncio.Task] = []
        self._health_waiters: List[asyncio.Future] = []
        self._accept_cdf = (self.model.cdf() if self.p.speculative and self.model is not None
                            else None)
        self.host = config.host
        self.port = config.port
        self._server = None

    # ---- lifecycle
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.started_at = self.loop.time()
        self.ready_at = self.started_at + self.cfg.startup_delay
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        listener = stamping_listener(self.cfg.host, self.cfg.port, 2048)
        if listener is not None:
            self._server = await self.loop.create_server(lambda: HttpProtocol(self),
                                                         sock=listener, backlog=2048)
        else:
            self._server = await self.loop.create_server(
                lambda: HttpProtocol(self), self.cfg.host, self.cfg.port, reuse_address=True,
                backlog=2048)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.p.mode == "batched":
            self._tasks.append(self.loop.create_task(self._scheduler()))
        self._tasks.append(self.loop.create_task(self._flusher()))

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop the server cleanly (idempotent)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self.loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - non-main thread
                pass

    async def serve_until_stopped(self) -> None:
        self.install_signal_handlers()
        await self._stop.wait()
        await self.shutdown()

    def _on_signal(self, sig: int) -> None:
        sys.stderr.write(f"servelab-simulator: {signal.Signals(sig).name} received, shutting "
                         f"down ({len(self.inflight)} requests in flight)\n")
        sys.stderr.flush()
        self._stop.set()

    def request_stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    async def shutdown(self) -> None:
        self._server.close()
        for req in list(self.inflight):
            self._finish_error(req, "server shutting down", send=True)
        for task in self._tasks:
            task.cancel()
        for proto in list(self.connections):
            if proto.transport is not None:
                proto.transport.close()
        self.truth.close()

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.truth.flush()

    def ready(self) -> bool:
        return self.loop.time() >= self.ready_at

    # ---- routing
    def dispatch(self, proto: HttpProtocol, method: str, path: str, headers: Mapping[str, str],
                 body: bytes, t_recv_ns: int, t_arrive_ns: Optional[int] = None) -> None:
        try:
            if path in ("/v1/chat/completions", "/v1/completions", "/generate"):
                if method != "POST":
                    raise _Fail(405, f"{path} takes POST")
                self._generation(proto, path, body, t_recv_ns, t_arrive_ns)
                return
            if method not in ("GET", "POST"):
                raise _Fail(405, f"{path} takes GET")
            handler = {"/health": self._health, "/health_generate": self._health_generate,
                       "/v1/models": self._models, "/metrics": self._metrics,
                       "/server_info": self._server_info, "/get_server_info": self._server_info,
                       "/get_model_info": self._model_info, "/model_info": self._model_info
                       }.get(path)
            if handler is None:
                raise _Fail(404, f"no route {path}; see GET /server_info")
            handler(proto)
        except _Fail as exc:
            proto.respond_json(exc.status, _error_obj(exc.status, exc.message, exc.err_type))

    def _health(self, proto):
        if not self.ready():
            proto.respond_json(503, _error_obj(503, "server is starting"))
        else:
            proto.respond(200, b"")

    def _health_generate(self, proto):
        if not self.ready():
            proto.respond_json(503, _error_obj(503, "server is starting"))
            return
        self.loop.create_task(self._health_check(proto))

    async def _health_check(self, proto):
        """Like SGLang: submit a 1-token generation; healthy as soon as the scheduler emits a
        token after the check began (this one's, or another request's on a busy server)."""
        req = self._new_request("generate", False, 1, 1, "length", None, time.monotonic_ns(),
                                internal=True)
        req.future = self.loop.create_future()
        self._health_waiters.append(req.future)
        if self._accept_cdf is not None:
            req.draws = _Draws(self.cfg.seed, "health", self._accept_cdf)
        self._start(req)
        try:
            await asyncio.wait_for(asyncio.shield(req.future), self.cfg.health_timeout)
        except asyncio.TimeoutError:
            if not proto.closed:
                proto.respond_json(503, _error_obj(503, "health generation timed out"))
            return
        finally:
            if req.future in self._health_waiters:
                self._health_waiters.remove(req.future)
        if not proto.closed:
            proto.respond(200, b"")

    def _models(self, proto):
        proto.respond_json(200, {"object": "list", "data": [{
            "id": self.cfg.model_name, "object": "model", "created": int(self.started_wall()),
            "owned_by": "servelab-simulator", "root": self.cfg.model_name,
            "max_model_len": self.kv_pool()}]})

    def _model_info(self, proto):
        proto.respond_json(200, {"model_path": self.cfg.model_name,
                                 "tokenizer_path": self.cfg.model_name, "is_generation": True,
                                 "served_model_name": self.cfg.model_name})

    def kv_pool(self) -> int:
        """Tokens the KV pool holds (effects.kv_pool_tokens)."""
        return self.model.kv_pool if self.model is not None else self.p.kv_capacity_tokens

    def started_wall(self) -> float:
        return time.time() - (self.loop.time() - self.started_at)

    def _server_info(self, proto):
        tput, accept = self.stats.window(self.loop.time())
        p = self.p
        proto.respond_json(200, {
            "engine": "servelab-simulator", "version": VERSION,
            "model_path": self.cfg.model_name, "served_model_name": self.cfg.model_name,
            "profile": p.name, "profile_params": dataclasses.asdict(p),
            "time_scale": self.ts, "seed": self.cfg.seed,
            "max_running_requests": p.max_running,
            "speculative_algorithm": "EAGLE3" if p.speculative else None,
            "speculative_num_steps": p.spec_num_steps or None,
            "speculative_eagle_topk": p.spec_eagle_topk or None,
            "speculative_num_draft_tokens": p.spec_num_draft_tokens or None,
            "prompt_token_rule": f"ceil(utf8_bytes / {BYTES_PER_TOKEN})",
            "default_workload": {"prompt_tokens": DEFAULT_PROMPT_TOKENS,
                                 "output_tokens": DEFAULT_OUTPUT_TOKENS},
            "faults": {"die_after": self.cfg.die_after, "error_rate": self.cfg.error_rate,
                       "stall_every": self.cfg.stall_every, "stall_ms": self.cfg.stall_ms,
                       "malformed_every": self.cfg.malformed_every,
                       "startup_delay": self.cfg.startup_delay},
            "truth_log": self.cfg.truth_log, "pid": os.getpid(),
            "internal_states": [{
                "avg_spec_accept_length": accept if p.speculative else None,
                "last_gen_throughput": tput,
                "effective_max_running_requests_per_dp": p.max_running,
                "memory_usage": {"token_capacity": self.kv_pool()}}],
        })

    def _metrics(self, proto):
        s = self.stats
        tput, accept = s.window(self.loop.time())
        used = sum(r.prompt_tokens + r.emitted for r in self.running)
        label = '{model_name=%s}' % self.model_json
        rows = [
            ("sglang:num_running_reqs", "gauge", "The number of running requests.",
             len(self.running) if self.p.mode == "batched" else len(self.inflight)),
            ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
             len(self.queue)),
            ("sglang:num_used_tokens", "gauge", "The number of used tokens.", used),
            ("sglang:token_usage", "gauge", "The token usage.", used / self.kv_pool()),
            ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", tput),
            ("sglang:spec_accept_length", "gauge",
             "The average acceptance length of speculative decoding (0 without it).",
             accept if self.p.speculative else 0.0),
            ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
             s.prompt_tokens_total),
            ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
             s.generation_tokens_total),
            ("sglang:num_requests_total", "counter", "Number of requests processed.",
             s.num_requests_total),
            ("servelab_sim:requests_received_total", "counter",
             "Generation requests received (health checks excluded).", s.requests_received_total),
            ("servelab_sim:requests_failed_total", "counter", "Requests that ended with an error.",
             s.requests_failed_total),
            ("servelab_sim:decode_steps_total", "counter", "Scheduler steps run.",
             s.decode_steps_total),
            ("servelab_sim:spec_switches_total", "counter",
             "Steps that switched speculation on or off (dynamic profiles).",
             s.spec_switches_total),
            ("servelab_sim:spec_verify_total", "counter",
             "Request-steps that verified draft tokens (accept length = tokens / verifies).",
             s.spec_verify_total),
            ("servelab_sim:spec_tokens_total", "counter",
             "Tokens yielded by those request-steps.", s.spec_tokens_total),
        ]
        out = []
        for name, kind, help_text, value in rows:
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n"
                       f"{name}{label} {float(value)!r}\n")
        proto.respond(200, "".join(out).encode("utf-8"),
                      content_type="text/plain; version=0.0.4; charset=utf-8")

    # ---- generation requests
    def _generation(self, proto, path, body, t_recv_ns, t_arrive_ns=None):
        if not self.ready():
            raise _Fail(503, "server is starting (--startup-delay); poll /health_generate",
                        "ServiceUnavailableError")
        try:
            data = json.loads(body or b"null")
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Fail(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise _Fail(400, "request body must be a JSON object")
        if path == "/generate":
            api, stream, max_tokens, min_tokens, ignore_eos, ptoks, key, rid = _parse_generate(data)
            include_usage = False
        else:
            api = "chat" if path.endswith("chat/completions") else "completions"
            stream, max_tokens, min_tokens, ignore_eos, ptoks, key, include_usage = \
                _parse_openai(api, data)
            rid = None
        if ignore_eos or min_tokens >= max_tokens:
            target, reason = max_tokens, "length"
        else:
            natural = max(natural_output_tokens(self.p, key, self.cfg.seed), min_tokens)
            target, reason = (max_tokens, "length") if natural >= max_tokens else (natural, "stop")
        req = self._new_request(api, stream, ptoks, target, reason, proto, t_recv_ns, rid)
        req.t_arrive_ns = t_arrive_ns
        req.include_usage = include_usage in (True, 2)
        req.continuous_usage = include_usage in (2, 3)
        self.counter += 1
        req.index = self.counter
        self.stats.requests_received_total += 1
        self._plan_faults(req)
        if self._accept_cdf is not None:
            # seeded by arrival order, so a run with the same seed and order repeats exactly
            req.draws = _Draws(self.cfg.seed, req.index, self._accept_cdf)
        proto.active = req
        if req.fail_at < 0:           # HTTP 500 before anything was sent
            self._finish_error(req, "simulated failure (--error-rate): HTTP 500", send=True)
            return
        if stream:
            proto.start_stream(req.id)
        self._start(req)

    def _new_request(self, api, stream, ptoks, target, reason, proto, t_recv_ns, rid=None,
                     internal=False):
        req = SimRequest()
        req.internal = internal
        prefix = {"chat": "chatcmpl-", "completions": "cmpl-", "generate": ""}[api]
        self.ids += 1
        req.id = rid or f"{prefix}sim{os.getpid():x}-{self.ids}"
        req.index = 0
        req.api, req.stream, req.prompt_tokens, req.target = api, stream, ptoks, target
        req.finish_reason, req.proto, req.t_recv_ns = reason, proto, t_recv_ns
        req.text_seed = int(_hash_unit("text", req.id) * 64)
        req.created = int(time.time())
        if api == "chat":
            req.prefix = (f'data: {{"id":"{req.id}","object":"chat.completion.chunk",'
                          f'"created":{req.created},"model":{self.model_json},"choices":[{{'
                          f'"index":0,"delta":{{"content":"').encode()
            req.suffix = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
        elif api == "completions":
            req.prefix = (f'data: {{"id":"{req.id}","object":"text_completion",'
                          f'"created":{req.created},"model":{self.model_json},"choices":[{{'
                          f'"index":0,"text":"').encode()
            req.suffix = b'","logprobs":null,"finish_reason":null}]}\n\n'
        else:
            req.prefix = req.suffix = b""
        if not internal:
            self.inflight.add(req)
        return req

    def _plan_faults(self, req: SimRequest) -> None:
        cfg, n = self.cfg, req.index
        if cfg.error_rate > 0 and _hash_unit("error", cfg.seed, n) < cfg.error_rate:
            midstream = req.stream and _hash_unit("error-kind", cfg.seed, n) < 0.5
            req.fail_at = max(1, req.target // 2) if midstream and req.target > 1 else -1
            if req.stream and req.target <= 1:
                req.fail_at = -1
        if cfg.stall_every and n % cfg.stall_every == 0 and cfg.stall_ms > 0:
            req.stall_at = max(1, req.target // 2)
        if cfg.malformed_every and n % cfg.malformed_every == 0 and req.stream:
            req.malformed_at = 1

    def _start(self, req: SimRequest) -> None:
        mode = self.p.mode
        if mode != "batched" and not req.internal:
            self.stats.prompt_tokens_total += req.prompt_tokens
        if mode == "batched":
            delay = (self.p.request_overhead_ms / 1000.0 / self.ts
                     * overhead_factor(self.p, self.cfg.seed, req.index))
            if delay > 0 and not req.internal:
                self.loop.call_later(delay, self._enqueue, req)
            else:
                self._enqueue(req)
        elif mode == "fixed":
            self.loop.create_task(self._run_fixed(req))
        else:
            self.loop.create_task(self._run_firehose(req))

    def cancel(self, req: SimRequest, reason: str) -> None:
        req.cancelled = True
        self._finish_error(req, reason, send=False)

    def client_gone(self, req: SimRequest) -> None:
        """The client of `req` disconnected: cancel it now, or --abort-delay-ms later (it keeps
        generating into the closed connection until then, unless it finishes first)."""
        delay = self.cfg.abort_delay_ms / 1000.0
        if delay <= 0 or self.loop is None:
            self.cancel(req, "client disconnected")
            return

        def late_abort():
            if not req.finished:
                self.cancel(req, "client disconnected (noticed after --abort-delay-ms)")
        self.loop.call_later(delay, late_abort)

    # ---- batched scheduler
    def _enqueue(self, req: SimRequest) -> None:
        if req.finished:
            return
        self.queue.append(req)
        self._wake.set()

    async def _scheduler(self) -> None:
        loop, p, ts, model = self.loop, self.p, self.ts, self.model
        lag_limit = 0.003
        anchor = loop.time()
        fixed_k = p.tokens_per_chunk
        previous_on: Optional[bool] = None
        chunk, pool, mixed = model.chunk, model.kv_pool, model.mixed
        while True:
            if self.queue and self.queue[0].finished:
                self.queue = deque(r for r in self.queue if not r.finished)
            if any(r.finished for r in self.prefilling):   # cancelled mid-prefill: slot freed
                self.prefilling = [r for r in self.prefilling if not r.finished]
            if not self.running and not self.queue and not self.prefilling:
                self._wake.clear()
                await self._wake.wait()
                anchor = loop.time()
                continue
            now = loop.time()
            now_ns = time.monotonic_ns()
            # admission and prefill: the engine's rule (admission.plan_step)
            used = (sum(_kv_need(r) for r in self.running if not r.finished)
                    + sum(_kv_need(r) for r in self.prefilling))
            plan = plan_step(self.queue, self.prefilling, len(self.running) + len(self.prefilling),
                             p, _prompt_tokens, _finished, chunk=chunk, prompt_left=_prefill_left,
                             kv_free=pool - used, kv_need=_kv_need, kv_empty=not used)
            for req in plan.admitted:
                req.t_admit_ns = now_ns
                req.prefill_left = req.prompt_tokens
            chunks = plan.chunks
            # without mixed chunks a step that prefills runs no decode (SGLang's default)
            decoding = ([r for r in self.running if r.stall_until <= now]
                        if mixed or not chunks else [])
            if decoding or mixed or not chunks:
                on = speculation_on(p, len(decoding), len(chunks), previous_on)
                if previous_on is not None and on != previous_on:
                    self.stats.spec_switches_total += 1
                dt = (model.step_ms(len(decoding), plan.prefill_tokens, on)
                      + switch_ms(p, on, previous_on)) / 1000.0 / ts
                previous_on = on
            else:
                on = previous_on is not False
                dt = model.step_ms(0, plan.prefill_tokens, on) / 1000.0 / ts
            deadline = anchor + dt
            if deadline > now:
                await asyncio.sleep(deadline - now)
            now = loop.time()
            anchor = deadline if now - deadline <= lag_limit else now
            self.stats.decode_steps_total += 1
            total = verifies = spec_tokens = 0
            for req in decoding:
                if req.finished:
                    continue
                left = req.target - req.emitted
                if fixed_k:
                    k = fixed_k
                elif req.draws is not None and on:
                    k = req.draws.next()
                    verifies += 1
                    spec_tokens += min(k, left)
                    req.verify_ct += 1
                else:
                    k = 1
                k = min(k, left)
                if not req.internal:
                    total += k
                self._emit(req, k)
            if chunk is not None:
                for req, n in chunks:
                    req.prefill_left -= n
                self.prefilling = [r for r in self.prefilling + plan.admitted
                                   if r.prefill_left > 0 and not r.finished]
            for req in plan.completed:
                if req.finished:
                    continue
                k = min(fixed_k or 1, req.target)
                if not req.internal:
                    total += k
                    self.stats.prompt_tokens_total += req.prompt_tokens
                self.running.append(req)
                self._emit(req, k)
            self.stats.tokens(now, total, verifies, spec_tokens)
            if any(r.finished for r in self.running):
                self.running = [r for r in self.running if not r.finished]

    # ---- fixed and firehose
    async def _run_fixed(self, req: SimRequest) -> None:
        loop, p = self.loop, self.p
        k = p.tokens_per_chunk or 1
        t_recv = req.t_recv_ns / 1e9
        deadline = t_recv + p.ttft_ms / 1000.0 / self.ts
        step = p.step_ms / 1000.0 / self.ts
        stalled = False
        while not req.finished:
            now = loop.time()
            if deadline > now:
                await asyncio.sleep(deadline - now)
            if req.finished:
                return
            n = min(k, req.target - req.emitted)
            if not req.internal:
                self.stats.tokens(loop.time(), n)
            self._emit(req, n)
            deadline += step
            if req.stall_until and not stalled:
                stalled = True                  # the planned stall delays every later chunk
                deadline += self.cfg.stall_ms / 1000.0

    async def _run_firehose(self, req: SimRequest) -> None:
        p, proto = self.p, req.proto
        k = p.tokens_per_chunk or 1
        per_write = p.firehose_events_per_write
        fast = req.stream and req.api != "generate" and not (
            req.fail_at or req.stall_at or req.malformed_at)
        event = req.prefix + token_text(0, k).encode() + req.suffix if fast else b""
        while not req.finished:
            left = req.target - req.emitted
            if fast and left >= k * per_write:
                # the hot path: a prebuilt write of per_write events of k tokens each
                if req.emitted == 0:
                    self._emit(req, k)          # the first chunk goes through the general path
                else:
                    t = time.monotonic_ns()
                    proto.stream_write(event * per_write)
                    req.emitted += k * per_write
                    req.chunk_ns.extend([t] * per_write)
                    req.chunk_tokens.extend([k] * per_write)
                    req.t_last_ns = t
                    self.stats.tokens(self.loop.time(), k * per_write)
                    if req.emitted >= req.target:
                        self._finish(req)
            else:
                n = min(k, left)
                if not req.internal:
                    self.stats.tokens(self.loop.time(), n)
                self._emit(req, n)
            if req.finished:
                return
            if proto is not None and proto.paused:
                await proto.drain()
            else:
                await asyncio.sleep(0)
            if req.stall_until:
                wait = req.stall_until - self.loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
