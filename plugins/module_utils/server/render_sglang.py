"""Profile -> `python -m sglang.launch_server ...` for a given SGLang release.

SGLang renames switches between releases, keeping the old spelling for a while as a deprecated
alias that may behave differently or vanish. The history below is data, read from each release's
own sglang/srt/server_args.py and sglang/srt/environ.py (tests/unit/test_server_sglang_argdefs.py
checks every rendered flag and environment variable against the wheels of the pinned releases):

- 0.5.14: `--enable-flashinfer-allreduce-fusion` becomes a deprecated alias of
  `--flashinfer-allreduce-fusion-backend auto`; `--cuda-graph-max-bs` a deprecated alias of
  `--cuda-graph-max-bs-decode` (0.5.23 has no `--cuda-graph-max-bs` at all).
- Spec v2 (overlap scheduler for EAGLE-family speculation): env `SGLANG_ENABLE_SPEC_V2`, default
  False up to 0.5.10, default True in 0.5.11-0.5.13; from 0.5.14 the variable is gone, overlap spec
  v2 is the default and only `--disable-overlap-schedule` turns the overlap off.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.server import fusion_gate
from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import Profile, ProfileError
from ansible_collections.servelab.serving.plugins.module_utils.server.versions import EngineVersion

# Releases whose argument definitions the tests check rendering against (wheels from PyPI).
SGLANG_PINNED_VERSIONS = ("0.5.10", "0.5.13.post1", "0.5.23")
SGLANG_DEFAULT_VERSION = "0.5.23"
VERIFIED_RANGE = ((0, 5, 10), (0, 5, 23))

# feature -> ((first release, spelling), ...), newest last.
SGLANG_FLAG_HISTORY = {
    "flashinfer_allreduce_fusion": (
        ((0,), "--enable-flashinfer-allreduce-fusion"),
        ((0, 5, 14), "--flashinfer-allreduce-fusion-backend"),
    ),
    "cuda_graph_max_bs": (
        ((0,), "--cuda-graph-max-bs"),
        ((0, 5, 14), "--cuda-graph-max-bs-decode"),
    ),
}
# (first release, env var or None, engine default for spec v2)
SPEC_V2_HISTORY = (
    ((0,), "SGLANG_ENABLE_SPEC_V2", False),
    ((0, 5, 11), "SGLANG_ENABLE_SPEC_V2", True),
    ((0, 5, 14), None, True),
)
SPEC_V2_OFF_FLAG = "--disable-overlap-schedule"


def _spelling(feature: str, version: EngineVersion) -> str:
    chosen = None
    for since, spelling in SGLANG_FLAG_HISTORY[feature]:
        if version.at_least(since):
            chosen = spelling
    return chosen


def _spec_v2_switch(version: EngineVersion):
    chosen = None
    for since, env_name, default in SPEC_V2_HISTORY:
        if version.at_least(since):
            chosen = (env_name, default)
    return chosen


def version_warnings(version: EngineVersion) -> List[str]:
    warnings = []
    low, high = VERIFIED_RANGE
    release = (tuple(version.release) + (0, 0, 0))[:3]
    if not version.at_least(low) or release > high:
        warnings.append(
            f"SGLang {version} is outside the releases whose flags servelab checks "
            f"({'.'.join(map(str, low))} to {'.'.join(map(str, high))}); the command uses the "
            f"nearest known spelling: check it against `python -m sglang.launch_server --help`")
    if version.prerelease:
        warnings.append(f"SGLang {version} is a pre-release: rendered as release "
                        f"{'.'.join(map(str, version.release))}")
    return warnings


def _multinode_flags(profile: Profile, where: str) -> List[str]:
    """--nnodes/--node-rank/--dist-init-addr (the same spelling in every pinned release). SGLang
    splits the TP ranks evenly over the nodes (0.5.10 asserts it; 0.5.23 computes tp_size // nnodes
    per node), so a tp that does not divide is refused here rather than failing on the GPUs."""
    nodes = profile.nodes
    if profile.tp is None:
        raise ProfileError(f"{where}: nodes needs tp, the tensor-parallel size over all "
                           f"{nodes.nnodes} nodes (e.g. {8 * nodes.nnodes} for 8 GPUs each)")
    if profile.tp % nodes.nnodes:
        raise ProfileError(f"{where}: tp {profile.tp} is not divisible by the {nodes.nnodes} nodes; "
                           f"SGLang gives each node tp / nnodes GPUs: set tp to a multiple of {nodes.nnodes}")
    return ["--nnodes", str(nodes.nnodes), "--node-rank", str(nodes.rank),
            "--dist-init-addr", nodes.dist_init_addr]


def render_sglang(profile: Profile, version: EngineVersion, python: str, host: str,
                  port: int, gpu_archs: Optional[Sequence[str]] = None) -> Tuple[List[str], dict, List[str]]:
    """Return (argv, env servelab sets, notes). Raises ProfileError for what SGLang cannot do.

    gpu_archs: the compute capabilities of the GPUs the server runs on (None: not known). A fusion
    flag that this SGLang refuses (or ignores) on one of them is left out, with a note saying so
    (server/fusion_gate.py)."""
    where = f"profile {profile.name!r}"
    if not profile.model:
        raise ProfileError(f"{where}: model is required for engine sglang "
                           f"(profile.model or the module's model option)")
    cmd = [python, "-m", "sglang.launch_server", "--model-path", profile.model,
           "--host", host, "--port", str(port)]
    env: dict = {}
    notes: List[str] = []
    if profile.served_model_name:
        cmd += ["--served-model-name", profile.served_model_name]
    if profile.tp is not None:
        cmd += ["--tp-size", str(profile.tp)]
    spec = profile.speculative
    if spec is not None:
        if spec.algorithm in ("EAGLE", "EAGLE3", "STANDALONE") and not spec.draft_model_path:
            raise ProfileError(
                f"{where}: speculative.draft_model_path is required for {spec.algorithm} "
                f"(the draft model's directory or hub id)")
        cmd += ["--speculative-algorithm", spec.algorithm]
        if spec.draft_model_path:
            cmd += ["--speculative-draft-model-path", spec.draft_model_path]
        if spec.num_steps is not None:
            cmd += ["--speculative-num-steps", str(spec.num_steps),
                    "--speculative-eagle-topk", str(spec.eagle_topk),
                    "--speculative-num-draft-tokens", str(spec.num_draft_tokens)]
    fusion = profile.flashinfer_allreduce_fusion
    refused = fusion_gate.not_allowed(version, gpu_archs) if fusion else []
    if refused:
        notes.append(fusion_gate.not_rendered_note(version, refused))
    elif fusion:
        flag = _spelling("flashinfer_allreduce_fusion", version)
        if flag == "--enable-flashinfer-allreduce-fusion":
            if fusion not in (True, "auto"):
                raise ProfileError(
                    f"{where}: flashinfer_allreduce_fusion backend {fusion!r} needs SGLang >= "
                    f"0.5.14 (engine_version is {version}); use true")
            cmd.append(flag)
        else:
            cmd += [flag, "auto" if fusion is True else fusion]
    if profile.torch_symm_mem:
        cmd.append("--enable-torch-symm-mem")
    if profile.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(profile.mem_fraction_static)]
    if profile.cuda_graph_max_bs is not None:
        cmd += [_spelling("cuda_graph_max_bs", version), str(profile.cuda_graph_max_bs)]
    if profile.max_running_requests is not None:
        cmd += ["--max-running-requests", str(profile.max_running_requests)]
    elif spec is not None:
        notes.append("SGLang caps max_running_requests at 48 for speculative decoding unless "
                     "max_running_requests is set")
    if profile.enable_metrics:
        cmd.append("--enable-metrics")
    if profile.nodes is not None:
        cmd += _multinode_flags(profile, where)
    if profile.spec_v2 is not None:
        env_name, _engine_default = _spec_v2_switch(version)
        if env_name:
            env[env_name] = "True" if profile.spec_v2 else "False"
        elif not profile.spec_v2:
            cmd.append(SPEC_V2_OFF_FLAG)
        else:
            notes.append(f"spec_v2: overlap spec v2 is SGLang {version}'s default; no switch needed")
    return cmd, env, notes
