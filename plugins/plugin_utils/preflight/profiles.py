"""The preflight of bench_profiles: each profile through server/profiles.py's own validation
(resolve_profile) and rendering (render_server) for the profile's engine (SGLang: for the newest
pinned release; the installed release's rendering and flag check run on the GPU server, see
module_utils/preflight.py); an external profile (engine external: an endpoint servelab does not
start) takes only EXTERNAL_PROFILE_KEYS, and its base_url (else bench_base_url) must be
http(s)://host[:port][/path] without credentials, query or fragment. The ports the run binds are
handed to the target checks, to be found free where they are bound.
"""
from __future__ import annotations

import difflib
import os
from typing import Any, Dict, Mapping, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.server.manager import NAME_RE
from ansible_collections.servelab.serving.plugins.module_utils.server.multinode import (
    DEFAULT_DIST_INIT_PORT,
    NodesError,
    resolve_nodes,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import (
    PROFILE_KEYS,
    ProfileError,
    resolve_profile,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.render import ENGINES, render_server
from ansible_collections.servelab.serving.plugins.module_utils.server.render_sglang import SGLANG_DEFAULT_VERSION
from ansible_collections.servelab.serving.plugins.module_utils.server.simulator_file import SCRIPT_NAME
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.derived import router_ports
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.model import (
    EXTERNAL, HostInput, TargetCheck,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import VariableSpec
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.typecheck import is_int, plain
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.urls import base_url_problem

# read by the role (tasks/profile.yml), not by llm_server
PROFILE_ROLE_KEYS = ("engine", "base_url")
# The keys an external profile may have: the rest (simulator, extra_args, tp, ...) describe a
# server servelab launches, and would silently do nothing.
EXTERNAL_PROFILE_KEYS = ("name", "engine", "base_url", "model")


def _where(inp: HostInput, name: str) -> str:
    return inp.origins.get(name, "")


def _strip_profile_prefix(message: str, name: str) -> str:
    """resolve_profile says `profile 'x': ...` / `profile: ...`; the label names it already."""
    for prefix in ("profile %r: " % name, "profile: "):
        if message.startswith(prefix):
            return message[len(prefix):]
    if message.startswith("profile."):
        return message[len("profile."):]
    return message


def _check_external(label: str, raw: Mapping, v: Mapping, problem) -> Optional[str]:
    """An external profile's keys and URL; the URL the sweep will use, or None."""
    ok = True
    for key in raw:
        if key not in EXTERNAL_PROFILE_KEYS:
            ok = False
            problem("%s.%s: only for a server servelab launches; an external profile (engine "
                    "external: an endpoint servelab does not start) takes %s only; remove %s, or "
                    "give the profile an engine servelab starts" % (
                        label, key, ", ".join(EXTERNAL_PROFILE_KEYS), key))
    own = raw.get("base_url")
    if own is None or (isinstance(own, str) and not own.strip()):
        shared = v.get("bench_base_url")
        if not (isinstance(shared, str) and shared.strip()):
            problem("%s.base_url: required for an external profile (the endpoint's root, e.g. "
                    "https://llm.example.com or http://10.0.0.5:8000/v1); or set bench_base_url "
                    "for every external profile" % label)
            return None
        # bench_base_url has its own check (_check_misc).
        return shared if ok and base_url_problem(shared) is None else None
    why = base_url_problem(own)
    if why:
        problem("%s.base_url: %s" % (label, why))
        return None
    return own if ok else None


def _check_profiles(inp: HostInput, spec: Mapping[str, VariableSpec], add,
                    targets: Dict[str, TargetCheck]) -> Tuple[int, Optional[str], Optional[str]]:
    """(profiles checked, the model name the first one serves: llm_bench's `model`, and the
    base_url of the first external profile when the host launches no server)."""
    v = inp.values
    profiles = v.get("bench_profiles")
    if profiles is None or profiles == []:
        add("bench_profiles", "bench_profiles: no profiles; give at least one, e.g. "
                              "[{name: baseline}] (keys: docs/contracts.md, llm_server profile)")
        return 0, None, None
    if not isinstance(profiles, (list, tuple)):
        return 0, None, None  # the type check has said so
    engines = tuple(spec["bench_engine"].choices) if "bench_engine" in spec else ENGINES
    default_engine = v.get("bench_engine")
    port = v.get("bench_server_port")
    port = int(port) if is_int(port) and 1 <= int(port) <= 65535 else None
    python = str(v.get("bench_engine_python") or "python3")
    bind = str(v.get("bench_server_bind") or "127.0.0.1")
    state_dir = str(v.get("bench_state_dir") or "~/.servelab/servers")
    env = v.get("bench_server_env") if isinstance(v.get("bench_server_env"), Mapping) else {}
    seen: Dict[str, int] = {}
    first_model = None
    external_url, launches = None, False
    for i, raw in enumerate(profiles):
        label = "bench_profiles[%d]" % i
        where = inp.origins.get(label, inp.origins.get("bench_profiles", ""))

        def problem(message, where=where):
            add("bench_profiles", message, where)

        if not isinstance(raw, Mapping):
            continue          # the type check has said so
        name = raw.get("name")
        if not name:
            problem("%s.name: missing; every profile needs a name (results are filed under it)"
                    % label)
            continue
        name = str(name)
        label = "%s (%s)" % (label, name)
        if name in seen:
            problem("%s.name: %r is also the name of bench_profiles[%d]; give each profile its "
                    "own name" % (label, name, seen[name]))
            continue
        seen[name] = i
        instance = "servelab-%s" % name
        if not NAME_RE.match(instance):
            problem("%s.name: %r must be letters, digits, '.', '_', '-' (at most 55 characters): "
                    "it names the server instance %s, its state directory and cgroup"
                    % (label, name, instance))
            continue
        allowed = tuple(PROFILE_KEYS) + PROFILE_ROLE_KEYS
        unknown = [str(k) for k in raw if k not in allowed]
        for key in unknown:
            near = difflib.get_close_matches(key, allowed, n=1)
            problem("%s: unknown key %r%s (profile keys: %s)" % (
                label, key, "; did you mean %s?" % near[0] if near else "", ", ".join(allowed)))
        if unknown:
            continue
        engine = raw.get("engine", default_engine)
        if engine not in engines:
            if "engine" in raw:
                problem("%s.engine: %r is not one of %s; fix the profile where bench_profiles is "
                        "set" % (label, engine, ", ".join(engines)))
            continue          # a bad bench_engine is the type check's
        if engine == EXTERNAL:
            url = _check_external(label, raw, v, problem)
            external_url = external_url or url
            first_model = first_model or str(raw.get("model") or v.get("bench_model") or "")
            continue
        launches = True
        if "base_url" in raw:
            problem("%s.base_url: only for an external profile (engine external); servelab "
                    "starts this one (engine %s) and reaches it at bench_target_host:"
                    "bench_server_port; set engine: external or remove base_url"
                    % (label, engine))
            continue
        profile = {"model": v.get("bench_model")}
        profile.update({k: plain(val) for k, val in raw.items() if k not in PROFILE_ROLE_KEYS})
        try:
            if "nodes" in profile:   # as the bench role resolves it (filter multinode_nodes)
                profile["nodes"] = resolve_nodes(profile["nodes"], inp.host, inp.groups, inp.addresses,
                                                 default_port=v.get("bench_dist_init_port", DEFAULT_DIST_INIT_PORT),
                                                 where="nodes")
            resolved = resolve_profile(profile)
            rendered = render_server(
                resolved, engine, bind, port, python,
                # The installed SGLang is unknown here; the newest pinned release accepts every
                # profile an older one does. The GPU server checks the installed one below.
                engine_version=SGLANG_DEFAULT_VERSION if engine == "sglang" else None,
                module_env={str(k): str(val) for k, val in env.items() if val is not None},
                simulator_script=os.path.join(state_dir, instance, SCRIPT_NAME))
        except (ProfileError, NodesError) as exc:
            problem("%s: %s" % (label, _strip_profile_prefix(str(exc), name)))
            continue
        first_model = first_model or rendered.model
        if engine in ("sglang", "vllm"):
            check = targets.setdefault(inp.host, TargetCheck(inp.host))
            check.servers.append({
                "variable": label, "hosts": [inp.host], "where": where,
                "request": {"name": instance, "engine": engine, "profile": profile,
                            "host": bind, "port": port, "python": python,
                            "env": {str(k): str(val) for k, val in env.items()
                                    if val is not None},
                            "state_dir": state_dir}})
        _rank_ports(inp, name, profile.get("nodes"), port, state_dir, where, targets,
                    dist_init_variable=("%s.nodes.port" % label if "port" in (raw.get("nodes") or {})
                                        else "bench_dist_init_port"))
    return len(seen), first_model, (None if launches else external_url)


def _rank_ports(inp: HostInput, name: str, nodes: Any, port: Optional[int], state_dir: str,
                where: str, targets: Dict[str, TargetCheck],
                dist_init_variable: str = "bench_dist_init_port") -> None:
    """A multi-node profile's other ranks bind this host's bench_server_port on their own hosts
    (roles/bench/tasks/multinode_start.yml): checked free there, as this host's is here. Rank 0
    also binds the dist-init port (torch.distributed's TCP store, the other ranks join it):
    checked free on rank 0's host, by the host that drives the profile (rank 0 itself)."""
    if not isinstance(nodes, Mapping):
        return
    hosts = list(nodes.get("hosts") or ())
    if hosts and hosts[0] == inp.host and nodes.get("port") is not None:
        targets.setdefault(inp.host, TargetCheck(inp.host)).ports.append({
            "variable": dist_init_variable, "port": int(nodes["port"]), "hosts": [inp.host],
            "where": inp.origins.get(dist_init_variable, where), "state_dir": state_dir,
            "needed_for": "the dist-init store of multi-node profile %s (rank 0)" % name})
    if port is None:
        return
    for rank, rank_host in enumerate(nodes.get("hosts") or ()):
        if rank_host == inp.host:
            continue
        targets.setdefault(str(rank_host), TargetCheck(str(rank_host))).ports.append({
            "variable": "bench_server_port", "port": port, "hosts": [inp.host],
            "where": inp.origins.get("bench_server_port", where), "state_dir": state_dir,
            "needed_for": "rank %d of multi-node profile %s (nodes)" % (rank, name)})


def _check_ports(inp: HostInput, targets: Dict[str, TargetCheck]) -> None:
    """Every port the host's run will bind, checked free on the host (module_utils/preflight
    .check_port): bench_server_port, and a router's two halves."""
    v = inp.values
    if not is_int(v.get("bench_server_port")):
        return
    needed = [{"port": int(v["bench_server_port"]), "needed_for": "the server"}]
    needed += router_ports(v)
    targets.setdefault(inp.host, TargetCheck(inp.host)).ports.extend(
        dict(item, variable="bench_server_port", hosts=[inp.host],
             where=inp.origins.get("bench_server_port", ""),
             state_dir=str(v.get("bench_state_dir") or "~/.servelab/servers"))
        for item in needed)
