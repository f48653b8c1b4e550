"""Serving profiles as data: parse, merge with a built-in base, validate.

A profile is what the benchmark compares (baseline, EAGLE-3, EAGLE-3 with spec v2 ...). It is a
plain dict in the inventory; this module turns it into a typed, validated `Profile` before any
process is touched, so a typo or a half-configured speculative block fails with a message naming
the key and the fix instead of silently producing a different server.

Engine-specific rendering lives in server_render*.py; this module knows no command lines.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Tuple, Union

# Dicts merge key by key, lists and scalars replace: the manifest's merge rule, reused.
from ansible_collections.servelab.serving.plugins.module_utils.mapping import deep_merge
from ansible_collections.servelab.serving.plugins.module_utils.server.multinode import (
    NodeGroup,
    NodesError,
    parse_nodes,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.spec_schedule import (
    ScheduleError,
    validate_schedule,
)


class ProfileError(ValueError):
    """Invalid profile; the message names the key and the fix."""


# Built-in profiles: partial templates that a user profile names with `base:`. They carry the
# speculative settings the field used; model paths always come from the user. EAGLE-3 used
# 16 draft tokens with topk > 1 in the field; spec v2 (overlap scheduler) needs topk 1, hence a
# profile of its own (3 steps, 4 draft tokens = steps + 1) rather than a toggle.
BUILTIN_PROFILES: dict = {
    "baseline": {
        "enable_metrics": True,
    },
    "eagle3": {
        "enable_metrics": True,
        "speculative": {
            "algorithm": "EAGLE3",
            "num_steps": 3,
            "eagle_topk": 4,
            "num_draft_tokens": 16,
        },
    },
    "eagle3_v2": {
        "enable_metrics": True,
        "spec_v2": True,
        "speculative": {
            "algorithm": "EAGLE3",
            "num_steps": 3,
            "eagle_topk": 1,
            "num_draft_tokens": 4,
        },
    },
}

PROFILE_KEYS = (
    "name", "base", "model", "served_model_name", "tp", "speculative", "spec_v2",
    "flashinfer_allreduce_fusion", "torch_symm_mem", "mem_fraction_static", "cuda_graph_max_bs",
    "max_running_requests", "enable_metrics", "extra_args", "env", "simulator", "command", "ready",
    "nodes",
)
SPECULATIVE_KEYS = ("algorithm", "draft_model_path", "num_steps", "eagle_topk", "num_draft_tokens",
                    "tokens_per_batch_size")
# Steps, topk and draft tokens are one decision: SGLang picks all three itself when none is set
# and asserts when only some are.
SPECULATIVE_SHAPE_KEYS = ("num_steps", "eagle_topk", "num_draft_tokens")
READY_KEYS = ("path", "method", "body", "status")
# Algorithms that load a separate draft model (NEXTN/MTP uses the target's own layers).
DRAFT_MODEL_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
SPEC_V2_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")
FUSION_BACKENDS = ("auto", "trtllm", "mnnvl")


@dataclass(frozen=True)
class SpeculativeConfig:
    algorithm: str
    draft_model_path: Optional[str] = None
    num_steps: Optional[int] = None
    eagle_topk: Optional[int] = None
    num_draft_tokens: Optional[int] = None
    # Speculation by load (vLLM's num_speculative_tokens_per_batch_size): server/spec_schedule.py.
    tokens_per_batch_size: Optional[Tuple[Tuple[int, int, int], ...]] = None


@dataclass(frozen=True)
class ReadyCheck:
    """An HTTP request that succeeds only when the server generates (not when it merely listens)."""
    path: str
    method: str = "GET"
    body: Optional[dict] = None
    status: int = 200


@dataclass(frozen=True)
class Profile:
    name: str
    base: Optional[str] = None
    model: Optional[str] = None
    served_model_name: Optional[str] = None
    tp: Optional[int] = None
    speculative: Optional[SpeculativeConfig] = None
    # None = the engine's default; True/False = asked for explicitly.
    spec_v2: Optional[bool] = None
    # False, True (backend auto) or a backend name.
    flashinfer_allreduce_fusion: Union[bool, str] = False
    torch_symm_mem: bool = False
    mem_fraction_static: Optional[float] = None
    cuda_graph_max_bs: Optional[int] = None
    max_running_requests: Optional[int] = None
    enable_metrics: bool = False
    extra_args: Tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    simulator: Mapping[str, Any] = field(default_factory=dict)
    command: Tuple[str, ...] = ()
    ready: Optional[ReadyCheck] = None
    # One model over several hosts (server/multinode.py): this host's rank, the group, rank 0's address.
    nodes: Optional[NodeGroup] = None

    @property
    def request_model(self) -> Optional[str]:
        """The model name clients send: what the server advertises."""
        return self.served_model_name or self.model

    def set_keys(self) -> Tuple[str, ...]:
        """Keys that ask an engine for something (used to reject keys an engine cannot honour)."""
        keys = []
        if self.tp is not None:
            keys.append("tp")
        if self.speculative is not None:
            keys.append("speculative")
        if self.spec_v2 is not None:
            keys.append("spec_v2")
        if self.flashinfer_allreduce_fusion:
            keys.append("flashinfer_allreduce_fusion")
        if self.torch_symm_mem:
            keys.append("torch_symm_mem")
        for key in ("mem_fraction_static", "cuda_graph_max_bs", "max_running_requests"):
            if getattr(self, key) is not None:
                keys.append(key)
        if self.enable_metrics:
            keys.append("enable_metrics")
        if self.simulator:
            keys.append("simulator")
        if self.command:
            keys.append("command")
        if self.nodes is not None:
            keys.append("nodes")
        return tuple(keys)


def _unknown(keys, allowed, where: str) -> None:
    unknown = sorted(str(k) for k in keys if k not in allowed)
    if unknown:
        raise ProfileError(
            f"{where}: unknown key(s) {', '.join(unknown)}; allowed keys: {', '.join(allowed)}")


def _as_int(value, where: str, minimum: int = 1) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ProfileError(f"{where} must be an integer >= {minimum}, got {value!r}")
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ProfileError(f"{where} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise ProfileError(f"{where} must be an integer >= {minimum}, got {number}")
    return number


def _as_fraction(value, where: str) -> Optional[float]:
    if value is None:
        return None
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ProfileError(f"{where} must be a number in (0, 1], got {value!r}") from None
    if not 0.0 < number <= 1.0:
        raise ProfileError(f"{where} must be a number in (0, 1], got {number}")
    return number


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _as_bool(value, where: str, allow_none: bool = False) -> Optional[bool]:
    if value is None:
        return None if allow_none else False
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ProfileError(f"{where} must be true or false, got {value!r}")


def _as_str_list(value, where: str) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(shlex.split(value))
    if not isinstance(value, (list, tuple)):
        raise ProfileError(f"{where} must be a list of strings (or one shell-quoted string)")
    return tuple(str(v) for v in value)


def _as_env(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ProfileError(f"{where} must be a mapping of NAME: value")
    env = {}
    for key, val in value.items():
        name = str(key)
        if not name or "=" in name or not (name[0].isalpha() or name[0] == "_"):
            raise ProfileError(f"{where}: {name!r} is not a valid environment variable name")
        if val is None:
            raise ProfileError(f"{where}.{name} has no value; give a string or remove it")
        env[name] = "true" if val is True else "false" if val is False else str(val)
    return env


def _parse_speculative(raw, where: str) -> Optional[SpeculativeConfig]:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where} must be a mapping with keys {', '.join(SPECULATIVE_KEYS)}")
    _unknown(raw.keys(), SPECULATIVE_KEYS, where)
    algorithm = raw.get("algorithm")
    if not algorithm:
        raise ProfileError(f"{where}.algorithm is required (e.g. EAGLE3)")
    algorithm = str(algorithm).upper()
    shape = {k: _as_int(raw.get(k), f"{where}.{k}") for k in SPECULATIVE_SHAPE_KEYS}
    given = [k for k, v in shape.items() if v is not None]
    if given and len(given) != len(SPECULATIVE_SHAPE_KEYS):
        missing = [k for k in SPECULATIVE_SHAPE_KEYS if shape[k] is None]
        raise ProfileError(
            f"{where}: {', '.join(given)} set without {', '.join(missing)}; set all of "
            f"{', '.join(SPECULATIVE_SHAPE_KEYS)} together, or none (the engine then chooses)")
    if shape["eagle_topk"] == 1 and shape["num_draft_tokens"] != shape["num_steps"] + 1:
        # SGLang silently rewrites this case; we refuse so that the recorded command is the truth.
        raise ProfileError(
            f"{where}: with eagle_topk 1 the draft is a chain, so num_draft_tokens must be "
            f"num_steps + 1 = {shape['num_steps'] + 1} (got {shape['num_draft_tokens']}); "
            f"SGLang would override it")
    draft = raw.get("draft_model_path")
    schedule = None
    if raw.get("tokens_per_batch_size") is not None:
        try:
            schedule = validate_schedule(raw["tokens_per_batch_size"], shape["num_steps"],
                                         f"{where}.tokens_per_batch_size")
        except ScheduleError as exc:
            raise ProfileError(str(exc)) from None
    return SpeculativeConfig(algorithm=algorithm, draft_model_path=str(draft) if draft else None,
                             tokens_per_batch_size=schedule, **shape)


def _parse_ready(raw, where: str) -> Optional[ReadyCheck]:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where} must be a mapping with keys {', '.join(READY_KEYS)}")
    _unknown(raw.keys(), READY_KEYS, where)
    path = str(raw.get("path") or "")
    if not path.startswith("/"):
        raise ProfileError(f"{where}.path must be an absolute URL path such as /v1/completions")
    body = raw.get("body")
    if body is not None and not isinstance(body, Mapping):
        raise ProfileError(f"{where}.body must be a mapping (sent as JSON)")
    method = str(raw.get("method") or ("POST" if body is not None else "GET")).upper()
    if method not in ("GET", "POST"):
        raise ProfileError(f"{where}.method must be GET or POST, got {method}")
    status = _as_int(raw.get("status", 200), f"{where}.status", minimum=100)
    return ReadyCheck(path=path, method=method, body=dict(body) if body else None, status=status)


def _parse_fusion(value, where: str) -> Union[bool, str]:
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if text in FUSION_BACKENDS:
        return text
    raise ProfileError(
        f"{where} must be true, false or a backend name ({', '.join(FUSION_BACKENDS)}), "
        f"got {value!r}")


def resolve_profile(raw: Optional[Mapping], default_model: Optional[str] = None) -> Profile:
    """Merge a user profile over its `base` (if any) and validate it; raise ProfileError."""
    raw = dict(raw or {})
    _unknown(raw.keys(), PROFILE_KEYS, "profile")
    base = raw.get("base")
    if base is not None:
        if base not in BUILTIN_PROFILES:
            raise ProfileError(
                f"profile.base {base!r} is not a built-in profile; use one of "
                f"{', '.join(BUILTIN_PROFILES)} or leave base out")
        raw = deep_merge(BUILTIN_PROFILES[base], raw)
    name = str(raw.get("name") or base or "")
    if not name:
        raise ProfileError("profile.name is required (the label results are filed under)")
    where = f"profile {name!r}"
    simulator = raw.get("simulator") or {}
    if not isinstance(simulator, Mapping):
        raise ProfileError(f"{where}: simulator must be a mapping (e.g. {{profile: baseline}})")
    model = raw.get("model", default_model)
    try:
        nodes = parse_nodes(raw.get("nodes"), where)
    except NodesError as exc:
        raise ProfileError(str(exc)) from None
    profile = Profile(
        name=name,
        base=base,
        model=str(model) if model else None,
        served_model_name=str(raw["served_model_name"]) if raw.get("served_model_name") else None,
        tp=_as_int(raw.get("tp"), f"{where}: tp"),
        speculative=_parse_speculative(raw.get("speculative"), f"{where}: speculative"),
        spec_v2=_as_bool(raw.get("spec_v2"), f"{where}: spec_v2", allow_none=True),
        flashinfer_allreduce_fusion=_parse_fusion(
            raw.get("flashinfer_allreduce_fusion"), f"{where}: flashinfer_allreduce_fusion"),
        torch_symm_mem=bool(_as_bool(raw.get("torch_symm_mem"), f"{where}: torch_symm_mem")),
        mem_fraction_static=_as_fraction(raw.get("mem_fraction_static"),
                                         f"{where}: mem_fraction_static"),
        cuda_graph_max_bs=_as_int(raw.get("cuda_graph_max_bs"), f"{where}: cuda_graph_max_bs"),
        max_running_requests=_as_int(raw.get("max_running_requests"),
                                     f"{where}: max_running_requests"),
        enable_metrics=bool(_as_bool(raw.get("enable_metrics"), f"{where}: enable_metrics")),
        extra_args=_as_str_list(raw.get("extra_args"), f"{where}: extra_args"),
        env=_as_env(raw.get("env"), f"{where}: env"),
        simulator=dict(simulator),
        command=_as_str_list(raw.get("command"), f"{where}: command"),
        ready=_parse_ready(raw.get("ready"), f"{where}: ready"),
        nodes=nodes,
    )
    _check_cross_keys(profile, where)
    return profile


def _check_cross_keys(profile: Profile, where: str) -> None:
    """Conflicts between keys, independent of the engine."""
    spec = profile.speculative
    if profile.spec_v2:
        if spec is None:
            raise ProfileError(
                f"{where}: spec_v2 is set but speculative is not; spec v2 is a speculative "
                f"decoding scheduler: add speculative (algorithm EAGLE3, eagle_topk 1) or drop spec_v2")
        if spec.algorithm not in SPEC_V2_ALGORITHMS:
            raise ProfileError(
                f"{where}: spec_v2 applies to {', '.join(SPEC_V2_ALGORITHMS)}, not {spec.algorithm}")
        if spec.eagle_topk != 1:
            got = "unset (the engine may choose topk > 1)" if spec.eagle_topk is None \
                else str(spec.eagle_topk)
            raise ProfileError(
                f"{where}: spec_v2 needs speculative.eagle_topk 1 (got {got}); set num_steps, "
                f"eagle_topk 1 and num_draft_tokens = num_steps + 1, or drop spec_v2")
    if "SGLANG_ENABLE_SPEC_V2" in profile.env and profile.spec_v2 is not None:
        raise ProfileError(
            f"{where}: env.SGLANG_ENABLE_SPEC_V2 and spec_v2 both set; keep spec_v2 only (servelab "
            f"renders the right switch for the engine version)")
