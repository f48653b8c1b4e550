"""Profile -> `vllm serve MODEL ...`.

Flags read from vLLM 0.33.0's vllm/engine/arg_utils.py and entrypoints/common/cli_args.py
(golden files in tests/data/sglang/golden/vllm-0.33.0/; vLLM's wheel is ~340 MB, too heavy for a
CI check like SGLang's). vLLM drafts chains (one token per step) unless given a token tree, so
an EAGLE profile maps to `num_speculative_tokens = num_steps` and topk must be 1.
"""
from __future__ import annotations

import json
import os
from typing import List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import Profile, ProfileError
from ansible_collections.servelab.serving.plugins.module_utils.server.spec_schedule import as_lists

VLLM_DEFAULT_VERSION = "0.33.0"
VLLM_METHODS = {
    "EAGLE": "eagle",
    "EAGLE3": "eagle3",
    "NEXTN": "mtp",
    "MTP": "mtp",
    "STANDALONE": "draft_model",
    "NGRAM": "ngram",
}
# Profile switches that are SGLang's and have no single vLLM flag; asking for them with vLLM is
# an error rather than a silently different server.
SGLANG_ONLY = {
    "spec_v2": "an SGLang scheduler switch",
    "flashinfer_allreduce_fusion": "vLLM sets fusion passes in --compilation-config; put them in "
                                   "extra_args",
    "torch_symm_mem": "vLLM selects it with env VLLM_ALLREDUCE_USE_SYMM_MEM; put that in env",
}


def vllm_executable(python: Optional[str]) -> str:
    """`vllm` beside the given interpreter (same venv), else from PATH."""
    if python and os.path.dirname(python):
        return os.path.join(os.path.dirname(python), "vllm")
    return "vllm"


def render_vllm(profile: Profile, python: Optional[str], host: str,
                port: int) -> Tuple[List[str], dict, List[str]]:
    where = f"profile {profile.name!r}"
    if not profile.model:
        raise ProfileError(f"{where}: model is required for engine vllm "
                           f"(profile.model or the module's model option)")
    for key, why in SGLANG_ONLY.items():
        if key in profile.set_keys():
            raise ProfileError(f"{where}: {key} is not rendered for engine vllm ({why})")
    cmd = [vllm_executable(python), "serve", profile.model, "--host", host, "--port", str(port)]
    notes: List[str] = []
    if profile.served_model_name:
        cmd += ["--served-model-name", profile.served_model_name]
    if profile.tp is not None:
        cmd += ["--tensor-parallel-size", str(profile.tp)]
    spec = profile.speculative
    if spec is not None:
        method = VLLM_METHODS.get(spec.algorithm)
        if method is None:
            raise ProfileError(f"{where}: speculative.algorithm {spec.algorithm} has no vLLM "
                               f"method; use one of {', '.join(sorted(VLLM_METHODS))}")
        if spec.num_steps is None:
            raise ProfileError(f"{where}: vLLM needs the number of speculative tokens: set "
                               f"speculative.num_steps, eagle_topk 1, num_draft_tokens")
        if spec.eagle_topk != 1:
            raise ProfileError(f"{where}: vLLM drafts chains; speculative.eagle_topk must be 1 "
                               f"for engine vllm (got {spec.eagle_topk})")
        config = {"method": method, "num_speculative_tokens": spec.num_steps}
        if spec.tokens_per_batch_size:
            # vLLM 0.33.0's switch by load (server/spec_schedule.py has its rules).
            config["num_speculative_tokens_per_batch_size"] = as_lists(spec.tokens_per_batch_size)
        if spec.draft_model_path:
            config["model"] = spec.draft_model_path
        elif method in ("eagle", "eagle3", "draft_model"):
            raise ProfileError(f"{where}: speculative.draft_model_path is required for "
                               f"{spec.algorithm}")
        cmd += ["--speculative-config", json.dumps(config, sort_keys=True, separators=(",", ":"))]
    if profile.mem_fraction_static is not None:
        cmd += ["--gpu-memory-utilization", str(profile.mem_fraction_static)]
    if profile.cuda_graph_max_bs is not None:
        cmd += ["--max-cudagraph-capture-size", str(profile.cuda_graph_max_bs)]
    if profile.max_running_requests is not None:
        cmd += ["--max-num-seqs", str(profile.max_running_requests)]
    if profile.enable_metrics:
        notes.append("enable_metrics: vLLM always serves /metrics; no flag needed")
    return cmd, {}, notes
