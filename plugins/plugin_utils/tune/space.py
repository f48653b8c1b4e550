"""The searched flags (`tune_space`) and the candidates they give.

`tune_space` maps each engine flag to its values: a list (`[32, 64, 128]`), or a range
(`{min: 16, max: 256, step: 16}`, or `{min: 0.7, max: 0.9, points: 5}`, `scale: log` for
geometric points). A flag is written as the engine's own (`--max-running-requests`,
`max_running_requests` and `max-running-requests` are the same). The candidates are the product of
the values; each becomes a trial profile (`apply`): the base profile with the flag set where
servelab already renders it (SGLang's `max_running_requests`, `cuda_graph_max_bs`,
`mem_fraction_static`, `speculative.*`), in `extra_args` otherwise, appended to `command` for the
command engine, or as the simulator's field for the simulator (`simulator.py` maps SGLang's names
to its fields).

Pure Python; SpaceError names `tune_space.<flag>` and the fix.
"""
from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import (
    BUILTIN_PROFILES,
)

MAX_CANDIDATES = 20000
MAX_VALUES = 64
# SGLang flags servelab renders from a profile key (module_utils/server/render_sglang.py): set
# there, never in extra_args (render would refuse the flag twice).
SGLANG_PROFILE_KEYS = {
    "--max-running-requests": ("max_running_requests",),
    "--cuda-graph-max-bs": ("cuda_graph_max_bs",),
    "--cuda-graph-max-bs-decode": ("cuda_graph_max_bs",),
    "--mem-fraction-static": ("mem_fraction_static",),
    "--tp-size": ("tp",),
    "--tp": ("tp",),
    "--speculative-num-steps": ("speculative", "num_steps"),
    "--speculative-eagle-topk": ("speculative", "eagle_topk"),
    "--speculative-num-draft-tokens": ("speculative", "num_draft_tokens"),
}
ENGINES = ("sglang", "vllm", "simulator", "command")
# Flags that only ask for more GPU memory as they grow (the KV pool's share, the CUDA graphs
# captured, the running batch, the tokens a step holds): a stated assumption, by which a
# candidate asking at least as much of each as a trial that failed is expected to fail too
# (proposer.py). SGLang's and transformers serve's names; the simulator takes SGLang's.
RESOURCE_FLAGS = frozenset((
    "--mem-fraction-static", "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode",
    "--max-running-requests", "--chunked-prefill-size", "--max-prefill-tokens",
    "--cb-num-blocks", "--cb-max-memory-percent", "--cb-max-batch-tokens",
))


def backoffs(space: Space, flags: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """`flags` with one RESOURCE_FLAGS flag one value lower (each such flag in turn): what an
    operator tries after an out-of-memory failure."""
    out = []
    for dim in space.dims:
        if dim.flag not in RESOURCE_FLAGS or not dim.numeric or dim.flag not in flags:
            continue
        lower = [v for v in dim.values if v < flags[dim.flag]]
        if lower:
            out.append(dict(flags, **{dim.flag: max(lower)}))
    return out


def asks_at_least(flags: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Whether `flags` asks for at least the memory `other` asks for: equal in every flag that
    is not a RESOURCE_FLAGS one, at least as large in each that is (and the two differ)."""
    if flags == other:
        return False
    for flag, value in other.items():
        mine = flags.get(flag)
        if flag in RESOURCE_FLAGS and isinstance(value, (int, float)) \
                and isinstance(mine, (int, float)) and not isinstance(value, bool):
            if mine < value:
                return False
        elif mine != value:
            return False
    return True


_FLAG_RE = re.compile(r"^--[a-z0-9][a-z0-9-]*$")


class SpaceError(ValueError):
    """A bad search space; the message names tune_space.<flag> and the fix."""


def canonical_flag(name: Any) -> str:
    """'max_running_requests', 'max-running-requests', '--max-running-requests' ->
    '--max-running-requests'."""
    text = str(name).strip()
    flag = "--" + text.lstrip("-").replace("_", "-").lower()
    if not _FLAG_RE.match(flag):
        raise SpaceError("tune_space.%s: not a flag name (letters, digits and dashes, e.g. "
                         "--max-running-requests)" % text)
    return flag


@dataclass(frozen=True)
class Dimension:
    flag: str
    values: Tuple[Any, ...]
    kind: str               # int | float | bool | str

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "float")

    def position(self, value) -> float:
        """Where `value` sits on this axis, in [0, 1]: by log for a positive numeric axis that
        spans a factor of 4 or more (batch sizes, token budgets), linearly otherwise, by index
        for the rest. The proposer's distance between candidates."""
        if len(self.values) == 1:
            return 0.0
        if self.numeric:
            lo, hi = float(min(self.values)), float(max(self.values))
            v = float(value)
            if lo > 0 and hi / lo >= 4:
                return (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return (v - lo) / (hi - lo) if hi > lo else 0.0
        return self.values.index(value) / (len(self.values) - 1)


def _kind(values: Sequence[Any]) -> str:
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "float"
    if all(isinstance(v, str) for v in values):
        return "str"
    raise SpaceError("mixed value types")


def _range(flag: str, spec: Mapping) -> List[Any]:
    where = "tune_space.%s" % flag
    unknown = sorted(str(k) for k in spec if k not in ("min", "max", "step", "points", "scale"))
    if unknown:
        raise SpaceError("%s: unknown key(s) %s; a range is {min, max, step} or {min, max, "
                         "points, scale: linear|log}" % (where, ", ".join(unknown)))
    lo, hi = spec.get("min"), spec.get("max")
    for key, value in (("min", lo), ("max", hi)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpaceError("%s.%s must be a number, got %r" % (where, key, value))
    if hi < lo:
        raise SpaceError("%s: max %r is below min %r" % (where, hi, lo))
    integer = isinstance(lo, int) and isinstance(hi, int)
    scale = spec.get("scale", "linear")
    if scale not in ("linear", "log"):
        raise SpaceError("%s.scale: %r is not linear or log" % (where, scale))
    if "step" in spec and "points" in spec:
        raise SpaceError("%s: give step or points, not both" % where)
    if "step" in spec:
        step = spec["step"]
        if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
            raise SpaceError("%s.step must be a number > 0, got %r" % (where, step))
        if scale == "log":
            raise SpaceError("%s: a log range takes points, not step" % where)
        integer = integer and isinstance(step, int)
        count = int(math.floor((hi - lo) / step + 1e-9)) + 1
        if count > MAX_VALUES:
            raise SpaceError("%s: %d values (more than %d); use a larger step"
                             % (where, count, MAX_VALUES))
        values = [lo + i * step for i in range(count)]
    else:
        points = spec.get("points", 5)
        if isinstance(points, bool) or not isinstance(points, int) or not 2 <= points <= MAX_VALUES:
            raise SpaceError("%s.points must be a whole number 2-%d, got %r"
                             % (where, MAX_VALUES, points))
        if scale == "log":
            if lo <= 0:
                raise SpaceError("%s: a log range needs min > 0, got %r" % (where, lo))
            values = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
        else:
            values = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
    if integer:
        values = sorted({int(round(v)) for v in values})
    else:
        values = sorted({round(v, 6) for v in values})
    return values


@dataclass(frozen=True)
class Space:
    dims: Tuple[Dimension, ...]

    @classmethod
    def parse(cls, raw) -> Space:
        if not isinstance(raw, Mapping) or not raw:
            raise SpaceError("tune_space must be a non-empty mapping of engine flag -> values, "
                             "e.g. {max_running_requests: [32, 64, 128], chunked_prefill_size: "
                             "{min: 2048, max: 16384, points: 4, scale: log}}")
        dims, seen = [], {}
        for name, spec in raw.items():
            flag = canonical_flag(name)
            if flag in seen:
                raise SpaceError("tune_space: %s and %s are the same flag %s; keep one"
                                 % (seen[flag], name, flag))
            seen[flag] = name
            if isinstance(spec, Mapping):
                values = _range(flag, spec)
            elif isinstance(spec, (list, tuple)):
                values = list(spec)
            else:
                raise SpaceError("tune_space.%s must be a list of values or a range {min, max, "
                                 "step|points}, got %r" % (name, spec))
            if not values:
                raise SpaceError("tune_space.%s: no values" % name)
            if len(values) > MAX_VALUES:
                raise SpaceError("tune_space.%s: %d values, at most %d" % (name, len(values),
                                                                           MAX_VALUES))
            if any(v is None or isinstance(v, (list, dict)) for v in values):
                raise SpaceError("tune_space.%s: values must be numbers, booleans or strings, "
                                 "got %r" % (name, values))
            try:
                kind = _kind(values)
            except SpaceError:
                raise SpaceError("tune_space.%s: mixed value types %r; give one type"
                                 % (name, values)) from None
            if len(set(values)) != len(values):
                raise SpaceError("tune_space.%s: a value is listed twice in %r" % (name, values))
            ordered = tuple(sorted(values)) if kind in ("int", "float") else tuple(values)
            dims.append(Dimension(flag=flag, values=ordered, kind=kind))
        space = cls(dims=tuple(dims))
        if space.size > MAX_CANDIDATES:
            raise SpaceError("tune_space: %d combinations (more than %d); give fewer values"
                             % (space.size, MAX_CANDIDATES))
        return space

    @property
    def flags(self) -> Tuple[str, ...]:
        return tuple(d.flag for d in self.dims)

    @property
    def size(self) -> int:
        return math.prod(len(d.values) for d in self.dims)

    def candidates(self) -> Iterator[Dict[str, Any]]:
        for combo in itertools.product(*(d.values for d in self.dims)):
            yield dict(zip(self.flags, combo))

    def position(self, flags: Mapping[str, Any]) -> Tuple[float, ...]:
        return tuple(d.position(flags[d.flag]) for d in self.dims)

    def as_dict(self) -> dict:
        return {d.flag: list(d.values) for d in self.dims}


def key(flags: Mapping[str, Any]) -> str:
    """One candidate's identity: 'cuda-graph-max-bs=64 max-running-requests=128'."""
    return " ".join("%s=%s" % (f[2:], _text(v)) for f, v in sorted(flags.items()))


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "%g" % value
    return str(value)


def _set_args(args: List[str], flag: str, value) -> List[str]:
    """args without `flag` (as `--flag v`, `--flag=v` or a bare switch), then the new setting."""
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == flag:
            nxt = args[i + 1] if i + 1 < len(args) else None
            skip = nxt is not None and not nxt.startswith("--")
            continue
        if arg.startswith(flag + "="):
            continue
        if flag.startswith("--") and arg == "--no-" + flag[2:]:
            continue
        out.append(arg)
    if isinstance(value, bool):
        return out + ([flag] if value else [])
    return out + [flag, _text(value)]


def apply(base: Mapping, engine: str, flags: Mapping[str, Any], name: str,
          simulator_fields: Optional[Mapping[str, str]] = None) -> dict:
    """The trial profile: `base` (a bench profile) with every flag of `flags` set, named `name`.
    simulator_fields: for the simulator engine, flag -> the simulator's field (simulator.py)."""
    profile = copy.deepcopy(dict(base))
    profile["name"] = name
    for flag, value in flags.items():
        if engine == "simulator":
            field = (simulator_fields or {}).get(flag)
            if field is None:
                raise SpaceError("tune_space.%s: the simulator models no such flag" % flag[2:])
            sim = dict(profile.get("simulator") or {})
            sim[field] = value
            profile["simulator"] = sim
        elif engine == "sglang" and flag in SGLANG_PROFILE_KEYS:
            path = SGLANG_PROFILE_KEYS[flag]
            if len(path) == 1:
                profile[path[0]] = value
            else:
                spec = profile.get(path[0])
                if spec is None and profile.get("base") in BUILTIN_PROFILES:
                    spec = BUILTIN_PROFILES[profile["base"]].get(path[0])
                if not isinstance(spec, Mapping):
                    raise SpaceError("tune_space.%s: the base profile has no speculative block to "
                                     "set it in (give the base profile speculative: {algorithm: "
                                     "EAGLE3, draft_model_path: ...})" % flag[2:])
                spec = dict(spec)
                spec[path[1]] = value
                profile[path[0]] = spec
        elif engine == "command":
            profile["command"] = _set_args(list(profile.get("command") or []), flag, value)
        else:
            profile["extra_args"] = _set_args(list(profile.get("extra_args") or []), flag, value)
    return profile
