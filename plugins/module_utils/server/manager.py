"""llm_server's logic: bring a named server to `started`, `stopped` or `restarted`.

started: the same config already serving -> unchanged; a different config, a dead server or one
that no longer generates -> (re)start. stopped: TERM, grace, KILL the whole tree, confirm the port
is free. Everything is validated and rendered before any process is touched; check mode stops
right after deciding.

Secrets (a profile's or the module's env, secret flags in extra_args/command, `api_key`) reach the
server's process and nothing else: the result, every failure, and the state file carry them
redacted (module_utils/redact.py), and a config with secrets is compared by a keyed hash.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import re
import secrets as secrets_random
import shlex
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils import redact
from ansible_collections.servelab.serving.plugins.module_utils.proc import cgroup as proc_cgroup
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime as proc_lifetime
from ansible_collections.servelab.serving.plugins.module_utils.server import engine as server_engine
from ansible_collections.servelab.serving.plugins.module_utils.server import launcher
from ansible_collections.servelab.serving.plugins.module_utils.server import ports as server_ports
from ansible_collections.servelab.serving.plugins.module_utils.server import simulator_file as server_simulator
from ansible_collections.servelab.serving.plugins.module_utils.server import state as server_state
from ansible_collections.servelab.serving.plugins.module_utils.server.fusion_gate import NOT_RENDERED
from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import ProfileError, resolve_profile
from ansible_collections.servelab.serving.plugins.module_utils.server.logscan import scan_log
from ansible_collections.servelab.serving.plugins.module_utils.server.ready import NotReady, wait_ready
from ansible_collections.servelab.serving.plugins.module_utils.server.render import ServerSpec, render_server
from ansible_collections.servelab.serving.plugins.module_utils.server.render_sglang import SGLANG_DEFAULT_VERSION
from ansible_collections.servelab.serving.plugins.module_utils.server.state import ServerState
from ansible_collections.servelab.serving.plugins.module_utils.server.versions import VersionError, parse_version

STATES = ("started", "stopped", "restarted")
# Engines whose API key servelab renders as a flag. vLLM has --api-key too, but it guards /v1/*,
# where its readiness probe (a 1-token completion) goes, and server/ready.py sends no key yet.
API_KEY_FLAGS = {"sglang": "--api-key"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ServerError(RuntimeError):
    """Failure with a message naming the cause and the fix; `details` go into the result."""

    def __init__(self, msg: str, **details):
        super().__init__(msg)
        self.msg = msg
        self.details = details


@dataclass
class ServerRequest:
    name: str
    state: str = "started"
    engine: str = "simulator"
    profile: Optional[Mapping] = None
    model: Optional[str] = None
    host: str = "127.0.0.1"
    port: Optional[int] = None
    advertise_host: Optional[str] = None
    state_dir: str = "~/.servelab/servers"
    python: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict)
    engine_version: Optional[str] = None
    gpu_compute_capabilities: Optional[List[str]] = None   # the server's GPUs (SGLang's fusion gate)
    ready_timeout: float = 900.0
    probe_timeout: float = 60.0
    stop_grace: float = 15.0
    kill_timeout: float = 15.0
    port_timeout: float = 30.0
    cgroup: str = "auto"
    verify_flags: bool = True
    stop_on_failure: bool = True
    wait: bool = True                   # False: launch and return (the ranks of a multi-node profile)
    api_key: Optional[str] = None       # the engine's API key (SGLang --api-key)
    secret_names: List[str] = field(default_factory=list)   # redact.Rules.of: names and flags
    check_mode: bool = False
    # Tests inject a stand-in simulator zipapp (simulator_file.build_archive); the module never
    # sets it.
    simulator_archive: Optional[bytes] = None


@dataclass
class ServerResult:
    changed: bool
    action: str                 # started | restarted | unchanged | stopped | absent (+ would_ in check)
    name: str
    state: str
    reason: str = ""
    engine: Optional[str] = None
    engine_version: Optional[str] = None
    profile: Optional[str] = None
    pid: Optional[int] = None
    cmd: List[str] = field(default_factory=list)
    cmdline: str = ""
    env: dict = field(default_factory=dict)
    config_hash: Optional[str] = None
    log_path: Optional[str] = None
    state_path: Optional[str] = None
    base_url: Optional[str] = None
    model: Optional[str] = None
    host: Optional[str] = None
    port: Optional[int] = None
    ready_seconds: Optional[float] = None
    features_skipped: List[str] = field(default_factory=list)
    engine_adjustments: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    ignored_keys: List[str] = field(default_factory=list)
    cgroup: Optional[str] = None
    cgroup_reason: Optional[str] = None
    stopped: Optional[dict] = None      # what a stop did: killed, survivors, seconds, port_free

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Rendering (pure apart from asking the engine's interpreter for its version)


def _engine_version(req: ServerRequest, python: str, warnings: List[str]) -> Optional[str]:
    if req.engine not in ("sglang", "vllm"):
        return req.engine_version
    installed = server_engine.installed_version(python, req.engine)
    if req.engine_version:
        parse_version(req.engine_version)
        if installed.value and installed.value != str(req.engine_version):
            raise ServerError(
                f"engine_version is {req.engine_version} but {python} has {req.engine} "
                f"{installed.value}: the flags would be rendered for the wrong release; set "
                f"engine_version: {installed.value} or leave it out")
        return str(req.engine_version)
    if installed.value:
        return installed.value
    if req.engine == "sglang":
        if req.check_mode or req.state == "stopped":
            warnings.append(f"could not read the installed sglang version ({installed.error}); "
                            f"rendered for {SGLANG_DEFAULT_VERSION}")
            return SGLANG_DEFAULT_VERSION
        raise ServerError(f"cannot tell which SGLang to render flags for: {installed.error}; set "
                          f"python to the interpreter of SGLang's venv, or engine_version")
    return None


def build_spec(req: ServerRequest) -> tuple:
    """(ServerSpec, simulator zipapp or None). Raises ServerError before anything is touched."""
    if not NAME_RE.match(req.name or ""):
        raise ServerError(f"name {req.name!r} must be 1-64 characters of letters, digits, "
                          f"'.', '_', '-' (it names the state directory and the cgroup)")
    python = req.python or sys.executable
    warnings: List[str] = []
    try:
        profile = resolve_profile(req.profile, default_model=req.model)
        version = _engine_version(req, python, warnings)
        sim_archive = script = None
        extra = {}
        if req.engine == "simulator":
            sim_archive = req.simulator_archive or server_simulator.simulator_archive()
            script = os.path.join(server_state.server_dir(req.state_dir, req.name),
                                  server_simulator.SCRIPT_NAME)
            extra["simulator_sha256"] = server_simulator.digest(sim_archive)
        spec = render_server(profile, req.engine, req.host, req.port, python,
                             engine_version=version, module_env=req.env,
                             simulator_script=script, advertise_host=req.advertise_host,
                             identity_extra=extra, gpu_archs=req.gpu_compute_capabilities)
    except (ProfileError, VersionError, server_simulator.SimulatorUnavailable) as exc:
        raise ServerError(str(exc)) from None
    if warnings:
        spec = dataclasses.replace(spec, warnings=tuple(warnings) + spec.warnings)
    return _with_api_key(spec, req), sim_archive


def _with_api_key(spec: ServerSpec, req: ServerRequest) -> ServerSpec:
    """The engine's API key as its flag, where servelab can render it and still probe readiness."""
    if not req.api_key:
        return spec
    flag = API_KEY_FLAGS.get(spec.engine)
    if spec.engine == "vllm":
        # A warning: the operator asked for a guarded server and gets an open one.
        return dataclasses.replace(spec, warnings=spec.warnings + (
            "api_key is not passed to vllm: its readiness probe (POST /v1/completions) cannot "
            "send a key yet, so the server runs without one",))
    if flag is None:
        why = ("the simulator checks no API key" if spec.engine == "simulator"
               else "write the engine's own flag into profile.command")
        return dataclasses.replace(spec, notes=spec.notes + (
            f"api_key is not passed to the {spec.engine} server ({why})",))
    if any(part == flag or part.startswith(flag + "=") for part in spec.cmd):
        raise ServerError(f"api_key is set and the profile's extra_args pass {flag} too; keep "
                          f"one of them")
    return dataclasses.replace(spec, cmd=spec.cmd + (flag, req.api_key))


def request_secrets(req: ServerRequest) -> tuple:
    """(rules, the secret values of the request): everything the module was handed, so that
    even a message raised before rendering (a bad profile quoting its env) is masked."""
    rules = redact.Rules.of(req.secret_names)
    found = redact.collect_secrets({"profile": req.profile, "env": dict(req.env or {})}, rules)
    if req.api_key:
        found.add(str(req.api_key))
    return rules, found


def keyed_config_hash(spec: ServerSpec, state: Optional[ServerState], secret: bool) -> tuple:
    """(config hash to record and compare, salt). A config with secrets gets an HMAC of the
    plain hash under a salt kept in the (0600) state file: the manifest shows the hash, and the
    plain one would let a weak secret be guessed offline from the rest of the command line."""
    if not secret:
        return spec.config_hash, None
    salt = (state.hash_salt if state is not None and state.hash_salt
            else secrets_random.token_hex(16))
    digest = hmac.new(salt.encode(), spec.config_hash.encode(), hashlib.sha256).hexdigest()
    return digest[:16], salt


def _verify_installed_flags(req: ServerRequest, spec: ServerSpec) -> List[str]:
    """Unknown flags fail here (before a launch); deprecated ones and unknowns become warnings."""
    if req.engine != "sglang" or not req.verify_flags:
        return []
    problems = server_engine.verify_sglang_flags(req.python or sys.executable, spec.cmd, spec.env)
    unknown = [p.message for p in problems if p.kind == "unknown_flag"]
    if unknown:
        raise ServerError(f"the installed SGLang {spec.engine_version} rejects the rendered "
                          f"command: {'; '.join(unknown)}", cmd=list(spec.cmd))
    return [f"flag check: {p.message}" for p in problems]


# ---------------------------------------------------------------------------------------------
# Result helpers


def _result_from_spec(spec: ServerSpec, req: ServerRequest, **kw) -> ServerResult:
    directory = server_state.server_dir(req.state_dir, req.name)
    return ServerResult(
        name=req.name, state=req.state, engine=spec.engine, engine_version=spec.engine_version,
        profile=spec.profile_name, cmd=list(spec.cmd), cmdline=spec.cmdline, env=dict(spec.env),
        config_hash=spec.config_hash, log_path=os.path.join(directory, server_state.LOG_FILE),
        state_path=os.path.join(directory, server_state.STATE_FILE), base_url=spec.base_url,
        model=spec.model, host=spec.host, port=spec.port, notes=list(spec.notes),
        warnings=list(spec.warnings), ignored_keys=list(spec.ignored_keys), **kw)


def _running(state: Optional[ServerState]) -> bool:
    return bool(state and state.status == "running"
                and proc_lifetime.is_alive(state.pid, state.start_time))


def _leftovers(state: Optional[ServerState]) -> dict:
    if state is None:
        return {}
    return launcher.members(state.pid, state.start_time, state.marker, state.cgroup)


# ---------------------------------------------------------------------------------------------
# Stop


def _stop(req: ServerRequest, state: ServerState) -> dict:
    report = launcher.stop_tree(state.pid, state.start_time, state.marker, state.cgroup,
                                grace=req.stop_grace, kill_timeout=req.kill_timeout)
    port_free = _wait_port_free(state.port, req.port_timeout)
    state.status = "stopped"
    server_state.save(req.state_dir, state)
    outcome = {"killed": report.killed, "survivors": report.survivors,
               "seconds": report.seconds, "port_free": port_free, "cgroup_kill": report.cgroup_kill}
    if report.survivors:
        raise ServerError(f"{len(report.survivors)} process(es) of server {req.name} survived "
                          f"SIGKILL: {report.survivors}", stopped=outcome)
    if not port_free:
        holders = server_ports.describe(server_ports.listeners(state.port))
        raise ServerError(f"server {req.name} stopped but port {state.port} is still in use by "
                          f"{', '.join(holders) or 'an unknown process'}", stopped=outcome)
    return outcome


def _stop_after_failure(req: ServerRequest, state: ServerState) -> Tuple[dict, str]:
    """Stop a server that failed to start; (the stop's outcome, the words for the message).
    A stop that fails too (a survivor, the port held by another process) is said beside the
    start's failure: it must not replace it, or the log that says why the server died is lost."""
    try:
        return _stop(req, state), "; it was stopped"
    except ServerError as stop_failed:
        outcome = dict(stop_failed.details.get("stopped") or {})
        outcome["error"] = stop_failed.msg
        return outcome, f"; stopping it failed too: {stop_failed.msg}"


def _wait_port_free(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while server_ports.is_listening(port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def ensure_stopped(req: ServerRequest) -> ServerResult:
    state = server_state.load(req.state_dir, req.name)
    result = ServerResult(changed=False, action="absent", name=req.name, state=req.state)
    if state is None:
        result.reason = f"no server named {req.name} under {req.state_dir}"
        return result
    for key in ("engine", "engine_version", "config_hash", "pid", "base_url", "model", "host",
                "port", "log_path", "cgroup"):
        setattr(result, key, getattr(state, key))
    result.cmd, result.env, result.profile = list(state.cmd), dict(state.env), state.profile
    result.cmdline = shlex.join(state.cmd)
    leftovers = _leftovers(state)
    if not leftovers:
        result.action, result.reason = "unchanged", "not running"
        if state.status != "stopped" and not req.check_mode:
            state.status = "stopped"
            server_state.save(req.state_dir, state)
        return result
    result.changed = True
    if req.check_mode:
        result.action = "would_stop"
        result.stopped = {"would_kill": [{"pid": p, "comm": i.comm}
                                         for p, i in sorted(leftovers.items())]}
        return result
    result.action = "stopped"
    result.stopped = _stop(req, state)
    return result


# ---------------------------------------------------------------------------------------------
# Start


def cgroup_leaf(name: str, server_dir: str) -> str:
    """The server's cgroup name: its instance name plus a digest of its state directory.

    The cgroup hierarchy is machine-wide while instance names are only unique within a state
    directory: two runs using the same profile names (two checkouts, a test beside a benchmark)
    would otherwise share one cgroup, and stopping one (cgroup.kill) would kill the other."""
    digest = hashlib.sha256(os.path.realpath(server_dir).encode("utf-8")).hexdigest()[:10]
    return f"{name}-{digest}"


def _start(req: ServerRequest, spec: ServerSpec, sim_archive: Optional[bytes],
           result: ServerResult, salt: Optional[str], rules: redact.Rules, secrets) -> None:
    directory = server_state.server_dir(req.state_dir, req.name)
    holders = server_ports.listeners(spec.port)
    if holders:
        raise ServerError(
            f"port {spec.port} is already in use by {', '.join(server_ports.describe(holders))}, "
            f"which is not server {req.name}: stop it (gpu_reap) or choose another port")
    if sim_archive is not None:
        server_simulator.materialise(directory, sim_archive)
    choice = proc_cgroup.prepare(cgroup_leaf(req.name, directory), req.cgroup)
    marker = f"{req.name}:{uuid.uuid4().hex[:12]}"
    try:
        launched = launcher.spawn(spec.cmd, spec.env, result.log_path, directory, marker, choice)
    except launcher.LaunchError as exc:
        raise ServerError(str(exc), cmd=list(spec.cmd)) from None
    # The engine may print its command line (SGLang logs its ServerArgs, api_key included): its
    # log is for the server's owner only. The directory is 0700 already (state.locked).
    for path in (launched.log_path, launched.log_path + ".1"):
        try:
            os.chmod(path, 0o600)
        except OSError:
            pass
    state = ServerState(
        name=req.name, engine=spec.engine, profile=spec.profile_name, status="running",
        config_hash=result.config_hash, hash_salt=salt,
        cmd=redact.redact_tree(list(spec.cmd), secrets, rules),
        env=redact.redact_tree(dict(spec.env), secrets, rules),
        host=spec.host,
        port=spec.port, probe_host=spec.probe_host, base_url=spec.base_url, model=spec.model,
        log_path=launched.log_path, marker=marker, pid=launched.pid,
        start_time=launched.start_time, cgroup=launched.cgroup,
        engine_version=spec.engine_version, started_at=time.time(),
        ready=dataclasses.asdict(spec.ready))
    server_state.save(req.state_dir, state, rules)   # first: a failed wait can still be stopped
    result.pid, result.cgroup, result.cgroup_reason = launched.pid, launched.cgroup, launched.cgroup_reason
    if not req.wait:
        result.reason += "; launched, not waited for (wait=false)"
        return
    try:
        seconds = wait_ready(spec.probe_host, spec.port, spec.ready, req.ready_timeout,
                             launched.log_path, launched.process.poll,
                             probe_timeout=req.probe_timeout)
    except NotReady as exc:
        stopped, outcome = _stop_after_failure(req, state) if req.stop_on_failure \
            else (None, "; it was left running")
        findings = scan_log(launched.log_path, spec.engine)
        raise ServerError(
            f"server {req.name} ({spec.engine}) failed to become ready: {exc.reason}"
            + outcome
            + f"\n--- last lines of {launched.log_path} ---\n{exc.log_tail}",
            log_tail=exc.log_tail, exit_code=exc.exit_code, cmd=list(spec.cmd),
            cmdline=spec.cmdline, log_path=launched.log_path, stopped=stopped,
            features_skipped=findings.features_skipped) from None
    state.ready_seconds = seconds
    server_state.save(req.state_dir, state)
    result.ready_seconds = seconds


def _scan(result: ServerResult, engine: str) -> None:
    findings = scan_log(result.log_path, engine)
    # A feature servelab left out of the command (SGLang's fusion gate) is skipped as surely as
    # one the log reports: the report lists both.
    result.features_skipped = [n for n in result.notes if NOT_RENDERED in n] + findings.features_skipped
    result.engine_adjustments = findings.engine_adjustments


def ensure_started(req: ServerRequest, spec: ServerSpec, sim_archive: Optional[bytes],
                   warnings: List[str] = ()) -> ServerResult:
    rules, secrets = request_secrets(req)
    state = server_state.load(req.state_dir, req.name)
    result = _result_from_spec(spec, req, changed=True, action="started")
    # Keyed whenever anything would be redacted, short values included (they are not searched
    # for in text, but they are secrets all the same).
    has_secret = bool(secrets) or redact.redact_argv(spec.cmd, rules) != list(spec.cmd) \
        or redact.redact_env(spec.env, rules) != dict(spec.env)
    result.config_hash, salt = keyed_config_hash(spec, state, has_secret)
    result.warnings += list(warnings)
    running = _running(state)
    if running and req.state == "started" and state.config_hash == result.config_hash:
        def exit_code():
            return None if proc_lifetime.is_alive(state.pid, state.start_time) else "?"

        # A server that was ready once and cannot generate within one probe budget is sick (it
        # gets restarted); one that never was ready may still be loading: give it the full time.
        budget = req.probe_timeout if state.ready_seconds is not None else req.ready_timeout
        try:
            seconds = wait_ready(spec.probe_host, spec.port, spec.ready,
                                 0.0 if req.check_mode else budget, state.log_path,
                                 exit_code, probe_timeout=req.probe_timeout)
            result.changed, result.action = False, "unchanged"
            result.reason = "the same config is already serving"
            result.pid, result.cgroup = state.pid, state.cgroup
            if state.ready_seconds is None and not req.check_mode:
                # Launched with wait=false: ready now, counted from its start.
                state.ready_seconds = round(max(0.0, time.time() - (state.started_at or time.time())), 3)
                server_state.save(req.state_dir, state)
            result.ready_seconds = state.ready_seconds if state.ready_seconds is not None else seconds
            _scan(result, spec.engine)
            return result
        except NotReady as exc:
            if _multinode(req) and not req.check_mode:
                # Restarting one rank alone cannot work: the others wait for the group it left.
                findings = scan_log(state.log_path, spec.engine)
                raise ServerError(
                    f"server {req.name} (rank of a multi-node profile) is not ready: {exc.reason}; "
                    f"a rank is not restarted alone: stop every rank and start the group again"
                    f"\n--- last lines of {state.log_path} ---\n{exc.log_tail}",
                    log_tail=exc.log_tail, exit_code=exc.exit_code, cmd=list(spec.cmd),
                    cmdline=spec.cmdline, log_path=state.log_path,
                    features_skipped=findings.features_skipped) from None
            result.action, result.reason = "restarted", f"the running server is not ready: {exc.reason}"
    elif running and req.state == "started":
        result.action = "restarted"
        result.reason = f"config changed ({state.config_hash} -> {result.config_hash})"
    elif running:
        result.action, result.reason = "restarted", "state=restarted"
    elif state is not None and state.status == "running":
        result.reason = f"the recorded server (pid {state.pid}) is gone"
    else:
        result.reason = "not running"
    if req.check_mode:
        result.action = "would_" + ("restart" if result.action == "restarted" else "start")
        return result
    if state is not None and _leftovers(state):
        # The old server, or what survived it (a TP worker holding GPU memory), goes first.
        result.stopped = _stop(req, state)
    _start(req, spec, sim_archive, result, salt, rules, secrets)
    _scan(result, spec.engine)
    return result


def _multinode(req: ServerRequest) -> bool:
    return isinstance(req.profile, Mapping) and req.profile.get("nodes") is not None


def redact_result(result: ServerResult, rules: redact.Rules, secrets) -> ServerResult:
    """The result as it may be shown and recorded: argv and env redacted, text masked."""
    data = redact.redact_tree(result.as_dict(), secrets, rules)
    data["cmdline"] = shlex.join(data["cmd"])
    return ServerResult(**data)


def redact_error(exc: ServerError, rules: redact.Rules, secrets) -> ServerError:
    details = redact.redact_tree(exc.details, secrets, rules)
    if "cmd" in details and "cmdline" in details:
        details["cmdline"] = shlex.join(details["cmd"])
    return ServerError(redact.redact_text(exc.msg, secrets, rules), **details)


def run(req: ServerRequest) -> ServerResult:
    """Bring the server to req.state; the result and every ServerError come out redacted."""
    rules, secrets = request_secrets(req)
    try:
        result = _run(req)
    except ServerError as exc:
        raise redact_error(exc, rules, secrets) from None
    except TimeoutError as exc:
        raise ServerError(redact.redact_text(str(exc), secrets, rules)) from None
    return redact_result(result, rules, secrets)


def _run(req: ServerRequest) -> ServerResult:
    if req.state not in STATES:
        raise ServerError(f"state must be one of {', '.join(STATES)}, got {req.state!r}")
    if req.state == "stopped":
        if not NAME_RE.match(req.name or ""):
            raise ServerError(f"name {req.name!r} must be 1-64 characters of letters, digits, "
                              f"'.', '_', '-'")
        if req.check_mode:
            return ensure_stopped(req)
        with server_state.locked(req.state_dir, req.name):
            return ensure_stopped(req)
    if req.profile is None:
        raise ServerError(f"profile is required for state={req.state} (e.g. {{name: baseline}})")
    # Validation and the flag check against the installed engine come before anything is touched.
    spec, sim_archive = build_spec(req)
    warnings = _verify_installed_flags(req, spec)
    if req.check_mode:   # reads only: no lock file, no directory
        return ensure_started(req, spec, sim_archive, warnings)
    with server_state.locked(req.state_dir, req.name):
        return ensure_started(req, spec, sim_archive, warnings)
