"""servelab simulator engine: an OpenAI/SGLang-compatible streaming LLM server on a timing model.

One self-contained file, Python standard library only. llm_server writes it onto the target as
servelab_simulator.py and runs `python3 servelab_simulator.py --port N --profile NAME ...`; it
prints `servelab-simulator listening on http://HOST:PORT` once it accepts connections.

Endpoints
    POST /v1/chat/completions, POST /v1/completions    OpenAI format, stream true/false, SSE
        `data: {...}` chunks, `data: [DONE]`; `stream_options.include_usage` adds a final chunk
        with `usage`; non-streamed responses always carry `usage`.
    POST /generate         SGLang native: {"text" | "input_ids", "sampling_params": {...},
        "stream": bool}; streamed chunks carry the cumulative `text` and `meta_info` with
        cumulative `completion_tokens` (and `spec_verify_ct` under speculation) like SGLang.
    GET /v1/models, /health, /health_generate (like SGLang: submits a 1-token generation and
    answers 200 once the scheduler emitted a token after the check began), /metrics
    (Prometheus, SGLang's metric names, label model_name), /server_info (alias
    /get_server_info: profile parameters, time_scale, version), /get_model_info.

Timing model (profiles `baseline`, `eagle3`, `baseline_cu128`, `eagle3_cu128`): continuous
batching. A scheduler loop runs steps; each step serves every running request (at most
`max_running`; the rest wait in a FIFO queue) and admits queued requests while their prompt
tokens fit the step's prefill budget (`max_prefill_tokens`, chunked prefill). One step lasts

    step_base_ms + step_per_req_ms * decoding + moe_ms * (1 - (1 - moe_token_share) ** routed)
    + prefill_per_token_ms * new_prompt_tokens                 (all divided by time_scale)

where `decoding` is the number of running requests that decode in the step and `routed` =
decoding + new_prompt_tokens. The `moe_ms` term is the MoE expert weights a step reads: one token
touches a share of the experts and a batch re-uses them, so the per-request cost falls as the
batch grows. Without it no linear model fits the field data (see _FIT below). A newly
admitted request emits its first token at the end of its prefill step; a decoding request emits
1 token per step, or under speculation a draw of the accepted length (1 + the run of accepted
draft tokens, each accepted with `spec_accept_rate`, at most `spec_num_steps`): multi-token
chunks. Each request also spends `request_overhead_ms` (times 1 +- request_overhead_jitter,
seeded) outside the batch before it can be admitted (HTTP, tokenizer, detokenizer, client
turnaround in the field's setup): it delays the request but not the others. Draws are seeded by
`--seed` and the request's arrival number, so a run repeats.

Test profiles: `fixed` (the first chunk exactly `ttft_ms` after the request, then one chunk every
`step_ms`; no batch, no queue) and `firehose` (writes chunks as fast as the loop allows, yielding
to the loop between writes, `firehose_events_per_write` SSE events per write).
`--tokens-per-chunk K` forces K tokens in every chunk, in any profile.

Tokens: prompt tokens = ceil(utf8 bytes / 4) of the prompt text (for chat: of all message
contents together; role names and template are not counted); `input_ids` count one each. Every
generated token is 4 bytes of ASCII text, so the same rule counts completions back. Output
length: exactly max_tokens with `ignore_eos` (or min_tokens >= max_tokens); otherwise a natural
length drawn from a log-normal (`natural_len_median`, `natural_len_sigma`) seeded by a hash of
the prompt and `--seed`, at least min_tokens, capped at max_tokens.

`time_scale` divides every model duration (the model runs that many times faster than real
time); fault knobs (`--stall-ms`, `--startup-delay`) are wall-clock.

Truth (`--truth-log PATH`): one JSON line per finished request (id also in the response `id`,
`meta_info.id` and the X-Request-Id header), with server CLOCK_MONOTONIC times in ns: t_recv_ns
(request body complete: when the server's event loop read it), t_arrive_ns (when the segment
that completed the request reached the server's socket: the kernel's receive stamp on Linux,
SO_TIMESTAMPNS; elsewhere, or where the stamp is unusable, the read time; `arrive_basis` says
which: kernel, read), chunk_ns and chunk_tokens (one entry per SSE event that carries
tokens), t_admit_ns (admitted to the batch), t_first_ns, t_last_ns, prompt_tokens,
completion_tokens, finish_reason, error (null or text), malformed_chunks, stalled_ms.
Buffered; flushed at least every second and at shutdown (SIGTERM/SIGINT).

Fault knobs: --die-after N (exit code 3, connections reset, right after the N-th generation
request sent its first chunk), --error-rate P (HTTP 500, or for a stream: an error event after
half the tokens then [DONE]), --stall-every N --stall-ms M (every N-th request stops emitting
for M ms after half its tokens), --malformed-every N (every N-th streamed request gets one
broken JSON event after its first chunk), --startup-delay S (503 from /health,
/health_generate and generation requests for S seconds), --abort-delay-ms M (a client that
disconnects mid-request is noticed M wall-clock ms late: its request keeps generating, holds its
batch slot and stays in `num_running_reqs` until then, as on a server whose abort arrives late;
0, the default, cancels it at once).

predict_level() and predict_crossover() give the model's closed-loop steady state from a fast
discrete-event simulation of the same scheduler logic with the same seeded draws (not the live
server; deterministic). `python3 simulator.py --fit-report` prints the fit against the field
data with its residuals.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import heapq
import json
import math
import os
import random
import signal
import socket
import statistics
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

VERSION = "0.1.0"
LISTEN_LINE = "servelab-simulator listening on http://{host}:{port}"

# --- the workload the fit assumes --------------------------------------------------------------
# "Coding/agentic prompts": a long context (system prompt, code, tool transcript) and a
# medium-length answer. The field data does not record the lengths; these are the assumed
# defaults, and the load generator's bench defaults use them so that a default run on the
# simulator reproduces the field curve. Every request generates exactly DEFAULT_OUTPUT_TOKENS
# (ignore_eos).
DEFAULT_PROMPT_TOKENS = 2048
DEFAULT_OUTPUT_TOKENS = 512
# The highest level of the field sweep; "saturation" figures are predicted there.
SATURATION_CONCURRENCY = 250
BYTES_PER_TOKEN = 4
DEFAULT_OPENAI_MAX_TOKENS = 4096     # when a request gives no max_tokens
DEFAULT_GENERATE_MAX_NEW_TOKENS = 128  # SGLang's default for /generate
EXIT_DIE_AFTER = 3


class SimError(ValueError):
    """Bad simulator settings: the message names the setting and the fix."""


# --- profiles -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimProfile:
    """Parameters of one simulated serving configuration. Times are model milliseconds
    (divided by time_scale when served). Every field is also a CLI flag (--step-base-ms ...)."""
    name: str
    mode: str = "batched"                 # batched | fixed | firehose
    step_base_ms: float = 0.0             # fixed cost of one scheduler step
    step_per_req_ms: float = 0.0          # cost per decoding request in a step
    moe_ms: float = 0.0                   # expert weight reads when a step touches every expert
    moe_token_share: float = 0.1          # share of the experts one routed token touches
    prefill_per_token_ms: float = 0.0     # prefill cost per new prompt token
    max_prefill_tokens: int = 16384       # prompt tokens admitted per step (chunked prefill)
    request_overhead_ms: float = 0.0      # per-request time outside the batch (mean)
    request_overhead_jitter: float = 0.5  # each request's overhead: mean * (1 +- this), seeded
    max_running: int = 256                # running requests; the rest queue
    speculative: bool = False
    spec_num_steps: int = 0               # draft depth: at most spec_num_steps + 1 tokens/step
    spec_accept_rate: float = 0.0         # chance each next draft token is accepted
    spec_eagle_topk: int = 0              # reported only (server_info)
    spec_num_draft_tokens: int = 0        # reported only (server_info)
    natural_len_median: int = 384         # natural output length (without ignore_eos)
    natural_len_sigma: float = 0.7
    kv_capacity_tokens: int = 1_000_000   # for sglang:token_usage
    step_ms: float = 12.0                 # fixed: gap between chunks
    ttft_ms: float = 50.0                 # fixed: request -> first chunk
    tokens_per_chunk: int = 0             # >0: every chunk carries this many tokens
    firehose_events_per_write: int = 1    # firehose: SSE events per transport write
    # Speculation switched by load (see speculation_on): off | threshold | thrash.
    spec_dynamic: str = "off"
    spec_max_batch: int = 0               # dynamic: speculation on while the batch is at most this
    spec_switch_ms: float = 0.0           # dynamic: extra step time on each step that switches
    spec_off_step_base_ms: float = 0.0    # dynamic: the step costs with speculation off
    spec_off_step_per_req_ms: float = 0.0
    step_scale: float = 1.0               # every step term times this (the split halves)
    description: str = ""


def spec_accept_mean(accept_rate: float, num_steps: int) -> float:
    """Mean accepted length: 1 + a + a^2 + ... + a^num_steps (stop at the first rejection)."""
    return sum(accept_rate ** i for i in range(num_steps + 1))


def spec_accept_cdf(accept_rate: float, num_steps: int) -> List[float]:
    """Cumulative P(accepted length <= k) for k = 1..num_steps+1, for inverse-CDF draws."""
    probs = [(accept_rate ** (k - 1)) * (1 - accept_rate) for k in range(1, num_steps + 1)]
    probs.append(accept_rate ** num_steps)
    out, acc = [], 0.0
    for p in probs:
        acc += p
        out.append(acc)
    out[-1] = 1.0
    return out


# Fitted parameters. How: benchmarks/sim_fit.py, a Nelder-Mead least-squares fit of
# predict_level() (the discrete-event model of this scheduler, with the server's seeded
# randomness) at the default workload (DEFAULT_PROMPT_TOKENS in, DEFAULT_OUTPUT_TOKENS out) to
# FIELD_DATA below: the eagle3 closed-loop sweep (C=1, 2, 5, 30, 70, saturation) and baseline
# saturation, with the single-stream figures held exactly (step_base_ms is solved from them, see
# fitted_profiles) and a penalty unless speculation leads at C=1 and C=2 and trails at C=5 by 3 %
# (the field's single-stream gap, 96.1 vs 92.6, leaves no room for more).
# Fitted: moe_ms, request_overhead_ms, the two step_per_req_ms.
# Chosen, not fitted (the field data cannot separate them from the fitted ones):
#   prefill_per_token_ms 0.05: 20k prompt tok/s;
#   moe_token_share 0.2: of 0.1 and 0.2 tried, 0.2 fits better (worst residual 4.5 % vs 5.3 %);
#   max_prefill_tokens 16384, request_overhead_jitter 0.5;
#   EAGLE-3 acceptance 0.7 per draft token over 5 draft steps: mean accepted length 2.94 (the
#   field did not record it; the throughput fit absorbs another value into the step costs).
# Why the moe term: no linear step model fits. Speculation must lead at C=2 (125.1 tok/s) while
# the baseline saturates near 773 tok/s: the baseline's marginal cost per request must be ~2.5x
# higher at low concurrency than at saturation, which is what expert re-use gives.
# Why request_overhead_ms (~1.1 s model time): the sweep's C=1 figure (77.5-80.9) sits 18 % below
# the pure decode rate (96.1), yet the saturation figures show no matching per-token cost: the
# time is spent outside the batch.
# Residuals: `python3 simulator.py --fit-report` and tests/unit/test_simulator_model.py.
_FIT = {
    "moe_ms": 17.687,
    "moe_token_share": 0.2,
    "request_overhead_ms": 1142.53,
    "prefill_per_token_ms": 0.05,
    "baseline_per_req_ms": 0.991,
    "eagle3_per_req_ms": 7.944,
    "spec_accept_rate": 0.7,
    "spec_num_steps": 5,
}
# Single-stream pure decode figures (tok/s) the profiles reproduce exactly (see fitted_profiles).
_SINGLE_STREAM = {"baseline": 92.6, "eagle3": 96.1, "baseline_cu128": 89.5, "eagle3_cu128": 54.1}


def _moe_fraction(share: float, routed_tokens: float) -> float:
    return 1.0 - (1.0 - share) ** routed_tokens if routed_tokens > 0 else 0.0


_DESCRIPTIONS = {
    "baseline": "8x RTX PRO 6000, TP=8, CUDA 13 + allreduce fusion, no speculation",
    "eagle3": "as baseline with EAGLE-3 (16 draft tokens, topk 4, 5 steps)",
    "baseline_cu128": "CUDA 12.8 without allreduce fusion, no speculation",
    "eagle3_cu128": "CUDA 12.8 without allreduce fusion, EAGLE-3",
}


def fitted_profiles(fit: Mapping[str, float]) -> Dict[str, SimProfile]:
    """The four field profiles from a set of fitted parameters (the _FIT layout).

    step_base_ms is solved so that one running request decodes at exactly the single-stream
    figure: base = tokens_per_step * 1000 / rate - per_req - moe(1 routed token). The CUDA 12.8
    (no allreduce fusion) profiles have only single-stream figures: they are the CUDA 13 profiles
    with that base raised to match them (fusion saves a fixed per-step all-reduce cost);
    everything else is assumed unchanged."""
    out = {}
    for name, rate in _SINGLE_STREAM.items():
        speculative = name.startswith("eagle3")
        per_req = float(fit["eagle3_per_req_ms" if speculative else "baseline_per_req_ms"])
        tokens = (spec_accept_mean(fit["spec_accept_rate"], int(fit["spec_num_steps"]))
                  if speculative else 1.0)
        spec = dict(spec_num_steps=int(fit["spec_num_steps"]),
                    spec_accept_rate=fit["spec_accept_rate"], spec_eagle_topk=4,
                    spec_num_draft_tokens=16) if speculative else {}
        base = (tokens * 1000.0 / rate - per_req
                - fit["moe_ms"] * _moe_fraction(fit["moe_token_share"], 1))
        out[name] = SimProfile(
            name=name, mode="batched", speculative=speculative,
            step_base_ms=round(base, 4), step_per_req_ms=per_req, moe_ms=fit["moe_ms"],
            moe_token_share=fit["moe_token_share"],
            prefill_per_token_ms=fit["prefill_per_token_ms"],
            request_overhead_ms=fit["request_overhead_ms"], description=_DESCRIPTIONS[name],
            **spec)
    return out


# --- speculation by load and the two-server split: stated model choices, not field fits --------
# The field ran each configuration statically; nothing in FIELD_DATA measures a switch or a split.
# A healthy schedule's switch: a change of the step's shape (the verify tokens in the batch), a
# graph switch of about a step's fixed cost. Chosen, not measured.
DYNAMIC_SWITCH_MS = 2.0
DYNAMIC_MAX_BATCH = 3        # the fitted curves cross between C=3 and C=5 (--fit-report)
# The pathological schedule's switch, chosen so that at twice the threshold the aggregate falls
# into the range vLLM issue #49548 reports for 8 clients over a threshold of 4: 24-157 tok/s
# dynamic against 232 static, i.e. 10-68 % of the static profile.
THRASH_SWITCH_MS = 120.0
# ASSUMPTION for the router case (two servers, each on half the GPUs): the field measured TP=8
# only. A half (TP=4 on 4 of the 8 GPUs) is modelled as the TP=8 fit with every step term
# SPLIT_STEP_SCALE times longer (each GPU reads twice the weights per step; the all-reduce is
# cheaper with fewer ranks, so less than 2x) and half the running slots. Override with
# step_scale in the profile's simulator settings; the report labels these curves as assumed.
SPLIT_STEP_SCALE = 1.7
SPLIT_MAX_RUNNING = 128
SPLIT_ASSUMPTION = (f"assumed, not fitted: each half runs the TP=8 fit with every step "
                    f"{SPLIT_STEP_SCALE}x longer and {SPLIT_MAX_RUNNING} running slots "
                    f"(the field measured TP=8 only)")


def load_switched_profiles(fitted: Mapping[str, SimProfile]) -> Dict[str, SimProfile]:
    """eagle3 switched by load (healthy and pathological) and the split halves, derived from the
    fitted baseline and eagle3 profiles."""
    base, spec = fitted["baseline"], fitted["eagle3"]
    off = dict(spec_off_step_base_ms=base.step_base_ms,
               spec_off_step_per_req_ms=base.step_per_req_ms)
    return {
        "eagle3_dynamic": dataclasses.replace(
            spec, name="eagle3_dynamic", spec_dynamic="threshold",
            spec_max_batch=DYNAMIC_MAX_BATCH, spec_switch_ms=DYNAMIC_SWITCH_MS,
            description="eagle3 while the batch is at most spec_max_batch, baseline above; "
                        "each switch costs spec_switch_ms", **off),
        "eagle3_thrash": dataclasses.replace(
            spec, name="eagle3_thrash", spec_dynamic="thrash",
            spec_max_batch=DYNAMIC_MAX_BATCH, spec_switch_ms=THRASH_SWITCH_MS,
            description="pathological schedule (vLLM issue #49548): keyed off every scheduled "
                        "request and flipping every step above the threshold", **off),
        "baseline_half": dataclasses.replace(
            base, name="baseline_half", step_scale=SPLIT_STEP_SCALE,
            max_running=SPLIT_MAX_RUNNING, description="baseline on half the GPUs: "
                                                       + SPLIT_ASSUMPTION),
        "eagle3_half": dataclasses.replace(
            spec, name="eagle3_half", step_scale=SPLIT_STEP_SCALE,
            max_running=SPLIT_MAX_RUNNING, description="eagle3 on half the GPUs: "
                                                       + SPLIT_ASSUMPTION),
    }


_FITTED = fitted_profiles(_FIT)
PROFILES: Dict[str, SimProfile] = {
    **_FITTED,
    **load_switched_profiles(_FITTED),
    "fixed": SimProfile(
        name="fixed", mode="fixed", max_running=1_000_000,
        description="test: first chunk after exactly ttft_ms, then one chunk every step_ms"),
    "firehose": SimProfile(
        name="firehose", mode="firehose", max_running=1_000_000,
        description="test: chunks as fast as the event loop allows"),
}
MODES = ("batched", "fixed", "firehose")
SPEC_DYNAMIC_MODES = ("off", "threshold", "thrash")
_PROFILE_FIELDS = {f.name: f for f in dataclasses.fields(SimProfile)}
_MODE_ONLY = {"step_ms": "fixed", "ttft_ms": "fixed", "firehose_events_per_write": "firehose"}


def validate_profile(p: SimProfile) -> SimProfile:
    """Raise SimError naming the first bad field; return the profile."""
    if p.mode not in MODES:
        raise SimError(f"mode must be one of {', '.join(MODES)} (got {p.mode!r})")
    nonneg = ("step_base_ms", "step_per_req_ms", "moe_ms", "prefill_per_token_ms",
              "request_overhead_ms", "step_ms", "ttft_ms", "natural_len_sigma")
    for name in nonneg:
        if not getattr(p, name) >= 0:
            raise SimError(f"{name} must be >= 0 (got {getattr(p, name)!r})")
    for name in ("max_prefill_tokens", "max_running", "natural_len_median",
                 "kv_capacity_tokens", "firehose_events_per_write"):
        if getattr(p, name) < 1:
            raise SimError(f"{name} must be >= 1 (got {getattr(p, name)!r})")
    if p.tokens_per_chunk < 0:
        raise SimError(f"tokens_per_chunk must be >= 0, 0 = chosen by the model "
                       f"(got {p.tokens_per_chunk})")
    if not 0.0 <= p.request_overhead_jitter < 1.0:
        raise SimError(f"request_overhead_jitter must be within [0, 1) "
                       f"(got {p.request_overhead_jitter})")
    if not 0.0 <= p.moe_token_share <= 1.0:
        raise SimError(f"moe_token_share must be within [0, 1] (got {p.moe_token_share})")
    if not 0.0 <= p.spec_accept_rate < 1.0:
        raise SimError(f"spec_accept_rate must be within [0, 1) (got {p.spec_accept_rate})")
    if p.spec_num_steps < 0:
        raise SimError(f"spec_num_steps must be >= 0 (got {p.spec_num_steps})")
    if p.speculative and p.spec_num_steps < 1:
        raise SimError("speculative profiles need spec_num_steps >= 1")
    if p.spec_dynamic not in SPEC_DYNAMIC_MODES:
        raise SimError(f"spec_dynamic must be one of {', '.join(SPEC_DYNAMIC_MODES)} "
                       f"(got {p.spec_dynamic!r})")
    if p.spec_dynamic != "off":
        if not p.speculative:
            raise SimError(f"spec_dynamic {p.spec_dynamic} switches speculation by load: it "
                           f"needs a speculative profile (e.g. --profile eagle3_dynamic)")
        if p.spec_max_batch < 1:
            raise SimError("spec_dynamic needs spec_max_batch >= 1, the largest batch that "
                           "still speculates")
        if p.spec_off_step_base_ms + p.spec_off_step_per_req_ms <= 0:
            raise SimError("spec_dynamic needs the step costs without speculation: set "
                           "spec_off_step_base_ms (and spec_off_step_per_req_ms)")
    for name in ("spec_switch_ms", "spec_off_step_base_ms", "spec_off_step_per_req_ms"):
        if not getattr(p, name) >= 0:
            raise SimError(f"{name} must be >= 0 (got {getattr(p, name)!r})")
    if p.spec_max_batch < 0:
        raise SimError(f"spec_max_batch must be >= 0 (got {p.spec_max_batch})")
    if not (math.isfinite(p.step_scale) and p.step_scale > 0):
        raise SimError(f"step_scale must be a number > 0 (got {p.step_scale!r})")
    if p.mode == "batched" and p.step_base_ms + p.step_per_req_ms + p.moe_ms <= 0:
        raise SimError("a batched profile needs a positive step time: set step_base_ms > 0")
    return p


def resolve_profile(profile_or_params: Union[str, SimProfile, Mapping[str, Any]]
                    ) -> Tuple[SimProfile, Optional[float]]:
    """A profile name, a SimProfile, or a mapping such as llm_server's `simulator:` settings
    ({profile: eagle3, time_scale: 10, max_running: 64, ...}) -> (SimProfile, time_scale|None).
    Mapping keys are SimProfile fields (dashes or underscores); unknown keys are errors, except
    server-only settings (seed, truth_log, faults), which do not change the timing model."""
    if isinstance(profile_or_params, SimProfile):
        return validate_profile(profile_or_params), None
    if isinstance(profile_or_params, str):
        if profile_or_params not in PROFILES:
            raise SimError(f"unknown profile {profile_or_params!r}; choose one of "
                           f"{', '.join(PROFILES)}")
        return PROFILES[profile_or_params], None
    if not isinstance(profile_or_params, Mapping):
        raise SimError(f"profile must be a name, a SimProfile or a mapping "
                       f"(got {type(profile_or_params).__name__})")
    params = {str(k).replace("-", "_"): v for k, v in profile_or_params.items()}
    base = resolve_profile(params.pop("profile", "baseline"))[0]
    time_scale = params.pop("time_scale", None)
    for ignored in _SERVER_ONLY_KEYS:
        params.pop(ignored, None)
    unknown = sorted(k for k in params if k not in _PROFILE_FIELDS or k == "name")
    if unknown:
        raise SimError(f"unknown simulator setting(s) {', '.join(unknown)}; known: "
                       f"{', '.join(sorted(set(_PROFILE_FIELDS) - {'name'}))}")
    typed = {k: _coerce(k, v) for k, v in params.items()}
    return (validate_profile(dataclasses.replace(base, **typed)),
            None if time_scale is None else _positive_float("time_scale", time_scale))


def _coerce(name: str, value: Any) -> Any:
    kind = type(getattr(PROFILES["baseline"], name))
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        return kind(value)
    except (TypeError, ValueError):
        raise SimError(f"{name} must be a {kind.__name__} (got {value!r})") from None


def _positive_float(name: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = float("nan")
    if not math.isfinite(out) or out <= 0:  # NaN too
        raise SimError(f"{name} must be a number > 0 (got {value!r}); e.g. {name} 10")
    return out


def tokens_per_decode_step(p: SimProfile) -> float:
    """Expected tokens one decoding request gets per step."""
    if p.tokens_per_chunk:
        return float(p.tokens_per_chunk)
    if p.speculative:
        return spec_accept_mean(p.spec_accept_rate, p.spec_num_steps)
    return 1.0


def step_ms(p: SimProfile, decoding: int, new_prompt_tokens: int = 0,
            spec_on: bool = True) -> float:
    """Model duration of one batched step (ms, before time_scale). A dynamic profile's step
    with speculation off costs what the baseline's does (spec_off_* costs)."""
    off = p.spec_dynamic != "off" and not spec_on
    base = p.spec_off_step_base_ms if off else p.step_base_ms
    per_req = p.spec_off_step_per_req_ms if off else p.step_per_req_ms
    return p.step_scale * (
        base + per_req * decoding
        + p.moe_ms * _moe_fraction(p.moe_token_share, decoding + new_prompt_tokens)
        + p.prefill_per_token_ms * new_prompt_tokens)


def speculation_on(p: SimProfile, decoding: int, admitted: int,
                   previous: Optional[bool]) -> bool:
    """Whether this step speculates.

    off: a speculative profile always does. threshold (the healthy schedule, vLLM's
    `num_speculative_tokens_per_batch_size` working as meant): on while the decoding batch is at
    most spec_max_batch. thrash (the pathological schedule, modelled on vLLM issue #49548's
    report): the lookup is keyed off every scheduled request, prefills included, and above the
    threshold it flips on/off from one step to the next ("K flips 2<->0 step-to-step"), so a
    loaded server pays spec_switch_ms on nearly every step. Not modelled: vLLM 0.33.0 runs CUDA
    graphs PIECEWISE instead of full whenever the schedule is set (vllm/config/vllm.py:1069-1086);
    the step times stay the profile's, so a scheduled run here is as fast as an unscheduled one."""
    if not p.speculative:
        return False
    if p.spec_dynamic == "off":
        return True
    if p.spec_dynamic == "threshold":
        return decoding <= p.spec_max_batch
    if decoding + admitted <= p.spec_max_batch:
        return True
    return not previous if previous is not None else False


def switch_ms(p: SimProfile, on: bool, previous: Optional[bool]) -> float:
    """The stated cost of a switch (a step whose speculation differs from the last one's)."""
    if p.spec_dynamic == "off" or previous is None or on == previous:
        return 0.0
    return p.spec_switch_ms * p.step_scale


def single_stream_tok_s(profile_or_params) -> float:
    """Pure decode rate of one running request (no prefill, no overhead), model time."""
    p, _params = resolve_profile(profile_or_params)
    if p.mode == "fixed":
        return (p.tokens_per_chunk or 1) * 1000.0 / p.step_ms
    if p.mode == "firehose":
        raise SimError("firehose has no timing model")
    return tokens_per_decode_step(p) * 1000.0 / step_ms(p, 1)


# --- token rules ----------------------------------------------------------------------------------
def prompt_tokens_for_text(text: str) -> int:
    """The documented rule: ceil(utf8 bytes / 4), at least 1."""
    return max(1, -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN))


def text_for_prompt_tokens(n: int, seed: int = 0) -> str:
    """An ASCII text that the rule above counts as exactly n tokens (for load generators)."""
    if n < 1:
        raise SimError(f"prompt tokens must be >= 1 (got {n})")
    return token_text(seed, n)


def _hash_unit(*parts: Any) -> float:
    """Deterministic uniform in (0, 1) from the parts."""
    h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
    return (int.from_bytes(h, "big") + 0.5) / 2.0 ** 64


def natural_output_tokens(p: SimProfile, content_key: str, seed: int) -> int:
    """Length the model would stop at by itself: log-normal, seeded by the prompt's hash."""
    z = statistics.NormalDist().inv_cdf(_hash_unit("len", seed, content_key))
    return max(1, int(round(p.natural_len_median * math.exp(p.natural_len_sigma * z))))


# 64 four-byte tokens: plain ASCII, nothing to escape in JSON.
_VOCAB = [" " + c + v + e for c in "bcdfgklmnprstvwz" for v, e in ("an", "el", "ir", "os")]
_VOCAB_TEXT = "".join(_VOCAB) * 3


def token_text(start: int, k: int) -> str:
    """Text of k consecutive generated tokens beginning at token position `start`."""
    i = (start % 64) * BYTES_PER_TOKEN
    if k <= 64:
        return _VOCAB_TEXT[i:i + k * BYTES_PER_TOKEN]
    return "".join(token_text(start + j, min(64, k - j)) for j in range(0, k, 64))


# --- predictions: a deterministic discrete-event model of the same scheduler ---------------------
@dataclass(frozen=True)
class LevelPrediction:
    """Steady state of a closed loop of `concurrency` clients (each sends its next request when the
    last finished), in real time (model time divided by time_scale)."""
    profile: str
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    time_scale: float
    output_tok_s: float
    total_tok_s: float
    request_s: float
    ttft_ms: float          # request received -> first chunk, mean
    tpot_ms: float          # (last - first chunk) / (output_tokens - 1), mean
    e2e_ms: float
    mean_running: float     # time-weighted requests in the batch
    mean_queued: float      # time-weighted requests waiting for admission
    method: str = "discrete-event"


def predict_level(profile_or_params, concurrency: int,
                  prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
                  output_tokens: int = DEFAULT_OUTPUT_TOKENS, *,
                  time_scale: Optional[float] = None, seed: int = 0) -> LevelPrediction:
    """The model's expected closed-loop steady state at one concurrency level.

    A discrete-event run of the scheduler logic the server uses (FIFO admission under
    max_running and the prefill budget, the step-time formula, the per-request overhead outside
    the batch with its jitter, seeded accepted-length draws), driven by the same seeded draws as
    the server. All clients start together; two rounds (2*C completions) are warm-up, then at
    least 4 rounds and MIN_MEASURED_REQUESTS requests are measured. Deterministic; milliseconds
    at low concurrency, about a second at C=250 with the default workload."""
    p, ts_from_params = resolve_profile(profile_or_params)
    ts = _positive_float("time_scale", time_scale if time_scale is not None
                         else (ts_from_params or 1.0))
    for name, value in (("concurrency", concurrency), ("prompt_tokens", prompt_tokens),
                        ("output_tokens", output_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise SimError(f"{name} must be an integer >= 1 (got {value!r})")
    if p.mode == "firehose":
        raise SimError("firehose streams as fast as it can: it has no timing model to predict")
    if p.mode == "fixed":
        k = p.tokens_per_chunk or 1
        chunks = -(-output_tokens // k)
        e2e = p.ttft_ms + (chunks - 1) * p.step_ms
        tpot = (e2e - p.ttft_ms) / (output_tokens - 1) if output_tokens > 1 else 0.0
        return _prediction(p, concurrency, prompt_tokens, output_tokens, ts,
                           concurrency * output_tokens / e2e * 1000.0, p.ttft_ms, tpot, e2e,
                           float(concurrency), 0.0, "analytic")
    return _simulate_closed_loop(p, concurrency, prompt_tokens, output_tokens, ts, seed)


MIN_MEASURED_REQUESTS = 200


def _prediction(p, c, pt, ot, ts, tok_s_model, ttft, tpot, e2e, running, queued, method):
    tok_s = tok_s_model * ts
    return LevelPrediction(
        profile=p.name, concurrency=c, prompt_tokens=pt, output_tokens=ot, time_scale=ts,
        output_tok_s=tok_s, total_tok_s=tok_s * (pt + ot) / ot, request_s=tok_s / ot,
        ttft_ms=ttft / ts, tpot_ms=tpot / ts, e2e_ms=e2e / ts, mean_running=running,
        mean_queued=queued, method=method)


def overhead_factor(p: SimProfile, seed: int, index: Any) -> float:
    """This request's share of request_overhead_ms: uniform in 1 +- jitter, seeded by arrival."""
    if not p.request_overhead_jitter:
        return 1.0
    return 1.0 + p.request_overhead_jitter * (2.0 * _hash_unit("overhead", seed, index) - 1.0)


def _simulate_closed_loop(p: SimProfile, C: int, P: int, O: int, ts: float,  # noqa: E741 (the model's C, P, O)
                          seed: int) -> LevelPrediction:
    """Per-request discrete-event run in model milliseconds. A request is a list
    [remaining tokens, t_send, t_first, draws or None]."""
    fixed_k = p.tokens_per_chunk
    cdf = (spec_accept_cdf(p.spec_accept_rate, p.spec_num_steps)
           if p.speculative and not fixed_k else None)
    per_step = fixed_k or 1
    first = min(O, fixed_k or 1)
    t = 0.0
    pending: List[Tuple[float, int, list]] = []   # heap of (t_eligible, arrival index, request)
    arrivals = 0

    def send(now: float) -> None:
        nonlocal arrivals
        arrivals += 1
        draws = None if cdf is None else _Draws(seed, arrivals, cdf)
        eligible = now + p.request_overhead_ms * overhead_factor(p, seed, arrivals)
        heapq.heappush(pending, (eligible, arrivals, [0, now, 0.0, draws]))

    for _i in range(C):
        send(0.0)
    queue: deque = deque()
    running: List[list] = []
    previous_on: Optional[bool] = None
    done = 0
    start_at = 2 * C
    stop_at = start_at + max(4 * C, MIN_MEASURED_REQUESTS)
    t_a: Optional[float] = None
    tokens = 0
    sum_ttft = sum_tpot = sum_e2e = 0.0
    measured = 0
    area_running = area_queued = 0.0
    for _step in range(50_000_000):
        if not running and not queue:
            t = max(t, pending[0][0])          # idle: the next eligible request starts a step
            while pending and pending[0][0] <= t:
                queue.append(heapq.heappop(pending)[2])
        while pending and pending[0][0] < t:   # became eligible during the last step
            queue.append(heapq.heappop(pending)[2])
        decoding = len(running)
        free = p.max_running - decoding
        budget = p.max_prefill_tokens
        new: List[list] = []
        while queue and free > 0 and (not new or P <= budget):
            new.append(queue.popleft())
            free -= 1
            budget -= P
        queued = len(queue)
        on = speculation_on(p, decoding, len(new), previous_on)
        dt = step_ms(p, decoding, len(new) * P, on) + switch_ms(p, on, previous_on)
        previous_on = on
        t += dt
        emitted = 0
        finished: List[list] = []
        for req in running:
            draws = req[3]
            k = per_step if draws is None or not on else draws.next()
            if k >= req[0]:
                k = req[0]
                finished.append(req)
            req[0] -= k
            emitted += k
        for req in new:
            req[2] = t
            req[0] = O - first
            emitted += first
            if req[0] <= 0:
                finished.append(req)
            else:
                running.append(req)
        if t_a is not None:
            tokens += emitted
            area_running += (decoding + len(new)) * dt
            area_queued += queued * dt
        if finished:
            gone = set(map(id, finished))
            running = [r for r in running if id(r) not in gone]
            for req in finished:
                done += 1
                if t_a is not None:
                    sum_ttft += req[2] - req[1]
                    sum_e2e += t - req[1]
                    sum_tpot += (t - req[2]) / (O - 1) if O > 1 else 0.0
                    measured += 1
                send(t)
        if t_a is None and done >= start_at:
            t_a = t
        elif t_a is not None and done >= stop_at:
            window = t - t_a
            n = max(1, measured)
            return _prediction(p, C, P, O, ts, tokens / window * 1000.0, sum_ttft / n,
                               sum_tpot / n, sum_e2e / n, area_running / window,
                               area_queued / window, "discrete-event")
    raise SimError("prediction did not reach a steady state (step budget exhausted)")


def predict_crossover(baseline, spec, levels: Sequence[int],
                      prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
                      output_tokens: int = DEFAULT_OUTPUT_TOKENS, *,
                      time_scale: Optional[float] = None) -> Optional[int]:
    """First level (in the given order, sorted ascending) where spec's predicted output tok/s is
    below baseline's; None if it never is."""
    for level in sorted(levels):
        b = predict_level(baseline, level, prompt_tokens, output_tokens, time_scale=time_scale)
        s = predict_level(spec, level, prompt_tokens, output_tokens, time_scale=time_scale)
        if s.output_tok_s < b.output_tok_s:
            return level
    return None


# --- the field data the profiles are fitted to (docs/architecture.md, 'The simulator') -----------------------------
@dataclass(frozen=True)
class FieldPoint:
    profile: str
    kind: str            # single_stream (pure decode) | closed_loop (default workload, C clients)
    concurrency: int
    low: float           # tok/s; a range where the field gave one
    high: float
    note: str = ""


FIELD_DATA: Tuple[FieldPoint, ...] = (
    FieldPoint("baseline", "single_stream", 1, 92.6, 92.6),
    FieldPoint("baseline", "closed_loop", SATURATION_CONCURRENCY, 773.0, 773.0, "~773 saturation"),
    FieldPoint("eagle3", "single_stream", 1, 96.1, 96.1),
    FieldPoint("eagle3", "closed_loop", 1, 77.5, 80.9, "sweep C=1"),
    FieldPoint("eagle3", "closed_loop", 2, 125.1, 125.1),
    FieldPoint("eagle3", "closed_loop", 5, 183.2, 183.2),
    FieldPoint("eagle3", "closed_loop", 30, 299.5, 299.5),
    FieldPoint("eagle3", "closed_loop", 70, 337.7, 337.7),
    FieldPoint("eagle3", "closed_loop", SATURATION_CONCURRENCY, 340.0, 354.0, "saturation"),
    FieldPoint("baseline_cu128", "single_stream", 1, 89.5, 89.5),
    FieldPoint("eagle3_cu128", "single_stream", 1, 54.1, 54.1),
)


@dataclass(frozen=True)
class FitResidual:
    profile: str
    kind: str
    concurrency: int
    field_low: float
    field_high: float
    model: float
    residual: float      # relative distance to the field range (0 inside it)


def fit_residuals(profiles: Optional[Mapping[str, SimProfile]] = None,
                  prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
                  output_tokens: int = DEFAULT_OUTPUT_TOKENS) -> List[FitResidual]:
    profiles = profiles or PROFILES
    out = []
    for fp in FIELD_DATA:
        p = profiles[fp.profile]
        if fp.kind == "single_stream":
            model = single_stream_tok_s(p)
        else:
            model = predict_level(p, fp.concurrency, prompt_tokens, output_tokens).output_tok_s
        if model < fp.low:
            resid = model / fp.low - 1.0
        elif model > fp.high:
            resid = model / fp.high - 1.0
        else:
            resid = 0.0
        out.append(FitResidual(fp.profile, fp.kind, fp.concurrency, fp.low, fp.high, model, resid))
    return out


def format_fit_report(profiles: Optional[Mapping[str, SimProfile]] = None) -> str:
    profiles = profiles or PROFILES
    lines = [f"fit at {DEFAULT_PROMPT_TOKENS} prompt / {DEFAULT_OUTPUT_TOKENS} output tokens "
             f"(saturation = C={SATURATION_CONCURRENCY})",
             f"{'profile':<15} {'kind':<13} {'C':>4} {'field tok/s':>13} {'model':>8} "
             f"{'residual':>9}"]
    for r in fit_residuals(profiles):
        span = (f"{r.field_low:.1f}" if r.field_low == r.field_high
                else f"{r.field_low:.1f}-{r.field_high:.1f}")
        lines.append(f"{r.profile:<15} {r.kind:<13} {r.concurrency:>4} {span:>13} "
                     f"{r.model:>8.1f} {100 * r.residual:>+8.1f}%")
    lines.append("closed loop, model tok/s:")
    levels = (1, 2, 3, 4, 5, 10, 30, 70, SATURATION_CONCURRENCY)
    for a, b in (("baseline", "eagle3"), ("baseline_cu128", "eagle3_cu128")):
        ra = [predict_level(profiles[a], c).output_tok_s for c in levels]
        rb = [predict_level(profiles[b], c).output_tok_s for c in levels]
        lines.append(f"  {'C':<15}" + "".join(f"{c:>8}" for c in levels))
        lines.append(f"  {a:<15}" + "".join(f"{v:>8.1f}" for v in ra))
        lines.append(f"  {b:<15}" + "".join(f"{v:>8.1f}" for v in rb))
        lines.append(f"  crossover {b} vs {a}: C="
                     f"{predict_crossover(profiles[a], profiles[b], levels)}")
    return "\n".join(lines)


# ==================================================================================================
# The server
# ==================================================================================================
_SERVER_ONLY_KEYS = ("seed", "truth_log", "die_after", "error_rate", "stall_every", "stall_ms",
                     "malformed_every", "startup_delay", "model_name", "host", "port")


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


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class TruthLog:
    """Buffered JSON lines; flushed by the server at least every second and at shutdown."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self._buf: List[str] = []
        self._fh = None
        if path:
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, exist_ok=True)
            self._fh = open(path, "a", encoding="utf-8")

    def add(self, record: Mapping[str, Any]) -> None:
        if self._fh is not None:
            self._buf.append(_dumps(record))

    def flush(self) -> None:
        if self._fh is not None and self._buf:
            self._fh.write("\n".join(self._buf) + "\n")
            self._buf.clear()
            self._fh.flush()

    def close(self) -> None:
        self.flush()
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class Stats:
    """Counters and gauges for /metrics and /server_info."""

    def __init__(self):
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_requests_total = 0          # finished generation requests
        self.requests_received_total = 0
        self.requests_failed_total = 0
        self.decode_steps_total = 0
        self.spec_switches_total = 0         # steps whose speculation differed from the last's
        self.spec_verify_total = 0           # request-steps that verified drafts
        self.spec_tokens_total = 0           # tokens those request-steps yielded
        self._buckets: deque = deque()       # [bucket(0.1 s), tokens, verifies, spec_tokens]
        self.last_gen_throughput = 0.0
        self.last_accept_length = 0.0

    def tokens(self, now: float, n: int, verifies: int = 0, spec_tokens: int = 0) -> None:
        self.generation_tokens_total += n
        self.spec_verify_total += verifies
        self.spec_tokens_total += spec_tokens
        b = int(now * 10)
        if self._buckets and self._buckets[-1][0] == b:
            last = self._buckets[-1]
            last[1] += n
            last[2] += verifies
            last[3] += spec_tokens
        else:
            self._buckets.append([b, n, verifies, spec_tokens])
            while self._buckets and self._buckets[0][0] < b - 100:
                self._buckets.popleft()

    def window(self, now: float, seconds: float = 5.0) -> Tuple[float, float]:
        """(tokens/s over the last `seconds`, mean accepted length over them)."""
        lo = int((now - seconds) * 10)
        toks = sum(x[1] for x in self._buckets if x[0] >= lo)
        ver = sum(x[2] for x in self._buckets if x[0] >= lo)
        stoks = sum(x[3] for x in self._buckets if x[0] >= lo)
        if toks:
            self.last_gen_throughput = toks / seconds
        if ver:
            self.last_accept_length = stoks / ver
        return self.last_gen_throughput, self.last_accept_length


class _Fail(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.err_type = status, message, err_type


class SimRequest:
    """One generation request and everything the stream and the truth record need."""
    __slots__ = ("id", "index", "api", "stream", "include_usage", "continuous_usage",
                 "prompt_tokens", "target",
                 "finish_reason", "proto", "t_recv_ns", "emitted", "chunk_ns", "chunk_tokens",
                 "t_first_ns", "t_last_ns", "error", "pieces", "text_seed", "fail_at",
                 "stall_at", "stall_until", "malformed_at", "malformed", "finished", "cancelled",
                 "internal", "future", "created", "prefix", "suffix", "verify_ct", "draws",
                 "t_admit_ns", "t_arrive_ns")

    def __init__(self):
        self.emitted = 0
        self.chunk_ns: List[int] = []
        self.chunk_tokens: List[int] = []
        self.t_first_ns = self.t_last_ns = None
        self.error = None
        self.pieces: List[str] = []
        self.fail_at = self.stall_at = self.malformed_at = 0
        self.stall_until = 0.0
        self.malformed = 0
        self.finished = self.cancelled = self.internal = False
        self.t_admit_ns = None
        self.t_arrive_ns: Optional[int] = None   # kernel receive stamp; None: the read time
        self.future = None
        self.proto = None
        self.verify_ct = 0
        self.draws = None
        self.include_usage = False
        self.continuous_usage = False   # stream_options.continuous_usage_stats (vLLM/SGLang)


# Kernel receive stamps for the truth's t_arrive_ns. The read time (t_recv_ns) includes however
# long a busy machine kept the server's loop from the socket; the kernel's stamp of the segment
# that completed a request is when the request reached the server, the truth a client's send
# lateness is measured against. asyncio's selector transport reads with its socket's recv(), so
# the listening socket hands out a socket whose recv() is a recvmsg() that keeps the stamp.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("qq")
_RX_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_RX_MAX_AGE_NS = 10_000_000_000     # older (or more than the skew in the future): a clock step
_RX_MAX_SKEW_NS = 1_000_000         # the stamp's CPU and ours may disagree by microseconds


class _StampedSocket(socket.socket):
    """An accepted connection whose recv() records the kernel's receive time of the last
    segment it returned, on the monotonic clock (rx_ns; None where the kernel gave none)."""

    __slots__ = ("rx_ns",)

    def recv(self, bufsize, flags=0):
        data, ancdata, _flags, _addr = self.recvmsg(bufsize, _RX_ANCILLARY, flags)
        now = time.monotonic_ns()
        stamp = None
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS \
                    and len(cdata) >= _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(cdata)
                age = time.time_ns() - (sec * 1_000_000_000 + nsec)
                if -_RX_MAX_SKEW_NS <= age < _RX_MAX_AGE_NS:
                    stamp = now - max(age, 0)
        self.rx_ns = stamp
        return data


class _StampingListener(socket.socket):
    """A listening socket (SO_TIMESTAMPNS on, which its connections inherit) whose accept()
    returns _StampedSocket connections."""

    __slots__ = ()

    def accept(self):
        fd, addr = self._accept()
        conn = _StampedSocket(self.family, self.type, self.proto, fileno=fd)
        conn.rx_ns = None
        # Streams are many small writes: never hold one back for an ACK (Nagle).
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr


def kernel_rx_stamps_possible() -> bool:
    return sys.platform.startswith("linux") and bool(_RX_ANCILLARY)


def stamping_listener(host: str, port: int, backlog: int) -> Optional[socket.socket]:
    """A bound, listening _StampingListener for host:port, or None where the host resolves to
    more than one address or stamps are not possible (the caller then lets asyncio listen)."""
    if not kernel_rx_stamps_possible():
        return None
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addrs = {(fam, sa) for fam, _t, _p, _c, sa in infos}
    if len(addrs) != 1:
        return None
    family, sockaddr = addrs.pop()
    # proto IPPROTO_TCP, as asyncio's own listener has: asyncio sets TCP_NODELAY only on sockets
    # whose proto says TCP, and without it a stream of small writes waits for delayed ACKs.
    sock = _StampingListener(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # On the listener, not only on each accepted socket: a segment is stamped when it
        # arrives only if some socket wants stamps by then (the kernel switches stamping on a
        # moment after the first socket asks), and a client's first request can arrive before
        # accept() returns. Accepted sockets inherit the option.
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive; one request at a time per connection (pipelined requests wait
    in the buffer); chunked transfer encoding for streams."""

    MAX_HEAD = 64 * 1024
    MAX_BODY = 64 * 1024 * 1024

    def __init__(self, server: SimServer):
        self.server = server
        self.transport = None
        self.buf = bytearray()
        self.busy = False
        self.closed = False
        self.keep_alive = True
        self.paused = False
        self._resume: Optional[asyncio.Future] = None
        self.active: Optional[SimRequest] = None
        self._sent_continue = False
        self._rx_sock: Optional[_StampedSocket] = None
        self._rx_ns: Optional[int] = None   # the kernel stamp of the read being processed

    # asyncio callbacks
    def connection_made(self, transport):
        self.transport = transport
        self.server.connections.add(self)
        # The transport's socket wrapper keeps the accepted socket as _sock; anything else
        # (another event loop, a wrapper without it) leaves t_arrive_ns at the read time.
        raw = transport.get_extra_info("socket")
        raw = getattr(raw, "_sock", raw)
        self._rx_sock = raw if isinstance(raw, _StampedSocket) else None

    def connection_lost(self, exc):
        self.closed = True
        self.server.connections.discard(self)
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)
        if self.active is not None and not self.active.finished:
            self.server.client_gone(self.active)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)

    async def drain(self):
        if self.paused and not self.closed:
            self._resume = asyncio.get_running_loop().create_future()
            await self._resume

    def data_received(self, data):
        self.buf += data
        if self._rx_sock is not None:
            self._rx_ns = self._rx_sock.rx_ns
        if not self.busy:
            self._process()

    # parsing
    def _process(self):
        while not self.busy and not self.closed:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > self.MAX_HEAD:
                    self._plain_error(431, "request head too large")
                return
            try:
                head = self.buf[:end].decode("latin-1")
                lines = head.split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _colon, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0") or 0)
            except ValueError:
                self._plain_error(400, "malformed HTTP request")
                return
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._plain_error(501, "chunked request bodies are not supported; send "
                                       "Content-Length")
                return
            if length < 0 or length > self.MAX_BODY:
                self._plain_error(413, f"body must be 0..{self.MAX_BODY} bytes")
                return
            if len(self.buf) < end + 4 + length:
                if (headers.get("expect", "").lower() == "100-continue"
                        and not self._sent_continue):
                    self._sent_continue = True
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            t_recv_ns = time.monotonic_ns()
            # The stamp is this request's arrival only for the first request the read completed
            # (a pipelined one behind it, or one processed from the buffer later, has none).
            t_arrive_ns, self._rx_ns = self._rx_ns, None
            body = bytes(self.buf[end + 4:end + 4 + length])
            del self.buf[:end + 4 + length]
            self._sent_continue = False
            conn = headers.get("connection", "").lower()
            self.keep_alive = ("close" not in conn) if version == "HTTP/1.1" \
                else ("keep-alive" in conn)
            self.busy = True
            self.server.dispatch(self, method, target.split("?", 1)[0], headers, body, t_recv_ns,
                                 t_arrive_ns)

    # responses
    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def respond(self, status: int, body: bytes, content_type: str = "application/json",
                extra: str = "") -> None:
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n{extra}"
                f"Connection: {'keep-alive' if self.keep_alive else 'close'}\r\n\r\n")
        self.write(head.encode("latin-1") + body)
        self.done()

    def respond_json(self, status: int, obj: Any, extra: str = "") -> None:
        self.respond(status, _dumps(obj).encode("utf-8"), extra=extra)

    def start_stream(self, request_id: str) -> None:
        self.write(("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n"
                    f"X-Request-Id: {request_id}\r\n"
                    f"Connection: {'keep-alive' if self.keep_alive else 'close'}\r\n\r\n"
                    ).encode("latin-1"))

    def stream_write(self, payload: bytes) -> None:
        if not self.closed:
            self.transport.write(b"%x\r\n%b\r\n" % (len(payload), payload))

    def end_stream(self, payload: bytes = b"") -> None:
        if not self.closed:
            if payload:
                self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(payload), payload))
            else:
                self.transport.write(b"0\r\n\r\n")
        self.done()

    def done(self) -> None:
        self.active = None
        self.busy = False
        if self.closed:
            return
        if not self.keep_alive:
            self.transport.close()
            return
        if self.buf:
            asyncio.get_running_loop().call_soon(self._process)

    def _plain_error(self, status: int, message: str) -> None:
        self.keep_alive = False
        self.busy = True
        self.respond_json(status, _error_obj(status, message))


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}


def _error_obj(status: int, message: str, err_type: Optional[str] = None) -> Dict[str, Any]:
    err_type = err_type or ("BadRequestError" if status < 500 else "InternalServerError")
    return {"object": "error", "error": {"message": message, "type": err_type, "code": status},
            "message": message, "code": status}


class SimServer:
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
        self.running: List[SimRequest] = []
        self._wake: Optional[asyncio.Event] = None
        self._stop: Optional[asyncio.Event] = None
        self._tasks: List[asyncio.Task] = []
        self._health_waiters: List[asyncio.Future] = []
        self._accept_cdf = (spec_accept_cdf(self.p.spec_accept_rate, self.p.spec_num_steps)
                            if self.p.speculative else None)
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
            "max_model_len": self.p.kv_capacity_tokens}]})

    def _model_info(self, proto):
        proto.respond_json(200, {"model_path": self.cfg.model_name,
                                 "tokenizer_path": self.cfg.model_name, "is_generation": True,
                                 "served_model_name": self.cfg.model_name})

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
                "memory_usage": {"token_capacity": p.kv_capacity_tokens}}],
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
            ("sglang:token_usage", "gauge", "The token usage.", used / self.p.kv_capacity_tokens),
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
        loop, p, ts = self.loop, self.p, self.ts
        lag_limit = 0.003
        anchor = loop.time()
        fixed_k = p.tokens_per_chunk
        previous_on: Optional[bool] = None
        while True:
            if self.queue and self.queue[0].finished:
                self.queue = deque(r for r in self.queue if not r.finished)
            if not self.running and not self.queue:
                self._wake.clear()
                await self._wake.wait()
                anchor = loop.time()
                continue
            now = loop.time()
            now_ns = time.monotonic_ns()
            # admission: FIFO, up to max_running, within the prefill budget
            new: List[SimRequest] = []
            budget = p.max_prefill_tokens
            free = p.max_running - len(self.running)
            while self.queue and free > 0:
                head = self.queue[0]
                if head.finished:
                    self.queue.popleft()
                    continue
                if new and head.prompt_tokens > budget:
                    break
                self.queue.popleft()
                head.t_admit_ns = now_ns
                new.append(head)
                free -= 1
                budget -= head.prompt_tokens
            decoding = [r for r in self.running if r.stall_until <= now]
            new_tokens = sum(r.prompt_tokens for r in new)
            on = speculation_on(p, len(decoding), len(new), previous_on)
            if previous_on is not None and on != previous_on:
                self.stats.spec_switches_total += 1
            dt = (step_ms(p, len(decoding), new_tokens, on)
                  + switch_ms(p, on, previous_on)) / 1000.0 / ts
            previous_on = on
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
            for req in new:
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

    # ---- emission
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


class _Draws:
    """Seeded accepted-length draws for one request (deterministic per seed and request id)."""
    __slots__ = ("_rng", "_cdf")

    def __init__(self, seed: int, key: Any, cdf: List[float]):
        self._rng = random.Random(f"{seed}:{key}")
        self._cdf = cdf

    def next(self) -> int:
        u = self._rng.random()
        for k, c in enumerate(self._cdf, 1):
            if u < c:
                return k
        return len(self._cdf)


# --- request parsing ------------------------------------------------------------------------------
def _int_field(data: Mapping[str, Any], name: str, default: Optional[int], minimum: int) -> int:
    value = data.get(name, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _Fail(400, f"{name} must be an integer >= {minimum} (got {value!r})")
    return value


def _bool_field(data: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = data.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _Fail(400, f"{name} must be true or false (got {value!r})")
    return value


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise _Fail(400, f"{where} must be a string or a list of text parts")


def _parse_openai(api: str, data: Mapping[str, Any]):
    stream = _bool_field(data, "stream")
    if data.get("n", 1) not in (1, None):
        raise _Fail(400, "n must be 1 (the simulator returns one choice)")
    max_tokens = data.get("max_tokens")
    if max_tokens is None and api == "chat":
        max_tokens = data.get("max_completion_tokens")
    max_tokens = _int_field({"max_tokens": max_tokens}, "max_tokens",
                            DEFAULT_OPENAI_MAX_TOKENS, 1)
    min_tokens = _int_field(data, "min_tokens", 0, 0)
    ignore_eos = _bool_field(data, "ignore_eos")
    opts = data.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise _Fail(400, "stream_options must be an object, e.g. {\"include_usage\": true}")
    include_usage = _bool_field(opts, "include_usage")
    # continuous_usage_stats: every content chunk carries the cumulative usage, so a client
    # knows how many tokens each (multi-token, speculative) chunk holds. 2 = final + per chunk.
    if _bool_field(opts, "continuous_usage_stats"):
        include_usage = 2 if include_usage else 3
    if api == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) for m in messages):
            raise _Fail(400, "messages must be a non-empty list of {role, content} objects")
        text = "".join(_content_text(m.get("content"), f"messages[{i}].content")
                       for i, m in enumerate(messages))
        ptoks = prompt_tokens_for_text(text)
        key = _dumps([[m.get("role"), _content_text(m.get("content"), "content")]
                      for m in messages])
    else:
        prompt = data.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ptoks, key = prompt_tokens_for_text(prompt), prompt
        elif isinstance(prompt, list) and prompt and all(
                isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            ptoks, key = len(prompt), _dumps(prompt)
        else:
            raise _Fail(400, "prompt must be a string or a list of token ids (one prompt per "
                             "request)")
    return stream, max_tokens, min_tokens, ignore_eos, ptoks, key, include_usage


def _parse_generate(data: Mapping[str, Any]):
    sp = data.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise _Fail(400, "sampling_params must be an object, e.g. {\"max_new_tokens\": 128}")
    stream = _bool_field(data, "stream")
    text, ids = data.get("text"), data.get("input_ids")
    if isinstance(text, str):
        ptoks, key = prompt_tokens_for_text(text), text
    elif isinstance(ids, list) and ids and all(
            isinstance(x, int) and not isinstance(x, bool) for x in ids):
        ptoks, key = len(ids), _dumps(ids)
    else:
        raise _Fail(400, "give \"text\" (a string) or \"input_ids\" (a list of ints); batches "
                         "(lists of prompts) are not supported by the simulator")
    max_tokens = _int_field(sp, "max_new_tokens", DEFAULT_GENERATE_MAX_NEW_TOKENS, 1)
    min_tokens = _int_field(sp, "min_new_tokens", 0, 0)
    ignore_eos = _bool_field(sp, "ignore_eos")
    rid = data.get("rid")
    if rid is not None and (not isinstance(rid, str) or not rid or any(
            c in rid for c in '"\\\r\n')):
        raise _Fail(400, "rid must be a plain non-empty string")
    return "generate", stream, max_tokens, min_tokens, ignore_eos, ptoks, key, rid


# --- CLI ----------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="servelab_simulator.py",
        description="servelab simulator: an OpenAI/SGLang-compatible streaming server on a "
                    "continuous-batching timing model.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000, help="0 = pick a free port")
    ap.add_argument("--profile", default="baseline", help=f"one of {', '.join(PROFILES)}")
    ap.add_argument("--time-scale", default="1.0",
                    help="the model runs this many times faster than real time")
    ap.add_argument("--model-name", default="servelab-sim")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--truth-log", default=None, help="JSON lines, one per finished request")
    ap.add_argument("--die-after", type=int, default=0, metavar="N",
                    help=f"exit (code {EXIT_DIE_AFTER}) right after the N-th request's first "
                         f"chunk")
    ap.add_argument("--error-rate", type=float, default=0.0, metavar="P",
                    help="share of requests that fail: HTTP 500 or an error event mid-stream")
    ap.add_argument("--stall-every", type=int, default=0, metavar="N",
                    help="every N-th request pauses half-way for --stall-ms")
    ap.add_argument("--stall-ms", type=float, default=0.0, metavar="MS",
                    help="stall length, wall-clock ms")
    ap.add_argument("--malformed-every", type=int, default=0, metavar="N",
                    help="every N-th streamed request gets one broken JSON event")
    ap.add_argument("--startup-delay", type=float, default=0.0, metavar="S",
                    help="seconds of 503 (starting) before the server is ready")
    ap.add_argument("--abort-delay-ms", type=float, default=0.0, metavar="MS",
                    help="a disconnected client's request keeps running this many wall-clock "
                         "ms before it is cancelled (0: at once)")
    ap.add_argument("--fit-report", action="store_true",
                    help="print the profiles' fit to the field data and exit")
    group = ap.add_argument_group("profile parameter overrides (model milliseconds)")
    for f in dataclasses.fields(SimProfile):
        if f.name in ("name", "description"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            group.add_argument(flag, dest=f.name, default=None, nargs="?", const="true",
                               metavar="BOOL")
        else:
            group.add_argument(flag, dest=f.name, default=None, metavar=str(f.type).upper())
    return ap


def config_from_args(argv: Optional[Sequence[str]] = None
                     ) -> Tuple[ServerConfig, argparse.Namespace]:
    """Parse and check the command line; raises SimError naming the flag and the fix."""
    args = build_parser().parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(SimProfile)
                 if f.name not in ("name", "description") and getattr(args, f.name) is not None}
    base = resolve_profile(args.profile)[0]
    for name in overrides:
        needs = _MODE_ONLY.get(name)
        mode = overrides.get("mode", base.mode)
        if needs and mode != needs:
            raise SimError(f"--{name.replace('_', '-')} applies to --profile {needs} only "
                           f"(profile {args.profile!r} is {mode})")
    profile, _params = resolve_profile(dict(overrides, profile=args.profile))
    checks = ((args.die_after, "--die-after", 0), (args.stall_every, "--stall-every", 0),
              (args.malformed_every, "--malformed-every", 0), (args.stall_ms, "--stall-ms", 0),
              (args.startup_delay, "--startup-delay", 0), (args.port, "--port", 0),
              (args.abort_delay_ms, "--abort-delay-ms", 0))
    for value, flag, minimum in checks:
        if value < minimum:
            raise SimError(f"{flag} must be >= {minimum} (got {value})")
    if args.port > 65535:
        raise SimError(f"--port must be 0..65535 (got {args.port})")
    if not 0.0 <= args.error_rate <= 1.0:
        raise SimError(f"--error-rate must be a probability within [0, 1] (got {args.error_rate})")
    if args.stall_every and not args.stall_ms:
        raise SimError("--stall-every needs --stall-ms M (how long each stall lasts)")
    cfg = ServerConfig(
        host=args.host, port=args.port, profile=profile,
        time_scale=_positive_float("--time-scale", args.time_scale),
        model_name=args.model_name, seed=args.seed, truth_log=args.truth_log,
        die_after=args.die_after, error_rate=args.error_rate, stall_every=args.stall_every,
        stall_ms=args.stall_ms, malformed_every=args.malformed_every,
        startup_delay=args.startup_delay, abort_delay_ms=args.abort_delay_ms)
    return cfg, args


async def serve(cfg: ServerConfig, on_listening=None) -> None:
    server = SimServer(cfg)
    await server.start()
    # Before the listening line: whoever reads it may send SIGTERM at once.
    server.install_signal_handlers()
    if on_listening is not None:
        on_listening(server)
    await server.serve_until_stopped()


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        cfg, args = config_from_args(argv)
    except SimError as exc:
        sys.stderr.write(f"servelab-simulator: error: {exc}\n")
        return 2
    # A script, not an Ansible module: it writes to its own stdout (stdout.write rather than
    # print, which module_utils may not use) and ends by SystemExit.
    if args.fit_report:
        sys.stdout.write(format_fit_report() + "\n")
        return 0

    def announce(server: SimServer) -> None:
        sys.stdout.write(LISTEN_LINE.format(host=server.host, port=server.port) + "\n")
        sys.stdout.flush()

    try:
        asyncio.run(serve(cfg, announce))
    except OSError as exc:
        sys.stderr.write(f"servelab-simulator: cannot listen on {cfg.host}:{cfg.port}: {exc}\n")
        return 1
    except KeyboardInterrupt:  # pragma: no cover - signal arrived before the handler was set
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
