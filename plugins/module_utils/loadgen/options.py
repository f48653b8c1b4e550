"""llm_bench's options, defined once: the argument spec the module and the action plugin both
validate with (the action as ansible-core's own action plugins do, through
`validate_argument_spec`), and whose defaults are LevelConfig's own field defaults.

So `level_seconds: 0` is an error naming the option (LevelConfig.validate), never a silent 30;
`concurrency: "1,2,5"` is the list [1, 2, 5] (Ansible's list conversion), and a typo'd option is
"Unsupported parameters" on the controller before any level runs.
"""
from __future__ import annotations

from dataclasses import MISSING, fields

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import APIS, RX_MODES
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import (
    ARRIVALS, LOAD_MODES, LevelConfig,
)

_LEVEL_DEFAULTS = {f.name: f.default for f in fields(LevelConfig) if f.default is not MISSING}


def _default(name: str):
    return _LEVEL_DEFAULTS[name]


# The module's argument spec (plugins/modules/llm_bench.py documents it; validate-modules checks
# the documentation against it). Defaults not taken from LevelConfig are the module's own.
ARGUMENT_SPEC = dict(
    base_url=dict(type="str", required=True),
    model=dict(type="str", default=_default("model")),
    api=dict(type="str", default=_default("api"), choices=list(APIS)),
    api_key=dict(type="str", no_log=True),
    host_label=dict(type="str", default=_default("host_label")),
    profile=dict(type="str", default=_default("profile")),
    repeat=dict(type="int", default=_default("repeat")),
    concurrency=dict(type="list", elements="int", required=True),
    load_mode=dict(type="str", default=_default("load_mode"), choices=list(LOAD_MODES)),
    request_rate=dict(type="list", elements="float"),
    arrival=dict(type="str", default=_default("arrival"), choices=list(ARRIVALS)),
    burstiness=dict(type="float", default=_default("burstiness")),
    workload=dict(type="dict", default={"kind": "builtin"}),
    # no_log=False: a name ending in "tokens" looks secret to Ansible's heuristics; it is a count.
    max_tokens=dict(type="int", default=_default("max_tokens"), no_log=False),
    # Unset (None): each prompt decides (synthetic prompts ask); false: no request carries it.
    ignore_eos=dict(type="bool"),
    extra_body=dict(type="dict", default={}),
    level_seconds=dict(type="float", default=_default("level_seconds")),
    warmup_requests=dict(type="int", default=_default("warmup_requests")),
    min_window_requests=dict(type="int"),
    min_latency_samples=dict(type="int", default=_default("min_latency_samples")),
    max_requests=dict(type="int"),
    level_timeout=dict(type="float", default=_default("level_timeout")),
    stall_timeout=dict(type="float", default=_default("stall_timeout")),
    slo=dict(type="dict", default={}),
    ci_batches=dict(type="int", default=_default("ci_batches")),
    # Ranges checked by LevelConfig.validate (strictly between 0 and 100, each once).
    percentiles=dict(type="list", elements="float"),
    target_ci_pct=dict(type="float"),
    processes=dict(type="int", default=_default("processes")),
    drain_timeout=dict(type="float", default=_default("drain_timeout")),
    drain_after=dict(type="bool", default=False),
    ramp_seconds=dict(type="float", default=_default("ramp_seconds")),
    socket_rcvbuf=dict(type="int", default=_default("socket_rcvbuf")),
    seed=dict(type="int", default=_default("seed")),
    per_chunk_usage=dict(type="bool", default=_default("per_chunk_usage")),
    rx_timestamps=dict(type="str", default=_default("rx_timestamps"), choices=list(RX_MODES)),
    server_metrics=dict(type="bool", default=_default("server_metrics")),
    results_dir=dict(type="path"),
    return_requests=dict(type="bool", default=True),
    progress_file=dict(type="path"),
)

# The action plugin's own options (the module never sees them), on top of the module's.
ACTION_ONLY_SPEC = dict(
    run_id=dict(type="str"),
    results_root=dict(type="path"),
    stop_on_failure=dict(type="bool", default=True),
    # Where this sweep stands in the run, for the progress line and its ETA (the bench role sets
    # them: profile 2 of 3); without them the line counts this sweep's levels only.
    profile_index=dict(type="int"),
    profile_count=dict(type="int"),
    # How many times each level is measured (the action's loop; each call measures one repeat,
    # passed to the module as `repeat`).
    repeats=dict(type="int", default=1),
    # Instead of the listed levels: the highest load that meets an SLO, each level chosen from
    # the last (plugin_utils/tune/capacity.py: bisection, short levels first, pruning).
    capacity_search=dict(type="dict"),
)
ACTION_ARGUMENT_SPEC = dict(ARGUMENT_SPEC, **ACTION_ONLY_SPEC)
ACTION_ONLY_OPTIONS = tuple(ACTION_ONLY_SPEC)

# Module options that do not become LevelConfig fields.
_NOT_LEVEL_FIELDS = ("workload", "results_dir", "return_requests", "concurrency", "request_rate",
                     "drain_after")


def with_defaults(params: dict) -> dict:
    """The options with every unset (missing or null) one at its spec default: what
    AnsibleModule would hand the module. Used by level_configs so that Python callers (tests,
    benchmarks) and Ansible get the same values."""
    out = dict(params)
    for name, spec in ARGUMENT_SPEC.items():
        if out.get(name) is None and "default" in spec:
            default = spec["default"]
            out[name] = dict(default) if isinstance(default, dict) else default
    return out


def level_fields(params: dict) -> dict:
    """The LevelConfig keyword arguments the options give (all of them but the per-level ones)."""
    names = {f.name for f in fields(LevelConfig)}
    return {k: v for k, v in params.items()
            if k in names and k not in _NOT_LEVEL_FIELDS and k in ARGUMENT_SPEC}
