"""The offline predictor: a deterministic discrete-event run of the server's scheduler (same
admission rule, step formula and seeded draws), and the fit report against the field data.
Standard library only."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.simulator import des
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, PROFILES, SATURATION_CONCURRENCY, SimError,
    SimProfile, _positive_float, resolve_profile, single_stream_tok_s,
)


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


class _LevelWindow(des.Observer):
    """predict_level's measurement: C clients, each sending its next request when the last one
    finished; two rounds (2*C completions) of warm-up, then at least 4 rounds and
    MIN_MEASURED_REQUESTS completions measured."""

    def __init__(self, engine: des.Engine, C: int, O: int):  # noqa: E741 (the model's names)
        self.engine, self.O = engine, O
        self.start_at = 2 * C
        self.stop_at = self.start_at + max(4 * C, MIN_MEASURED_REQUESTS)
        self.done = self.measured = 0
        self.t_a: Optional[float] = None
        self.tokens = 0
        self.sum_ttft = self.sum_tpot = self.sum_e2e = 0.0
        self.area_running = self.area_queued = 0.0
        self.window = 0.0

    def on_step(self, t, dt, emitted, batch, queued, firsts):
        if self.t_a is not None:
            self.tokens += emitted
            self.area_running += batch * dt
            self.area_queued += queued * dt

    def on_finish(self, req, t):
        self.done += 1
        if self.t_a is not None:
            O = self.O  # noqa: E741
            self.sum_ttft += req[des.FIRST] - req[des.SEND]
            self.sum_e2e += t - req[des.SEND]
            self.sum_tpot += (t - req[des.FIRST]) / (O - 1) if O > 1 else 0.0
            self.measured += 1
        self.engine.send(t)

    def end_step(self, t):
        if self.t_a is None and self.done >= self.start_at:
            self.t_a = t
        elif self.t_a is not None and self.done >= self.stop_at:
            self.window = t - self.t_a
            return True
        return False


def _simulate_closed_loop(p: SimProfile, C: int, P: int, O: int, ts: float,  # noqa: E741 (the model's C, P, O)
                          seed: int) -> LevelPrediction:
    """The discrete-event engine (des.py) in a closed loop of C clients, all starting at 0."""
    engine = des.Engine(p, P, O, seed)
    window = _LevelWindow(engine, C, O)
    for _i in range(C):
        engine.send(0.0)
    engine.run(window)
    n = max(1, window.measured)
    return _prediction(p, C, P, O, ts, window.tokens / window.window * 1000.0,
                       window.sum_ttft / n, window.sum_tpot / n, window.sum_e2e / n,
                       window.area_running / window.window, window.area_queued / window.window,
                       "discrete-event")


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


# --- the field data the profiles are fitted to (docs/architecture.md, 'The simulator') ---------
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
