"""bench.yml's preflight: every bench_* setting of every GPU server, checked on the controller
before any server starts, any run directory is made or results/latest moves.

The values checked are the ones the bench role will see: the host's variables (inventory,
group_vars, -e) over the role's defaults (roles/bench/defaults/main.yml), templated in the host's
context. The rules:

- every bench_* variable a host (or the controller) has must be declared in
  roles/bench/meta/argument_specs.yml or be one of PLAYBOOK_VARIABLES (those bench.yml, its plays
  or the shipped inventories read outside the role); anything else is a typo, reported with the
  nearest known name. A new variable is declared there, or it is rejected here;
- types follow the role's argument spec strictly: a list or a mapping given as a string is an
  error, not a conversion (Ansible's validator would split "1,2,5", but the role's tasks use the
  variable itself, not the converted copy, and fail later with a Jinja type error); numbers and
  booleans given as strings (-e key=value) are accepted as the modules accept them. Whatever
  ansible-core's own ArgumentSpecValidator (the role's built-in validation) rejects is rejected
  too;
- ranges: port 1-65535, level seconds > 0 (and below llm_bench's level_timeout), SLOs > 0,
  concurrency levels >= 1, repeats >= 1 (sweep_plan.check_repeats, llm_bench's own rule),
  timeouts > 0, regexes that compile;
- profiles through server/profiles.py's own validation (resolve_profile) and rendering
  (render_server) for the profile's engine (SGLang: for the newest pinned release; the installed
  release's rendering and flag check run on the GPU server, see module_utils/preflight.py);
  an external profile (engine external: an endpoint servelab does not start) takes only
  EXTERNAL_PROFILE_KEYS, and its base_url (else bench_base_url) must be http(s)://host[:port][/path]
  without credentials, query or fragment;
- the workload's shape through loadgen/workloads.check_spec; a jsonl file is read where the
  bench client reads it (a target check);
- then llm_bench's own option check (loadgen/config.level_configs) over the options the role
  will pass, so the sweep cannot reject later what passed here.

All problems are collected (not just the first) and deduplicated across hosts; each message
names the variable and the fix. This module is pure: the action plugin
(plugins/action/bench_preflight.py) gathers the variables and runs the target checks.
"""
from __future__ import annotations

import difflib
import os
import re
from urllib.parse import urlsplit
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import BOOLEANS, boolean

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    BenchOptionsError,
    level_configs,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import ARGUMENT_SPEC as BENCH_SPEC
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVELS, PARTS_DIR
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import (
    WorkloadError,
    check_spec,
)
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
from ansible_collections.servelab.serving.plugins.plugin_utils.derived_preflight import (
    check_derived,
    derived_executables, router_ports,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.sweep_plan import (
    RepeatsError,
    check_repeats,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.fleet_checks import client_problems

COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLE_DIR = os.path.join(COLLECTION_ROOT, "roles", "bench")
ROLE_SPEC_FILE = os.path.join(ROLE_DIR, "meta", "argument_specs.yml")
ROLE_DEFAULTS_FILE = os.path.join(ROLE_DIR, "defaults", "main.yml")

# bench_* variables read outside the bench role, with who reads them. Role variables are
# declared in roles/bench/meta/argument_specs.yml instead (that is what the role validates with);
# a variable in neither place is reported as unknown.
PLAYBOOK_VARIABLES = {
    "bench_report_baseline": "playbooks/bench.yml: the report's baseline profile",
    "bench_compare_to": "playbooks/bench.yml: an earlier run (run id or path) the report compares with",
    "bench_resume": "playbooks/bench.yml: resume an interrupted run",
    "bench_remeasure": "playbooks/bench.yml: measure finished levels again on resume",
    "bench_continue_on_profile_failure": "playbooks/bench.yml: go on after a failed profile",
    "bench_break_lock": "playbooks/bench.yml: take over a run lock held from another controller",
    "bench_reap_pattern_scope": "gpu_reap's pattern scope in the bench role",
    "bench_api_key": "the bench client's bearer token",
    "bench_time_scale": "inventory/local: fills its profiles' simulator.time_scale",
    "bench_draft_model": "inventory/sample: fills speculative.draft_model_path",
}
# Set by playbooks/bench.yml's first play after the preflight; templates may refer to them.
PLAYBOOK_SET = ("bench_run_id",)

# read by the role (tasks/profile.yml), not by llm_server
PROFILE_ROLE_KEYS = ("engine", "base_url")
EXTERNAL = "external"               # the engine of an endpoint servelab did not start
# The keys an external profile may have: the rest (simulator, extra_args, tp, ...) describe a
# server servelab launches, and would silently do nothing.
EXTERNAL_PROFILE_KEYS = ("name", "engine", "base_url", "model")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
LEVEL_TIMEOUT = float(BENCH_SPEC["level_timeout"]["default"])
FIX = "fix it where it is set (group_vars, host_vars or -e)"
# llm_bench option -> the bench_* variable the role fills it from (for llm_bench's own messages).
# (Every option but base_url comes from the bench_* variable of its own name.)
OPTION_VARIABLES = dict(
    {"base_url": "bench_target_host/bench_server_port"},
    **{name: "bench_" + name for name in (
        "model", "api", "concurrency", "workload", "max_tokens", "level_seconds", "level_timeout",
        "warmup_requests", "slo", "min_latency_samples", "drain_timeout", "load_mode", "request_rate",
        "arrival", "processes", "ignore_eos", "extra_body", "min_window_requests", "max_requests",
        "target_ci_pct", "ci_batches", "stall_timeout", "ramp_seconds", "socket_rcvbuf", "seed",
        "per_chunk_usage", "rx_timestamps", "server_metrics",
    )})
# llm_bench options the role passes from a bench_* variable of the same name, by type
# (tasks/profile.yml's sweep); None (an optional one unset) is left out, as the role omits it.
SWEEP_OPTIONS = {
    "int": ("max_tokens", "warmup_requests", "min_latency_samples", "processes",
            "min_window_requests", "max_requests", "ci_batches", "socket_rcvbuf", "seed"),
    "float": ("level_seconds", "level_timeout", "stall_timeout", "drain_timeout",
              "target_ci_pct", "ramp_seconds"),
    "bool": ("ignore_eos", "per_chunk_usage", "server_metrics"),
    "str": ("api", "load_mode", "arrival", "rx_timestamps"),
}


# The variables the sweep check reads: one already found wrong skips it (no second message).
SWEEP_VARIABLES = tuple(
    ["bench_concurrency", "bench_workload", "bench_slo", "bench_target_host",
     "bench_server_port", "bench_model", "bench_request_rate", "bench_extra_body"]
    + ["bench_" + name for names in SWEEP_OPTIONS.values() for name in names])


@dataclass(frozen=True)
class VariableSpec:
    """One option of the role's argument spec (only what the checks use)."""
    name: str
    type: str = "str"
    elements: Optional[str] = None
    choices: Tuple[Any, ...] = ()
    required: bool = False


@dataclass(frozen=True)
class Problem:
    variable: str                 # bench_profiles[1] (eagle3).engine, bench_slo.ttft_ms, ...
    message: str                  # the whole sentence, starting with the variable
    where: str = ""               # file:line the value came from, when Ansible knows it
    hosts: Tuple[str, ...] = ()

    def text(self) -> str:
        out = self.message
        if self.where:
            out += " (set at %s)" % self.where
        if self.hosts:
            out += " [%s]" % ", ".join(self.hosts)
        return out

    def as_dict(self) -> dict:
        return {"variable": self.variable, "message": self.message, "where": self.where,
                "hosts": list(self.hosts)}


@dataclass
class HostInput:
    """One GPU server's settings, as the bench role will see them."""
    host: str
    values: Dict[str, Any]                                    # defaults applied, templated
    given: Tuple[str, ...] = ()                               # bench_* names the host has set
    origins: Dict[str, str] = field(default_factory=dict)     # name (or name[i]) -> file:line
    errors: Dict[str, str] = field(default_factory=dict)      # name -> templating error
    # Whether its bench_client is this host's machine (fleet_checks.same_machine; None: unknown).
    client_is_local: Optional[bool] = None
    # The inventory, for multi-node profiles (nodes.group): groups -> hosts, host -> ansible_host.
    groups: Dict[str, List[str]] = field(default_factory=dict)
    addresses: Dict[str, str] = field(default_factory=dict)


@dataclass
class TargetCheck:
    """What must be checked on one host (bench client, GPU server) by the bench_preflight module."""
    host: str
    workloads: List[dict] = field(default_factory=list)
    servers: List[dict] = field(default_factory=list)
    executables: List[dict] = field(default_factory=list)
    ports: List[dict] = field(default_factory=list)      # ports the run binds there: free?

    def as_dict(self) -> dict:
        return {"host": self.host, "workloads": self.workloads, "servers": self.servers,
                "executables": self.executables, "ports": self.ports}

    def count(self) -> int:
        return (len(self.workloads) + len(self.servers) + len(self.executables)
                + len(self.ports))


@dataclass
class Preflight:
    problems: List[Problem]
    target_checks: List[TargetCheck]
    hosts: Tuple[str, ...]
    profiles: int

    @property
    def ok(self) -> bool:
        return not self.problems


# ---------------------------------------------------------------------------------------------
# The role's spec and the known names


def role_spec(argument_specs: Mapping) -> Dict[str, VariableSpec]:
    """{name: VariableSpec} from the parsed roles/bench/meta/argument_specs.yml."""
    options = ((argument_specs or {}).get("argument_specs") or {}).get("main", {}).get("options")
    out = {}
    for name, opt in (options or {}).items():
        out[str(name)] = VariableSpec(
            name=str(name), type=str(opt.get("type", "str")),
            elements=str(opt["elements"]) if opt.get("elements") else None,
            choices=tuple(opt.get("choices") or ()), required=bool(opt.get("required")))
    return out


def known_names(spec: Mapping[str, VariableSpec]) -> Tuple[str, ...]:
    return tuple(sorted(set(spec) | set(PLAYBOOK_VARIABLES)))


def unknown_variables(names: Iterable[str], known: Sequence[str],
                      origins: Optional[Mapping[str, str]] = None) -> List[Problem]:
    """bench_* names nobody reads: a typo silently runs the default instead."""
    problems = []
    for name in sorted(set(names)):
        if not name.startswith("bench_") or name in known:
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if near:
            msg = "%s: unknown variable; did you mean %s?" % (name, near[0])
        else:
            msg = ("%s: unknown variable (neither declared in roles/bench/meta/argument_specs.yml "
                   "nor read by bench.yml); remove it, or name your own helper variables without "
                   "the bench_ prefix" % name)
        problems.append(Problem(name, msg, (origins or {}).get(name, "")))
    return problems


# ---------------------------------------------------------------------------------------------
# Types


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, (int, float)):
        return "a number"
    return "a %s" % type(value).__name__


def _is_int(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, str):
        return bool(re.fullmatch(r"\s*[+-]?\d+\s*", value))
    return False


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return False


def _number(value: Any) -> float:
    return float(value)


def _list_hint(name: str, text: str) -> str:
    """The YAML list a comma-separated string probably meant."""
    parts = [p.strip() for p in text.strip().strip("[]").split(",") if p.strip()]
    shown = ", ".join(parts) if parts else "..."
    return ("%s: %r is a string; give a YAML list [%s] (with -e, JSON: -e '{\"%s\": [%s]}')"
            % (name, text, shown, name, shown))


def _check_scalar(name: str, kind: str, value: Any) -> Optional[str]:
    if kind == "int" and not _is_int(value):
        return "%s: %r is %s, not an integer; %s" % (name, value, _kind(value), FIX)
    if kind == "float" and not _is_number(value):
        return "%s: %r is %s, not a number; %s" % (name, value, _kind(value), FIX)
    if kind == "bool" and not (isinstance(value, bool) or str(value).lower() in
                               {str(b).lower() for b in BOOLEANS}):
        return "%s: %r is not true or false; %s" % (name, value, FIX)
    if kind in ("str", "path", "raw") and isinstance(value, (Mapping, list, tuple)):
        return "%s: expected a single value, got %s; %s" % (name, _kind(value), FIX)
    return None


def check_type(spec: VariableSpec, value: Any) -> List[str]:
    """Messages for a value the role's tasks could not use as declared (None = unset, fine)."""
    name = spec.name
    if value is None:
        return []
    if spec.type == "list":
        if isinstance(value, str):
            return [_list_hint(name, value)]
        if not isinstance(value, (list, tuple)):
            return ["%s: expected a list, got %s (%r); %s" % (name, _kind(value), value, FIX)]
        out = []
        for i, item in enumerate(value):
            if spec.elements == "dict":
                if not isinstance(item, Mapping):
                    out.append("%s[%d]: expected a mapping, got %s (%r)"
                               % (name, i, _kind(item), item))
            elif spec.elements in ("int", "float") and (isinstance(item, str)
                                                        or not _is_number(item)):
                # Strings are rejected even when numeric: the role compares the items in Jinja.
                out.append("%s[%d]: %r is %s; give numbers, e.g. [1, 2, 5]"
                           % (name, i, item, _kind(item)))
            elif spec.elements == "int" and not _is_int(item):
                out.append("%s[%d]: %r is not an integer" % (name, i, item))
            elif spec.elements:
                msg = _check_scalar("%s[%d]" % (name, i), spec.elements, item)
                if msg:
                    out.append(msg)
        return out
    if spec.type == "dict":
        if not isinstance(value, Mapping):
            return ["%s: expected a mapping, got %s (%r); give a YAML mapping; %s"
                    % (name, _kind(value), value, FIX)]
        return []
    msg = _check_scalar(name, spec.type, value)
    if msg:
        return [msg]
    if spec.choices and value not in spec.choices:
        near = difflib.get_close_matches(str(value), [str(c) for c in spec.choices], n=1)
        return ["%s: %r is not one of %s%s" % (
            name, value, ", ".join(map(str, spec.choices)),
            "; did you mean %s?" % near[0] if near else "")]
    return []


def plain(value: Any) -> Any:
    """Tagged and lazy Ansible containers -> plain ones, for the validator and for JSON."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def validator_messages(spec_options: Mapping[str, Mapping], values: Mapping[str, Any]
                       ) -> List[Tuple[str, str]]:
    """(name, message) for what ansible-core's ArgumentSpecValidator (the role's built-in
    validation, with the same spec) rejects. `required` is left to the checks here: bench_run_id
    is set by bench.yml after the preflight."""
    spec = {}
    for name, opt in spec_options.items():
        opt = {k: v for k, v in opt.items()
               if k in ("type", "elements", "choices", "options", "no_log")}
        spec[name] = opt
    params = {k: plain(v) for k, v in values.items() if k in spec and v is not None}
    result = ArgumentSpecValidator(spec).validate(params)
    out = []
    for message in result.error_messages:
        named = [n for n in spec if re.search(r"\b%s\b" % re.escape(n), message)]
        out.append((named[0] if named else "bench_*", str(message)))
    return out


# ---------------------------------------------------------------------------------------------
# External endpoints


def _shown_url(parts) -> str:
    """The URL without what may be a secret (user:password@, ?query, #fragment)."""
    host = parts.hostname or ""
    if ":" in host:
        host = "[%s]" % host
    try:
        port = parts.port
    except ValueError:
        port = None
    return "%s://%s%s%s" % (parts.scheme, host, ":%d" % port if port else "", parts.path)


def base_url_problem(url: Any) -> Optional[str]:
    """Why `url` is not the root of an endpoint llm_bench can measure (None: it is). Only
    http(s)://host[:port][/path]: credentials belong in bench_api_key (a secret, never recorded),
    and the URL is recorded in the manifest and the report. Never echoes a credential."""
    example = "e.g. https://llm.example.com or http://10.0.0.5:8000/v1"
    if not isinstance(url, str) or not url.strip():
        return "empty; give the endpoint's root URL (%s)" % example
    if any(c.isspace() for c in url):
        return "%r has white space in it; give the endpoint's root URL (%s)" % (url.strip(), example)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return "not a URL (%s); give http(s)://host[:port][/path], %s" % (exc, example)
    if parts.username is not None or parts.password is not None:
        return ("%s carries credentials (user:password@ in the URL, not shown here): remove them "
                "and give the key in bench_api_key (sent as a bearer token, masked, never "
                "recorded)" % _shown_url(parts))
    if parts.query or parts.fragment:
        return ("%s has a query or fragment (not shown here): give the endpoint's root only (the "
                "API paths /v1/... are added to it); a key goes in bench_api_key"
                % _shown_url(parts))
    if parts.scheme not in ("http", "https"):
        return "%r: expected http:// or https:// (%s)" % (url, example)
    if not parts.hostname:
        return "%r names no host (%s)" % (url, example)
    if port is not None and not 1 <= port <= 65535:
        return "%r: port %d is not a TCP port (1-65535)" % (url, port)
    return None


# ---------------------------------------------------------------------------------------------
# One host


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


def _check_numbers(inp: HostInput, add) -> None:
    v = inp.values
    port = v.get("bench_server_port")
    if _is_int(port) and not 1 <= int(port) <= 65535:
        add("bench_server_port", "bench_server_port: %s is not a TCP port (1-65535); set the "
                                 "port the server listens on" % port)
    seconds = v.get("bench_level_seconds")
    timeout = v.get("bench_level_timeout", LEVEL_TIMEOUT)
    timeout = _number(timeout) if _is_number(timeout) else LEVEL_TIMEOUT
    if _is_number(seconds):
        if _number(seconds) <= 0:
            add("bench_level_seconds", "bench_level_seconds: %s must be > 0 (the seconds of each "
                                       "level's measurement window, e.g. 20)" % seconds)
        elif _number(seconds) >= timeout:
            add("bench_level_seconds", "bench_level_seconds: %s must be below llm_bench's "
                                       "level_timeout (%g s, bench_level_timeout), which bounds "
                                       "warmup + window + tail" % (seconds, timeout))
    ready = v.get("bench_external_ready_timeout")
    if _is_number(ready) and _number(ready) < 0:
        add("bench_external_ready_timeout", "bench_external_ready_timeout: %s must be >= 0 "
                                            "(seconds; 0 tries once)" % ready)
    for name, low, what in (("bench_server_ready_timeout", 0, "seconds"),
                            ("bench_max_tokens", 0, "tokens per request")):
        value = v.get(name)
        if _is_number(value) and _number(value) <= low:
            add(name, "%s: %s must be > %s (%s)" % (name, value, low, what))
    for name in ("bench_warmup_requests", "bench_reap_grace"):
        value = v.get(name)
        if _is_number(value) and _number(value) < 0:
            add(name, "%s: %s must be >= 0" % (name, value))
    repeats = v.get("bench_repeats")
    if _is_int(repeats):    # not an integer at all: the type check said so
        try:
            check_repeats(repeats, "bench_repeats")
        except RepeatsError as exc:
            add("bench_repeats", "%s; %s" % (exc, FIX))
    levels = v.get("bench_concurrency")
    if isinstance(levels, (list, tuple)):
        if not levels:
            add("bench_concurrency", "bench_concurrency: empty; give the levels to measure, "
                                     "e.g. [1, 2, 5, 10]")
        for i, level in enumerate(levels):
            if _is_int(level) and not isinstance(level, str) and int(level) < 1:
                add("bench_concurrency", "bench_concurrency[%d]: %s must be >= 1 (a level is a "
                                         "number of concurrent workers)" % (i, level))


def _check_slo(inp: HostInput, add) -> None:
    slo = inp.values.get("bench_slo")
    if not isinstance(slo, Mapping):
        return
    for key, value in slo.items():
        if key not in SLO_KEYS:
            near = difflib.get_close_matches(str(key), SLO_KEYS, n=1)
            add("bench_slo", "bench_slo.%s: unknown SLO%s (use %s)" % (
                key, "; did you mean %s?" % near[0] if near else "", ", ".join(SLO_KEYS)))
        elif value is None or value == "":
            continue
        elif not _is_number(value):
            add("bench_slo", "bench_slo.%s: %r is not a number of milliseconds" % (key, value))
        elif _number(value) <= 0:
            add("bench_slo", "bench_slo.%s: %s must be > 0 (milliseconds)" % (key, value))


def _check_misc(inp: HostInput, inventory_hosts: Sequence[str], add) -> None:
    v = inp.values
    client = v.get("bench_client")
    if isinstance(client, str) and client not in inventory_hosts and client != "localhost":
        add("bench_client", "bench_client: %r is not a host of the inventory; name one (default: "
                            "the first host of bench_clients, else localhost)" % client)
    for name in ("bench_target_host", "bench_server_bind", "bench_state_dir", "bench_model"):
        value = v.get(name)
        if isinstance(value, str) and not value.strip():
            add(name, "%s: empty; %s" % (name, FIX))
    for name in ("bench_reap_patterns", "bench_reap_protect"):
        patterns = v.get(name) if isinstance(v.get(name), list) else []
        for i, pattern in enumerate(patterns):
            try:
                re.compile(str(pattern))
            except re.error as exc:
                add(name, "%s[%d]: %r is not a regular expression (%s)" % (name, i, pattern, exc))
    run_id = v.get("bench_run_id")
    if "bench_run_id" in inp.given and isinstance(run_id, str) and (
            not run_id or "/" in run_id or run_id.startswith(".")):
        add("bench_run_id", "bench_run_id: %r must be a plain directory name (no '/', not "
                            "starting with '.')" % run_id)
    env = v.get("bench_server_env")
    if isinstance(env, Mapping):
        for key, value in env.items():
            if value is None:
                add("bench_server_env", "bench_server_env.%s has no value; give a string or "
                                        "remove it" % key)
    base_url = v.get("bench_base_url")
    if isinstance(base_url, str) and base_url.strip():
        why = base_url_problem(base_url)
        if why:
            add("bench_base_url", "bench_base_url: %s" % why)


def _check_workload(inp: HostInput, add, targets: Dict[str, TargetCheck]) -> Optional[dict]:
    workload = inp.values.get("bench_workload")
    if not isinstance(workload, Mapping):
        return None
    try:
        spec = check_spec(plain(workload))
    except WorkloadError as exc:
        text = str(exc)
        add("bench_workload", "bench_" + text if text.startswith("workload")
            else "bench_workload: " + text)
        return None
    if spec["kind"] == "jsonl":
        # The file is on the bench client: read and parsed there, by llm_bench's own loader.
        client = str(inp.values.get("bench_client") or "localhost")
        check = targets.setdefault(client, TargetCheck(client))
        for item in check.workloads:
            if item["workload"] == spec:
                item["hosts"].append(inp.host)
                break
        else:
            check.workloads.append({"variable": "bench_workload", "hosts": [inp.host],
                                    "where": _where(inp, "bench_workload"), "workload": spec})
    return spec


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
    port = int(port) if _is_int(port) and 1 <= int(port) <= 65535 else None
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
        _rank_ports(inp, name, profile.get("nodes"), port, state_dir, where, targets)
    return len(seen), first_model, (None if launches else external_url)


def _sweep_args(v: Mapping[str, Any]) -> Dict[str, Any]:
    """The SWEEP_OPTIONS the role passes, converted as llm_bench's argument spec converts them
    (a -e value is a string); an unset one (None, or a variable the host lacks) is left out."""
    convert = {"int": lambda x: int(float(x)) if _is_int(x) else int(x), "float": _number,
               "bool": lambda x: boolean(x, strict=True), "str": str}
    out: Dict[str, Any] = {}
    for kind, names in SWEEP_OPTIONS.items():
        for name in names:
            value = v.get("bench_" + name)
            if value is not None:
                out[name] = convert[kind](value)
    return out


def _check_sweep_options(inp: HostInput, workload: Optional[dict], model: Optional[str],
                         add, base_url: Optional[str] = None) -> None:
    """llm_bench's own check over the options the role passes (profile.yml's sweep task)."""
    v = inp.values
    try:
        # The role passes these (tasks/profile.yml's sweep); their types were checked above.
        args = dict(_sweep_args(v), **{
            "base_url": base_url or "http://%s:%s" % (v.get("bench_target_host"),
                                                      v.get("bench_server_port")),
            "model": model or str(v.get("bench_model") or ""),
            "host_label": inp.host, "profile": "preflight",
            "concurrency": [int(c) for c in v.get("bench_concurrency") or []],
            "workload": workload or {"kind": "builtin"},
            "slo": plain(v.get("bench_slo") or {}),
            "extra_body": plain(v.get("bench_extra_body") or {}),
        })
        rates = v.get("bench_request_rate")
        if rates is not None:
            args["request_rate"] = [_number(r) for r in rates]
        level_configs(args, read_workload=False)
    except (BenchOptionsError, ValueError, TypeError) as exc:
        text = str(exc)
        option = re.split(r"[.:\s]", text, maxsplit=1)[0]
        variable = OPTION_VARIABLES.get(option, "bench_*")
        add(variable.split("/")[0], "%s: llm_bench rejects its option %s; fix %s"
            % (variable, text, variable))


DERIVED_VARIABLES = ("bench_derived_profiles", "bench_derived_source", "bench_derived_baseline",
                     "bench_profiles", "bench_engine", "bench_server_port")


def check_host(inp: HostInput, spec: Mapping[str, VariableSpec],
               spec_options: Mapping[str, Mapping], inventory_hosts: Sequence[str],
               targets: Dict[str, TargetCheck]) -> Tuple[List[Problem], int]:
    problems: List[Problem] = []
    flagged = set()

    def add(name, message, where=None):
        flagged.add(name)
        problems.append(Problem(name, message, _where(inp, name) if where is None else where,
                                (inp.host,)))

    for name, error in sorted(inp.errors.items()):
        add(name, "%s: cannot be evaluated (%s); %s" % (name, error, FIX))
    for name, opt in spec.items():
        if name in inp.errors:
            continue
        for message in check_type(opt, inp.values.get(name)):
            add(name, message)
    for name, message in validator_messages(spec_options, {
            k: val for k, val in inp.values.items() if k not in flagged and k not in inp.errors}):
        if name not in flagged:
            add(name, "%s: %s; %s" % (name, message, FIX))
    _check_numbers(inp, add)
    _check_slo(inp, add)
    _check_misc(inp, inventory_hosts, add)
    for name, message in client_problems(inp.host, inp.values, inp.client_is_local):
        if name not in flagged:
            add(name, message)
    workload = _check_workload(inp, add, targets) if "bench_workload" not in flagged else None
    count, model, external_url = (0, None, None)
    if "bench_profiles" not in flagged and "bench_engine" not in inp.errors:
        count, model, external_url = _check_profiles(inp, spec, add, targets)
    if not flagged.intersection(DERIVED_VARIABLES):
        check_derived(inp.values, add)
    if count and external_url is None and not flagged.intersection(
            ("bench_server_port", "bench_derived_profiles", "bench_state_dir")):
        _check_ports(inp, targets)
    # Only its own two variables: a missing HAProxy is reported beside a broken profile list.
    if not flagged.intersection(("bench_derived_profiles", "bench_haproxy_binary")):
        programs = derived_executables(inp.values)
        if programs:
            targets.setdefault(inp.host, TargetCheck(inp.host)).executables.extend(
                dict(item, hosts=[inp.host], where=inp.origins.get(item["variable"], ""))
                for item in programs)
    if not flagged.intersection(SWEEP_VARIABLES) and not set(SWEEP_VARIABLES) & set(inp.errors):
        _check_sweep_options(inp, workload, model, add, external_url)
    return problems, count


def _rank_ports(inp: HostInput, name: str, nodes: Any, port: Optional[int], state_dir: str,
                where: str, targets: Dict[str, TargetCheck]) -> None:
    """A multi-node profile's other ranks bind this host's bench_server_port on their own hosts
    (roles/bench/tasks/multinode_start.yml): checked free there, as this host's is here."""
    if not isinstance(nodes, Mapping) or port is None:
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
    if not _is_int(v.get("bench_server_port")):
        return
    needed = [{"port": int(v["bench_server_port"]), "needed_for": "the server"}]
    needed += router_ports(v)
    targets.setdefault(inp.host, TargetCheck(inp.host)).ports.extend(
        dict(item, variable="bench_server_port", hosts=[inp.host],
             where=inp.origins.get("bench_server_port", ""),
             state_dir=str(v.get("bench_state_dir") or "~/.servelab/servers"))
        for item in needed)


def _merge(problems: Iterable[Problem]) -> List[Problem]:
    """The same problem on several hosts (a group_vars value) is reported once, with its hosts."""
    merged: Dict[Tuple[str, str, str], List[str]] = {}
    order: List[Tuple[str, str, str]] = []
    for p in problems:
        key = (p.variable, p.message, p.where)
        if key not in merged:
            merged[key] = []
            order.append(key)
        merged[key] += [h for h in p.hosts if h not in merged[key]]
    return [Problem(k[0], k[1], k[2], tuple(merged[k])) for k in order]


def run_preflight(inputs: Sequence[HostInput], spec_options: Mapping[str, Mapping],
                  inventory_hosts: Sequence[str], controller: Optional[HostInput] = None,
                  group: str = "gpu_servers") -> Preflight:
    """Check every host; `controller` is the play's own host, whose bench_* names (play 3 reads
    bench_report_baseline there) are held to the same unknown-variable rule."""
    spec = role_spec({"argument_specs": {"main": {"options": spec_options}}})
    known = known_names(spec)
    problems: List[Problem] = []
    targets: Dict[str, TargetCheck] = {}
    if not inputs:
        problems.append(Problem(group, "%s: the inventory has no host in group %s; nothing to "
                                       "benchmark (add your GPU servers to it, see "
                                       "inventory/sample)" % (group, group)))
    profiles = 0
    names = set()
    for inp in inputs:
        for p in unknown_variables(inp.given, known, inp.origins):
            problems.append(Problem(p.variable, p.message, p.where, (inp.host,)))
        found, count = check_host(inp, spec, spec_options, inventory_hosts, targets)
        problems += found
        profiles += count
        listed = inp.values.get("bench_profiles")
        for raw in listed if isinstance(listed, list) else []:
            if isinstance(raw, Mapping) and raw.get("name"):
                names.add(str(raw["name"]))
    if controller is not None:
        for p in unknown_variables(controller.given, known, controller.origins):
            problems.append(Problem(p.variable, p.message, p.where, (controller.host,)))
        baseline = (controller.values or {}).get("bench_report_baseline")
        if baseline is not None and names and str(baseline) not in names:
            near = difflib.get_close_matches(str(baseline), sorted(names), n=1)
            problems.append(Problem(
                "bench_report_baseline", "bench_report_baseline: %r is not the name of any "
                "profile (%s)%s" % (baseline, ", ".join(sorted(names)),
                                    "; did you mean %s?" % near[0] if near else ""),
                controller.origins.get("bench_report_baseline", ""), (controller.host,)))
    if controller is not None:
        problems += _check_compare_to(controller)
    return Preflight(_merge(problems), list(targets.values()),
                     tuple(i.host for i in inputs), profiles)


def compare_to_dir(value: str, results_root: str) -> str:
    """bench_compare_to as a directory: a path when it has a '/', else a run id under the
    results root (playbooks/bench.yml resolves it the same way)."""
    return value if "/" in value else os.path.join(results_root or "", value)


def _check_compare_to(controller: HostInput) -> List[Problem]:
    values = controller.values or {}
    value = values.get("bench_compare_to")
    if value in (None, ""):
        return []
    origin = controller.origins.get("bench_compare_to", "")
    if not isinstance(value, str):
        return [Problem("bench_compare_to", "bench_compare_to: %r is not a run id or a path"
                        % (value,), origin, (controller.host,))]
    root = str(values.get("bench_results_root") or "")
    where = compare_to_dir(value, root)
    if os.path.isdir(os.path.join(where, PARTS_DIR)) or os.path.isfile(os.path.join(where, LEVELS)):
        return []
    return [Problem("bench_compare_to", "bench_compare_to: no earlier run at %s (it has neither "
                    "%s/ nor %s); give a run id under %s or the path of a run directory"
                    % (where, PARTS_DIR, LEVELS, root or "bench_results_root"),
                    origin, (controller.host,))]


def failure_lines(problems: Sequence[Problem], where: str = "") -> List[str]:
    head = ("bench preflight%s: %d problem(s); nothing was started, no run directory was made, "
            "results/latest was not moved:" % (" on " + where if where else "", len(problems)))
    return [head] + ["- " + p.text() for p in problems]
