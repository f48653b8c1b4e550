"""llm_bench options -> validated level configurations, and the sweep over them.

Shared by the module (which runs levels on the bench client) and the action plugin (which checks
the options on the controller before the first level, and applies the same stop rule). Between
levels the sweep waits for an idle server (drain.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.caller import caller_gone
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.drain import (
    NOT_DRAINED, Drainer, drain_plan,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig, LoadgenError
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import row_dict
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    level_verdict, open_loop_flag,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import (
    ACTION_ONLY_OPTIONS, level_fields, with_defaults,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen import level as _level
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import (
    Workload, WorkloadError, check_spec, load, missing_level_hook, with_ignore_eos,
)

__all__ = ["ACTION_ONLY_OPTIONS", "BenchOptionsError", "level_configs", "run_levels"]


class BenchOptionsError(ValueError):
    """A bad option: the message names it and says how to fix it."""


def _levels(params: dict) -> List[Tuple[int, Optional[float]]]:
    """(concurrency, request_rate) per level, in the order given."""
    conc = params.get("concurrency")
    if not conc or not isinstance(conc, (list, tuple)):
        raise BenchOptionsError("concurrency: give a non-empty list of positive integers, e.g. "
                                "[1, 2, 5, 10]")
    for value in conc:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BenchOptionsError("concurrency: %r is not a positive integer (levels must be "
                                    "numbers of workers >= 1)" % (value,))
    if params.get("load_mode", "concurrency") == "rate":
        rates = params.get("request_rate") or []
        if not rates:
            raise BenchOptionsError("request_rate: load_mode rate needs a list of request rates "
                                    "per second, e.g. [1, 2, 4]")
        for rate in rates:
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
                raise BenchOptionsError("request_rate: %r is not a positive number of requests "
                                        "per second" % (rate,))
        if len(conc) != 1:
            raise BenchOptionsError("concurrency: with load_mode rate give one value, the cap on "
                                    "requests in flight (got %r)" % (conc,))
        return [(conc[0], float(rate)) for rate in rates]
    if params.get("request_rate"):
        raise BenchOptionsError("request_rate: only used with load_mode rate (set load_mode: "
                                "rate, or drop request_rate)")
    return [(c, None) for c in conc]


def level_configs(params: dict, read_workload: bool = True
                  ) -> Tuple[List[LevelConfig], Optional[Workload]]:
    """Validate every option and build one LevelConfig per level, before any load is sent.

    `params` are llm_bench's options (options.ARGUMENT_SPEC); unset ones take the spec's
    defaults, and nothing else is defaulted here. With `read_workload` false (the controller's
    check), the workload option's shape is checked but no file is read: a jsonl workload lives on
    the bench client, where the module reads and checks it before its first request."""
    params = with_defaults(params)
    try:
        spec = check_spec(params["workload"])
        workload = load(params["workload"]) if read_workload else None
        if workload is not None:
            workload = with_ignore_eos(workload, params.get("ignore_eos"))
    except WorkloadError as exc:
        raise BenchOptionsError(str(exc)) from None
    unkept = missing_level_hook(spec, getattr(_level, "WORKLOAD_HOOKS", ()))
    if unkept:
        raise BenchOptionsError(unkept)
    slo = dict(params["slo"])
    for key, value in slo.items():
        if key not in ("ttft_ms", "tpot_ms", "e2e_ms"):
            raise BenchOptionsError("slo.%s: unknown SLO; use ttft_ms, tpot_ms, e2e_ms" % key)
        try:
            slo[key] = None if value in (None, "") else float(value)
        except (TypeError, ValueError):
            raise BenchOptionsError("slo.%s: expected milliseconds, got %r" % (key, value)) from None
    # ignore_eos unset: the prompts decide (with_ignore_eos); the level adds it only when true.
    common = dict(level_fields(params), slo=slo, extra_body=dict(params["extra_body"]),
                  ignore_eos=params.get("ignore_eos") is True)
    configs = []
    for concurrency, rate in _levels(params):
        cfg = LevelConfig(**dict(common, concurrency=concurrency, request_rate=rate))
        try:
            cfg.validate()
        except (LoadgenError, TypeError, ValueError) as exc:
            raise BenchOptionsError(str(exc)) from None
        configs.append(cfg)
    return configs, workload


@dataclass
class SweepOutcome:
    levels: List[dict] = field(default_factory=list)
    requests_by_level: List[List[dict]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    failure: Optional[str] = None
    # the caller went away (loadgen/caller.py): the last level was cut short, nobody reads it
    orphaned: bool = False

    @property
    def requests(self) -> List[dict]:
        return [r for level in self.requests_by_level for r in level]


def _label(cfg) -> str:
    if getattr(cfg, "load_mode", "concurrency") == "rate":
        return "rate=%g/s" % cfg.request_rate
    return "C=%d" % cfg.concurrency


def run_levels(configs: List[LevelConfig], workload: Workload, drain_last: bool = False,
               drainer: Optional[Drainer] = None) -> SweepOutcome:
    """Run the levels in order; stop after a level that shows the server is not serving.

    After each level but the last (the last too with `drain_last`: another call runs the next
    one) the sweep waits, bounded by drain_timeout, until the server is idle again, and records
    the wait on that level's row (drain_s, drain_basis; drain.py says how idle is told). The
    drainer's preparation (finding the server's gauge, or the idle TTFT) runs before the first
    level, only when some level is to be drained."""
    outcome = SweepOutcome()
    timeout = float(getattr(configs[0], "drain_timeout", 0) or 0) if configs else 0.0
    plan = drain_plan(len(configs), timeout, drain_last)
    if any(plan) and drainer is None:
        drainer = Drainer(configs[0])
    if any(plan):
        drainer.prepare()
    for cfg, drain_after in zip(configs, plan):
        try:
            result = run_level(cfg, workload)
        except LoadgenError as exc:
            raise BenchOptionsError(str(exc)) from None
        # The rule the report applies too: a level it will mark failed ends the sweep.
        verdict = level_verdict(asdict(result.row))
        drained = NOT_DRAINED
        # Nobody reads the result any more (ansible-playbook is gone): no drain, no next level.
        orphaned = caller_gone()
        if drain_after and not verdict.failed and not orphaned:
            drained = drainer.drain(_label(cfg))
        result.row.drain_s, result.row.drain_basis = drained.seconds, drained.basis
        result.row.prompt_token_source = getattr(workload, "token_source", "")
        row = row_dict(result.row)
        outcome.levels.append(row)
        outcome.requests_by_level.append(result.requests)
        outcome.warnings.extend(result.warnings)
        # An open-loop level that fell short says why (the cap, or a late client), beside the
        # send lateness the level reports.
        behind = open_loop_flag(row)
        if behind:
            outcome.warnings.append("%s: %s" % (_label(cfg), behind))
        if drained.warning:
            outcome.warnings.append(drained.warning)
        if verdict.failed:
            outcome.failure = "C=%d: %s" % (cfg.concurrency, verdict.reason)
            break
        if orphaned:
            outcome.orphaned = True
            break
    return outcome
