"""From a measured crossover to the profile that switches speculation by load (bench_derive).

After the static profiles of a run were swept on a host, their crossover (report/analysis.py,
the same one the report states) gives the largest batch that still speculates
(module_utils/server/spec_schedule.py). From it:

- schedule, engine vllm: the speculative profile with speculative.tokens_per_batch_size, k tokens
  up to that batch, none above it (rendered into vLLM's --speculative-config and checked against
  vLLM's own rules);
- schedule, engine simulator (standing in for vLLM on the embedded default): the speculative
  profile's simulator settings with spec_dynamic `threshold` (or `thrash`, the pathological
  schedule, for tests), spec_max_batch, and the baseline's step costs for the steps without
  speculation;
- router, engines sglang / vllm / simulator: two servers, each on half the GPUs (the
  speculative profile and the baseline with tp halved and CUDA_VISIBLE_DEVICES split; the
  simulator's halves with the stated step scale), and HAProxy in front routing to the
  speculative one while it has fewer than that batch in flight (module_utils/server/haproxy.py).
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    DYNAMIC_SWITCH_MS, resolve_profile, SPLIT_ASSUMPTION, SPLIT_MAX_RUNNING, SPLIT_STEP_SCALE,
    THRASH_SWITCH_MS,
)
from ansible_collections.servelab.serving.plugins.module_utils.server import haproxy
from ansible_collections.servelab.serving.plugins.module_utils.server.spec_schedule import (
    as_lists,
    build_schedule,
    speculation_max_batch,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report import advice
from ansible_collections.servelab.serving.plugins.plugin_utils.report import analysis
from ansible_collections.servelab.serving.plugins.plugin_utils.report import repeats
from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import load_levels

KINDS = ("schedule", "router")
SIMULATOR_SCHEDULES = ("threshold", "thrash")
VLLM_DEFAULT_MAX_NUM_SEQS = advice.VLLM_DEFAULT_MAX_NUM_SEQS


class DeriveError(ValueError):
    """Nothing sensible can be derived; the message says why and what to change."""


@dataclass
class Derived:
    kind: str
    name: str                       # the derived profile's name in the results
    source: str
    baseline: str
    max_batch: int | None = None
    crossover: str = ""             # the crossover sentence it was derived from
    skipped: str = ""               # why nothing runs (no crossover on this host)
    profile: dict = field(default_factory=dict)        # schedule: the profile to run
    spec_profile: dict = field(default_factory=dict)   # router: the two halves
    base_profile: dict = field(default_factory=dict)
    router_config: str = ""                            # router: HAProxy's configuration
    setting: str = ""               # the setting in one line, for the manifest and the report
    gpu_split: str = ""
    assumption: str = ""

    def as_dict(self) -> dict:
        out = asdict(self)
        out["marker"] = {"kind": self.kind, "source": self.source, "baseline": self.baseline,
                         "max_batch": self.max_batch, "setting": self.setting,
                         "gpu_split": self.gpu_split, "assumption": self.assumption,
                         "crossover": self.crossover}
        return out


def _profile(profiles: list, name: str) -> dict:
    for p in profiles:
        if isinstance(p, dict) and p.get("name") == name:
            return copy.deepcopy(p)
    raise DeriveError(f"no profile named {name!r} in bench_profiles "
                      f"({', '.join(str(p.get('name')) for p in profiles)})")


def measured_crossover(results_dir: str, host: str, baseline: str, source: str):
    levels, _warnings = load_levels(results_dir)
    # One row per level, as the report concludes from: the mean of its repeats (bench_repeats).
    levels = repeats.summarise(levels)
    rows = levels[levels["host"] == host]
    for cross in analysis.compute_crossover(rows, baseline):
        if cross.profile == source:
            return cross
    return None


def _gpu_halves(tp: int | None) -> tuple:
    if not tp or tp < 2 or tp % 2:
        raise DeriveError(f"the router splits the GPUs in two halves: the profiles need an even "
                          f"tp >= 2 (got {tp!r})")
    ids = [str(i) for i in range(tp)]
    return tp // 2, ",".join(ids[:tp // 2]), ",".join(ids[tp // 2:])


def _simulator_settings(p: dict) -> dict:
    settings = dict(p.get("simulator") or {})
    settings.setdefault("profile", p.get("base") or p.get("name"))
    return settings


def derive_schedule(out: Derived, engine: str, spec: dict, base: dict,
                    simulator_schedule: str) -> Derived:
    keep = out.max_batch
    derived = dict(spec, name=out.name)
    if engine == "vllm":
        speculative = dict(derived.get("speculative") or {})
        k = speculative.get("num_steps")
        if not k:
            raise DeriveError(f"profile {spec['name']!r} has no speculative.num_steps: the "
                              f"schedule needs the number of speculative tokens")
        top = derived.get("max_running_requests") or VLLM_DEFAULT_MAX_NUM_SEQS
        speculative["tokens_per_batch_size"] = as_lists(build_schedule(keep, int(k), int(top)))
        derived["speculative"] = speculative
        out.setting = (f"speculative.tokens_per_batch_size {speculative['tokens_per_batch_size']}"
                       f" (vLLM's num_speculative_tokens_per_batch_size)")
    elif engine == "simulator":
        settings = _simulator_settings(spec)
        off, _scale = resolve_profile(_simulator_settings(base))
        settings.update(spec_dynamic=simulator_schedule, spec_max_batch=keep,
                        spec_switch_ms=(THRASH_SWITCH_MS if simulator_schedule == "thrash"
                                        else DYNAMIC_SWITCH_MS),
                        spec_off_step_base_ms=off.step_base_ms,
                        spec_off_step_per_req_ms=off.step_per_req_ms)
        resolve_profile(settings)      # a bad combination fails here, not at the start
        derived["simulator"] = settings
        out.setting = (f"simulator spec_dynamic {simulator_schedule}, speculation up to batch "
                       f"{keep}, {settings['spec_switch_ms']} model ms per switch (standing in "
                       f"for vLLM's schedule)")
    else:
        raise DeriveError(f"engine {engine} has no switch by load; use the router "
                          f"(bench_derived_profiles: [router])")
    out.profile = derived
    return out


def derive_router(out: Derived, engine: str, spec: dict, base: dict, listen_host: str,
                  ports: tuple, total_gpus: int | None) -> Derived:
    spec_half, base_half = dict(spec, name=f"{out.name}_spec"), dict(base, name=f"{out.name}_base")
    if engine == "simulator":
        for half in (spec_half, base_half):
            settings = _simulator_settings(half)
            settings.setdefault("step_scale", SPLIT_STEP_SCALE)
            settings.setdefault("max_running", SPLIT_MAX_RUNNING)
            resolve_profile(settings)
            half["simulator"] = settings
        split = haproxy.RouterSplit(listen_host, ports[0], ports[1], ports[2], out.max_batch)
        out.gpu_split = haproxy.gpu_split_statement(split, total_gpus or 8)
        out.assumption = SPLIT_ASSUMPTION
    else:
        tp = spec.get("tp")
        half_tp, spec_ids, base_ids = _gpu_halves(tp)
        for half, ids in ((spec_half, spec_ids), (base_half, base_ids)):
            half["tp"] = half_tp
            half["env"] = dict(half.get("env") or {}, CUDA_VISIBLE_DEVICES=ids)
        split = haproxy.RouterSplit(listen_host, ports[0], ports[1], ports[2], out.max_batch,
                                    spec_gpus=spec_ids, base_gpus=base_ids)
        out.gpu_split = haproxy.gpu_split_statement(split)
        out.assumption = (f"each half runs with tp={half_tp}; the static profiles ran with "
                          f"tp={tp}: the split's curves are measured here, not derived")
    out.spec_profile, out.base_profile = spec_half, base_half
    out.router_config = haproxy.render_config(split, total_gpus)
    out.setting = (f"HAProxy: use_backend spec if {{ be_conn(spec) lt {out.max_batch} }}, "
                   f"default_backend base (speculative server on port {ports[1]}, baseline "
                   f"server on port {ports[2]}, the router on {ports[0]})")
    return out


def derive(results_dir: str, host: str, kind: str, engine: str, profiles: list, source: str,
           baseline: str, listen_host: str = "127.0.0.1", port: int = 30000,
           simulator_schedule: str = "threshold", total_gpus: int | None = None) -> Derived:
    if kind not in KINDS:
        raise DeriveError(f"kind must be one of {', '.join(KINDS)} (got {kind!r})")
    if simulator_schedule not in SIMULATOR_SCHEDULES:
        raise DeriveError(f"simulator_schedule must be one of {', '.join(SIMULATOR_SCHEDULES)}")
    spec, base = _profile(profiles, source), _profile(profiles, baseline)
    out = Derived(kind=kind, name=f"{source}_{kind}", source=source, baseline=baseline)
    cross = measured_crossover(results_dir, host, baseline, source)
    if cross is None or not cross.stops_paying:
        out.crossover = cross.text if cross is not None else f"no levels of {source} on {host}"
        out.skipped = (f"{source} on {host} never fell below {baseline} after holding it in "
                       f"this run ({out.crossover}), so there is no load to switch speculation at")
        return out
    out.crossover = cross.text
    if cross.status == "crossed":
        out.max_batch = speculation_max_batch(cross.bracket[0] if cross.bracket else None,
                                              cross.concurrency, cross.estimate)
    else:
        # Tied, then below: speculation is kept up to the last tied level and no further (no
        # estimate: a tie says nothing about where between the two levels it turns).
        out.max_batch = speculation_max_batch(cross.stops_paying[0], cross.stops_paying[1], None)
    if kind == "schedule":
        return derive_schedule(out, engine, spec, base, simulator_schedule)
    return derive_router(out, engine, spec, base, listen_host, (port, port + 1, port + 2),
                         total_gpus)
