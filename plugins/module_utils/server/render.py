"""One profile + engine + address -> one exact server spec (command line, env, readiness probe).

The spec is what gets launched, what the state file records and what the config hash covers, so
"the same config" means byte-for-byte the same argv and env. Engine specifics live in
server_render_sglang.py / server_render_vllm.py; the simulator and `command` engines are here.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import shlex
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import Profile, ProfileError, ReadyCheck
from ansible_collections.servelab.serving.plugins.module_utils.server.render_sglang import (
    render_sglang,
    version_warnings,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.render_vllm import render_vllm
from ansible_collections.servelab.serving.plugins.module_utils.server.versions import parse_version

ENGINES = ("sglang", "vllm", "simulator", "command")
DEFAULT_PORTS = {"sglang": 30000, "vllm": 8000, "simulator": 30000}
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
COMMAND_PLACEHOLDERS = ("{host}", "{port}", "{model}", "{python}")
# With profile.nodes, `command` also gets the node's place in the group (a stand-in for SGLang's
# multi-node flags in tests, or another engine's own).
NODE_PLACEHOLDERS = ("{node_rank}", "{nnodes}", "{dist_init_addr}")
# SGLang's ranks other than 0 run no API server: once their schedulers joined the group and are
# ready they serve a stand-in health server on the same port (GET /health and /health_generate
# answer 200 without generating; sglang/srt/entrypoints/engine.py, launch_dummy_health_check_server).
# Their readiness is that; the group is ready when rank 0 generates.
FOLLOWER_READY = ReadyCheck(path="/health", method="GET")
# Profile keys that ask a real engine for something; the simulator models them through its own
# `simulator:` settings, so a profile shared between the field and the laptop stays valid.
SIMULATOR_IGNORES = ("tp", "speculative", "spec_v2", "flashinfer_allreduce_fusion",
                     "torch_symm_mem", "mem_fraction_static", "cuda_graph_max_bs",
                     "max_running_requests", "enable_metrics", "nodes")
# With `command` the user writes the whole command line: a switch servelab would not render is a
# mistake worth an error.
COMMAND_REJECTS = tuple(k for k in SIMULATOR_IGNORES if k != "nodes") + ("simulator",)
SIMULATOR_FLAGS = {"profile": "--profile", "time_scale": "--time-scale",
                   "truth_log": "--truth-log", "die_after": "--die-after",
                   "startup_delay": "--startup-delay"}


@dataclass(frozen=True)
class ServerSpec:
    engine: str
    profile_name: str
    cmd: Tuple[str, ...]
    env: Mapping[str, str]          # only what servelab sets on top of the inherited environment
    host: str
    port: int
    probe_host: str                 # where readiness is probed from the server's own machine
    base_url: str                   # what clients use
    model: Optional[str]            # the name to send in requests
    ready: ReadyCheck
    engine_version: Optional[str] = None
    notes: Tuple[str, ...] = ()
    warnings: Tuple[str, ...] = ()
    ignored_keys: Tuple[str, ...] = ()
    identity_extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def cmdline(self) -> str:
        return shlex.join(self.cmd)

    @property
    def config_hash(self) -> str:
        """Covers everything that makes a different server: argv, env, engine version, probe."""
        identity = {
            "engine": self.engine, "engine_version": self.engine_version,
            "cmd": list(self.cmd), "env": dict(sorted(self.env.items())),
            "ready": [self.ready.method, self.ready.path, self.ready.body, self.ready.status],
            "extra": dict(sorted(self.identity_extra.items())),
        }
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def default_ready(engine: str, model: Optional[str]) -> ReadyCheck:
    """A real generation, never just an open port."""
    if engine in ("sglang", "simulator"):
        # SGLang runs a 1-token generation through the scheduler for this endpoint.
        return ReadyCheck(path="/health_generate", method="GET")
    body = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
    if model:
        body["model"] = model
    return ReadyCheck(path="/v1/completions", method="POST", body=body)


def _with_model(ready: ReadyCheck, model: Optional[str]) -> ReadyCheck:
    if ready.body is not None and model and "model" not in ready.body:
        return ReadyCheck(path=ready.path, method=ready.method,
                          body=dict(ready.body, model=model), status=ready.status)
    return ready


# Flags servelab itself gives the simulator (render_simulator): not a profile's to set.
SIMULATOR_OWN_FLAGS = ("--host", "--port", "--model-name")


def simulator_flags() -> Tuple[str, ...]:
    """The simulator's own option strings, from its argparse definitions (simulator/cli.py's
    build_parser): what it accepts, so an unknown `simulator:` key is refused when the profile
    is rendered (the preflight, before anything starts) instead of by argparse's usage at the
    server's start. Imported here, not at the top: only a simulator profile needs it."""
    return tuple(_simulator_actions())


def _simulator_actions() -> dict:
    """{option string: whether it takes a value} of the simulator's argparse definitions: a
    switch (--fit-report) takes none, a profile's bool field (--mixed-chunk BOOL) takes one."""
    # pylint: disable-next=import-outside-toplevel
    from ansible_collections.servelab.serving.plugins.module_utils.simulator.cli import build_parser
    return {opt: action.nargs != 0
            for action in build_parser()._actions   # pylint: disable=protected-access
            for opt in action.option_strings if opt.startswith("--")}


def _unknown_simulator_key(key: str, flag: str, known: Tuple[str, ...], where: str) -> str:
    keys = sorted(f[2:].replace("-", "_") for f in known
                  if f not in SIMULATOR_OWN_FLAGS and f != "--help")
    if flag in SIMULATOR_OWN_FLAGS:
        return (f"{where}: simulator.{key} is set by servelab ({flag}: bench_server_bind, "
                f"bench_server_port, the profile's model); remove it from simulator")
    near = difflib.get_close_matches(str(key), keys, n=1)
    return (f"{where}: simulator.{key}: unknown simulator key (the simulator has no {flag})"
            + (f"; did you mean {near[0]}?" if near else "")
            + f" (simulator keys: {', '.join(keys)})")


def _simulator_args(profile: Profile, where: str) -> List[str]:
    settings = dict(profile.simulator)
    settings.setdefault("profile", profile.base or profile.name)
    args: List[str] = []
    actions = _simulator_actions()
    known = tuple(actions)
    for key in sorted(settings, key=lambda k: (k != "profile", k)):
        value = settings[key]
        flag = SIMULATOR_FLAGS.get(key, "--" + str(key).replace("_", "-"))
        if isinstance(value, (list, tuple, dict)):
            raise ProfileError(f"{where}: simulator.{key} must be a single value; "
                               f"put repeated flags into extra_args")
        if flag not in known or flag in SIMULATOR_OWN_FLAGS:
            raise ProfileError(_unknown_simulator_key(key, flag, known, where))
        if value is None:
            continue
        if isinstance(value, bool) and actions[flag]:
            # a profile's bool field: false must be said, the profile's default may be true
            args += [flag, "true" if value else "false"]
        elif value is True:
            args.append(flag)
        elif value is not False:
            args += [flag, str(value)]
    return args


def render_simulator(profile: Profile, python: str, script: str, host: str,
                     port: int) -> Tuple[List[str], dict, List[str]]:
    where = f"profile {profile.name!r}"
    cmd = [python, script, "--host", host, "--port", str(port),
           "--model-name", profile.request_model or "servelab-sim"]
    cmd += _simulator_args(profile, where)
    return cmd, {}, []


def render_command(profile: Profile, python: str, host: str,
                   port: int) -> Tuple[List[str], dict, List[str]]:
    where = f"profile {profile.name!r}"
    if not profile.command:
        raise ProfileError(f"{where}: engine command needs profile.command, the server's command "
                           f"line (placeholders {', '.join(COMMAND_PLACEHOLDERS)} are filled in)")
    rejected = [k for k in profile.set_keys() if k in COMMAND_REJECTS]
    if rejected:
        raise ProfileError(f"{where}: {', '.join(rejected)} cannot be rendered for engine command; "
                           f"write the engine's own flags into profile.command")
    values = {"{host}": host, "{port}": str(port), "{model}": profile.model or "",
              "{python}": python}
    if profile.nodes is not None:
        values.update({"{node_rank}": str(profile.nodes.rank), "{nnodes}": str(profile.nodes.nnodes),
                       "{dist_init_addr}": profile.nodes.dist_init_addr})
    if "{model}" in " ".join(profile.command) and not profile.model:
        raise ProfileError(f"{where}: profile.command uses {{model}} but no model is set")
    cmd = []
    for part in profile.command:
        for placeholder, value in values.items():
            part = part.replace(placeholder, value)
        cmd.append(part)
    return cmd, {}, []


def _merge_env(module_env: Mapping[str, str], profile: Profile, rendered: Mapping[str, str]) -> dict:
    env = dict(module_env or {})
    env.update(profile.env)
    for key, value in rendered.items():
        if key in env and env[key] != value:
            raise ProfileError(f"profile {profile.name!r}: env.{key}={env[key]!r} conflicts with "
                               f"{value!r}, which servelab sets from the profile's switches; "
                               f"remove it from env")
        env[key] = value
    return env


def _check_extra_args(cmd: List[str], profile: Profile) -> None:
    rendered = {part for part in cmd if part.startswith("--")}
    for arg in profile.extra_args:
        name = arg.split("=", 1)[0]
        if name in rendered:
            raise ProfileError(f"profile {profile.name!r}: extra_args repeats {name}, which "
                               f"servelab already renders from the profile; set the profile key "
                               f"instead of passing the flag twice")


def render_server(profile: Profile, engine: str, host: str, port: Optional[int], python: str,
                  engine_version: Optional[str] = None, module_env: Optional[Mapping] = None,
                  simulator_script: Optional[str] = None, advertise_host: Optional[str] = None,
                  identity_extra: Optional[Mapping[str, str]] = None,
                  gpu_archs: Optional[Sequence[str]] = None) -> ServerSpec:
    """Validate and render; raises ProfileError naming the key and the fix. gpu_archs: the compute
    capabilities of the server's GPUs, when known (SGLang's own fusion gate: server/fusion_gate.py)."""
    if engine not in ENGINES:
        raise ProfileError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if port is None:
        if engine not in DEFAULT_PORTS:
            raise ProfileError(f"port is required for engine {engine}")
        port = DEFAULT_PORTS[engine]
    if not 0 < int(port) < 65536:
        raise ProfileError(f"port must be in 1..65535, got {port}")
    port = int(port)
    warnings: List[str] = []
    ignored: Tuple[str, ...] = ()
    if engine in ("sglang", "command") and profile.speculative is not None \
            and profile.speculative.tokens_per_batch_size:
        raise ProfileError(f"profile {profile.name!r}: speculative.tokens_per_batch_size is vLLM's "
                           f"switch by load; {engine} has none (for SGLang, run two servers "
                           f"behind the router: bench_derived_profiles [router])")
    if engine == "sglang":
        version = parse_version(engine_version)
        warnings += version_warnings(version)
        cmd, env, notes = render_sglang(profile, version, python, host, port, gpu_archs)
    elif engine == "vllm":
        if profile.nodes is not None:
            raise ProfileError(f"profile {profile.name!r}: nodes (one model over several hosts) is rendered "
                               f"for engine sglang only; vLLM's multi-node runs on Ray: drop nodes")
        cmd, env, notes = render_vllm(profile, python, host, port)
    elif engine == "simulator":
        if not simulator_script:
            raise ProfileError("internal: simulator_script path missing")
        ignored = tuple(k for k in profile.set_keys() if k in SIMULATOR_IGNORES)
        cmd, env, notes = render_simulator(profile, python, simulator_script, host, port)
    else:
        cmd, env, notes = render_command(profile, python, host, port)
    _check_extra_args(cmd, profile)
    cmd = cmd + list(profile.extra_args)
    if profile.command and engine != "command":
        raise ProfileError(f"profile {profile.name!r}: command is only used with engine command "
                           f"(engine is {engine}); remove it or switch the engine")
    merged_env = _merge_env(module_env or {}, profile, env)
    ready = _with_model(profile.ready or default_ready(engine, profile.request_model),
                        profile.request_model)
    if profile.nodes is not None and profile.nodes.rank > 0:
        ready = FOLLOWER_READY
    probe_host = WILDCARD_HOSTS.get(host, host)
    public = advertise_host or probe_host
    return ServerSpec(
        engine=engine, profile_name=profile.name, cmd=tuple(cmd), env=merged_env, host=host,
        port=port, probe_host=probe_host, base_url=f"http://{_url_host(public)}:{port}",
        model=profile.request_model or ("servelab-sim" if engine == "simulator" else None),
        ready=ready, engine_version=str(engine_version) if engine_version else None,
        notes=tuple(notes), warnings=tuple(warnings), ignored_keys=ignored,
        identity_extra=dict(identity_extra or {}))
