"""Between load levels: wait until the server is idle again (docs/architecture.md, 'Measurement').

Why. A level ends by cancelling its tail: the requests still in flight once every window request
finished are given up and their connections closed (level.py). The server may go on working on
them for a while - until it notices the disconnect, until its engine processes the abort, or
for good if it never checks - and a next level started at once would measure its first seconds
(its warmup, or worse its window) against a server still busy with work nobody waits for. So
after each level but the last, the sweep waits, bounded by `drain_timeout`, until the server is
idle, and records the wait on the drained level's row (`drain_s`, `drain_basis`).

How idle is told, in order of preference:
1. metric (DRAIN_METRIC): the server's own gauges on `/metrics` - SGLang `sglang:num_running_reqs`
   and `sglang:num_queue_reqs`, vLLM `vllm:num_requests_running` and `vllm:num_requests_waiting`
   (server_metrics.GAUGES names them; its parser and loadgen.http's http_get read them) - polled
   every POLL_S until both read 0 twice in a row. Only when `server_metrics` is on (off, the
   drain does not read `/metrics` either and probes instead).
2. probe (DRAIN_PROBE), for servers without such a gauge (transformers serve, an unknown
   endpoint): one small streaming request (max_tokens 1) at a time through the load generator's
   own HTTP client, timed like a level's requests (send -> first token). Before the first level
   PROBE_IDLE_COUNT probes give the idle TTFT (their median); after a level the server counts as
   idle once PROBE_SETTLE consecutive probes each had TTFT <= max(PROBE_RATIO x idle, idle +
   PROBE_SLACK_MS). The ratio absorbs a slow server's noise, the fixed slack a fast one's (a
   5 ms idle TTFT jitters by milliseconds on a busy client), and two in a row keep one lucky
   probe from ending the wait. Probes are sent by the controller between levels, never inside
   run_level: they count toward no level's figures.
3. timeout (DRAIN_TIMEOUT): neither settled within `drain_timeout` (or the server's gauge and
   probes could not be read); the sweep gets a warning that the next level may have started
   with a loaded server. Every scrape and probe is bounded by what is left of `drain_timeout`
   (and by PROBE_TIMEOUT_S), so the drain never waits longer than its bound plus one short
   connect.
The last level is not drained, and `drain_timeout: 0` drains none: DRAIN_NONE, drain_s None.

What the pinned engines do when a streaming client disconnects (read in their released code;
nothing of it is copied here):
- SGLang 0.5.23 (roles/sglang/defaults/main.yml; wheel sglang-0.5.23 from PyPI). The HTTP server
  (python/sglang/srt/entrypoints/http_server.py, `serve_generate_request`; the OpenAI routes in
  entrypoints/openai/serving_chat.py the same) returns a Starlette StreamingResponse; uvicorn
  (the default server; Granian only with --enable-http2) reports ASGI spec 2.3, so Starlette
  listens for `http.disconnect` and cancels the body iterator at once. The CancelledError runs
  through TokenizerManager.generate_request's `except BaseException` (managers/
  tokenizer_manager.py, `_release_req_states_on_failure`), which sends an AbortReq for the
  dispatched request right away; the response's background task `create_abort_task` aborts
  again 2 s after the response ended, as a fallback. The scheduler's `abort_request`
  (managers/scheduler.py) pops a queued request at once and marks a running one `to_finish`:
  it "will still run one decode forward pass", then its KV slot is freed. So the slot is free
  within about one decode step of the disconnect (about 2 s where the immediate path misses).
  Gauge lag: `sglang:num_running_reqs` is set from decode batches only every
  `decode_log_interval` steps, but on idle the scheduler's `_maybe_log_idle_metrics`
  (managers/scheduler_components/metrics_reporter.py) publishes at once when the gauge
  disagrees with the running batch ("the true idle value"); so it reaches 0 just after the
  engine does, not on the 30 s idle refresh older releases had.
- vLLM 0.33.0 (plugins/module_utils/server/render_vllm.py VLLM_DEFAULT_VERSION; wheel from PyPI).
  The OpenAI routes (vllm/entrypoints/openai/chat_completion/api_router.py) wrap the handler in
  `with_cancellation` (vllm/entrypoints/serve/utils/api_utils.py; it was
  vllm/entrypoints/utils.py in older releases) and stream through a Starlette StreamingResponse,
  which, as above, cancels the generator on disconnect; AsyncLLM.generate
  (vllm/v1/engine/async_llm.py) catches CancelledError/GeneratorExit and awaits
  `self.abort(...)`, which aborts in the output processor and sends the abort to the engine
  core; EngineCore.abort_requests -> Scheduler.finish_requests (vllm/v1/core/sched/scheduler.py)
  removes it from the running and waiting queues and frees its blocks between steps (aborts
  that arrive during a step are applied right after it). Gauge lag: `vllm:num_requests_running`/
  `_waiting` are set from the SchedulerStats each engine step returns; the freed request stays
  in `finished_req_ids`, so the engine runs one more (empty) step whose stats say 0 (the
  scheduler returns stats even without outputs) - the gauge follows within a step. With
  `--disable-log-stats` there are no scheduler stats; the gauge then stays at its last value
  and the drain ends on its bound (a warning says so).
So both free the slot within about one engine step of the disconnect, and both gauges follow
within a step: the metric path fits both, and it is usually done in well under a second. The
drain matters most for servers that notice late (a fallback abort, a server that checks
between long steps or never): the simulator's `--abort-delay-ms` models one.

Standard library only: shipped to targets with the load generator.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (
    Endpoint, http_get, open_connection, request_body,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    NS_PER_S, RequestTiming,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.server_metrics import (
    GAUGES, parse_prometheus,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    DRAIN_METRIC, DRAIN_NONE, DRAIN_PROBE, DRAIN_TIMEOUT,
)

POLL_S = 0.1                # between two /metrics reads
METRIC_SETTLE = 2           # consecutive idle readings
SCRAPE_TIMEOUT_S = 2.0      # one /metrics read, at most (and never past the drain's bound)
PROBE_IDLE_COUNT = 3        # probes before the first level; their median is the idle TTFT
PROBE_RATIO = 1.5           # idle again: TTFT <= max(PROBE_RATIO x idle, idle + PROBE_SLACK_MS)
PROBE_SLACK_MS = 5.0
PROBE_SETTLE = 2            # consecutive probes within that tolerance
PROBE_GAP_S = 0.05          # between two probes after a level
PROBE_TIMEOUT_S = 10.0      # one probe, at most (connect + TTFT; never past the drain's bound)
PROBE_PROMPT = "Say OK."

RUNNING_GAUGES = GAUGES["running_reqs"]
QUEUED_GAUGES = GAUGES["queued_reqs"]


@dataclass
class DrainOutcome:
    """How the wait after one level ended: `basis` is a DRAIN_* word, `seconds` the wait (None
    when not drained), `warning` a sentence for the sweep's warnings (DRAIN_TIMEOUT)."""
    basis: str
    seconds: Optional[float] = None
    warning: Optional[str] = None


NOT_DRAINED = DrainOutcome(DRAIN_NONE, None)


def idle_tolerance_ms(idle_ms: float) -> float:
    """The largest probe TTFT that counts as idle, given the idle TTFT (see the docstring)."""
    return max(PROBE_RATIO * idle_ms, idle_ms + PROBE_SLACK_MS)


def _gauge(sample: Dict[str, float], names) -> Optional[float]:
    for name in names:
        if name in sample:
            return sample[name]
    return None


def busy_requests(sample: Dict[str, float]) -> Optional[float]:
    """Running + queued requests by the server's own gauges, None if it has no running gauge."""
    running = _gauge(sample, RUNNING_GAUGES)
    if running is None:
        return None
    return running + (_gauge(sample, QUEUED_GAUGES) or 0.0)


class Drainer:
    """Waits for an idle server between levels. `prepare()` once before the first level (it picks
    the gauge or measures the idle TTFT), then `drain(label)` after each level to be drained."""

    def __init__(self, cfg, fetch: Callable[[str, float], str] = http_get,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg = cfg
        self.fetch = fetch
        self.clock = clock
        self.endpoint = Endpoint(cfg.base_url, cfg.api, cfg.api_key)
        self.metrics_url = self.endpoint.url(cfg.metrics_path)
        prompt = SimpleNamespace(text=PROBE_PROMPT,
                                 messages=[{"role": "user", "content": PROBE_PROMPT}])
        # The levels' own body (model, extra_body, usage options), one token long.
        self.wire = self.endpoint.wire(request_body(cfg.api, cfg.model, prompt, 1, False,
                                                    cfg.extra_body, cfg.per_chunk_usage))
        self.use_metric = False
        self.idle_ttft_ms: Optional[float] = None
        self.note: Optional[str] = None     # why neither way works, when it does not
        self.prepared = False

    # -- before the first level -------------------------------------------------------------

    def prepare(self) -> None:
        """Find the server's running-requests gauge; without one, the idle TTFT by probes.
        Bounded like a drain: by drain_timeout in all (and each read by its own limit)."""
        self.prepared = True
        deadline = self.clock() + max(0.0, float(self.cfg.drain_timeout))
        if self.cfg.server_metrics:
            try:
                busy = busy_requests(parse_prometheus(self.fetch(
                    self.metrics_url, self._bounded(SCRAPE_TIMEOUT_S, deadline))))
            except Exception as exc:  # noqa: BLE001 - any failure: no gauge, probe instead
                busy, why = None, "%s: %s" % (self.metrics_url, exc)
            else:
                why = "%s has no running-requests gauge" % self.metrics_url
            if busy is not None:
                self.use_metric = True
                return
        else:
            why = "server_metrics is off"
        ttfts = []
        error = "no time left for it"
        while len(ttfts) < PROBE_IDLE_COUNT and self.clock() < deadline:
            ttft, error = self.probe(self._bounded(PROBE_TIMEOUT_S, deadline))
            if ttft is None:
                break           # a server that fails a probe now gives no idle reference
            ttfts.append(ttft)
        if ttfts:
            self.idle_ttft_ms = statistics.median(ttfts)
        else:
            self.note = "%s, and the idle probe failed (%s)" % (why, error)

    def _bounded(self, limit: float, deadline: float) -> float:
        return max(0.05, min(limit, deadline - self.clock()))

    # -- after a level ----------------------------------------------------------------------

    def drain(self, label: str) -> DrainOutcome:
        """Wait (at most cfg.drain_timeout s) until the server is idle; never raises."""
        bound = float(self.cfg.drain_timeout)
        if bound <= 0:
            return NOT_DRAINED
        if not self.prepared:
            self.prepare()
        start = self.clock()
        deadline = start + bound
        if self.use_metric:
            settled, last = self._wait_metric(deadline)
            basis, seen = DRAIN_METRIC, "running+queued requests last read %s" % last
        elif self.idle_ttft_ms is not None:
            settled, last = self._wait_probe(deadline)
            basis = DRAIN_PROBE
            seen = "probe TTFT last %s (idle %.1f ms, idle means <= %.1f ms)" % (
                last, self.idle_ttft_ms, idle_tolerance_ms(self.idle_ttft_ms))
        else:
            # No way to tell: the bound is the only protection left, so it is waited out.
            settled, seen = False, self.note or "no way to tell an idle server"
            self._sleep_until(deadline)
        waited = round(self.clock() - start, 3)
        if settled:
            return DrainOutcome(basis, waited)
        return DrainOutcome(DRAIN_TIMEOUT, waited, (
            "%s: the server was not seen idle within drain_timeout (%g s; %s): the next level "
            "may have started with a loaded server" % (label, bound, seen)))

    def _sleep_until(self, deadline: float) -> None:
        left = deadline - self.clock()
        if left > 0:
            time.sleep(left)

    def _settle(self, deadline: float, read: Callable[[float], Tuple[bool, str]], settle: int,
                gap: float) -> Tuple[bool, str]:
        """Read until `settle` idle readings in a row (True, the last reading) or the deadline
        (False, the last reading); `read(deadline)` gives (idle, what it read)."""
        streak = 0
        last = "nothing"
        while True:
            if deadline - self.clock() <= 0:
                return False, last
            idle, last = read(deadline)
            streak = streak + 1 if idle else 0
            if streak >= settle:
                return True, last
            left = deadline - self.clock()
            if left <= 0:
                return False, last
            time.sleep(min(gap, left))

    def _wait_metric(self, deadline: float) -> Tuple[bool, str]:
        def read(deadline):
            try:
                text = self.fetch(self.metrics_url, self._bounded(SCRAPE_TIMEOUT_S, deadline))
                busy = busy_requests(parse_prometheus(text))
            except Exception as exc:  # noqa: BLE001 - a failed read is not an idle reading
                return False, "an error (%s)" % exc
            return busy == 0, "no gauge" if busy is None else "%g" % busy
        return self._settle(deadline, read, METRIC_SETTLE, POLL_S)

    def _wait_probe(self, deadline: float) -> Tuple[bool, str]:
        limit = idle_tolerance_ms(self.idle_ttft_ms)

        def read(deadline):
            ttft, error = self.probe(self._bounded(PROBE_TIMEOUT_S, deadline))
            if ttft is None:
                return False, "failed (%s)" % error
            return ttft <= limit, "%.1f ms" % ttft
        return self._settle(deadline, read, PROBE_SETTLE, PROBE_GAP_S)

    # -- one probe --------------------------------------------------------------------------

    def probe(self, timeout: float) -> Tuple[Optional[float], Optional[str]]:
        """One streaming request of one token on a fresh connection: (TTFT ms, None), or (None,
        why). Bounded by `timeout` s in all (connect, TTFT, the rest of the stream)."""
        try:
            return asyncio.run(self._probe(timeout))
        except Exception as exc:  # noqa: BLE001 - a probe that fails is reported, not raised
            return None, "%s: %s" % (type(exc).__name__, exc)

    async def _probe(self, timeout: float) -> Tuple[Optional[float], Optional[str]]:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        t_end = loop.time() + timeout

        def on_done(_conn, req):
            if not done.done():
                done.set_result(req)

        def on_lost(_conn):
            if not done.done():
                done.set_exception(ConnectionError("connection closed before the answer"))

        conn = await open_connection(loop, self.endpoint, self.cfg.api, on_done, on_lost,
                                     max(0.01, min(self.cfg.connect_timeout, timeout)),
                                     self.cfg.socket_rcvbuf)
        try:
            req = RequestTiming(worker=-1, request_id=-1, t_send=0)
            conn.send(req, self.wire)
            try:
                req = await asyncio.wait_for(done, max(0.01, t_end - loop.time()))
            except asyncio.TimeoutError:
                return None, "no answer within %.1f s" % timeout
        finally:
            if not conn.closed:
                conn.transport.abort()
                await asyncio.sleep(0)      # let the transport close its socket
        if req.error is not None and req.t_first is None:
            return None, req.error
        if req.t_first is None:
            return None, "no token in the answer"
        return (req.t_first - req.t_send) * 1e3 / NS_PER_S, None


def drain_plan(count: int, drain_timeout: float, drain_last: bool = False) -> List[bool]:
    """Which of `count` levels are drained after they ran: every one but the last (the last too
    with `drain_last`, when another call runs the next level), none with drain_timeout 0."""
    if drain_timeout <= 0:
        return [False] * count
    return [drain_last or i < count - 1 for i in range(count)]


__all__ = ["DrainOutcome", "Drainer", "NOT_DRAINED", "busy_requests", "drain_plan",
           "idle_tolerance_ms"]
