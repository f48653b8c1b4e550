"""Per-request predictions of a benchmark run, for the tuner: predict_run.

The discrete-event engine (des.py: the server's admission rule, step formula and seeded draws)
driven by the load generator's own definitions, so a prediction and a measured level are the
same figures of the same load:
- closed loop (`concurrency` C): C clients, each sending its next request the moment the last
  one finished (all start at 0);
- open loop (`rate` requests/s): arrivals from the load generator's ArrivalSchedule
  (loadgen/sender.py: `poisson`, stratified exponential gaps; `constant`; `gamma` with
  `burstiness`), seeded by `seed`;
- warm-up, window and tail as a level's (loadgen/level.py): the window opens once `warmup`
  requests finished (default: C in a closed loop, the loadgen's one per worker; about a second
  of arrivals, ceil(rate), in an open loop), and closes once it held `requests` sends and lasted
  `seconds` (either or both); requests sent inside it are the window requests, and the load stays
  on until every one of them finished;
- figures as metrics.py defines them: output tok/s = tokens emitted inside the window / its
  length; request/s = window requests / window length; goodput = window requests that met every
  SLO / window length, judged by loadgen.metrics.meets_slo itself; TTFT, TPOT, E2E per request,
  ITL per token (a chunk of k tokens after a gap gives k samples of gap/k, weighted percentiles).
Times are real (model time divided by time_scale). Deterministic for a given seed.

Runs on the controller (the tuner): it imports the load generator, so it is not part of the
simulator's zipapp (server/simulator_file.py ships what the server needs). Standard library only.
"""
from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    NS_PER_MS, RequestTiming, meets_slo, percentile, weighted_percentile,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.sender import (
    ArrivalSchedule, check_burstiness,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import ARRIVALS
from ansible_collections.servelab.serving.plugins.module_utils.simulator import des
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, SimError, _positive_float, resolve_profile,
)

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
LATENCIES = ("ttft_ms", "tpot_ms", "e2e_ms")


TIMEOUT_ERROR = "timeout: cut by timeout_s (the level_timeout) before it finished"


@dataclass(frozen=True)
class PredictedRequest:
    """One window request, real milliseconds; t_send_ms from the run's start. A request cut by
    timeout_s has ok False, e2e_ms and tpot_ms None (ttft_ms too if no token came)."""
    index: int                 # arrival number (1-based): the server's seed for its draws
    t_send_ms: float
    ttft_ms: Optional[float]
    tpot_ms: Optional[float]   # None for a 1-token answer (as metrics.tpot_ns)
    e2e_ms: Optional[float]
    prompt_tokens: int
    output_tokens: int         # emitted (all of them unless cut)
    ok: bool = True

    def timing(self) -> RequestTiming:
        """The load generator's record of this request (integer ns), for its own rules."""
        send = int(round(self.t_send_ms * NS_PER_MS))

        def at(ms: Optional[float]) -> Optional[int]:
            return None if ms is None else send + int(round(ms * NS_PER_MS))
        return RequestTiming(worker=0, request_id=self.index, t_send=send,
                             t_first=at(self.ttft_ms), t_last=at(self.e2e_ms),
                             prompt_tokens=self.prompt_tokens,
                             completion_tokens=self.output_tokens, in_window=True,
                             error=None if self.ok else TIMEOUT_ERROR)


@dataclass(frozen=True)
class PredictedRun:
    """A predicted level: its window requests and figures (real time)."""
    profile: str
    load_mode: str             # closed | rate
    concurrency: Optional[int]
    rate: Optional[float]
    arrival: Optional[str]
    prompt_tokens: int
    output_tokens: int
    time_scale: float
    seed: int
    window_s: float
    requests: Tuple[PredictedRequest, ...]
    output_tok_s: float
    total_tok_s: float
    request_s: float
    itl_mean_ms: Optional[float]
    itl_p50_ms: Optional[float]
    itl_p90_ms: Optional[float]
    itl_p99_ms: Optional[float]
    mean_running: float        # time-weighted requests in the batch over the window
    mean_queued: float         # time-weighted requests waiting for admission
    slo: Optional[Mapping[str, Optional[float]]] = None
    goodput: Optional[float] = None      # req/s meeting every SLO of `slo` (None without one)
    method: str = "discrete-event"
    failed: int = 0                      # window requests cut by timeout_s
    window_complete: bool = True         # False: half of timeout_s closed the window early
    _itl: Tuple[Tuple[float, float], ...] = field(default=(), repr=False, compare=False)

    def goodput_for(self, slo: Mapping[str, Optional[float]]) -> float:
        """Window requests meeting every SLO (metrics.meets_slo) per second."""
        slo = _check_slo(slo)
        if not self.requests:
            return 0.0                   # no window (window_complete False)
        met = sum(1 for r in self.requests if meets_slo(r.timing(), slo))
        return met / self.window_s

    def latency(self, name: str, q: float) -> Optional[float]:
        """Percentile q (0-100) of ttft_ms, tpot_ms, e2e_ms or itl_ms over the window requests
        (metrics.percentile, metrics.weighted_percentile for ITL); None without samples."""
        if name == "itl_ms":
            return weighted_percentile(self._itl, q)
        if name not in LATENCIES:
            raise SimError(f"latency name must be one of {', '.join(LATENCIES + ('itl_ms',))} "
                           f"(got {name!r})")
        values = sorted(v for v in (getattr(r, name) for r in self.requests if r.ok)
                        if v is not None)
        return percentile(values, q)

    def mean(self, name: str) -> Optional[float]:
        if name not in LATENCIES:
            raise SimError(f"latency name must be one of {', '.join(LATENCIES)} (got {name!r})")
        values = [v for v in (getattr(r, name) for r in self.requests if r.ok) if v is not None]
        return sum(values) / len(values) if values else None


def _check_slo(slo: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    if not isinstance(slo, Mapping):
        raise SimError(f"slo must be a mapping such as {{'ttft_ms': 2000, 'tpot_ms': 50}} "
                       f"(got {type(slo).__name__})")
    out: Dict[str, Optional[float]] = {}
    for key, value in slo.items():
        if key not in SLO_KEYS:
            raise SimError(f"slo.{key}: unknown SLO; use {', '.join(SLO_KEYS)}")
        if value is None:
            out[key] = None
            continue
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            raise SimError(f"slo.{key}: expected milliseconds, got {value!r}") from None
    return out


class _RunWindow(des.Observer):
    """The level's warm-up, window and tail over the engine's requests (model ms)."""

    def __init__(self, engine: des.Engine, warmup: int, requests: Optional[int],
                 seconds_model: Optional[float], closed: bool, timeout_model: float):
        self.engine, self.closed = engine, closed
        self.timeout = timeout_model
        self.window_complete = True
        self.timed_out = False
        self.warmup = warmup
        self.n = requests or 0
        self.span = seconds_model or 0.0
        self.finished = 0
        self.ws: Optional[float] = 0.0 if warmup == 0 else None
        self.we: Optional[float] = None
        self.t_next: Optional[float] = None if requests else -math.inf
        self.window: List[list] = []
        self.outstanding = 0
        # (t, dt, emitted, batch, queued, firsts) of every step from the window's opening on
        self.steps: List[Tuple[float, float, int, int, int, int]] = []
        self.resend: List[float] = []

    def on_send(self, req):
        ws = self.ws
        if ws is None or self.we is not None or req[des.SEND] < ws:
            return
        if len(self.window) >= self.n:
            if self.t_next is None:
                self.t_next = req[des.SEND]
            end = max(ws + self.span, self.t_next)
            if req[des.SEND] >= end:
                self.we = end
                return
        req[des.ITL] = {}
        self.window.append(req)
        self.outstanding += 1

    def on_step(self, t, dt, emitted, batch, queued, firsts):
        if self.ws is not None:
            self.steps.append((t, dt, emitted, batch, queued, firsts))

    def on_finish(self, req, t):
        self.finished += 1
        if req[des.ITL] is not None:
            self.outstanding -= 1
        if self.closed:
            self.resend.append(t)

    def end_step(self, t):
        if self.ws is None and self.finished >= self.warmup:
            self.ws = t
        if t >= self.timeout / 2 and self.we is None:
            # the loadgen closes the window at half of level_timeout, flagged incomplete
            self.ws = t if self.ws is None else self.ws
            self.we, self.window_complete = t, False
        for now in self.resend:
            self.engine.send(now, self)
        self.resend.clear()
        if t >= self.timeout:
            self.timed_out = True
            return True
        return self.we is not None and self.outstanding == 0


def _arrival_times(rate: float, arrival: str, burstiness: float, seed: int,
                   time_scale: float) -> Iterator[float]:
    """The load generator's arrival schedule, in model ms (real seconds times time_scale)."""
    schedule = ArrivalSchedule(rate, arrival, random.Random(f"servelab-predict:{seed}"), 0,
                               burstiness)
    per_ns = time_scale / NS_PER_MS
    while True:
        yield schedule.advance() * per_ns


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SimError(f"{name} must be an integer >= {minimum} (got {value!r})")
    return value


def predict_run(profile_or_params, *, concurrency: Optional[int] = None,
                rate: Optional[float] = None, arrival: str = "poisson",
                burstiness: float = 1.0,
                prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
                output_tokens: int = DEFAULT_OUTPUT_TOKENS,
                requests: Optional[int] = None, seconds: Optional[float] = None,
                warmup: Optional[int] = None, time_scale: Optional[float] = None,
                seed: int = 0, slo: Optional[Mapping[str, Optional[float]]] = None,
                timeout_s: Optional[float] = None) -> PredictedRun:
    """Predict one benchmark level request by request (see the module docstring).

    profile_or_params: a profile name, a SimProfile or a `simulator:` mapping (resolve_profile).
    Exactly one of concurrency (closed loop) or rate (open loop, req/s real time, with arrival
    poisson | constant | gamma and its burstiness). The window holds `requests` sends and lasts
    `seconds` real seconds (at least one of them). slo: {ttft_ms, tpot_ms, e2e_ms} (ms, any
    subset) for `goodput`; PredictedRun.goodput_for(slo) judges another without rerunning.
    time_scale: as the server's (default: the mapping's, else 1). timeout_s: the level_timeout
    (real seconds from the start; None: none): half of it closes the window (window_complete
    False; no window at all if the warm-up was not over by then: no requests, every rate 0),
    all of it ends the run and its unfinished window requests fail (`failed`), as the load
    generator does; an overloaded candidate then costs a bounded time to predict. Raises
    SimError naming the argument for bad input."""
    p, ts_from_params = resolve_profile(profile_or_params)
    ts = _positive_float("time_scale", time_scale if time_scale is not None
                         else (ts_from_params or 1.0))
    if p.mode != "batched":
        raise SimError(f"predict_run models the batched scheduler; profile {p.name!r} is "
                       f"{p.mode} (use predict_level for fixed)")
    P = _positive_int("prompt_tokens", prompt_tokens)
    O = _positive_int("output_tokens", output_tokens)  # noqa: E741
    if (concurrency is None) == (rate is None):
        raise SimError("give exactly one of concurrency (closed loop) or rate (open loop, "
                       "requests/s)")
    if requests is None and seconds is None:
        raise SimError("give requests (window requests) or seconds (window length), or both")
    if requests is not None:
        _positive_int("requests", requests)
    span = None if seconds is None else _positive_float("seconds", seconds) * 1000.0 * ts
    slo_checked = None if slo is None else _check_slo(slo)
    bound = (math.inf if timeout_s is None
             else _positive_float("timeout_s", timeout_s) * 1000.0 * ts)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise SimError(f"seed must be an integer (got {seed!r})")
    if concurrency is not None:
        C = _positive_int("concurrency", concurrency)
        engine = des.Engine(p, P, O, seed)
        warm = C if warmup is None else _positive_int("warmup", warmup, 0)
        observer = _RunWindow(engine, warm, requests, span, closed=True, timeout_model=bound)
        for _i in range(C):
            engine.send(0.0, observer)
        mode, arrival_used, rate_used = "closed", None, None
    else:
        rate_used = _positive_float("rate", rate)
        if arrival not in ARRIVALS:
            raise SimError(f"arrival must be one of {', '.join(ARRIVALS)} (got {arrival!r})")
        problem = check_burstiness(arrival, burstiness)
        if problem:
            raise SimError(problem)
        engine = des.Engine(p, P, O, seed,
                            arrivals=_arrival_times(rate_used, arrival, burstiness, seed, ts))
        warm = math.ceil(rate_used) if warmup is None else _positive_int("warmup", warmup, 0)
        observer = _RunWindow(engine, warm, requests, span, closed=False, timeout_model=bound)
        mode, arrival_used, C = "rate", arrival, None
    engine.run(observer)
    return _figures(p.name, observer, mode, C, rate_used, arrival_used, P, O, ts, seed,
                    slo_checked)


def _figures(name, obs: _RunWindow, mode, C, rate, arrival, P, O, ts, seed, slo) -> PredictedRun:  # noqa: E741
    ws, we = obs.ws, obs.we
    window_model = we - ws
    if not obs.window_complete and not obs.window:
        # the loadgen: no window possible in time (warm-up not over at half of level_timeout)
        return PredictedRun(
            profile=name, load_mode=mode, concurrency=C, rate=rate, arrival=arrival,
            prompt_tokens=P, output_tokens=O, time_scale=ts, seed=seed, window_s=0.0,
            requests=(), output_tok_s=0.0, total_tok_s=0.0, request_s=0.0, itl_mean_ms=None,
            itl_p50_ms=None, itl_p90_ms=None, itl_p99_ms=None, mean_running=0.0,
            mean_queued=0.0, slo=slo, goodput=None if slo is None else 0.0,
            window_complete=False)
    if window_model <= 0 or not obs.window:
        raise SimError("the prediction's window holds no request: give more requests or seconds")
    tokens = area_running = area_queued = 0.0
    prompt_in_window = 0
    for t, dt, emitted, batch, queued, firsts in obs.steps:
        if ws <= t < we:
            tokens += emitted
            prompt_in_window += firsts * P     # metrics.py: prompts whose first token came
        # the time-weighted batch over the part of each step inside the window
        inside = min(t, we) - max(t - dt, ws)
        if inside > 0:
            area_running += batch * inside
            area_queued += queued * inside
    itl: Dict[float, float] = {}
    out: List[PredictedRequest] = []
    for req in obs.window:
        send, first, last = req[des.SEND], req[des.FIRST], req[des.LAST]
        for key, weight in req[des.ITL].items():
            itl[key / ts] = itl.get(key / ts, 0) + weight
        if last > 0:
            out.append(PredictedRequest(
                index=req[des.INDEX], t_send_ms=send / ts, ttft_ms=(first - send) / ts,
                tpot_ms=(last - first) / (O - 1) / ts if O > 1 else None,
                e2e_ms=(last - send) / ts, prompt_tokens=P, output_tokens=O))
        else:                                     # cut by timeout_s
            out.append(PredictedRequest(
                index=req[des.INDEX], t_send_ms=send / ts,
                ttft_ms=(first - send) / ts if first > 0 else None, tpot_ms=None, e2e_ms=None,
                prompt_tokens=P, output_tokens=O - req[des.LEFT] if first > 0 else 0, ok=False))
    window_s = window_model / ts / 1000.0
    pairs = tuple(sorted(itl.items()))
    weight = sum(w for _v, w in pairs)
    run = PredictedRun(
        profile=name, load_mode=mode, concurrency=C, rate=rate, arrival=arrival,
        prompt_tokens=P, output_tokens=O, time_scale=ts, seed=seed, window_s=window_s,
        requests=tuple(out), output_tok_s=tokens / window_s,
        total_tok_s=(tokens + prompt_in_window) / window_s, request_s=len(out) / window_s,
        itl_mean_ms=sum(v * w for v, w in pairs) / weight if weight else None,
        itl_p50_ms=weighted_percentile(pairs, 50), itl_p90_ms=weighted_percentile(pairs, 90),
        itl_p99_ms=weighted_percentile(pairs, 99),
        mean_running=area_running / window_model, mean_queued=area_queued / window_model,
        slo=slo, _itl=pairs, failed=sum(1 for r in out if not r.ok),
        window_complete=obs.window_complete)
    if slo is not None:
        run = _with_goodput(run, slo)
    return run


def _with_goodput(run: PredictedRun, slo: Mapping[str, Optional[float]]) -> PredictedRun:
    return dataclasses.replace(run, goodput=run.goodput_for(slo))
