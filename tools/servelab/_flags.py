"""`servelab bench`'s flags for the common case, mapped onto the bench role's own variables.

    servelab bench --base-url URL --model NAME -c 1,2,4 --level-seconds 20

--base-url benchmarks one endpoint servelab did not start: one profile of engine `external`
(roles/bench: no reap, no server start or lock; GET <url>/v1/models before the first level), so
the embedded default inventory (this machine as bench client and "GPU server") is all it needs.
Each flag is one existing variable (roles/bench/meta/argument_specs.yml): no variable of its own.
A flag and a -e that set the same variable are refused rather than one silently winning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional
from urllib.parse import urlsplit

EXTERNAL_PROFILE = "external"     # the one profile --base-url benchmarks, unless --profile names it


class FlagError(ValueError):
    """A bad flag value: the message names the flag and the fix."""


@dataclass(frozen=True)
class BenchFlags:
    base_url: Optional[str] = None
    model: Optional[str] = None
    concurrency: Optional[str] = None      # "1,2,4" as typed
    level_seconds: Optional[str] = None
    profile: Optional[str] = None


def concurrency_levels(text: str) -> List[int]:
    """-c 1,2,4 -> [1, 2, 4]; anything but positive whole numbers is a FlagError."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise FlagError("-c/--concurrency: give the levels as whole numbers, e.g. -c 1,2,4")
    levels = []
    for item in items:
        if not item.isdigit() or int(item) < 1:
            raise FlagError("-c/--concurrency: %r is not a whole number >= 1 (write the levels "
                            "separated by commas, e.g. -c 1,2,4)" % item)
        levels.append(int(item))
    return levels


def _level_seconds(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise FlagError("--level-seconds: %r is not a number of seconds > 0 (e.g. "
                        "--level-seconds 20)" % text)
    return int(value) if value.is_integer() else value


def _base_url(text: str) -> str:
    parts = urlsplit(str(text).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FlagError("--base-url: %r is not an http(s) URL (e.g. --base-url "
                        "http://10.0.0.5:8000; the bench preflight checks the rest)" % text)
    return str(text).strip()


def flag_vars(flags: BenchFlags) -> dict:
    """The bench variables the flags give (only those set)."""
    out: dict = {}
    if flags.profile is not None and flags.base_url is None:
        raise FlagError("--profile: names the --base-url endpoint's profile; give --base-url "
                        "too (other profiles come from bench_profiles, -e)")
    if flags.base_url is not None:
        name = flags.profile if flags.profile is not None else EXTERNAL_PROFILE
        if not name.strip():
            raise FlagError("--profile: give a name (it labels every result)")
        out["bench_base_url"] = _base_url(flags.base_url)
        out["bench_profiles"] = [{"name": name.strip(), "engine": "external"}]
    if flags.model is not None:
        if not flags.model.strip():
            raise FlagError("--model: give the model name the endpoint serves (GET "
                            "<base_url>/v1/models lists them)")
        out["bench_model"] = flags.model.strip()
    if flags.concurrency is not None:
        out["bench_concurrency"] = concurrency_levels(flags.concurrency)
    if flags.level_seconds is not None:
        out["bench_level_seconds"] = _level_seconds(flags.level_seconds)
    return out


def merge(flag_values: dict, extravars: dict, flag_names: dict) -> dict:
    """-e's variables and the flags', refusing a variable set both ways."""
    both = sorted(set(flag_values) & set(extravars))
    if both:
        raise FlagError("%s set both by a flag (%s) and by -e: give it once" % (
            ", ".join(both), ", ".join(sorted({flag_names[name] for name in both}))))
    return dict(extravars, **flag_values)


# Which flag sets which variable (for merge's message).
FLAG_OF = {"bench_base_url": "--base-url",
           "bench_profiles": "--base-url", "bench_model": "--model",
           "bench_concurrency": "-c/--concurrency", "bench_level_seconds": "--level-seconds"}
