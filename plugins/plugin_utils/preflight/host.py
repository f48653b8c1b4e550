"""bench.yml's preflight of one GPU server: every bench_* setting as the bench role will see it.

In order: templating errors, the declared types (typecheck.py, from roles/bench/meta/
argument_specs.yml), ansible-core's own validation of the role's spec, the ranges of the variables
llm_bench never sees (port 1-65535, timeouts, regexes that compile, SLOs > 0), the fleet
(fleet.py), the workload's shape, the profiles (profiles.py), the derived profiles (derived.py),
and last llm_bench's own option check (loadgen/config.level_configs, whose LevelConfig.validate is
the one range check of the sweep options) over the very options the role will pass
(options.llm_bench_args), so the sweep cannot reject later what passed here.
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    BenchOptionsError,
    level_configs,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import (
    ACTION_ONLY_OPTIONS, ARGUMENT_SPEC as LLM_BENCH_MODULE_SPEC,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import (
    WorkloadError,
    check_spec,
    reads_client_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.derived import (
    check_derived,
    derived_executables,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.fleet import client_problems
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.model import (
    FIX, HostInput, Problem, TargetCheck,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import (
    RUN_IDENTITY, LLM_BENCH_SPEC, VariableSpec, bench_spec, llm_bench_args,
    llm_bench_variables,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.profiles import (
    _check_ports, _check_profiles, _where,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.typecheck import (
    check_type, is_int, is_number, plain, to_number, validator_messages,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.urls import base_url_problem
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.search_plan import (
    SearchPlan, SearchPlanError,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.sweep_plan import (
    RepeatsError,
    check_repeats,
)

SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
# Where the sweep's base_url comes from when the host launches its server.
LAUNCHED_BASE_URL = "bench_target_host/bench_server_port"


def sweep_variables() -> Tuple[str, ...]:
    """The variables the sweep check reads (the llm_bench module options the role fills, and
    what the launched server's base_url is made of): one already found wrong skips it, so that
    it is not reported twice."""
    names = [var for option, var in llm_bench_variables().items()
             if option in LLM_BENCH_MODULE_SPEC and var not in RUN_IDENTITY]
    return tuple(names) + tuple(LAUNCHED_BASE_URL.split("/"))


def _check_numbers(inp: HostInput, add) -> None:
    """The ranges of the variables llm_bench never sees; the sweep options' are LevelConfig's
    (_check_sweep_options), and bench_repeats' the action's own rule (sweep_plan)."""
    v = inp.values
    port = v.get("bench_server_port")
    if is_int(port) and not 1 <= int(port) <= 65535:
        add("bench_server_port", "bench_server_port: %s is not a TCP port (1-65535); set the "
                                 "port the server listens on" % port)
    ready = v.get("bench_external_ready_timeout")
    if is_number(ready) and to_number(ready) < 0:
        add("bench_external_ready_timeout", "bench_external_ready_timeout: %s must be >= 0 "
                                            "(seconds; 0 tries once)" % ready)
    value = v.get("bench_server_ready_timeout")
    if is_number(value) and to_number(value) <= 0:
        add("bench_server_ready_timeout", "bench_server_ready_timeout: %s must be > 0 (seconds)"
            % value)
    value = v.get("bench_reap_grace")
    if is_number(value) and to_number(value) < 0:
        add("bench_reap_grace", "bench_reap_grace: %s must be >= 0" % value)
    repeats = v.get("bench_repeats")
    if is_int(repeats):    # not an integer at all: the type check said so
        try:
            check_repeats(repeats, "bench_repeats")
        except RepeatsError as exc:
            add("bench_repeats", "%s; %s" % (exc, FIX))


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
        elif not is_number(value):
            add("bench_slo", "bench_slo.%s: %r is not a number of milliseconds" % (key, value))
        elif to_number(value) <= 0:
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
    if reads_client_files(spec):
        # A data file (jsonl, sharegpt, hf, multi_turn, trace) or a tokenizer is on the bench
        # client: read and parsed there, by llm_bench's own loader, before anything starts.
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


def _convert(option: str, value: Any) -> Any:
    """`value` as llm_bench's argument spec converts it (a -e value is a string)."""
    spec = LLM_BENCH_SPEC[option]
    kind, elements = spec.get("type", "str"), spec.get("elements")
    scalar = {"int": lambda x: int(float(x)) if is_int(x) else int(x), "float": to_number,
              "bool": lambda x: boolean(x, strict=True), "str": str, "path": str}
    if kind == "list":
        return [scalar.get(elements, plain)(item) for item in value]
    return scalar.get(kind, plain)(value)


def _sweep_args(v: Mapping[str, Any]) -> Dict[str, Any]:
    """The options the role passes to llm_bench (options.llm_bench_args: the lookup
    servelab.serving.llm_bench_args), converted as llm_bench converts them; the action's own
    options (run_id, repeats, ...) are not LevelConfig's and are left to their own checks."""
    return {option: _convert(option, value) for option, value in llm_bench_args(v).items()
            if option not in ACTION_ONLY_OPTIONS}


def _check_sweep_options(inp: HostInput, workload: Optional[dict], model: Optional[str],
                         add, base_url: Optional[str] = None,
                         flagged: Sequence[str] = ()) -> None:
    """llm_bench's own check (level_configs: LevelConfig.validate, its one range check) over the
    options the role passes. It stops at the first bad option: that one is reported, set to its
    declared default, and the check runs again, so every bad option is named at once. A
    variable already found wrong (`flagged`: its type, a templating error) starts at its default
    and is not reported twice."""
    spec = bench_spec()
    variables = dict(llm_bench_variables(spec),
                     base_url="bench_base_url" if base_url else LAUNCHED_BASE_URL)
    values = dict(inp.values)
    replaced = set()
    for name in set(flagged) | set(inp.errors):
        if name in spec and name in sweep_variables():
            values[name] = spec[name].default
            replaced.add(name)
    for _attempt in range(len(variables) + 1):
        try:
            # Per call the role passes the URL and the model of the server it measures, and labels.
            args = dict(_sweep_args(values), **{
                "base_url": base_url or "http://%s:%s" % (values.get("bench_target_host"),
                                                          values.get("bench_server_port")),
                "model": model or str(values.get("bench_model") or ""),
                "host_label": inp.host, "profile": "preflight",
                "workload": workload or {"kind": "builtin"},
            })
            level_configs(args, read_workload=False)
            return
        except (BenchOptionsError, ValueError, TypeError) as exc:
            text = str(exc)
        option = re.split(r"[.:\s]", text, maxsplit=1)[0]
        variable = variables.get(option, "bench_*")
        name = variable.split("/")[0]
        if name in replaced or name not in spec:
            if name not in replaced:
                add(name, "%s: llm_bench rejects its option %s; fix %s" % (variable, text, variable))
            return
        add(name, "%s: llm_bench rejects its option %s (given %r); fix %s"
            % (variable, text, inp.values.get(name), variable))
        values[name] = spec[name].default
        replaced.add(name)


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
    # After the profiles: the model the first one serves is llm_bench's `model`.
    _check_sweep_options(inp, workload, model, add, external_url, tuple(flagged))
    if not flagged.intersection(("bench_capacity_search", "bench_concurrency", "bench_repeats")):
        _check_capacity_search(inp, workload, add)
    return problems, count


def _check_capacity_search(inp: HostInput, workload: Optional[dict], add) -> None:
    """bench_capacity_search by llm_bench's own rules (tune/search_plan.py: the spec, its
    concurrency cap, no repeats) and the first level's options (level_configs)."""
    raw = inp.values.get("bench_capacity_search")
    if raw is None:
        return
    try:
        plan = SearchPlan.build(raw, _sweep_args(inp.values), inp.values.get("bench_repeats", 1))
        level_configs(dict(plan.module_args, base_url="http://127.0.0.1:1", model="preflight",
                           workload=workload or {"kind": "builtin"}), read_workload=False)
    except (SearchPlanError, BenchOptionsError, ValueError, TypeError) as exc:
        add("bench_capacity_search", "bench_capacity_search: %s; %s" % (exc, FIX))
