"""The preflight of bench_derived_profiles (speculation by load, derived in the same run).

Checked before anything starts, with the rest of the bench preflight (host.py calls
check_derived): the derived profile is built from two profiles of bench_profiles, by an
engine that has the switch (schedule: vLLM, or the simulator standing in for it; router: any
engine servelab launches), and the router needs two more ports after bench_server_port and
HAProxy on the GPU server (derived_executables: checked there, with the other target checks).
"""
from __future__ import annotations

from typing import Any, Mapping

SCHEDULE_ENGINES = ("vllm", "simulator")
ROUTER_ENGINES = ("sglang", "vllm", "simulator")


def check_derived(values: Mapping[str, Any], add) -> None:
    kinds = values.get("bench_derived_profiles")
    if not isinstance(kinds, list) or not kinds:
        return
    name = "bench_derived_profiles"
    if len(set(map(str, kinds))) != len(kinds):
        add(name, f"{name}: {kinds} repeats a kind; list schedule and/or router once each")
    profiles = [p for p in values.get("bench_profiles") or [] if isinstance(p, Mapping)]
    by_name = {str(p.get("name")): p for p in profiles}
    engine = str(values.get("bench_engine") or "")
    source, baseline = values.get("bench_derived_source"), values.get("bench_derived_baseline")
    for var, wanted in (("bench_derived_source", source), ("bench_derived_baseline", baseline)):
        if wanted not in by_name:
            add(var, f"{var}: {wanted!r} is not a profile of bench_profiles "
                     f"({', '.join(by_name) or 'none'}); name the "
                     f"{'speculative profile' if var.endswith('source') else 'baseline'} "
                     f"the derived profile is built from")
    if source == baseline and source is not None:
        add("bench_derived_source", "bench_derived_source and bench_derived_baseline name the same "
                                    "profile; the derived profile switches between two")
    for wanted in (source, baseline):
        own = (by_name.get(wanted) or {}).get("engine")
        if own and own != engine:
            add(name, f"{name}: profile {wanted!r} has its own engine {own}; derived profiles "
                      f"need both profiles on bench_engine ({engine})")
    if "schedule" in kinds and engine not in SCHEDULE_ENGINES:
        add(name, f"{name}: schedule needs an engine with a switch by load "
                  f"({', '.join(SCHEDULE_ENGINES)}; bench_engine is {engine}); SGLang has none: "
                  f"use router instead")
    if "router" in kinds:
        if engine not in ROUTER_ENGINES:
            add(name, f"{name}: router starts its two servers itself; bench_engine must be one "
                      f"of {', '.join(ROUTER_ENGINES)} (got {engine})")
        port = values.get("bench_server_port")
        if isinstance(port, int) and port + 2 > 65535:
            add("bench_server_port", f"bench_server_port: the router's two servers take "
                                     f"{port + 1} and {port + 2}; choose a port below 65534")
        tp = (by_name.get(source) or {}).get("tp")
        if engine != "simulator" and source in by_name and (
                not isinstance(tp, int) or tp < 2 or tp % 2):
            add(name, f"{name}: router gives each server half the GPUs: profile {source!r} "
                      f"needs an even tp >= 2 (got {tp!r})")


def router_ports(values: Mapping[str, Any]) -> list:
    """The ports a `router` derived profile binds besides bench_server_port (its speculative
    half on +1, its baseline half on +2: roles/bench/tasks/router.yml); [] without one. The
    run locks them with the server port, and the preflight checks them free."""
    kinds = values.get("bench_derived_profiles")
    port = values.get("bench_server_port")
    if not isinstance(kinds, list) or "router" not in kinds:
        return []
    try:
        port = int(port)
    except (TypeError, ValueError):
        return []
    if not 1 <= port <= 65533:
        return []            # check_derived says so
    return [{"port": port + 1, "needed_for": "the speculative half of the router "
                                             "(bench_derived_profiles: router, bench_server_port + 1)"},
            {"port": port + 2, "needed_for": "the baseline half of the router "
                                             "(bench_derived_profiles: router, bench_server_port + 2)"}]


def derived_executables(values: Mapping[str, Any]) -> list:
    """What a derived profile starts besides the engine, checked on the GPU server by the
    target preflight (module_utils/preflight.check_executable): HAProxy for the router."""
    kinds = values.get("bench_derived_profiles")
    if not isinstance(kinds, list) or "router" not in kinds:
        return []
    return [{"variable": "bench_haproxy_binary",
             "path": str(values.get("bench_haproxy_binary") or ""),
             "needed_for": "bench_derived_profiles: router (HAProxy splits the load between the "
                           "two halves)",
             "fix": "install HAProxy (Debian, Ubuntu: apt-get install haproxy)"}]
