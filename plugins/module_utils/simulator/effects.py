"""The effects of the serving flags a tuner searches, as the simulator models them: each one a
stated assumption (docs/simulator.md, "The searched flags"), read against SGLang 0.5.23's own
scheduler. StepModel is what the live server and the discrete-event engine both step with.
Standard library only; it imports nothing of the simulator (profiles.py imports it).

- Speculation's shape (EAGLE steps S, topk K, draft tokens D) acts through the accepted length
  and the step cost. The draft tree has D - 1 nodes over depth d = min(S, D - 1) (SGLang keeps
  the D - 1 best-scored of K + (S - 1) * K^2 candidates, speculative/eagle_utils.py:100-110; with
  K = 1 it rewrites D to S + 1, arg_groups/speculative_hook.py:1254-1265), so a depth holds on
  average w = min(K, (D - 1) / d) candidates. Each depth is accepted with probability
  a(w) = 1 - (1 - a_ref) * (1 - spec_topk_gain) ** (w - w_ref): each further candidate catches
  `spec_topk_gain` of the misses that remain (w_ref: the width the profile's spec_accept_rate
  was stated at). The accepted length is 1 + the run of accepted depths, at most d + 1.
  Step cost: spec_draft_step_ms per draft step and spec_verify_token_ms per verified token per
  request, relative to the reference shape the profile's step costs were fitted at.
- The KV pool (tokens): kv_capacity_tokens, or with mem_fraction_static f set,
  kv_capacity_tokens * (f - weights_mem_fraction) / (1 - weights_mem_fraction): SGLang sizes
  the pool from the memory above the weights (mem_cache/kv_cache_configurator.py:2990-3062).
- CUDA graphs: a decode batch above cuda_graph_max_bs runs eager
  (model_executor/runner/decode_cuda_graph_runner.py:887-891, model_runner.py:1991-2068); the
  eager step pays its fixed per-step cost cuda_graph_eager_factor times (the launches a graph
  replays at once), the batch-proportional work is the same.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

# Above this the accepted-length model stops (a draft is never certain).
MAX_ACCEPT_RATE = 0.99


def moe_fraction(share: float, routed_tokens: float) -> float:
    """Share of the expert weights a step reads when `routed_tokens` tokens are routed."""
    return 1.0 - (1.0 - share) ** routed_tokens if routed_tokens > 0 else 0.0


# --- speculation ---------------------------------------------------------------------------------
def tree_candidates(steps: int, topk: int) -> int:
    """Draft tokens SGLang scores per request: topk at the first step, topk^2 at each later one
    (speculative/spec_utils.py:417-468); the tree keeps the best D - 1 of them."""
    return topk + (steps - 1) * topk * topk


def spec_shape(steps: int, topk: int, draft_tokens: int) -> Tuple[int, int, float]:
    """(draft tokens used, depth d, mean candidates per depth w) of an EAGLE shape. topk 0 means
    1, draft_tokens 0 means steps + 1 (a chain); with topk 1 SGLang runs steps + 1 whatever D."""
    k = topk or 1
    used = steps + 1 if (k == 1 or not draft_tokens) else draft_tokens
    depth = min(steps, used - 1)
    width = min(float(k), (used - 1) / depth) if depth > 0 else 0.0
    return used, depth, width


def spec_shape_problem(steps: int, topk: int, draft_tokens: int) -> Optional[str]:
    """Why SGLang cannot run this shape (None: it can)."""
    if steps < 1:
        return f"spec_num_steps must be >= 1 (got {steps})"
    if topk < 0 or draft_tokens < 0:
        return "spec_eagle_topk and spec_num_draft_tokens must be >= 0 (0: the chain default)"
    k = topk or 1
    if k > 1 and draft_tokens == 1:
        return "spec_num_draft_tokens must be >= 2 (the verified token and at least one draft)"
    if k > 1 and draft_tokens and draft_tokens - 1 > tree_candidates(steps, k):
        return (f"spec_num_draft_tokens {draft_tokens} needs {draft_tokens - 1} draft tokens but "
                f"topk {k} over {steps} steps scores only {tree_candidates(steps, k)} "
                f"(topk + (steps - 1) * topk^2; SGLang's torch.topk in organize_draft_results "
                f"fails): lower spec_num_draft_tokens or raise the steps or topk")
    return None


def _reference(p: Any) -> Tuple[int, int, int]:
    return (p.spec_ref_num_steps or p.spec_num_steps, p.spec_ref_eagle_topk or p.spec_eagle_topk,
            p.spec_ref_draft_tokens or p.spec_num_draft_tokens)


def accept_rate(p: Any) -> float:
    """Per-depth acceptance of the profile's shape (see the module docstring)."""
    _used, _depth, width = spec_shape(p.spec_num_steps, p.spec_eagle_topk, p.spec_num_draft_tokens)
    _u, _d, ref_width = spec_shape(*_reference(p))
    if width == ref_width:
        return p.spec_accept_rate
    miss = (1.0 - p.spec_accept_rate) * (1.0 - p.spec_topk_gain) ** (width - ref_width)
    return min(MAX_ACCEPT_RATE, max(0.0, 1.0 - miss))


def accept_depth(p: Any) -> int:
    return spec_shape(p.spec_num_steps, p.spec_eagle_topk, p.spec_num_draft_tokens)[1]


def accept_mean(rate: float, depth: int) -> float:
    """Mean accepted length: 1 + a + a^2 + ... + a^depth (stop at the first rejection)."""
    return sum(rate ** i for i in range(depth + 1))


def accept_cdf(rate: float, depth: int) -> List[float]:
    """Cumulative P(accepted length <= k) for k = 1..depth+1, for inverse-CDF draws."""
    probs = [(rate ** (k - 1)) * (1 - rate) for k in range(1, depth + 1)]
    probs.append(rate ** depth)
    out, acc = [], 0.0
    for prob in probs:
        acc += prob
        out.append(acc)
    out[-1] = 1.0
    return out


def spec_cost_deltas(p: Any) -> Tuple[float, float]:
    """(fixed ms per step, ms per decoding request per step) this shape costs over the shape
    the profile's step costs were fitted at: spec_draft_step_ms per draft step,
    spec_verify_token_ms per verified token."""
    ref_steps, ref_topk, ref_draft = _reference(p)
    used = spec_shape(p.spec_num_steps, p.spec_eagle_topk, p.spec_num_draft_tokens)[0]
    ref_used = spec_shape(ref_steps, ref_topk, ref_draft)[0]
    return (p.spec_draft_step_ms * (p.spec_num_steps - ref_steps),
            p.spec_verify_token_ms * (used - ref_used))


# --- memory ----------------------------------------------------------------------------------------
def kv_pool_tokens(p: Any) -> int:
    """Tokens the KV pool holds (see the module docstring)."""
    f = p.mem_fraction_static
    if not f:
        return p.kv_capacity_tokens
    return int(round(p.kv_capacity_tokens * (f - p.weights_mem_fraction)
                     / (1.0 - p.weights_mem_fraction)))


def chunk_size(p: Any) -> Optional[int]:
    """Prompt tokens one step prefills under chunked prefill; None: off (SGLang: <= 0 disables,
    managers/scheduler.py:1370-1373)."""
    return p.chunked_prefill_size if p.chunked_prefill_size > 0 else None


# --- the step ------------------------------------------------------------------------------------
class StepModel:
    """The step-time formula of one profile with its flags' effects resolved once (the server and
    the engine call step_ms every step). Model milliseconds, before time_scale."""
    __slots__ = ("base", "per_req", "moe_ms", "share", "prefill_ms", "scale", "dynamic",
                 "off_base", "off_per_req", "graph_max_bs", "eager_extra", "rate", "depth",
                 "kv_pool", "chunk", "mixed")

    def __init__(self, p: Any):
        base_delta, per_req_delta = spec_cost_deltas(p) if p.speculative else (0.0, 0.0)
        # a shape cheaper than the reference cannot make a step cost less than nothing
        self.base = max(0.0, p.step_base_ms + base_delta)
        self.per_req = max(0.0, p.step_per_req_ms + per_req_delta)
        self.moe_ms, self.share = p.moe_ms, p.moe_token_share
        self.prefill_ms, self.scale = p.prefill_per_token_ms, p.step_scale
        self.dynamic = p.spec_dynamic != "off"
        self.off_base, self.off_per_req = p.spec_off_step_base_ms, p.spec_off_step_per_req_ms
        self.graph_max_bs = p.cuda_graph_max_bs
        self.eager_extra = (p.cuda_graph_eager_factor - 1.0)
        self.rate = accept_rate(p) if p.speculative else 0.0
        self.depth = accept_depth(p) if p.speculative else 0
        self.kv_pool = kv_pool_tokens(p)
        self.chunk = chunk_size(p)
        self.mixed = p.mixed_chunk

    def step_ms(self, decoding: int, new_prompt_tokens: int = 0, spec_on: bool = True) -> float:
        off = self.dynamic and not spec_on
        base = self.off_base if off else self.base
        per_req = self.off_per_req if off else self.per_req
        if self.graph_max_bs and decoding > self.graph_max_bs:
            base += self.eager_extra * base            # eager: the launches a graph saves
        return self.scale * (
            base + per_req * decoding
            + self.moe_ms * moe_fraction(self.share, decoding + new_prompt_tokens)
            + self.prefill_ms * new_prompt_tokens)

    def eager(self, decoding: int) -> bool:
        return bool(self.graph_max_bs) and decoding > self.graph_max_bs

    def tokens_per_step(self) -> float:
        return accept_mean(self.rate, self.depth)

    def cdf(self) -> List[float]:
        return accept_cdf(self.rate, self.depth)
