"""A load level's configuration and its validation (LevelConfig), and the load generator's
error (LoadgenError). Stdlib only.

LevelConfig is what llm_bench's options become for one level (loadgen/config.py builds it, the
module's argument spec takes its defaults from it, loadgen/options.py); `validate()` refuses a bad
value naming the field and the fix, before anything is sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (
    APIS, RX_KERNEL, RX_MODES, Endpoint,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.sender import (
    ARRIVAL_CONSTANT, ARRIVAL_GAMMA, ARRIVAL_POISSON, check_burstiness,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.percentiles import check_percentiles

LOAD_MODES = ("concurrency", "rate")
ARRIVALS = (ARRIVAL_POISSON, ARRIVAL_CONSTANT, ARRIVAL_GAMMA)


class LoadgenError(Exception):
    """Bad configuration or a client process that failed: the message says what to fix."""


@dataclass
class LevelConfig:
    base_url: str
    model: str = ""
    api: str = "openai_chat"
    concurrency: int = 1
    load_mode: str = "concurrency"
    request_rate: Optional[float] = None
    arrival: str = "poisson"
    burstiness: float = 1.0         # gamma arrivals: the gaps' shape (CV 1/sqrt(burstiness))
    max_tokens: int = 256
    ignore_eos: bool = False
    level_seconds: float = 30.0
    warmup_requests: Optional[int] = 1          # per worker (closed loop)
    min_window_requests: Optional[int] = None   # default: C (closed loop) or 10 (open loop)
    min_latency_samples: int = 30               # succeeded window requests behind percentiles
    max_requests: Optional[int] = None
    level_timeout: float = 600.0
    stall_timeout: float = 120.0
    connect_timeout: float = 10.0
    socket_rcvbuf: Optional[int] = 65536         # bytes; 0/None = the OS default
    ramp_seconds: float = 0.5                    # closed loop: worker starts spread over this
    slo: Dict[str, Optional[float]] = field(default_factory=dict)
    ci_batches: int = 10
    # Percentiles reported beside p50/p90/p99 of TTFT, TPOT, ITL and E2E, each a column
    # (results/percentiles.py): e.g. [95, 99.9]; None or [] for none.
    percentiles: Optional[List[float]] = None
    target_ci_pct: Optional[float] = None
    processes: int = 0              # 0: automatic (auto_processes), per level
    drain_timeout: float = 30.0     # s to wait for an idle server after the level; 0: no wait
    seed: int = 1
    extra_body: Dict[str, object] = field(default_factory=dict)
    api_key: Optional[str] = None
    per_chunk_usage: bool = True
    rx_timestamps: str = RX_KERNEL  # chunk arrival times: the kernel's (http.py), or at the read
    server_metrics: bool = True
    metrics_path: str = "/metrics"
    metrics_interval: float = 1.0
    host_label: str = "localhost"
    profile: str = "default"
    repeat: int = 1                 # which measurement of this level (llm_bench's repeats)
    keep_chunks: bool = False       # keep per-chunk arrival times in the request rows (tests)
    # A file the level's controller rewrites about once a second with its figures so far
    # (loadgen/live.py); the action plugin sets it when it can read it (a local bench client).
    progress_file: Optional[str] = None

    def validate(self) -> None:
        """Raise LoadgenError naming the field and the fix, before anything is sent."""
        def bad(name, msg):
            raise LoadgenError("%s: %s" % (name, msg))
        Endpoint(self.base_url, self.api)   # raises ValueError with the field named
        if self.api not in APIS:
            bad("api", "expected one of %s" % ", ".join(APIS))
        if self.api != "sglang_generate" and not self.model:
            bad("model", "required for the OpenAI APIs (the name the server serves, see "
                         "GET /v1/models)")
        if self.rx_timestamps not in RX_MODES:
            bad("rx_timestamps", "expected one of %s" % ", ".join(RX_MODES))
        if self.load_mode not in LOAD_MODES:
            bad("load_mode", "expected one of %s" % ", ".join(LOAD_MODES))
        if int(self.concurrency) < 1:
            bad("concurrency", "expected an integer >= 1, got %r" % self.concurrency)
        if int(self.repeat) < 1:
            bad("repeat", "expected an integer >= 1 (the first measurement of a level is 1), "
                          "got %r" % self.repeat)
        if self.load_mode == "rate":
            if not self.request_rate or float(self.request_rate) <= 0:
                bad("request_rate", "load_mode rate needs a request rate > 0 (requests/s)")
            if self.arrival not in ARRIVALS:
                bad("arrival", "expected one of %s" % ", ".join(ARRIVALS))
            problem = check_burstiness(self.arrival, self.burstiness)
            if problem:     # already "burstiness: ..." (sender.py), the fix included
                raise LoadgenError(problem)
        if self.max_tokens < 1:
            bad("max_tokens", "expected an integer >= 1")
        if self.level_seconds <= 0:
            bad("level_seconds", "expected seconds > 0")
        if self.level_timeout <= self.level_seconds:
            bad("level_timeout", "must exceed level_seconds (%s): it bounds warmup + window + "
                                 "tail" % self.level_seconds)
        problem = check_percentiles(self.percentiles)
        if problem:     # already "percentiles: ...", the fix included
            raise LoadgenError(problem)
        if self.ci_batches < 2:
            bad("ci_batches", "expected >= 2 batches for a confidence interval")
        if self.target_ci_pct is not None and self.target_ci_pct <= 0:
            bad("target_ci_pct", "expected a percentage > 0 (e.g. 2 for +-2%)")
        if self.min_latency_samples < 0:
            bad("min_latency_samples", "expected an integer >= 0 (0: no minimum)")
        if self.drain_timeout < 0:
            bad("drain_timeout", "expected seconds >= 0 (0: do not wait for an idle server)")
        if self.processes < 0:
            bad("processes", "expected >= 1 client processes, or 0 for automatic")
        if self.ramp_seconds < 0 or self.ramp_seconds >= self.level_timeout / 2:
            bad("ramp_seconds", "expected seconds >= 0 and well below level_timeout")
        if self.socket_rcvbuf is not None and self.socket_rcvbuf < 0:
            bad("socket_rcvbuf", "expected bytes >= 0 (0 = the OS default)")
        for key, value in (self.slo or {}).items():
            if key not in ("ttft_ms", "tpot_ms", "e2e_ms"):
                bad("slo.%s" % key, "unknown SLO; use ttft_ms, tpot_ms, e2e_ms")
            if value is not None and float(value) <= 0:
                bad("slo.%s" % key, "expected milliseconds > 0")
        for name in ("warmup_requests", "min_window_requests", "max_requests"):
            value = getattr(self, name)
            if value is not None and int(value) < (0 if name == "warmup_requests" else 1):
                bad(name, "expected a non-negative integer" if name == "warmup_requests"
                    else "expected an integer >= 1")
