"""Server-side figures over a load level's window, from the server's Prometheus `/metrics`.

The load generator's controller samples `/metrics` in a background thread through the level; the
window's figures are then: counters differenced between the samples nearest the window's edges
(divided by the time between those samples), gauges averaged over the samples inside the window.
Works with SGLang's names (`sglang:...`, `--enable-metrics`) and vLLM's (`vllm:...`); a server
without `/metrics` simply yields no server figures. Standard library only.
"""
from __future__ import annotations

import re
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

# Gauges averaged over the window: column suffix -> metric names (first present wins).
GAUGES = {
    "running_reqs": ("sglang:num_running_reqs", "vllm:num_requests_running"),
    "queued_reqs": ("sglang:num_queue_reqs", "vllm:num_requests_waiting"),
    "token_usage": ("sglang:token_usage", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
    "spec_accept_length": ("sglang:spec_accept_length",),
    "gen_throughput": ("sglang:gen_throughput",),
    "cache_hit_rate": ("sglang:cache_hit_rate",),
}
# Counters turned into rates per second over the window.
COUNTERS = {
    "generation_tokens_s": ("sglang:generation_tokens_total", "vllm:generation_tokens_total"),
    "prompt_tokens_s": ("sglang:prompt_tokens_total", "vllm:prompt_tokens_total"),
    "requests_s": ("sglang:num_requests_total", "vllm:request_success_total"),
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def parse_prometheus(text: str) -> Dict[str, float]:
    """Metric name -> value, label sets combined: counters (`*_total`) are summed over their
    label sets (e.g. TP ranks), other samples averaged. Histogram buckets are skipped."""
    sums: Dict[str, float] = {}
    counts: Dict[str, int] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        if name.endswith("_bucket"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    return {name: (total if name.endswith("_total") else total / counts[name])
            for name, total in sums.items()}


def _first(sample: Dict[str, float], names) -> Optional[float]:
    for name in names:
        if name in sample:
            return sample[name]
    return None


def window_figures(samples: List[Tuple[int, Dict[str, float]]], ws: int, we: int
                   ) -> Dict[str, float]:
    """Server figures for the window [ws, we) from (time_ns, parsed /metrics) samples."""
    if not samples or we <= ws:
        return {}
    out: Dict[str, float] = {}
    inside = [s for t, s in samples if ws <= t <= we]
    for column, names in GAUGES.items():
        values = [v for v in (_first(s, names) for s in inside) if v is not None]
        if values:
            out["server_%s_mean" % column] = round(sum(values) / len(values), 4)
    # Edges: the last sample at or before ws and the first at or after we (else the nearest).
    before = [(t, s) for t, s in samples if t <= ws] or samples[:1]
    after = [(t, s) for t, s in samples if t >= we] or samples[-1:]
    (t1, s1), (t2, s2) = before[-1], after[0]
    if t2 > t1:
        for column, names in COUNTERS.items():
            v1, v2 = _first(s1, names), _first(s2, names)
            if v1 is not None and v2 is not None and v2 >= v1:
                out["server_%s" % column] = round((v2 - v1) / ((t2 - t1) / 1e9), 3)
        # vLLM spec decoding: accept length = 1 + accepted / drafts over the window.
        acc = ("vllm:spec_decode_num_accepted_tokens_total",)
        drafts = ("vllm:spec_decode_num_drafts_total",)
        a1, a2, d1, d2 = _first(s1, acc), _first(s2, acc), _first(s1, drafts), _first(s2, drafts)
        if None not in (a1, a2, d1, d2) and d2 > d1:
            out["server_spec_accept_length_mean"] = round(1 + (a2 - a1) / (d2 - d1), 4)
        out["server_metrics_span_s"] = round((t2 - t1) / 1e9, 3)
    return out


class MetricsSampler:
    """Samples `/metrics` every `interval` s in a daemon thread until stopped. If the first scrape
    fails the sampler stops quietly and `note` says why."""

    def __init__(self, url: str, fetch: Callable[[str, float], str], interval: float = 1.0,
                 timeout: float = 3.0):
        self.url = url
        self.fetch = fetch
        self.interval = interval
        self.timeout = timeout
        self.samples: List[Tuple[int, Dict[str, float]]] = []
        self.note: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def start(self) -> MetricsSampler:
        self._thread = threading.Thread(target=self._run, name="servelab-metrics", daemon=True)
        self._thread.start()
        return self

    def sample_now(self) -> None:
        try:
            text = self.fetch(self.url, self.timeout)
        except Exception as exc:  # noqa: BLE001 - any failure just means "no server figures"
            if not self.samples:
                self.note = "no server metrics from %s: %s" % (self.url, exc)
                self._stop.set()
            return
        parsed = parse_prometheus(text)
        with self._lock:
            self.samples.append((time.monotonic_ns(), parsed))

    def _run(self):
        while not self._stop.is_set():
            self.sample_now()
            self._stop.wait(self.interval)

    def stop(self) -> List[Tuple[int, Dict[str, float]]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1)
        with self._lock:
            return list(self.samples)
