"""tune.yml's preflight: the tune_* variables checked and turned into the tune's settings, every
candidate of the space held to the engine's rules, before anything starts.

In order: unknown tune_* names (roles/tune/meta/argument_specs.yml is the one definition), the
declared types, the base profile, the objective, the space, the numbers, the bench_* settings a
tune sets itself; then each candidate is made into its trial profile (space.apply) and validated
as llm_server would (server/profiles.py, the engine's rendering; for the simulator its own
parameter checks; SGLang's own rules on combinations, server/engine_rules.py, read from the
newest pinned release, for SGLang and for the simulator's SGLang flags). A combination the
engine refuses is left out and listed (`refused`, with the reason and the release's file:line);
so is one the engine would run as the same server as an earlier candidate (the simulator
resolving two alike, SGLang rewriting topk 1's draft tokens to steps + 1). A flag the engine
does not have is a problem (for SGLang and the command
engine that is decided on the GPU server, by the bench_preflight module: the release's own
argument definitions, the command's own --help).

Pure Python: the action plugin (plugins/action/tune.py) gathers the values.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import yaml

from ansible_collections.servelab.serving.plugins.module_utils.server import engine_rules
from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import (
    BUILTIN_PROFILES, ProfileError, resolve_profile,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator import knobs
from ansible_collections.servelab.serving.plugins.module_utils.simulator.effects import spec_shape
from ansible_collections.servelab.serving.plugins.module_utils.server.render import (
    ENGINES as SERVER_ENGINES, render_server,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.render_sglang import (
    SGLANG_DEFAULT_VERSION,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    SimError, resolve_profile as resolve_sim_profile,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.model import FIX, Problem
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import role_spec
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.typecheck import (
    check_type, validator_messages,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.objective import (
    Objective, ObjectiveError,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.simulator import (
    simulator_fields,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.space import (
    Space, SpaceError, apply, key,
)

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
TUNE_ROLE_DIR = os.path.join(COLLECTION_ROOT, "roles", "tune")
TUNE_SPEC_FILE = os.path.join(TUNE_ROLE_DIR, "meta", "argument_specs.yml")
TUNE_DEFAULTS_FILE = os.path.join(TUNE_ROLE_DIR, "defaults", "main.yml")
PREFIX = "tune_"
# The bench settings a tune sets per trial itself: a value given for them would be overridden.
SET_BY_TUNE = ("bench_capacity_search", "bench_profiles (the trials)")
AXIS_DEFAULTS = {"rate": (0.05, 2000.0, 1.0), "concurrency": (1.0, 1024.0, 8.0)}
PROBE_NAMES = ("tune-probe-first", "tune-probe-last")


@functools.cache
def tune_spec_options() -> Dict[str, Mapping]:
    with open(TUNE_SPEC_FILE, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    return dict(((doc.get("argument_specs") or {}).get("main") or {}).get("options") or {})


def tune_spec():
    return role_spec({"argument_specs": {"main": {"options": tune_spec_options()}}})


@dataclass
class TuneCheck:
    problems: List[Problem] = field(default_factory=list)
    settings: Dict[str, Any] = field(default_factory=dict)
    candidates: List[Dict[str, Any]] = field(default_factory=list)
    refused: List[Dict[str, Any]] = field(default_factory=list)
    probes: List[dict] = field(default_factory=list)
    help_checks: List[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _number(value, default=None) -> Optional[float]:
    if value is None or value == "":
        return default
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def base_profile(values: Mapping, add) -> Optional[dict]:
    raw = values.get("tune_base_profile")
    profiles = values.get("bench_profiles") or []
    if isinstance(raw, Mapping):
        return dict(raw)
    names = [str(p.get("name")) for p in profiles if isinstance(p, Mapping)]
    if raw in (None, ""):
        if not profiles or not isinstance(profiles[0], Mapping):
            add("tune_base_profile", "tune_base_profile: unset and bench_profiles is empty; name "
                                     "a profile of bench_profiles or give one (a dict)")
            return None
        return dict(profiles[0])
    for p in profiles:
        if isinstance(p, Mapping) and str(p.get("name")) == str(raw):
            return dict(p)
    near = difflib.get_close_matches(str(raw), names, n=1)
    add("tune_base_profile", "tune_base_profile: %r is not a profile of bench_profiles (%s)%s"
        % (raw, ", ".join(names) or "none", "; did you mean %s?" % near[0] if near else ""))
    return None


def refusal(profile: dict, engine: str, flags: Mapping[str, Any]) -> Optional[str]:
    """Why the engine would refuse this trial profile (None: it would not), checked as
    llm_server checks before a launch, on the controller; then SGLang's own rules on the
    combination (server/engine_rules.py, the newest pinned release's)."""
    try:
        parsed = resolve_profile({k: v for k, v in profile.items() if k != "engine"},
                                 default_model="tune-check")
        if engine == "simulator":
            resolve_sim_profile(dict(parsed.simulator))
            render_server(parsed, engine, "127.0.0.1", 30000, "python3",
                          simulator_script="servelab_simulator.pyz")
        elif engine == "sglang":
            render_server(parsed, engine, "127.0.0.1", 30000, "python3",
                          engine_version=SGLANG_DEFAULT_VERSION)
        else:
            render_server(parsed, engine, "127.0.0.1", 30000, "python3")
    except (ProfileError, SimError) as exc:
        return str(exc)
    problems = engine_rules.refused(engine_rules.check_sglang_flags(
        SGLANG_DEFAULT_VERSION, sglang_view(profile, engine)))
    if problems:
        return "; ".join("%s (SGLang %s, %s)" % (p.message, p.release, p.source)
                         for p in problems)
    return None


def sglang_view(profile: Mapping, engine: str) -> Dict[str, Any]:
    """The trial profile's settings in SGLang's names (engine_rules.FLAGS): an SGLang profile's
    keys, speculative block and extra_args; a simulator profile's fields through knobs.py (the
    simulator's SGLang flags stand for SGLang's). Empty for another engine."""
    out: Dict[str, Any] = {}
    if engine == "sglang":
        spec = dict(profile.get("speculative") or
                    BUILTIN_PROFILES.get(str(profile.get("base")), {}).get("speculative") or {})
        if spec:
            out.update(speculative_algorithm=spec.get("algorithm"),
                       speculative_num_steps=spec.get("num_steps"),
                       speculative_eagle_topk=spec.get("eagle_topk"),
                       speculative_num_draft_tokens=spec.get("num_draft_tokens"))
        for k in ("max_running_requests", "cuda_graph_max_bs", "mem_fraction_static"):
            if profile.get(k) is not None:
                out[k] = profile[k]
        args = [str(a) for a in profile.get("extra_args") or []]
        for i, arg in enumerate(args):
            name = knobs.flag_name(arg.split("=", 1)[0]) if arg.startswith("--") else None
            if name not in engine_rules.FLAGS:
                continue
            raw = arg.split("=", 1)[1] if "=" in arg else (
                args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True)
            out[name] = _scalar(raw)
    elif engine == "simulator":
        try:
            values = knobs.sglang_flags(dict(profile.get("simulator") or {}))
            speculative = resolve_sim_profile(dict(profile.get("simulator") or {}))[0].speculative
        except SimError:
            return {}
        out = {k: v for k, v in values.items() if v is not None and k in engine_rules.FLAGS}
        if speculative:
            out["speculative_algorithm"] = "EAGLE3"
    return out


def _scalar(raw):
    if isinstance(raw, bool):
        return raw
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw


def same_server(profile: Mapping, engine: str) -> Optional[str]:
    """What decides the server a candidate runs, for telling two candidates apart: the
    simulator's resolved profile with the draft tree it runs (draft tokens used, depth, mean
    width: two candidates alike in these run alike, effects.py), or for
    SGLang its settings after the engine's own rewrite (engine_rules' topk1_draft_rewritten:
    topk 1 runs steps + 1 draft tokens whatever was given). None: every candidate is its own."""
    if engine == "simulator":
        try:
            p, ts = resolve_sim_profile(dict(profile.get("simulator") or {}))
        except SimError:
            return None
        fields = {k: v for k, v in dataclasses.asdict(p).items()
                  if k not in ("name", "description")}
        if p.speculative:       # the tree it runs (effects.spec_shape), not the shape given
            used, depth, width = spec_shape(p.spec_num_steps, p.spec_eagle_topk,
                                            p.spec_num_draft_tokens)
            fields.update(spec_num_draft_tokens=used, spec_eagle_topk=round(width, 9),
                          spec_tree_depth=depth)
        return json.dumps([fields, ts], sort_keys=True, default=str)
    if engine == "sglang":
        view = sglang_view(profile, engine)
        if view.get("speculative_eagle_topk") == 1 and view.get("speculative_num_steps"):
            view["speculative_num_draft_tokens"] = view["speculative_num_steps"] + 1
        rest = {k: v for k, v in profile.items() if k not in ("name", "speculative")}
        return json.dumps([view, rest], sort_keys=True, default=str)
    return None


def check_tune(values: Mapping[str, Any], given: Sequence[str], origins: Mapping[str, str],
               host: str) -> TuneCheck:
    out = TuneCheck()

    def add(name, message):
        out.problems.append(Problem(name, message, origins.get(name.split(".")[0], ""),
                                    (host,)))

    spec = tune_spec()
    known = sorted(spec)
    for name in sorted(set(given)):
        if name.startswith(PREFIX) and name not in spec:
            near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            add(name, "%s: unknown variable; %s" % (
                name, "did you mean %s?" % near[0] if near else
                "roles/tune/meta/argument_specs.yml declares no such option; remove it, or name "
                "your own helper variables without the tune_ prefix"))
    unknown = len(out.problems)
    flagged = set()
    for name, opt in spec.items():
        for message in check_type(opt, values.get(name)):
            add(name, message)
            flagged.add(name)
    for name, message in validator_messages(tune_spec_options(), {
            k: v for k, v in values.items() if k in spec and k not in flagged}):
        if name not in flagged:
            add(name, "%s: %s; %s" % (name, message, FIX))
            flagged.add(name)
    if values.get("tune_space") is None:
        add("tune_space", "tune_space: required - the engine flags to search, each a list or a "
                          "range, e.g. {max_running_requests: [32, 64, 128]}")
        flagged.add("tune_space")
    if flagged:
        return out

    base = base_profile(values, add)
    engine = str((base or {}).get("engine") or values.get("bench_engine") or "simulator")
    if base is not None:
        if engine not in SERVER_ENGINES:
            add("tune_base_profile", "tune_base_profile: engine %s cannot be tuned: a tune sets "
                                     "the flags of a server it starts (%s)"
                % (engine, ", ".join(SERVER_ENGINES)))
        if base.get("nodes") is not None:
            add("tune_base_profile", "tune_base_profile: a multi-node profile (nodes) cannot be "
                                     "tuned: tune one server")
    raw_objective = dict(values.get("tune_objective") or {})
    if not raw_objective.get("slo"):
        raw_objective["slo"] = {k: v for k, v in (values.get("bench_slo") or {}).items()
                                if v not in (None, "")}
    try:
        objective = Objective.parse(raw_objective)
    except ObjectiveError as exc:
        add("tune_objective", "%s (tune_objective.slo, else bench_slo)" % exc
            if "slo" in str(exc) else str(exc))
        objective = None
    try:
        space = Space.parse(values.get("tune_space"))
    except SpaceError as exc:
        add("tune_space", str(exc))
        space = None

    axis = values.get("tune_axis") or "rate"
    low, high, first = AXIS_DEFAULTS[axis]
    level_s = _number(values.get("tune_level_seconds"), _number(values.get("bench_level_seconds")))
    short_s = _number(values.get("tune_short_level_seconds"),
                      level_s / 4 if level_s else None)
    tolerance = _number(values.get("tune_tolerance"), 0.05)
    load_min = _number(values.get("tune_load_min"), low)
    load_max = _number(values.get("tune_load_max"), high)
    first = _number(values.get("tune_first_load"), first)
    budget = values.get("tune_budget") or {}
    if not level_s or level_s <= 0:
        add("tune_level_seconds", "tune_level_seconds: %r must be > 0 (seconds; unset: "
                                  "bench_level_seconds)" % values.get("tune_level_seconds"))
    elif short_s is not None and short_s > 0 and short_s >= level_s:
        add("tune_short_level_seconds", "tune_short_level_seconds: %g must be below "
                                        "tune_level_seconds %g (0: no short levels)"
            % (short_s, level_s))
    if short_s is not None and short_s < 0:
        add("tune_short_level_seconds", "tune_short_level_seconds: %g must be >= 0" % short_s)
    if not 0.01 <= (tolerance or 0) <= 0.5:
        add("tune_tolerance", "tune_tolerance: %r must be within 0.01-0.5 (a relative precision)"
            % values.get("tune_tolerance"))
    if load_min is None or load_max is None or load_min <= 0 or load_max <= load_min:
        add("tune_load_min", "tune_load_min %r and tune_load_max %r: give 0 < min < max (%s)"
            % (values.get("tune_load_min"), values.get("tune_load_max"),
               "requests/s" if axis == "rate" else "concurrency"))
    if first is None or first <= 0:
        add("tune_first_load", "tune_first_load: %r must be > 0" % values.get("tune_first_load"))
    if not isinstance(budget, Mapping) or not budget or any(
            k not in ("trials", "minutes") for k in budget):
        add("tune_budget", "tune_budget: %r must be {trials: N} and/or {minutes: M}" % (budget,))
    else:
        trials, minutes = budget.get("trials"), budget.get("minutes")
        if trials is not None and (isinstance(trials, bool) or not isinstance(trials, int)
                                   or trials < 1):
            add("tune_budget", "tune_budget.trials: %r must be a whole number >= 1" % (trials,))
        if minutes is not None and (_number(minutes) is None or _number(minutes) <= 0):
            add("tune_budget", "tune_budget.minutes: %r must be a number > 0" % (minutes,))
    if int(values.get("tune_min_trials") or 0) < 1:
        add("tune_min_trials", "tune_min_trials: must be >= 1")
    if int(values.get("tune_max_levels") or 0) < 2:
        add("tune_max_levels", "tune_max_levels: must be >= 2 (a bracket needs two loads)")
    if values.get("bench_capacity_search") is not None:
        add("bench_capacity_search", "bench_capacity_search: tune.yml sets each trial's capacity "
                                     "search itself; remove it (tune_* set the search)")
    if int(values.get("bench_repeats") or 1) != 1:
        add("bench_repeats", "bench_repeats: a tune measures each load once (a trial's "
                             "precision is its bracket, tune_tolerance); remove it")
    if values.get("bench_derived_profiles"):
        add("bench_derived_profiles", "bench_derived_profiles: not run by tune.yml; remove it")
    if len(out.problems) > unknown or base is None or space is None or objective is None:
        return out

    fields = simulator_fields() if engine == "simulator" else None
    for flag in space.flags:
        if engine == "simulator" and flag not in fields:
            near = difflib.get_close_matches(flag, sorted(fields), n=1)
            add("tune_space", "tune_space.%s: the simulator models no such flag%s (it models: "
                              "%s)" % (flag[2:], "; did you mean %s?" % near[0][2:] if near
                                       else "", ", ".join(sorted(f[2:] for f in fields))))
    if len(out.problems) > unknown:
        return out
    servers: Dict[str, str] = {}
    for flags in space.candidates():
        try:
            profile = apply(base, engine, flags, "tune-check", fields)
        except SpaceError as exc:
            add("tune_space", str(exc))
            return out
        reason = refusal(profile, engine, flags)
        if reason:
            out.refused.append({"flags": flags, "key": key(flags), "reason": reason,
                                "kind": "refused"})
            continue
        server = same_server(profile, engine)
        if server is not None and server in servers:
            out.refused.append({"flags": flags, "key": key(flags), "kind": "same server",
                                "reason": "the engine runs it as the same server as %s"
                                          % servers[server]})
            continue
        if server is not None:
            servers[server] = key(flags)
        out.candidates.append(flags)
    if not out.candidates:
        reasons = sorted({r["reason"] for r in out.refused})
        add("tune_space", "tune_space: every one of its %d combinations is refused by the "
                          "engine's rules (%s); change the values" % (space.size,
                                                                      "; ".join(reasons[:3])))
        return out
    for name, flags in zip(PROBE_NAMES, (out.candidates[0], out.candidates[-1])):
        out.probes.append(apply(base, engine, flags, name, fields))
    if engine == "command":
        out.help_checks.append({"variable": "tune_space", "argv": list(base.get("command") or []),
                                "flags": list(space.flags), "hosts": [host],
                                "where": origins.get("tune_space", "")})
    time_scale = ((base.get("simulator") or {}).get("time_scale")
                  if engine == "simulator" else None)
    out.settings = {
        "host": host, "engine": engine, "base_profile": base, "space": space.as_dict(),
        "objective": objective.as_dict(), "axis": axis,
        "budget": {k: budget[k] for k in ("trials", "minutes") if budget.get(k) is not None},
        "strategy": values.get("tune_strategy") or "model",
        "level_seconds": level_s, "short_level_seconds": short_s or None,
        "tolerance": tolerance, "min_trials": int(values.get("tune_min_trials")),
        "max_levels": int(values.get("tune_max_levels")),
        "load_min": load_min, "load_max": load_max, "first_load": first,
        "concurrency_cap": int(values.get("tune_concurrency_cap") or 1024),
        "workload": values.get("bench_workload"), "max_tokens": values.get("bench_max_tokens"),
        "time_scale": _number(time_scale), "refused": [r["key"] for r in out.refused],
        "candidates": len(out.candidates),
    }
    return out
