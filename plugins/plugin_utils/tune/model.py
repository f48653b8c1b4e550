"""The tuner's model: the simulator (module_utils/simulator: predict_run over the flags' modelled
effects, knobs.py), its free parameters fitted to the trials measured so far.

Parameters. The engine being tuned is not the profile the simulator was fitted to (another GPU,
model, workload), so a handful of the model's free parameters (knobs.FREE_PARAMETERS) are fitted
as multiplicative scales (`SCALES`: which fields each moves): `speed` (every step cost: how
fast this GPU and model are), and, where the space searches a flag that acts through one, the
per-request step cost (`max_running_requests`, `cuda_graph_max_bs`), the prefill cost
(`chunked_prefill_size`), the KV pool (`mem_fraction_static`), the eager step's factor
(`cuda_graph_max_bs`), the draft acceptance, the gain of a wider draft tree and the draft's cost
(the `speculative_*` shape), then the per-request overhead. At most one fitted parameter more
than the trials with a bracket, with a ridge towards the prior (RIDGE) so that the data decides
what it can and the prior the rest. When a TTFT or E2E limit is set, the overhead comes right
after the speed: a latency floor is where a new engine differs first.

The fit. A trial measured its capacity bracket [lo, hi): the SLO was met at lo and missed at hi.
The model's SLO margin at a load x, m(x) = max over the limited latencies of
log(predicted percentile / limit), must cross 0 in that bracket: the loss is the sum over
finished trials of m(sqrt(lo * hi))^2, and over trials that only missed (pruned, none passed)
of max(0, -m(hi))^2. One prediction per trial per evaluation (predict_run with a fixed seed:
common random numbers, so the loss moves with the parameters and not with the draws);
coordinate search on the log scales (a coarse grid of factors around the current value, then a
finer one, twice, stopping early when a pass improves nothing).

Prediction. A candidate's capacity is where m crosses 0 (bracketing by 1.5x, then bisection in
log space to about 2 %), and its score the predicted goodput (or output tok/s) there. Its
uncertainty (`spread`, log units) is the fit's own root-mean-square margin error, converted to
capacity, plus what a few trials cannot pin down yet (40 % x 2 / (2 + trials)), at least 5 %
(before any trial: 40 %, the prior's).

Controller only, standard library only. Every prediction is deterministic for its inputs.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.simulator import knobs
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS, SimError, resolve_profile,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.runs import predict_run
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.proposer import (
    Observation, Prediction,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.simulator import (
    simulator_fields,
)

# Fitted scale -> the SimProfile fields it multiplies.
SCALES: Dict[str, Tuple[str, ...]] = {
    "speed": ("step_base_ms", "step_per_req_ms", "moe_ms", "spec_off_step_base_ms",
              "spec_off_step_per_req_ms", "spec_draft_step_ms", "spec_verify_token_ms"),
    "per_request": ("step_per_req_ms",),
    "prefill": ("prefill_per_token_ms",),
    "kv_pool": ("kv_capacity_tokens",),
    "eager": ("cuda_graph_eager_factor",),
    "acceptance": ("spec_accept_rate",),
    "width_gain": ("spec_topk_gain",),
    "draft_cost": ("spec_draft_step_ms", "spec_verify_token_ms"),
    "overhead": ("request_overhead_ms",),
}
# Which scale a searched flag (its SimProfile field) makes worth fitting, in order.
FIELD_SCALES = {
    "max_running": ("per_request",), "cuda_graph_max_bs": ("eager", "per_request"),
    "chunked_prefill_size": ("prefill",), "max_prefill_tokens": ("prefill",),
    "mixed_chunk": ("prefill",), "mem_fraction_static": ("kv_pool",),
    "kv_capacity_tokens": ("kv_pool",), "spec_num_steps": ("acceptance", "draft_cost"),
    "spec_eagle_topk": ("acceptance", "width_gain"),
    "spec_num_draft_tokens": ("acceptance", "width_gain", "draft_cost"),
}
BOUNDS = (0.125, 8.0)          # a scale's range
PRIOR_SPREAD = 0.4             # log units: before any trial
MIN_SPREAD = 0.05
FIT_REQUESTS = 100             # requests per prediction in the fit
RANK_REQUESTS = 80             # ... and in a candidate's capacity
SEED = 7
COARSE = (0.5, 0.7071, 1.4142, 2.0)
RIDGE = 0.02                   # weight of sum(log(scale)^2) in the loss
FINE = (0.8409, 1.1892)


def workload_tokens(settings: Mapping) -> Tuple[int, int]:
    """(prompt, output) tokens per request the tune's workload sends: a synthetic workload's own,
    else the simulator's defaults; output capped by bench_max_tokens."""
    workload = settings.get("workload") or {}
    prompt = workload.get("input_tokens") or DEFAULT_PROMPT_TOKENS
    output = workload.get("output_tokens") or DEFAULT_OUTPUT_TOKENS
    cap = settings.get("max_tokens")
    if cap:
        output = min(int(output), int(cap))
    return int(prompt), int(output)


def base_params(settings: Mapping) -> Optional[Dict[str, Any]]:
    """The simulator settings the model starts from: a simulator base profile's own; for SGLang
    the field fit's `baseline` (or `eagle3` with speculation) with the base profile's own
    modelled flags; None for an engine or a flag the simulator does not model."""
    engine = settings["engine"]
    base = settings.get("base_profile") or {}
    fields = simulator_fields()
    if engine == "simulator":
        if any(f not in fields for f in settings["space"]):
            return None
        return dict(base.get("simulator") or {"profile": base.get("base") or "baseline"})
    if engine != "sglang":
        return None
    if any(knobs.flag_name(f) not in {k.flag for k in knobs.SGLANG_KNOBS}
           for f in settings["space"]):
        return None
    spec = base.get("speculative") or {}
    own = {k: base.get(k) for k in ("max_running_requests", "cuda_graph_max_bs",
                                    "mem_fraction_static") if base.get(k) is not None}
    for key, flag in (("num_steps", "speculative_num_steps"), ("eagle_topk",
                      "speculative_eagle_topk"), ("num_draft_tokens",
                                                  "speculative_num_draft_tokens")):
        if spec.get(key) is not None:
            own[flag] = spec[key]
    try:
        return knobs.simulator_params(own, "eagle3" if spec else "baseline")
    except SimError:
        return None


def candidate_params(settings: Mapping, base: Mapping, flags: Mapping[str, Any]) -> dict:
    params = dict(base)
    fields = simulator_fields()
    for flag, value in flags.items():
        field = fields.get(flag) or fields.get("--" + knobs.flag_name(flag).replace("_", "-"))
        params[field] = value
    return params


class SimModel:
    """The simulator as the proposer's model (module docstring)."""
    name = "simulator"

    def __init__(self, settings: Mapping, base: Mapping):
        self.settings = settings
        self.base = dict(base)
        self.objective = settings["objective"]
        self.axis = settings["axis"]
        self.prompt, self.output = workload_tokens(settings)
        self.scales: Dict[str, float] = {}
        self.rmse: Optional[float] = None
        self.points = 0
        self._cache: Dict[Tuple, Prediction] = {}
        self._previous: Dict[Tuple, float] = {}     # each candidate's last predicted capacity
        fields = simulator_fields()
        searched = [fields.get(f) or fields.get("--" + knobs.flag_name(f).replace("_", "-"))
                    for f in settings["space"]]
        order = ["speed"]
        if any(k in self.objective["slo"] for k in ("ttft_ms", "e2e_ms")):
            order.append("overhead")    # the TTFT floor: the first thing a new engine differs in
        for field in searched:
            for scale in FIELD_SCALES.get(field, ()):
                if scale not in order:
                    order.append(scale)
        if "overhead" not in order:
            order.append("overhead")
        p, _ts = resolve_profile(self.base)
        if not p.speculative:
            order = [o for o in order if o not in ("acceptance", "width_gain", "draft_cost")]
        self.order = order

    # -- the simulator at one load ---------------------------------------------------------------
    def _params(self, flags: Mapping[str, Any], scales: Mapping[str, float]) -> dict:
        params = candidate_params(self.settings, self.base, flags)
        p, _ts = resolve_profile(params)
        for scale, factor in scales.items():
            if factor == 1.0:
                continue
            for field in SCALES[scale]:
                value = params.get(field, getattr(p, field))
                if field in ("spec_accept_rate", "spec_topk_gain"):
                    # scale the odds, kept inside [0, 0.99]
                    odds = value / max(1e-6, 1.0 - value) * factor
                    params[field] = min(0.99, odds / (1.0 + odds))
                elif field == "kv_capacity_tokens":
                    params[field] = max(1, int(round(value * factor)))
                elif field == "cuda_graph_eager_factor":
                    params[field] = max(1.0, 1.0 + (value - 1.0) * factor)
                else:
                    params[field] = value * factor
        return params

    def _run(self, params: Mapping, x: float, requests: int):
        load = ({"rate": float(x)} if self.axis == "rate"
                else {"concurrency": max(1, int(round(x)))})
        # An overloaded load is cut after ten times the level it should have taken: what matters
        # is that it misses the SLO, not by how much.
        expected = requests / float(x) if self.axis == "rate" else requests
        return predict_run(params, prompt_tokens=self.prompt, output_tokens=self.output,
                           requests=requests, seed=SEED, slo=self.objective["slo"],
                           timeout_s=max(30.0, 10.0 * expected), **load)

    def margin(self, params: Mapping, x: float, requests: int = FIT_REQUESTS):
        """(m(x), the run): the predicted SLO margin at load x (module docstring)."""
        try:
            run = self._run(params, x, requests)
        except SimError:
            return 5.0, None
        if not run.requests:
            return 5.0, run
        worst = -math.inf
        q = self.objective["percentile"]
        for key, limit in self.objective["slo"].items():
            value = run.latency(key, q)
            worst = max(worst, 5.0 if value is None or value <= 0 else math.log(value / limit))
        if run.failed > (1.0 - q / 100.0) * len(run.requests):
            worst = max(worst, 1.0)     # requests cut by the timeout never met the SLO
        return worst, run

    def _score(self, run) -> float:
        if run is None:
            return 0.0
        if self.objective["metric"] == "output_tok_s":
            return run.output_tok_s
        return run.goodput or 0.0

    # -- the fit -------------------------------------------------------------------------------------
    def _loss(self, scales: Mapping[str, float], data) -> float:
        # A ridge towards the prior: with fewer trials than scales the data does not decide them.
        total = RIDGE * sum(math.log(v) ** 2 for v in scales.values())
        for flags, lo, hi in data:
            params = self._params(flags, scales)
            if lo is not None and hi is not None:
                m, _run = self.margin(params, math.sqrt(lo * hi))
                total += min(m, 3.0) ** 2
            elif hi is not None:
                m, _run = self.margin(params, hi)
                total += max(0.0, -m) ** 2
            elif lo is not None:
                m, _run = self.margin(params, lo)
                total += max(0.0, m) ** 2
        return total

    def fit(self, observations: Sequence[Observation]) -> Dict[str, Any]:
        data = [(o.flags, o.lo, o.hi) for o in observations
                if o.status != "failed" and (o.lo is not None or o.hi is not None)]
        brackets = [d for d in data if d[1] is not None and d[2] is not None]
        free = self.order[:max(1, min(len(self.order), len(brackets) + 1))] if data else []
        scales = {s: self.scales.get(s, 1.0) for s in free}
        self._cache.clear()
        measured = sorted(d[1] for d in brackets)
        if measured:
            self._last_guess = measured[len(measured) // 2]
        if not data:
            self.scales, self.rmse = {}, None
            return self.describe(0)
        best = self._loss(scales, data)
        for factors in (COARSE, FINE, FINE):
            improved = False
            for name in free:
                start = scales[name]
                for f in factors:
                    trial = dict(scales, **{name: min(BOUNDS[1], max(BOUNDS[0], start * f))})
                    loss = self._loss(trial, data)
                    if loss < best - 1e-12:
                        best, scales, improved = loss, trial, True
            if not improved and factors is not COARSE:
                break
        self.scales = scales
        self.rmse = math.sqrt(best / len(data))
        self.points = len(data)
        return self.describe(len(data))

    def describe(self, points: int) -> Dict[str, Any]:
        fitted = ", ".join("%s x%.3g" % (k, v) for k, v in self.scales.items()) or "the prior"
        return {"model": "simulator", "scales": dict(self.scales), "rmse_log": self.rmse,
                "note": "the simulator (%s) with %s fitted to %d trial(s)%s" % (
                    self.base.get("profile", "baseline"), fitted, points,
                    "; margin error %.2f (log)" % self.rmse if self.rmse is not None else "")}

    # -- prediction ----------------------------------------------------------------------------------
    @property
    def spread(self) -> float:
        """How far a prediction away from every measured trial may be off (log units): the fit's
        own error (a margin error e moves the capacity by about e/2 near the knee), and what a
        few trials cannot pin down yet (PRIOR_SPREAD, shrinking as 2 / (2 + trials))."""
        if self.rmse is None:
            return PRIOR_SPREAD
        unpinned = PRIOR_SPREAD * 2.0 / (2.0 + self.points)
        return max(MIN_SPREAD, min(PRIOR_SPREAD, 0.5 * self.rmse + unpinned))

    def predict(self, flags: Mapping[str, Any]) -> Prediction:
        key = tuple(sorted((k, str(v)) for k, v in flags.items()))
        if key in self._cache:
            return self._cache[key]
        params = self._params(flags, self.scales)
        lo_x, hi_x, lo_run = self._capacity(params, self._previous.get(key))
        if lo_x is not None:
            self._previous[key] = lo_x
        if lo_x is None:
            out = Prediction(1e-6, None, "simulator")
        else:
            out = Prediction(max(1e-6, self._score(lo_run)), lo_x, "simulator")
        self._cache[key] = out
        return out

    def _capacity(self, params: Mapping, previous: Optional[float] = None):
        """(lo, hi, the run at lo): the highest load the model says meets the SLO and the lowest
        it says misses it, to about 3 %; lo None when even a sixteenth of the guess misses it
        (a latency floor above the limit)."""
        integer = self.axis == "concurrency"
        lo_bound = float(self.settings["load_min"])
        hi_bound = float(self.settings["load_max"])

        def clamp(x):
            x = min(hi_bound, max(lo_bound, x))
            return float(max(1, round(x))) if integer else x
        x = clamp(previous or self._guess())
        step = 1.1 if previous else 1.5     # the last round's answer is near: a small bracket
        m, run = self.margin(params, x, RANK_REQUESTS)
        lo = hi = lo_run = None
        if m <= 0:
            lo, lo_run = x, run
            for _attempt in range(12):
                nxt = clamp(lo * step)
                if nxt <= lo:
                    return lo, None, lo_run
                m, run = self.margin(params, nxt, RANK_REQUESTS)
                if m > 0:
                    hi = nxt
                    break
                lo, lo_run = nxt, run
            else:
                return lo, None, lo_run
        else:
            hi = x
            for divisor in ((step, 2.0, 4.0, 16.0) if previous else (2.0, 4.0, 16.0)):
                nxt = clamp(x / divisor)
                if nxt >= hi:
                    break
                m, run = self.margin(params, nxt, RANK_REQUESTS)
                if m <= 0:
                    lo, lo_run = nxt, run
                    break
                hi = nxt
            if lo is None:
                return None, hi, None
        for _attempt in range(8):
            if hi / lo - 1 <= 0.04 or (integer and hi - lo <= 1):
                break
            mid = math.sqrt(lo * hi)
            mid = float(round(mid)) if integer else mid
            if mid in (lo, hi):
                break
            m, run = self.margin(params, mid, RANK_REQUESTS)
            if m <= 0:
                lo, lo_run = mid, run
            else:
                hi = mid
        return lo, hi, lo_run

    def _guess(self) -> float:
        """Where a candidate's predicted capacity search starts: the median measured capacity,
        else tune_first_load."""
        return getattr(self, "_last_guess", None) or float(self.settings["first_load"])


def simulator_model(settings: Mapping) -> Optional[SimModel]:
    """The simulator model where it models the engine and every searched flag, else None."""
    base = base_params(settings)
    if base is None:
        return None
    try:
        resolve_profile(base)
    except SimError:
        return None
    return SimModel(settings, base)
