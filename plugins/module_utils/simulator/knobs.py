"""SGLang's serving flags in the simulator's terms: which SimProfile field each searched flag
drives and how, and the model's free parameters a tuner fits to its trials. One table, so a tuner
proposes candidates in SGLang's flag names and predicts them with the simulator.

    params = simulator_params({"max_running_requests": 64, "chunked_prefill_size": 4096},
                              base={"profile": "eagle3", "time_scale": 20})
    run = runs.predict_run(params, concurrency=32, requests=200)

Flags are SGLang's ServerArgs names (dashes, a leading `--`, and the release spelling
`cuda_graph_max_bs_decode` are accepted). A flag left out (or None, the engine's "choose
yourself") keeps the base profile's value. Controller side (the tuner); not in the zipapp.
Standard library only.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from ansible_collections.servelab.serving.plugins.module_utils.simulator.effects import spec_shape
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    SimError, SimProfile, resolve_profile,
)


@dataclass(frozen=True)
class Knob:
    flag: str             # SGLang's ServerArgs field
    field: str            # the SimProfile field it drives
    effect: str           # how, in the model (docs/simulator.md "The searched flags")
    engine_default: str   # what SGLang does when the flag is not given, and the model's stand-in


SGLANG_KNOBS: Tuple[Knob, ...] = (
    Knob("max_running_requests", "max_running",
         "bounds the running batch; the rest queue FIFO",
         "SGLang: from the KV pool, 48 with speculation; the model: the profile's (256)"),
    Knob("chunked_prefill_size", "chunked_prefill_size",
         "a step prefills at most this many prompt tokens; a longer prompt is split over steps "
         "(its TTFT rises, the running decodes' ITL tail falls); <= 0 off",
         "SGLang: by GPU memory (8192 on 60-160 GB cards); the model: off (whole prompts, "
         "max_prefill_tokens per step: how the field was fitted)"),
    Knob("enable_mixed_chunk", "mixed_chunk",
         "True: a step prefills and decodes together; False: a step that prefills runs no decode",
         "SGLang: False; the model: True (how the field was fitted) -- pass False to model "
         "SGLang's default scheduler"),
    Knob("cuda_graph_max_bs", "cuda_graph_max_bs",
         "a decode batch above it runs eager: its fixed per-step cost times "
         "cuda_graph_eager_factor",
         "SGLang: by GPU memory and TP (512 at TP>=4 on 60-160 GB cards), capped at "
         "max_running_requests in 0.5.23; the model: 0 (every batch graphed)"),
    Knob("mem_fraction_static", "mem_fraction_static",
         "the KV pool: kv_capacity_tokens * (f - weights_mem_fraction) / (1 - "
         "weights_mem_fraction) tokens; a request waits until its prompt and output fit",
         "SGLang: (GPU memory - activation and graph reserve) / GPU memory; the model: not set "
         "(the pool is kv_capacity_tokens)"),
    Knob("max_prefill_tokens", "max_prefill_tokens",
         "prompt tokens admitted per step without chunking (the first always fits); caps the "
         "chunk with it", "SGLang: 16384; the model: 16384"),
    Knob("speculative_num_steps", "spec_num_steps",
         "draft depth: the tree is min(steps, draft tokens - 1) deep; each draft step costs "
         "spec_draft_step_ms over the reference shape",
         "SGLang: chosen with topk and draft tokens by model architecture; the model: the "
         "profile's"),
    Knob("speculative_eagle_topk", "spec_eagle_topk",
         "candidates per draft step: up to min(topk, (draft tokens - 1) / depth) per depth, "
         "each catching spec_topk_gain of the remaining misses; topk 1 runs steps + 1 tokens",
         "as speculative_num_steps"),
    Knob("speculative_num_draft_tokens", "spec_num_draft_tokens",
         "tokens verified per request per step: caps the tree, costs spec_verify_token_ms per "
         "request each over the reference shape", "as speculative_num_steps"),
)
_BY_FLAG: Dict[str, Knob] = {k.flag: k for k in SGLANG_KNOBS}
# Later releases' spelling of the same setting (render_sglang.SGLANG_FLAG_HISTORY).
FLAG_ALIASES = {"cuda_graph_max_bs_decode": "cuda_graph_max_bs"}

# The model's free parameters: what a tuner fits to measured trials (the field fit's own, and the
# stated choices behind the flags' effects). Everything else is a flag above or a setting.
FREE_PARAMETERS: Tuple[str, ...] = (
    "step_base_ms", "step_per_req_ms", "moe_ms", "moe_token_share", "prefill_per_token_ms",
    "request_overhead_ms", "spec_accept_rate", "spec_topk_gain", "spec_draft_step_ms",
    "spec_verify_token_ms", "kv_capacity_tokens", "weights_mem_fraction",
    "cuda_graph_eager_factor",
)
# The simulator engine's own keys: every SimProfile field (a `simulator:` key and a CLI flag).
SIMULATOR_KEYS: Tuple[str, ...] = tuple(f.name for f in fields(SimProfile)
                                        if f.name not in ("name", "description"))


def flag_name(flag: str) -> str:
    """SGLang's field name of `--cuda-graph-max-bs`, `cuda-graph-max-bs`, ... (aliases resolved)."""
    name = str(flag).lstrip("-").replace("-", "_")
    return FLAG_ALIASES.get(name, name)


def simulator_params(flags: Mapping[str, Any],
                     base: Union[str, SimProfile, Mapping[str, Any]] = "baseline"
                     ) -> Dict[str, Any]:
    """The `simulator:` mapping (runs.predict_run, predict_level, llm_server's profile) for these
    SGLang flag values on top of `base` (a profile name or a `simulator:` mapping). Raises
    SimError naming an unknown flag or a value the model refuses."""
    if isinstance(base, SimProfile):
        raise SimError("base must be a profile name or a simulator: mapping, to be extended")
    params: Dict[str, Any] = ({"profile": base} if isinstance(base, str) else dict(base))
    for raw, value in flags.items():
        name = flag_name(raw)
        knob = _BY_FLAG.get(name)
        if knob is None:
            raise SimError(f"{raw}: not a flag the simulator models; modelled: "
                           f"{', '.join(sorted(_BY_FLAG))}")
        if value is None:
            continue
        params[knob.field] = value
    resolve_profile(params)          # every value checked now, naming the field
    return params


def sglang_flags(profile_or_params: Union[str, SimProfile, Mapping[str, Any]]
                 ) -> Dict[str, Optional[Any]]:
    """The searched flags' values a simulator profile stands for (None: not set, the engine's
    default), in SGLang's names: the inverse of simulator_params."""
    p, _ts = resolve_profile(profile_or_params)
    used, _depth, _width = spec_shape(p.spec_num_steps, p.spec_eagle_topk, p.spec_num_draft_tokens)
    shape = {"spec_eagle_topk": p.spec_eagle_topk or 1, "spec_num_draft_tokens": used}
    out: Dict[str, Optional[Any]] = {}
    for knob in SGLANG_KNOBS:
        value = shape.get(knob.field, getattr(p, knob.field))
        if knob.field.startswith("spec_") and not p.speculative:
            value = None
        elif knob.field in ("mem_fraction_static", "cuda_graph_max_bs") and not value:
            value = None
        elif knob.field == "chunked_prefill_size" and value <= 0:
            value = -1
        out[knob.flag] = value
    return out
