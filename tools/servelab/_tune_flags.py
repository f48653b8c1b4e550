"""`servelab tune`'s flags for the common case, each mapped onto one tune_* or bench_* variable
(roles/tune/meta/argument_specs.yml, roles/bench/meta/argument_specs.yml): no variable of its own.

    servelab tune --space max_running_requests=16,32,64 --space chunked_prefill_size=2048,8192 \\
        --slo ttft_ms=500,tpot_ms=50 --trials 8

A flag and a -e that set the same variable are refused (_flags.merge), and a bad value is a
FlagError naming the flag, before anything starts. Ranges and everything else: tune.yml's
preflight.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

from ._flags import FlagError

TUNE_FLAG_OF = {"tune_space": "--space", "bench_slo": "--slo", "tune_budget": "--trials/--minutes",
                "tune_objective": "--metric", "bench_resume": "--resume"}


@dataclass(frozen=True)
class TuneFlags:
    space: List[str]
    slo: Optional[str] = None
    trials: Optional[str] = None
    minutes: Optional[str] = None
    metric: Optional[str] = None
    resume: Optional[str] = None


def _number(text: str):
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        return text
    return value


def space_values(items: List[str]) -> dict:
    """--space FLAG=V1,V2,... (repeatable) -> tune_space."""
    out: dict = {}
    for item in items:
        flag, sep, raw = item.partition("=")
        values = [v for v in (part.strip() for part in raw.split(",")) if v]
        if not sep or not flag.strip() or not values:
            raise FlagError("--space: %r is not FLAG=V1,V2,... (e.g. --space "
                            "max_running_requests=16,32,64)" % item)
        if flag.strip() in out:
            raise FlagError("--space: %s given twice; list its values once" % flag.strip())
        out[flag.strip()] = [_number(v) for v in values]
    return out


def slo_values(text: str) -> dict:
    """--slo ttft_ms=500,tpot_ms=50 -> bench_slo."""
    out = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, raw = part.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = None
        if not sep or name.strip() not in ("ttft_ms", "tpot_ms", "e2e_ms") or value is None \
                or not math.isfinite(value) or value <= 0:
            raise FlagError("--slo: %r is not LIMIT=MS with LIMIT ttft_ms, tpot_ms or e2e_ms "
                            "(e.g. --slo ttft_ms=500,tpot_ms=50)" % part)
        out[name.strip()] = value
    return out


def tune_vars(flags: TuneFlags) -> dict:
    out: dict = {}
    if flags.space:
        out["tune_space"] = space_values(flags.space)
    if flags.slo is not None:
        out["bench_slo"] = slo_values(flags.slo)
    budget = {}
    if flags.trials is not None:
        if not flags.trials.isdigit() or int(flags.trials) < 1:
            raise FlagError("--trials: %r is not a whole number >= 1" % flags.trials)
        budget["trials"] = int(flags.trials)
    if flags.minutes is not None:
        try:
            minutes = float(flags.minutes)
        except ValueError:
            minutes = -1.0
        if not math.isfinite(minutes) or minutes <= 0:
            raise FlagError("--minutes: %r is not a number of minutes > 0" % flags.minutes)
        budget["minutes"] = minutes
    if budget:
        out["tune_budget"] = budget
    if flags.metric is not None:
        if flags.metric not in ("goodput", "output_tok_s"):
            raise FlagError("--metric: %r is not goodput or output_tok_s" % flags.metric)
        out["tune_objective"] = {"metric": flags.metric, "percentile": 99}
    if flags.resume is not None:
        if not flags.resume.strip() or "/" in flags.resume:
            raise FlagError("--resume: give the run id of the tune to continue (results/<run_id>)")
        out["bench_resume"] = flags.resume.strip()
    return out
