"""Measurement definitions: every figure servelab reports is defined here, once.

Clock: every time is the client's CLOCK_MONOTONIC in integer nanoseconds (`time.monotonic_ns`).

Per request (a request that finished without error):
- TTFT  = t_first - t_send, where t_send is taken right before the request bytes are written to
          the socket and t_first is the arrival of the first chunk carrying generated tokens.
- E2E   = t_last - t_send, t_last = arrival of the last chunk carrying generated tokens.
- TPOT  = (t_last - t_first) / (completion_tokens - 1); undefined for 1-token answers.
- ITL   = per token. A chunk carrying k tokens that arrives `gap` after the previous token-carrying
          chunk contributes k samples of gap/k (speculative decoding sends several tokens per
          chunk). Where the server does not say how many tokens a chunk carries, the samples are
          inter-chunk gaps (weight 1 each) and the level is labelled `itl_basis = "chunk"`.
Tokens: the server's counts (OpenAI `usage`, SGLang `meta_info`), never the requested maximum.
Without them the number of token-carrying chunks is used and labelled `tokens_source = "chunks"`.

Per level (the window [ws, we) is chosen by the load generator: warmup over, all workers busy,
before any worker stopped; see loadgen.py):
- output tok/s = generated tokens whose chunk arrived inside the window / window length. A chunk
                 of unknown size carries completion_tokens / chunks of its request.
- total tok/s  = (output tokens as above + prompt tokens of requests whose first token arrived
                 inside the window) / window length (the prompt is processed before that moment).
- request/s    = requests sent inside the window ("window requests") / window length.
- goodput      = window requests that met every given SLO (TTFT, TPOT, E2E) / window length.
- latency percentiles (TTFT, TPOT, ITL, E2E) are over the window requests that succeeded.
- CI: the window is cut into equal batches; the 95% confidence half-width of output tok/s is
      t(0.975, B-1) * stdev(batch rates) / sqrt(B) (batch means).
Whole-run figures (`run_*`) use every request of the level and the span from the first send to
the last token, as other tools report them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# The row these computations fill, and the words of its labels, are the results contract's.
from ansible_collections.servelab.serving.plugins.module_utils import netstamp
from ansible_collections.servelab.serving.plugins.module_utils.results import request_itl
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.chunk_arrays import (
    add_window_tokens, itl_series,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.samples import (
    Samples, quantiles, mean as sample_mean, std as sample_std, weighted_sums,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    ITL_BASIS_CHUNK, ITL_BASIS_TOKEN, LevelRow, TOKENS_CHUNKS, TOKENS_SERVER,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.percentiles import (
    PERCENTILE_METRICS, STANDARD_PERCENTILES, extra_percentiles, percentile_column,
)

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000

# Error text of requests that the load generator itself cut off at the end of a level (the tail
# that kept the load constant while the window's last requests finished). They are recorded for
# transparency and are not counted as errors.
CANCELLED_PREFIX = "cancelled:"

# A request's phase in its level (requests.jsonl `phase`), by when it was sent.
PHASE_WARMUP = "warmup"          # before the window opened
PHASE_WINDOW = "window"          # inside the window: the level's figures come from these
PHASE_TAIL = "tail"              # after the window closed, finished while the load stayed on
PHASE_CANCELLED = "cancelled"    # still in flight when the level ended, cancelled
PHASES = (PHASE_WARMUP, PHASE_WINDOW, PHASE_TAIL, PHASE_CANCELLED)

# A failed request's kind (requests.jsonl `error_kind`), from the start of its error text: every
# error llm_bench records begins with one of these (http.py, level.py).
ERROR_KINDS = (
    ("HTTP ", "http_status"),                   # the server answered with a non-200 status
    ("connect failed", "connect"),
    ("connection lost", "connection_lost"),
    ("stalled:", "stall"),                      # nothing received for stall_timeout
    ("timeout:", "timeout"),                    # level_timeout cut a window request
    (CANCELLED_PREFIX, "cancelled"),            # the level's tail, not an error of the server
    ("server error in stream", "server_error"),
    ("aborted by server", "server_abort"),
    ("stream ended without generated tokens", "no_tokens"),
    ("malformed", "protocol"), ("unexpected chunk", "protocol"), ("response head", "protocol"),
)
ERROR_KIND_OTHER = "other"


def error_kind(error: Optional[str]) -> Optional[str]:
    """The kind of a recorded error text (ERROR_KINDS); None for a request that succeeded."""
    if error is None:
        return None
    for prefix, kind in ERROR_KINDS:
        if error.startswith(prefix):
            return kind
    return ERROR_KIND_OTHER


# --------------------------------------------------------------------------------------------
# Percentiles and statistics


def percentile(sorted_values: Sequence[float], q: float) -> Optional[float]:
    """Percentile `q` (0-100) of already sorted values, linear interpolation between closest
    ranks (numpy's default), None for no values."""
    n = len(sorted_values)
    if n == 0:
        return None
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return float(sorted_values[lo]) + (float(sorted_values[hi]) - float(sorted_values[lo])) * frac


def weighted_percentile(pairs: Sequence[Tuple[float, float]], q: float) -> Optional[float]:
    """Percentile `q` of values with integer weights, exactly as `percentile` over the list in
    which each value appears `weight` times (so k samples of gap/k are k real samples)."""
    if not pairs:
        return None
    if all(w == 1 for _key, w in pairs):
        return percentile(sorted(v for v, _weight in pairs), q)
    ordered = sorted(pairs)
    total = int(round(sum(w for _key, w in ordered)))
    if total <= 0:
        return None
    pos = (total - 1) * q / 100.0
    lo_rank = int(math.floor(pos))
    frac = pos - lo_rank
    lo_value = hi_value = None
    acc = 0
    for value, weight in ordered:
        acc += int(round(weight))
        if lo_value is None and acc > lo_rank:
            lo_value = value
        if acc > lo_rank + 1 or (acc > lo_rank and lo_rank + 1 >= total):
            hi_value = value
            break
    if hi_value is None:
        hi_value = ordered[-1][0]
    return float(lo_value) + (float(hi_value) - float(lo_value)) * frac


# Two-sided 95% Student t quantiles t(0.975, df) for small df; larger df use the normal value.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
         17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
         25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000,
         120: 1.980}


def t975(df: int) -> float:
    """t(0.975, df); between tabulated values the next smaller df is used (a slightly wider,
    conservative interval)."""
    if df <= 0:
        return float("inf")
    usable = [d for d in _T975 if d <= df]
    return _T975[max(usable)] if df < 1000 else 1.960


def batch_means_ci95(batch_rates: Sequence[float]) -> Optional[float]:
    """Half-width of the 95% confidence interval of the mean of `batch_rates` (batch means)."""
    b = len(batch_rates)
    if b < 2:
        return None
    mean = sum(batch_rates) / b
    var = sum((x - mean) ** 2 for x in batch_rates) / (b - 1)
    return t975(b - 1) * math.sqrt(var) / math.sqrt(b)


# --------------------------------------------------------------------------------------------
# Per request


@dataclass
class RequestTiming:
    """What the client observed for one request; times in client monotonic ns.

    `chunk_times` are the arrival times of the chunks that carried generated tokens and
    `chunk_tokens` the number of tokens each carried (None when the server does not say)."""
    worker: int
    request_id: int
    t_send: int
    t_first: Optional[int] = None
    t_last: Optional[int] = None
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    tokens_source: Optional[str] = None
    chunks: int = 0
    error: Optional[str] = None
    in_window: bool = False
    t_sched: Optional[int] = None         # open loop: when the arrival was due (queue time)
    server_id: Optional[str] = None       # the server's X-Request-Id, when it sends one
    chunk_times: Optional[Sequence[int]] = None
    chunk_tokens: Optional[Sequence[int]] = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.t_first is not None

    @property
    def cancelled(self) -> bool:
        return self.error is not None and self.error.startswith(CANCELLED_PREFIX)


def ttft_ns(r: RequestTiming) -> Optional[int]:
    if r.t_first is None:
        return None
    return r.t_first - r.t_send


def e2e_ns(r: RequestTiming) -> Optional[int]:
    if r.t_last is None:
        return None
    return r.t_last - r.t_send


def tpot_ns(r: RequestTiming) -> Optional[float]:
    n = r.completion_tokens
    if r.t_first is None or r.t_last is None or n is None or n < 2:
        return None
    return (r.t_last - r.t_first) / (n - 1)


def chunk_token_weights(r: RequestTiming) -> Optional[List[float]]:
    """Tokens carried by each token-carrying chunk: the server's per-chunk counts when known,
    else the request's total spread evenly over its chunks (used for window throughput only)."""
    times = r.chunk_times or ()
    if not times:
        return None
    if r.chunk_tokens is not None and len(r.chunk_tokens) == len(times):
        return list(map(float, r.chunk_tokens))
    total = r.completion_tokens if r.completion_tokens is not None else len(times)
    return [total / len(times)] * len(times)


def itl_samples(r: RequestTiming, per_token: bool) -> List[Tuple[float, float]]:
    """ITL samples (value_ns, weight) of one request. per_token: a chunk of k tokens arriving
    `gap` after the previous one gives the value gap/k with weight k (k samples of gap/k);
    otherwise each inter-chunk gap is one sample."""
    times = r.chunk_times or ()
    out: List[Tuple[float, float]] = []
    toks = r.chunk_tokens if per_token else None
    for i in range(1, len(times)):
        gap = times[i] - times[i - 1]
        if toks is not None:
            k = toks[i]
            if k <= 0:
                continue
            out.append((gap / k, float(k)))
        else:
            out.append((float(gap), 1.0))
    return out


def request_phase(r: RequestTiming, ws: int, we: int) -> str:
    """PHASES: which part of the level [ws, we) the request was sent in (no window: warmup)."""
    if r.cancelled:
        return PHASE_CANCELLED
    if r.in_window:
        return PHASE_WINDOW
    if we > ws > 0 and r.t_send >= we:
        return PHASE_TAIL
    return PHASE_WARMUP


def request_row(r: RequestTiming, ws: int = 0, we: int = 0,
                wall_offset_ns: Optional[int] = None) -> Dict[str, object]:
    """The per-request fields of requests.jsonl that come from measurement (results.REQUEST_FIELDS
    minus host/profile/concurrency, which the caller adds). `wall_offset_ns` (realtime minus
    monotonic, read once per level) gives the send time on the wall clock."""
    ttft = ttft_ns(r)
    e2e = e2e_ns(r)
    if wall_offset_ns is None:
        wall_offset_ns = netstamp.wall_offset_ns()
    tpot = tpot_ns(r)
    itl, itl_basis = request_itl.encode(r.chunk_times, r.chunk_tokens)
    return {
        "worker": r.worker,
        "request_id": r.request_id,
        "t_send": r.t_send,
        "t_first": r.t_first,
        "t_last": r.t_last,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "tokens_source": r.tokens_source,
        "ttft_ms": None if ttft is None else round(ttft / NS_PER_MS, 4),
        "e2e_ms": None if e2e is None else round(e2e / NS_PER_MS, 4),
        "tpot_ms": None if tpot is None else round(tpot / NS_PER_MS, 5),
        "chunks": r.chunks,
        "error": r.error,
        "in_window": bool(r.in_window),
        "server_id": r.server_id,
        "queue_ms": (None if r.t_sched is None
                     else round((r.t_send - r.t_sched) / NS_PER_MS, 4)),
        "t_send_unix_ns": r.t_send + wall_offset_ns,
        "phase": request_phase(r, ws, we),
        "error_kind": error_kind(r.error),
        "itl": itl,                 # the inter-token gaps in us (results/request_itl.py)
        "itl_basis": itl_basis,
    }


def meets_slo(r: RequestTiming, slo: Dict[str, Optional[float]]) -> bool:
    """True when a successful request met every SLO given (ms); a 1-token answer has no TPOT and
    meets any TPOT SLO (as vLLM's goodput does)."""
    if not r.ok:
        return False
    limits = (("ttft_ms", ttft_ns(r)), ("tpot_ms", tpot_ns(r)), ("e2e_ms", e2e_ns(r)))
    for key, value_ns in limits:
        limit = slo.get(key)
        if limit is None:
            continue
        if value_ns is None:
            if key == "tpot_ms":
                continue
            return False
        if value_ns / NS_PER_MS > float(limit):
            return False
    return True


# --------------------------------------------------------------------------------------------
# Partial sums: each load-generator process reduces its own requests to a LevelPart, the parent
# merges the parts. Keeping raw samples (not pre-computed percentiles) keeps the merge exact; the
# samples are series (loadgen/samples.py) that the load generator writes to its spool directory,
# so a long level's end holds none of them in memory.

# The sample series of a LevelPart: (name, typecode, weighted). Times in ns: ints ("q"), TPOT and
# ITL are quotients ("d"); ITL samples carry their weights (a k-token chunk is k samples).
SERIES = (("ttft", "q", False), ("tpot", "d", False), ("e2e", "q", False),
          ("itl", "d", True), ("lateness", "q", False),
          ("run_ttft", "q", False), ("run_tpot", "d", False), ("run_e2e", "q", False))


def _series(name: str, path_prefix: Optional[str] = None) -> Samples:
    typecode, weighted = next((t, w) for n, t, w in SERIES if n == name)
    return Samples(typecode, weighted, None if path_prefix is None
                   else "%s.%s" % (path_prefix, name))


@dataclass
class LevelPart:
    ws: int = 0
    we: int = 0
    batches: int = 0
    window_output_tokens: float = 0.0
    window_prompt_tokens: float = 0.0
    batch_tokens: List[float] = field(default_factory=list)
    run_output_tokens: float = 0.0
    run_prompt_tokens: float = 0.0
    run_first_send: Optional[int] = None
    run_last_token: Optional[int] = None
    # window requests
    ttft: Samples = field(default_factory=lambda: _series("ttft"))
    tpot: Samples = field(default_factory=lambda: _series("tpot"))
    e2e: Samples = field(default_factory=lambda: _series("e2e"))
    itl: Samples = field(default_factory=lambda: _series("itl"))     # (value, weight) samples
    lateness: Samples = field(default_factory=lambda: _series("lateness"))  # t_send - t_sched
    window_requests: int = 0
    window_scheduled: int = 0       # open loop: sent arrivals due in the window (t_sched)
    window_errors: int = 0
    window_good: int = 0
    # whole run
    run_ttft: Samples = field(default_factory=lambda: _series("run_ttft"))
    run_tpot: Samples = field(default_factory=lambda: _series("run_tpot"))
    run_e2e: Samples = field(default_factory=lambda: _series("run_e2e"))
    run_requests: int = 0
    run_ok: int = 0
    run_errors: int = 0
    cancelled: int = 0
    per_token_itl: bool = True
    tokens_fallback: int = 0
    first_error: Optional[str] = None

    def spill_to(self, path_prefix: str) -> LevelPart:
        """Write the sample series to files `path_prefix`.<series> as they grow."""
        for name, _typecode, _weighted in SERIES:
            setattr(self, name, _series(name, path_prefix))
        return self

    def seal(self) -> LevelPart:
        """Write what the series buffer: the part can then be pickled and merged."""
        for name, _typecode, _weighted in SERIES:
            getattr(self, name).seal()
        return self

    def remove_files(self) -> None:
        for name, _typecode, _weighted in SERIES:
            getattr(self, name).remove()

    def merge(self, other: LevelPart) -> LevelPart:
        if not self.batch_tokens:
            self.batch_tokens = [0.0] * len(other.batch_tokens)
        for i, v in enumerate(other.batch_tokens):
            self.batch_tokens[i] += v
        for name in ("window_output_tokens", "window_prompt_tokens", "run_output_tokens",
                     "run_prompt_tokens", "window_requests", "window_errors", "window_good",
                     "run_requests", "run_ok", "run_errors", "cancelled", "tokens_fallback",
                     "window_scheduled"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, _typecode, _weighted in SERIES:
            getattr(self, name).merge(getattr(other, name))
        if other.run_first_send is not None:
            self.run_first_send = (other.run_first_send if self.run_first_send is None
                                   else min(self.run_first_send, other.run_first_send))
        if other.run_last_token is not None:
            self.run_last_token = (other.run_last_token if self.run_last_token is None
                                   else max(self.run_last_token, other.run_last_token))
        self.per_token_itl = self.per_token_itl and other.per_token_itl
        self.first_error = self.first_error or other.first_error
        return self


def reduce_requests(requests: Iterable[RequestTiming], ws: int, we: int, batches: int,
                    slo: Dict[str, Optional[float]],
                    per_token_itl: Optional[bool] = None,
                    samples_path: Optional[str] = None) -> LevelPart:
    """Reduce one process's requests to a LevelPart for the window [ws, we) (ws == we == 0: no
    window). Window requests are those flagged in_window by the load generator.
    `per_token_itl`, when the caller tracked it as the requests finished (every successful
    request had per-chunk counts, and one succeeded), lets `requests` be a stream read once
    (the load generator's spool) instead of a list. `samples_path`: the sample series are
    written to files of that prefix (LevelPart.spill_to) instead of kept in memory."""
    part = LevelPart(ws=ws, we=we, batches=batches)
    if samples_path is not None:
        part.spill_to(samples_path)
    has_window = we > ws > 0
    nb = batches if has_window else 0
    part.batch_tokens = [0.0] * nb
    if per_token_itl is None:
        requests = list(requests)
        # Per-token ITL needs per-chunk counts on every successful request of the level.
        per_token_itl = all(r.chunk_tokens is not None for r in requests if r.ok) and any(
            r.ok for r in requests)
    part.per_token_itl = per_token_itl
    for r in requests:
        if r.cancelled:
            part.cancelled += 1
            # Its tokens still arrived while the server was loaded: they count for throughput.
        else:
            part.run_requests += 1
            if r.ok:
                part.run_ok += 1
            elif r.error is not None:
                part.run_errors += 1
                part.first_error = part.first_error or r.error
        if part.run_first_send is None or r.t_send < part.run_first_send:
            part.run_first_send = r.t_send
        weights = chunk_token_weights(r)
        if weights is not None:
            times = r.chunk_times
            if r.t_last is not None and (part.run_last_token is None
                                         or r.t_last > part.run_last_token):
                part.run_last_token = r.t_last
            part.run_output_tokens += sum(weights)
            if r.prompt_tokens:
                part.run_prompt_tokens += r.prompt_tokens
            if has_window:
                # The window's tokens by batch: each chunk in [ws, we) adds its weight to the
                # batch (t - ws) * nb // span (loadgen/chunk_arrays.py: in bulk, the same sums).
                part.window_output_tokens = add_window_tokens(
                    times, weights, ws, we, part.batch_tokens, part.window_output_tokens)
                if r.prompt_tokens and r.t_first is not None and ws <= r.t_first < we:
                    part.window_prompt_tokens += r.prompt_tokens
        if r.ok:
            if r.tokens_source != TOKENS_SERVER:
                part.tokens_fallback += 1
            _append_latencies(r, part.run_ttft, part.run_tpot, part.run_e2e)
        if has_window and r.t_sched is not None and ws <= r.t_sched < we:
            part.window_scheduled += 1
        if r.in_window and has_window and not r.cancelled:
            part.window_requests += 1
            if r.t_sched is not None:
                part.lateness.append(r.t_send - r.t_sched)
            if not r.ok:
                part.window_errors += 1
                continue
            if meets_slo(r, slo):
                part.window_good += 1
            _append_latencies(r, part.ttft, part.tpot, part.e2e)
            values, weights = itl_series(r.chunk_times, r.chunk_tokens, part.per_token_itl)
            part.itl.extend(values, weights)
    return part.seal()


def _append_latencies(r: RequestTiming, ttft: Samples, tpot: Samples, e2e: Samples) -> None:
    ttft.append(ttft_ns(r))
    e2e.append(e2e_ns(r))
    value = tpot_ns(r)
    if value is not None:
        tpot.append(value)


# --------------------------------------------------------------------------------------------
# The level row (its fields are defined in results/levels.py)


def _ms(value_ns: Optional[float], digits: int = 5) -> Optional[float]:
    return None if value_ns is None else round(value_ns / NS_PER_MS, digits)


def _pcts(samples: Samples, qs: Sequence[float]) -> List[Optional[float]]:
    """Percentiles of a series (weighted or not), ms: exact (samples.quantiles)."""
    return [_ms(value) for value in quantiles(samples, qs)]


def _mean_ms(samples: Samples) -> Optional[float]:
    return _ms(sample_mean(samples))


def _std_ms(samples: Samples) -> Optional[float]:
    """Population standard deviation (divisor n), as numpy.std's default (ddof=0), which vLLM's
    benchmark_serving uses for its std_*_ms: the same figure from the same samples."""
    return _ms(sample_std(samples))


def level_row(host: str, profile: str, concurrency: int, part: LevelPart,
              slo: Dict[str, Optional[float]], percentiles: Sequence[float] = ()) -> LevelRow:
    """Turn merged LevelPart sums into the level row. Client-honesty fields (CPU, lag,
    client_limited) are filled in by the load generator, which measured them. `percentiles`:
    the ones asked for beside STANDARD_PERCENTILES (llm_bench's `percentiles`), each a column
    of TTFT, TPOT, ITL and E2E (results/levels.py percentile_column)."""
    window_s = (part.we - part.ws) / NS_PER_S if part.we > part.ws > 0 else 0.0
    has_window = window_s > 0
    extra = extra_percentiles(percentiles)
    qs = tuple(STANDARD_PERCENTILES) + tuple(extra)
    figures = {metric: _pcts(getattr(part, metric), qs)
               for metric, _header, _vllm in PERCENTILE_METRICS}
    ttft50, ttft90, ttft99 = figures["ttft"][:3]
    tpot50, tpot90, tpot99 = figures["tpot"][:3]
    e2e50, e2e90, e2e99 = figures["e2e"][:3]
    itl50, itl90, itl99 = figures["itl"][:3]
    total_w, itl_mean_ns, itl_std_ns = weighted_sums(part.itl)
    itl_mean = _ms(itl_mean_ns) if total_w else None
    extra_columns = {percentile_column(metric, q): values[3 + i]
                     for metric, values in figures.items() for i, q in enumerate(extra)}
    ci = None
    if has_window and part.batch_tokens:
        batch_s = window_s / len(part.batch_tokens)
        ci = batch_means_ci95([tokens / batch_s for tokens in part.batch_tokens])
    run_s = None
    if part.run_first_send is not None and part.run_last_token is not None:
        run_s = (part.run_last_token - part.run_first_send) / NS_PER_S
    any_slo = any(slo.get(k) is not None for k in ("ttft_ms", "tpot_ms", "e2e_ms"))
    return LevelRow(
        host=host, profile=profile, concurrency=int(concurrency),
        requests=part.window_requests, errors=part.window_errors,
        window_s=round(window_s, 4),
        output_tok_s=_round(part.window_output_tokens / window_s) if has_window else None,
        output_tok_s_ci95=_round(ci),
        total_tok_s=(_round((part.window_output_tokens + part.window_prompt_tokens) / window_s)
                     if has_window else None),
        request_s=_round(part.window_requests / window_s, 4) if has_window else None,
        ttft_p50_ms=ttft50, ttft_p90_ms=ttft90, ttft_p99_ms=ttft99,
        tpot_p50_ms=tpot50, tpot_p90_ms=tpot90, tpot_p99_ms=tpot99,
        itl_p50_ms=itl50, itl_p99_ms=itl99,
        e2e_p50_ms=e2e50, e2e_p99_ms=e2e99,
        goodput_request_s=(_round(part.window_good / window_s, 4)
                           if has_window and any_slo else None),
        client_limited=False,
        itl_basis=ITL_BASIS_TOKEN if part.per_token_itl else ITL_BASIS_CHUNK,
        tokens_source=TOKENS_SERVER if part.tokens_fallback == 0 else TOKENS_CHUNKS,
        ttft_mean_ms=_mean_ms(part.ttft), tpot_mean_ms=_mean_ms(part.tpot),
        itl_mean_ms=itl_mean, itl_p90_ms=itl90, e2e_p90_ms=e2e90,
        e2e_mean_ms=_mean_ms(part.e2e),
        ttft_std_ms=_std_ms(part.ttft), tpot_std_ms=_std_ms(part.tpot),
        itl_std_ms=_ms(itl_std_ns) if total_w else None,
        e2e_std_ms=_std_ms(part.e2e),
        ci_batches=len(part.batch_tokens) if has_window else 0,
        run_s=None if run_s is None else round(run_s, 4),
        run_requests=part.run_requests, run_errors=part.run_errors,
        run_output_tok_s=_round(part.run_output_tokens / run_s) if run_s else None,
        run_request_s=_round(part.run_ok / run_s, 4) if run_s else None,
        run_ttft_p50_ms=_pcts(part.run_ttft, (50,))[0],
        run_tpot_p50_ms=_pcts(part.run_tpot, (50,))[0],
        run_e2e_p50_ms=_pcts(part.run_e2e, (50,))[0],
        cancelled_tail=part.cancelled,
        latency_samples=len(part.ttft),
        send_lateness_p50_ms=_pcts(part.lateness, (50,))[0] if part.lateness else None,
        send_lateness_p99_ms=_pcts(part.lateness, (99,))[0] if part.lateness else None,
        first_error=part.first_error,
        extra_percentiles=extra_columns,
    )


def _round(value: Optional[float], digits: int = 3) -> Optional[float]:
    return None if value is None else round(value, digits)
