"""The level row: its typed form (LevelRow) and one definition per field (FIELDS).

A level row is one (host, profile, load level) of a sweep, as llm_bench measured it. Each field is
defined here once, with its unit, its header, its display format and what it means; levels.csv's
columns, the live progress line, the callback's lines and the report's tables are all rendered
from these definitions (level_views.py), so a figure reads the same wherever it is shown; its
cells in levels.csv are written and read back typed by them too (level_csv.py).

The words the row's text fields take (load modes, ITL basis, token source, stop reasons) are
defined here too: producers write them and consumers compare against them by name.

Standard library only: shipped to targets with the load generator.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVEL_COLUMNS
from ansible_collections.servelab.serving.plugins.module_utils.results.percentiles import (
    METRIC_HEADER, METRIC_MEANING, METRIC_VLLM, percentile_columns, percentile_parts, percentile_word,
)

# --------------------------------------------------------------------------------------------
# The words of the row's text fields

LOAD_MODE_CONCURRENCY = "concurrency"   # closed loop: C workers, each sends when its last ended
LOAD_MODE_RATE = "rate"                 # open loop: arrivals at request_rate, C caps in flight

ITL_BASIS_TOKEN = "token"     # ITL per token (the server said how many tokens each chunk held)
ITL_BASIS_CHUNK = "chunk"     # ITL per chunk (it did not)

TOKENS_SERVER = "server"      # token counts from the server (usage, meta_info)
TOKENS_CHUNKS = "chunks"      # labelled fallback: token-carrying chunks counted by the client

# How the wait for an idle server after a level ended (`drain_basis`).
DRAIN_METRIC = "metric"       # the server's running-requests gauge fell to 0
DRAIN_PROBE = "probe"         # a probe request's TTFT came back to the idle value
DRAIN_TIMEOUT = "timeout"     # the bound was reached first: the next level may start loaded
DRAIN_NONE = "none"           # not drained (turned off, or the last level)

# Which clock stamped the chunk arrivals (`rx_timestamps`).
RX_KERNEL = "kernel"          # the kernel's receive timestamp of the segment (SO_TIMESTAMPNS)
RX_USER = "user"              # the client's clock when it read the socket

# Why a level stopped (`stop_reason`).
STOP_WINDOW_COMPLETE = "window complete"
STOP_LEVEL_TIMEOUT = "level_timeout reached"
STOP_SERVER_FAILING = "server failing"      # errors kept coming: the level gave up
STOP_ABORTED = "aborted"
STOP_UNKNOWN = "unknown"


# --------------------------------------------------------------------------------------------
# The typed row (results.LEVEL_COLUMNS first, then the extra columns)


@dataclass
class LevelRow:
    host: str
    profile: str
    concurrency: int
    requests: int
    errors: int
    window_s: float
    output_tok_s: Optional[float]
    output_tok_s_ci95: Optional[float]
    total_tok_s: Optional[float]
    request_s: Optional[float]
    ttft_p50_ms: Optional[float]
    ttft_p90_ms: Optional[float]
    ttft_p99_ms: Optional[float]
    tpot_p50_ms: Optional[float]
    tpot_p90_ms: Optional[float]
    tpot_p99_ms: Optional[float]
    itl_p50_ms: Optional[float]
    itl_p99_ms: Optional[float]
    e2e_p50_ms: Optional[float]
    e2e_p99_ms: Optional[float]
    goodput_request_s: Optional[float]
    client_limited: bool
    # --- extra columns (consumers tolerate them) ---
    load_mode: str = LOAD_MODE_CONCURRENCY
    request_rate: Optional[float] = None
    repeat: int = 1
    itl_basis: str = ITL_BASIS_TOKEN
    tokens_source: str = TOKENS_SERVER
    ttft_mean_ms: Optional[float] = None
    tpot_mean_ms: Optional[float] = None
    itl_mean_ms: Optional[float] = None
    itl_p90_ms: Optional[float] = None
    e2e_p90_ms: Optional[float] = None
    e2e_mean_ms: Optional[float] = None
    ttft_std_ms: Optional[float] = None
    tpot_std_ms: Optional[float] = None
    itl_std_ms: Optional[float] = None
    e2e_std_ms: Optional[float] = None
    ci_batches: int = 0
    run_s: Optional[float] = None
    run_requests: int = 0
    run_errors: int = 0
    run_output_tok_s: Optional[float] = None
    run_request_s: Optional[float] = None
    run_ttft_p50_ms: Optional[float] = None
    run_tpot_p50_ms: Optional[float] = None
    run_e2e_p50_ms: Optional[float] = None
    cancelled_tail: int = 0
    client_processes: int = 1
    client_cpu_s: Optional[float] = None
    client_cpu_util: Optional[float] = None
    client_cpu_us_per_token: Optional[float] = None
    loop_lag_p99_ms: Optional[float] = None
    loop_lag_max_ms: Optional[float] = None
    module_cpu_s: Optional[float] = None
    ansible_cpu_s: Optional[float] = None
    host_cpu_util: Optional[float] = None
    rx_timestamps: str = ""
    prompt_token_source: str = ""
    latency_samples: int = 0
    min_latency_samples: int = 0
    arrival_rate_s: Optional[float] = None
    scheduled_requests: Optional[int] = None
    send_lateness_p50_ms: Optional[float] = None
    send_lateness_p99_ms: Optional[float] = None
    drain_s: Optional[float] = None
    drain_basis: str = ""
    window_complete: bool = True
    window_start_ns: int = 0
    window_end_ns: int = 0
    window_start_unix_ns: Optional[int] = None
    window_end_unix_ns: Optional[int] = None
    date: Optional[str] = None
    stop_reason: str = ""
    first_error: Optional[str] = None
    # GPU telemetry over the window: filled by the report from the GPU server's samples
    # (plugin_utils/report/telemetry.py); llm_bench leaves them empty.
    gpu_sm_util_mean: Optional[float] = None
    gpu_mem_used_mib_max: Optional[float] = None
    gpu_power_w_mean: Optional[float] = None
    gpu_sm_clock_mhz_mean: Optional[float] = None
    gpu_energy_j: Optional[float] = None
    tokens_per_joule: Optional[float] = None
    gpu_samples: Optional[int] = None
    # Flattened into the server_* columns of levels.csv (SERVER fields below).
    server_metrics: Dict[str, float] = field(default_factory=dict)
    # The percentiles asked for beside the standard ones (llm_bench's `percentiles`): column
    # name (percentile_column) -> ms; flattened into the row (row_dict), after FIXED_COLUMNS.
    extra_percentiles: Dict[str, Optional[float]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# One definition per field

KIND_STR, KIND_INT, KIND_FLOAT, KIND_BOOL = "str", "int", "float", "bool"


@dataclass(frozen=True)
class LevelField:
    """One field of a level row: how it is called, counted and shown."""
    name: str        # LevelRow attribute and levels.csv column
    unit: str        # "" for counts, labels and flags
    header: str      # what tables and lines call it, without the unit
    fmt: str         # format() spec of its value on display; "" for text and flags
    meaning: str     # one sentence: what the figure is
    kind: str        # KIND_*: how a levels.csv cell is read back
    optional: bool   # None is a value (not measured); a blank cell reads back as None
    server: bool     # one of the server's /metrics figures (LevelRow.server_metrics)
    summary: bool = False   # the report's repeats summary only (SUMMARY_FIELDS): no csv column
    # Its names in `vllm bench serve --save-result`'s JSON (same unit), for the vLLM-format
    # export (plugin_utils/report/peer_export.py); () where vLLM has no such figure.
    vllm: Tuple[str, ...] = ()

    @property
    def title(self) -> str:
        """Header and unit, as a column title: 'TTFT p50 ms'."""
        return "%s %s" % (self.header, self.unit) if self.unit else self.header

    @property
    def views(self) -> Tuple[str, ...]:
        """The views that show this field: levels.csv (unless it is a summary figure), and the
        layouts below that name it (the fields that name a level head every view)."""
        return (() if self.summary else (VIEW_CSV,)) + tuple(
            view for view, cells in LAYOUTS.items()
            if self.name in IDENTITY or any(self.name in cell.fields for cell in cells))


def _annotation(name: str) -> Tuple[str, bool]:
    """(kind, optional) from LevelRow's annotation of `name` ('Optional[float]' -> float, True)."""
    text = str(LevelRow.__dataclass_fields__[name].type)
    optional = text.startswith("Optional[")
    inner = text[len("Optional["):-1] if optional else text
    if inner not in (KIND_STR, KIND_INT, KIND_FLOAT, KIND_BOOL):
        raise TypeError("LevelRow.%s: %s is not a plain column type" % (name, text))
    return inner, optional


def _row_field(name: str, unit: str, header: str, fmt: str, meaning: str,
               vllm: Tuple[str, ...] = ()) -> LevelField:
    kind, optional = _annotation(name)
    return LevelField(name, unit, header, fmt, meaning, kind, optional, server=False, vllm=vllm)


def server_field(name: str, unit: str, header: str, fmt: str, meaning: str) -> LevelField:
    return LevelField(name, unit, header, fmt, meaning, KIND_FLOAT, optional=True, server=True)


_WINDOW = "over the window requests that succeeded"
# numpy.std's default (ddof=0), as vLLM's benchmark_serving computes its std_*_ms columns.
_STD = ("population standard deviation (divisor n: numpy.std's default ddof=0, as vLLM's "
        "std_*_ms) " + _WINDOW)

FIELDS: Tuple[LevelField, ...] = (
    # --- the contract's columns (results.LEVEL_COLUMNS), in their order ---
    _row_field("host", "", "host", "", "inventory host the server under test ran on"),
    _row_field("profile", "", "profile", "", "server profile (results label)"),
    _row_field("concurrency", "", "C", "d",
               "closed loop: workers, each sending its next request when its last one ended; "
               "open loop: the cap on requests in flight"),
    _row_field("requests", "", "requests", "d",
               "window requests: sent inside the measurement window (cancelled tail excluded)"),
    _row_field("errors", "", "errors", "d", "window requests that failed"),
    _row_field("window_s", "s", "window", ".1f", "length of the measurement window",
               vllm=("duration",)),
    _row_field("output_tok_s", "tok/s", "output", ".1f",
               "generated tokens that arrived inside the window / window length",
               vllm=("output_throughput",)),
    _row_field("output_tok_s_ci95", "tok/s", "CI95", ".1f",
               "95% confidence half-width of output tok/s: over one level's window by batch "
               "means; for the mean of a level's repeats (the report's summary row) across the "
               "repeats: t(n-1) x SD / sqrt(n), never less than the repeats' own half-widths "
               "combined"),
    _row_field("total_tok_s", "tok/s", "total", ".1f",
               "output tokens plus the prompt tokens of requests whose first token arrived "
               "inside the window, / window length",
               vllm=("total_token_throughput",)),
    _row_field("request_s", "request/s", "throughput", ".2f", "window requests / window length",
               vllm=("request_throughput",)),
    _row_field("ttft_p50_ms", "ms", "TTFT p50", ".1f", "time to first token, median " + _WINDOW,
               vllm=("median_ttft_ms", "p50_ttft_ms")),
    _row_field("ttft_p90_ms", "ms", "TTFT p90", ".1f", "time to first token, p90 " + _WINDOW,
               vllm=("p90_ttft_ms",)),
    _row_field("ttft_p99_ms", "ms", "TTFT p99", ".1f", "time to first token, p99 " + _WINDOW,
               vllm=("p99_ttft_ms",)),
    _row_field("tpot_p50_ms", "ms", "TPOT p50", ".1f",
               "(t_last - t_first) / (completion_tokens - 1), median " + _WINDOW,
               vllm=("median_tpot_ms", "p50_tpot_ms")),
    _row_field("tpot_p90_ms", "ms", "TPOT p90", ".1f", "time per output token, p90 " + _WINDOW,
               vllm=("p90_tpot_ms",)),
    _row_field("tpot_p99_ms", "ms", "TPOT p99", ".1f", "time per output token, p99 " + _WINDOW,
               vllm=("p99_tpot_ms",)),
    _row_field("itl_p50_ms", "ms", "ITL p50", ".1f",
               "inter-token latency per token (a k-token chunk counts k gaps of gap/k), median",
               vllm=("median_itl_ms", "p50_itl_ms")),
    _row_field("itl_p99_ms", "ms", "ITL p99", ".1f", "inter-token latency, p99",
               vllm=("p99_itl_ms",)),
    _row_field("e2e_p50_ms", "ms", "E2E p50", ".1f", "send to last token, median " + _WINDOW,
               vllm=("median_e2el_ms", "p50_e2el_ms")),
    _row_field("e2e_p99_ms", "ms", "E2E p99", ".1f", "send to last token, p99 " + _WINDOW,
               vllm=("p99_e2el_ms",)),
    _row_field("goodput_request_s", "request/s", "goodput", ".2f",
               "window requests that met every given SLO / window length; none without an SLO",
               vllm=("request_goodput",)),
    _row_field("client_limited", "", "client-limited", "",
               "a client process used >= 90% of a core, its loop-lag p99 was >= 2 ms, or the "
               "bench side (clients, module, Ansible) used >= 90% of its CPUs: the figures may "
               "measure the client, not the server"),
    # --- the extra columns, in LevelRow's order ---
    _row_field("load_mode", "", "load mode", "", "concurrency (closed loop) or rate (open loop)"),
    _row_field("request_rate", "request/s", "offered", ".2f",
               "open loop: the arrival rate asked for; none in closed loop"),
    _row_field("repeat", "", "repeat", "d",
               "which measurement of the level the row is, 1 to llm_bench's repeats "
               "(bench_repeats): each repeat is a whole level (warm-up, window, tail, drain), "
               "repeat r sends with seed + r - 1; 1 for a level measured once"),
    _row_field("itl_basis", "", "ITL basis", "",
               "token: per-token ITL; chunk: per chunk (the server sent no per-chunk counts)"),
    _row_field("tokens_source", "", "tokens source", "",
               "server: the server's token counts; chunks: counted by the client (fallback)"),
    _row_field("ttft_mean_ms", "ms", "TTFT mean", ".1f", "time to first token, mean",
               vllm=("mean_ttft_ms",)),
    _row_field("tpot_mean_ms", "ms", "TPOT mean", ".1f", "time per output token, mean",
               vllm=("mean_tpot_ms",)),
    _row_field("itl_mean_ms", "ms", "ITL mean", ".1f", "inter-token latency, token-weighted mean",
               vllm=("mean_itl_ms",)),
    _row_field("itl_p90_ms", "ms", "ITL p90", ".1f", "inter-token latency, p90",
               vllm=("p90_itl_ms",)),
    _row_field("e2e_p90_ms", "ms", "E2E p90", ".1f", "send to last token, p90",
               vllm=("p90_e2el_ms",)),
    _row_field("e2e_mean_ms", "ms", "E2E mean", ".1f",
               "send to last token, mean " + _WINDOW + " (vLLM's mean_e2el_ms)",
               vllm=("mean_e2el_ms",)),
    _row_field("ttft_std_ms", "ms", "TTFT SD", ".1f", "time to first token, " + _STD,
               vllm=("std_ttft_ms",)),
    _row_field("tpot_std_ms", "ms", "TPOT SD", ".1f", "time per output token, " + _STD,
               vllm=("std_tpot_ms",)),
    _row_field("itl_std_ms", "ms", "ITL SD", ".1f",
               "inter-token latency, token-weighted " + _STD,
               vllm=("std_itl_ms",)),
    _row_field("e2e_std_ms", "ms", "E2E SD", ".1f", "send to last token, " + _STD,
               vllm=("std_e2el_ms",)),
    _row_field("ci_batches", "", "CI batches", "d", "batches the window was cut into for CI95"),
    _row_field("run_s", "s", "run", ".1f", "whole level: first send to last token"),
    _row_field("run_requests", "", "run requests", "d",
               "requests of the whole level that finished (cancelled tail excluded)"),
    _row_field("run_errors", "", "run errors", "d", "requests of the whole level that failed"),
    _row_field("run_output_tok_s", "tok/s", "run output", ".1f",
               "whole level: output tokens / run_s, as other tools report it"),
    _row_field("run_request_s", "request/s", "run throughput", ".2f",
               "whole level: successful requests / run_s"),
    _row_field("run_ttft_p50_ms", "ms", "run TTFT p50", ".1f", "whole level: TTFT median"),
    _row_field("run_tpot_p50_ms", "ms", "run TPOT p50", ".1f", "whole level: TPOT median"),
    _row_field("run_e2e_p50_ms", "ms", "run E2E p50", ".1f", "whole level: E2E median"),
    _row_field("cancelled_tail", "", "cancelled", "d",
               "requests still in flight when the level ended, cancelled (not errors)"),
    _row_field("client_processes", "", "client processes", "d", "load-generator processes"),
    _row_field("client_cpu_s", "s", "client CPU", ".2f",
               "CPU time of all client processes, the kernel's account of them once reaped"),
    _row_field("client_cpu_util", "", "client CPU of a core", ".0%",
               "busiest client process's CPU over the window, as a fraction of one core"),
    _row_field("client_cpu_us_per_token", "us/token", "client CPU", ".1f",
               "client CPU in the window per streamed output token"),
    _row_field("loop_lag_p99_ms", "ms", "loop lag p99", ".2f",
               "client event-loop lag p99 (worst process)"),
    _row_field("loop_lag_max_ms", "ms", "loop lag max", ".2f", "client event-loop lag, worst"),
    _row_field("module_cpu_s", "s", "module CPU", ".2f",
               "CPU time of the llm_bench module process itself (controller, /metrics sampler)"),
    _row_field("ansible_cpu_s", "s", "Ansible CPU", ".2f",
               "CPU time of Ansible's own processes on the bench client during the level; none "
               "when Ansible runs on another machine"),
    _row_field("host_cpu_util", "", "host CPU busy", ".0%",
               "the bench client machine's CPU busy over the window, fraction of all its cores"),
    _row_field("rx_timestamps", "", "RX timestamps", "",
               "kernel: chunk arrival times are the kernel's receive timestamps (SO_TIMESTAMPNS); "
               "user: taken when the client read the socket"),
    _row_field("prompt_token_source", "", "prompt tokens by", "",
               "how the workload counted the input lengths it asked for: tokenizer:<path> "
               "(exact, that tokenizer), words (about one word per token; prompt_tokens has "
               "the server's count), text (prompts as given, no length asked for)"),
    _row_field("latency_samples", "", "latency samples", "d",
               "window requests the latency percentiles come from (succeeded)"),
    _row_field("min_latency_samples", "", "min latency samples", "d",
               "the latency samples the level asked for (it ran on until it had them, bounded "
               "by level_timeout)"),
    _row_field("arrival_rate_s", "request/s", "achieved rate", ".2f",
               "open loop: requests sent in the window / window length; none in closed loop"),
    _row_field("scheduled_requests", "", "arrivals due, sent", "d",
               "open loop: the arrivals the schedule drew for the window that were sent (due in "
               "it, sent in it or after it); requests below it: sends slipped out of the window"),
    _row_field("send_lateness_p50_ms", "ms", "send lateness p50", ".3f",
               "open loop: how long after its scheduled arrival a window request was sent "
               "(connection-cap queueing included), median"),
    _row_field("send_lateness_p99_ms", "ms", "send lateness p99", ".3f",
               "open loop: send lateness, p99"),
    _row_field("drain_s", "s", "drain", ".2f",
               "after the level's tail was cancelled: time until the server was idle again, "
               "before the next level started"),
    _row_field("drain_basis", "", "drain basis", "",
               "how idle was seen: metric (the server's running-requests gauge), probe (a probe "
               "request's TTFT back to idle), timeout (bound reached), none (not drained)"),
    _row_field("window_complete", "", "window complete", "",
               "the window closed on its own terms (time and requests), not on a bound"),
    _row_field("window_start_ns", "ns", "window start", "d", "client CLOCK_MONOTONIC"),
    _row_field("window_end_ns", "ns", "window end", "d", "client CLOCK_MONOTONIC"),
    _row_field("window_start_unix_ns", "ns", "window start (wall clock)", "d",
               "window start on the bench client's wall clock (Unix epoch), to join samples "
               "taken on other machines (GPU telemetry)"),
    _row_field("window_end_unix_ns", "ns", "window end (wall clock)", "d",
               "window end on the bench client's wall clock (Unix epoch)"),
    _row_field("date", "", "date", "",
               "when the level was measured: its window start, UTC, as YYYYMMDD-HHMMSS (the "
               "format of vLLM's result `date`, which is in the bench client's local time)",
               vllm=("date",)),
    _row_field("stop_reason", "", "stop reason", "",
               "why the level ended: %s" % ", ".join((STOP_WINDOW_COMPLETE, STOP_LEVEL_TIMEOUT,
                                                      STOP_SERVER_FAILING, STOP_ABORTED))),
    _row_field("first_error", "", "first error", "", "text of the level's first failed request"),
    # --- GPU telemetry over the window (the GPU server's NVML samples, joined by the report) ---
    _row_field("gpu_sm_util_mean", "%", "GPU SM util", ".0f",
               "SM utilisation (NVML), mean over the GPUs and the samples inside the window"),
    _row_field("gpu_mem_used_mib_max", "MiB", "GPU memory used", ".0f",
               "GPU memory used, summed over the GPUs, highest sample inside the window"),
    _row_field("gpu_power_w_mean", "W", "GPU power", ".0f",
               "board power, summed over the GPUs, mean over the samples inside the window"),
    _row_field("gpu_sm_clock_mhz_mean", "MHz", "GPU SM clock", ".0f",
               "SM clock, mean over the GPUs and the samples inside the window"),
    _row_field("gpu_energy_j", "J", "GPU energy", ".0f",
               "summed GPU power integrated over the window (trapezoid over its samples, the "
               "first and last held to the window's edges); none with fewer than 2 samples"),
    _row_field("tokens_per_joule", "tok/J", "tokens per joule", ".3f",
               "output tokens that arrived inside the window / GPU energy over the window"),
    _row_field("gpu_samples", "", "GPU samples", "d",
               "telemetry samples inside the window (none: no telemetry for this level)"),
    # --- the server's /metrics over the window (loadgen/server_metrics.py), when it has them ---
    server_field("server_running_reqs_mean", "", "server running", ".1f",
                 "requests the server was running, mean over the window"),
    server_field("server_queued_reqs_mean", "", "server queued", ".1f",
                 "requests waiting in the server's queue, mean over the window"),
    server_field("server_token_usage_mean", "", "server KV usage", ".2f",
                 "fraction of the KV cache in use, mean over the window"),
    server_field("server_spec_accept_length_mean", "tokens", "spec accept length", ".2f",
                 "speculative decoding: tokens accepted per verification step, mean"),
    server_field("server_gen_throughput_mean", "tok/s", "server gen throughput", ".1f",
                 "the server's own generation throughput gauge, mean over the window"),
    server_field("server_cache_hit_rate_mean", "", "server cache hit rate", ".2f",
                 "prefix cache hit rate, mean over the window"),
    server_field("server_generation_tokens_s", "tok/s", "server generation", ".1f",
                 "generated-token counter over the window, per second"),
    server_field("server_prompt_tokens_s", "tok/s", "server prompt", ".1f",
                 "prompt-token counter over the window, per second"),
    server_field("server_requests_s", "request/s", "server requests", ".2f",
                 "finished-request counter over the window, per second"),
    server_field("server_metrics_span_s", "s", "server metrics span", ".1f",
                 "time between the /metrics samples the counters were differenced over"),
)

# The report's summary of a level measured more than once (bench_repeats): one row per level
# whose figures are the mean of its repeats (plugin_utils/report/repeats.py). These are that
# row's own figures, not levels.csv columns: the exports keep one row per repeat.
SUMMARY_FIELDS: Tuple[LevelField, ...] = (
    LevelField("repeats", "", "repeats", "d",
               "repeats the summary row's figures are the mean of: the usable ones, or all when "
               "none is usable (a repeat left out is named in the row's flags)",
               KIND_INT, True, False, summary=True),
    LevelField("output_tok_s_sd", "tok/s", "output SD", ".1f",
               "standard deviation of output tok/s across those repeats (n - 1); none for one",
               KIND_FLOAT, True, False, summary=True),
    LevelField("output_tok_s_min", "tok/s", "output min", ".1f",
               "lowest output tok/s of those repeats", KIND_FLOAT, True, False, summary=True),
    LevelField("output_tok_s_max", "tok/s", "output max", ".1f",
               "highest output tok/s of those repeats", KIND_FLOAT, True, False, summary=True),
)
FIELD: Dict[str, LevelField] = {f.name: f for f in FIELDS + SUMMARY_FIELDS}

# levels.csv: the contract's columns first (consumers rely on their order), then the other row
# fields in FIELDS order, then every server figure (csv_columns).
EXTRA_COLUMNS: Tuple[str, ...] = tuple(
    f.name for f in FIELDS if not f.server and f.name not in LEVEL_COLUMNS)
ROW_COLUMNS: Tuple[str, ...] = tuple(LEVEL_COLUMNS) + EXTRA_COLUMNS
# One column set for every run, whatever it measured (a server without /metrics, no GPU
# telemetry): a figure not measured is an empty cell, never a missing column, so two runs'
# exports line up column for column (pandas.concat, a spreadsheet, a diff).
FIXED_COLUMNS: Tuple[str, ...] = ROW_COLUMNS + tuple(f.name for f in FIELDS if f.server)


# --------------------------------------------------------------------------------------------
# The columns of the percentiles chosen by the user (results/percentiles.py)


def percentile_field(name: str) -> Optional[LevelField]:
    """The field of a chosen percentile's column (like the fixed ones': ms, one decimal), or
    None for a name that is not one."""
    parts = percentile_parts(name)
    if parts is None:
        return None
    metric, q = parts
    word = percentile_word(q)
    return LevelField(name, "ms", "%s p%s" % (METRIC_HEADER[metric], word), ".1f",
                      "%s, p%s %s (a percentile asked for with bench_percentiles)"
                      % (METRIC_MEANING[metric], word, _WINDOW),
                      KIND_FLOAT, True, False, vllm=("p%s_%s_ms" % (word, METRIC_VLLM[metric]),))


def field_of(name: str) -> Optional[LevelField]:
    """The field of a column: the table's, or a chosen percentile's; None for others."""
    return FIELD.get(name) or percentile_field(name)


def row_dict(row: LevelRow) -> dict:
    """The level row as the part files, levels.csv and llm_bench's result carry it: the
    dataclass's fields, the chosen percentiles flattened into their own columns."""
    out = asdict(row)
    out.update(out.pop("extra_percentiles") or {})
    return out


def csv_columns(server_names: Iterable[str] = (), names: Iterable[str] = ()) -> List[str]:
    """levels.csv's header: FIXED_COLUMNS, then the chosen percentiles' columns among `names`
    (the columns the rows hold; percentile_columns' order), then any of `server_names` (the
    server figures the rows hold) the field table does not know, sorted (kept rather than
    dropped: a figure a newer version wrote must not vanish from the export). Every figure
    loadgen/server_metrics.py makes has a field (tests/unit/test_results_levels.py), so a run
    that chose no percentiles has FIXED_COLUMNS."""
    return (list(FIXED_COLUMNS) + percentile_columns(names)
            + sorted(set(server_names) - set(FIXED_COLUMNS)))


# vLLM's result `date` format (benchmark_serving: datetime.now().strftime), written in UTC here.
DATE_FORMAT = "%Y%m%d-%H%M%S"


def level_date(window_start_unix_ns) -> Optional[str]:
    """The `date` of a level from its window start on the wall clock (None: not known)."""
    if isinstance(window_start_unix_ns, bool) or not isinstance(window_start_unix_ns, (int, float)):
        return None
    if not math.isfinite(window_start_unix_ns) or window_start_unix_ns <= 0:
        return None
    return time.strftime(DATE_FORMAT, time.gmtime(window_start_unix_ns / 1e9))


# --------------------------------------------------------------------------------------------
# Views: which fields each one shows, and how they are grouped into cells


SINGLE = "single"        # one field
SPREAD = "spread"        # a value and its half-width: 90.0 ± 2.2
QUANTILES = "quantiles"  # percentiles of one figure: 25.0 / 60.0
COUNT = "count"          # a count out of a total: 3/40


@dataclass(frozen=True)
class Cell:
    """One figure as a reader sees it: a field, or fields that are read together."""
    fields: Tuple[str, ...]
    shape: str = SINGLE


VIEW_CSV = "levels.csv"
# Which level a row is: every view names it by these first (as row keys, not as figure cells).
IDENTITY = ("host", "profile", "concurrency")
VIEW_LINE = "line"               # the live line per level (llm_bench action, servelab callback)
VIEW_TABLE = "table"             # the report's closed-loop level table
VIEW_RATE_TABLE = "rate table"   # the report's open-loop (request-rate) table
VIEW_REPEATS = "repeats table"   # the report's spread of the levels measured more than once

_TOK_S = Cell(("output_tok_s", "output_tok_s_ci95"), SPREAD)
_ERRORS = Cell(("errors", "requests"), COUNT)
LAYOUTS: Dict[str, Tuple[Cell, ...]] = {
    VIEW_LINE: (_TOK_S, Cell(("ttft_p50_ms",)), Cell(("tpot_p50_ms",)), _ERRORS,
                Cell(("window_s",))),
    VIEW_TABLE: (_TOK_S, Cell(("ttft_p50_ms", "ttft_p99_ms"), QUANTILES),
                 Cell(("tpot_p50_ms", "tpot_p99_ms"), QUANTILES),
                 Cell(("itl_p50_ms", "itl_p99_ms"), QUANTILES), _ERRORS),
    VIEW_RATE_TABLE: (Cell(("request_rate",)), Cell(("concurrency",)), _TOK_S,
                      Cell(("ttft_p50_ms", "ttft_p99_ms"), QUANTILES),
                      Cell(("tpot_p50_ms", "tpot_p99_ms"), QUANTILES), _ERRORS),
    VIEW_REPEATS: (Cell(("repeats",)), _TOK_S, Cell(("output_tok_s_sd",)),
                   Cell(("output_tok_s_min", "output_tok_s_max"), QUANTILES),
                   Cell(("ttft_p50_ms",)), Cell(("tpot_p50_ms",))),
}


# vLLM's result key -> the field holding that figure (several keys may name one field).
VLLM_KEYS: Dict[str, str] = {key: f.name for f in FIELDS for key in f.vllm}
