"""The order of a sweep's measurements for llm_bench's action: the fixed levels (sweep_plan.py,
in rounds), or a capacity search whose next level depends on the last (capacity.py).

Both are iterables of sweep_plan.Measurement that the action runs one module call each; the
action tells the plan each measurement's rows (`record`, for a kept level of a resumed run too),
and a search decides its next load from them. A search's level options carry their own window
(`level_seconds`: short or full) and the load (`request_rate` or `concurrency`).
Controller only, standard library only.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterator, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    BenchOptionsError, level_configs,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    CAPACITY_DIR, atomic_write_text,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.sweep_plan import Measurement
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.capacity import (
    FAILED, Outcome, Search, SearchError, SearchSpec, Step,
)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class SearchPlanError(ValueError):
    """capacity_search and the sweep's options do not go together; the message says why."""


class FixedPlan:
    """The listed levels, each `repeats` times (sweep_plan.sweep_order)."""

    def __init__(self, measurements: List[Measurement]) -> None:
        self.measurements = measurements

    def __iter__(self) -> Iterator[Measurement]:
        return iter(self.measurements)

    @property
    def count(self) -> int:
        return len(self.measurements)

    @staticmethod
    def level_count(configs: int) -> int:
        return configs

    def drains_after(self, step: Measurement) -> bool:
        return step.position < len(self.measurements) - 1

    def record(self, step, rows) -> None:
        """Nothing to decide: the levels are fixed."""

    @staticmethod
    def why(_step) -> str:
        return ""

    @staticmethod
    def outcome(_failure: str = "") -> Optional[dict]:
        return None


def outcome_path(run_dir: str, host: str, profile: str) -> str:
    return os.path.join(run_dir, CAPACITY_DIR, "%s__%s.json" % (_UNSAFE.sub("_", str(host)),
                                                                _UNSAFE.sub("_", str(profile))))


def read_outcome(run_dir: str, host: str, profile: str) -> Optional[dict]:
    """A capacity search's written outcome, or None."""
    try:
        with open(outcome_path(run_dir, host, profile), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class SearchPlan:
    """A capacity search as a sweep plan (module docstring)."""

    def __init__(self, spec: SearchSpec, module_args: dict) -> None:
        self.spec = spec
        self.module_args = module_args
        self.search = Search(spec)
        self._steps: dict = {}     # position -> capacity.Step

    @classmethod
    def build(cls, raw, module_args: dict, repeats) -> SearchPlan:
        """The plan, and the sweep options it measures with: the load mode of its axis, the
        objective's SLO (goodput is counted under it)."""
        try:
            spec = SearchSpec.parse(raw)
        except SearchError as exc:
            raise SearchPlanError(str(exc)) from None
        if repeats not in (None, 1):
            raise SearchPlanError("capacity_search measures each load once; repeats (%r) "
                                  "applies to the listed levels only: drop one" % (repeats,))
        args = dict(module_args)
        args["slo"] = dict(spec.objective.slo)
        if spec.axis == "rate":
            caps = args.get("concurrency") or []
            if len(caps) != 1:
                raise SearchPlanError("capacity_search over the request rate needs concurrency "
                                      "to be one value, the cap on requests in flight (got %r)"
                                      % (caps,))
            args.update(load_mode="rate", request_rate=[spec.start])
        else:
            args.update(load_mode="concurrency", concurrency=[int(spec.start)])
            args.pop("request_rate", None)
        return cls(spec, args)

    def __iter__(self) -> Iterator[Measurement]:
        position = 0
        while True:
            nxt = self.search.next_step()
            if isinstance(nxt, Outcome):
                return
            self._steps[position] = nxt
            yield self._measurement(position, nxt)
            if len(self.search.levels) <= position:
                # The action recorded nothing for it (the module failed before a row).
                return
            position += 1

    def _measurement(self, position: int, step: Step) -> Measurement:
        options = dict(step.level(self.spec.axis), level_seconds=step.seconds)
        try:
            cfg = level_configs(dict(self.module_args, **options), read_workload=False)[0][0]
        except BenchOptionsError as exc:
            raise SearchPlanError("capacity_search: level %s: %s" % (
                self.search.label(step.x), exc)) from None
        label = ("C=%d" % int(step.x)) if self.spec.axis == "concurrency" else (
            "rate=%g/s" % step.x)
        return Measurement(position=position, level_index=position, repeat=1, repeats=1,
                           cfg=cfg, step=options, label=label)

    @property
    def count(self) -> int:
        return self.spec.max_levels

    def level_count(self, _configs: int) -> int:
        return self.spec.max_levels

    @staticmethod
    def drains_after(_step) -> bool:
        return True

    def why(self, measurement: Measurement) -> str:
        step = self._steps.get(measurement.position)
        if step is None:
            return ""
        return "capacity search, %s level (%gs): %s" % (step.phase, step.seconds, step.why)

    def record(self, measurement: Measurement, rows) -> None:
        step = self._steps.get(measurement.position)
        if step is None or not rows:
            return
        self.search.add(step.x, step.phase, rows[-1])

    def outcome(self, failure: str = "") -> dict:
        nxt = self.search.next_step()
        if isinstance(nxt, Outcome):
            out = nxt
        else:
            out = self.search.finish(FAILED, failure or "the sweep stopped before the search "
                                                        "ended")
        data = out.as_dict()
        data["axis"] = self.spec.axis
        data["spec"] = self.spec.as_dict()
        data["levels_measured"] = [
            {"x": m.x, "phase": m.phase, "passed": m.judgement.passed,
             "score": m.judgement.score, "throughput": m.judgement.throughput,
             "reason": m.judgement.reason} for m in self.search.levels]
        return data

    @staticmethod
    def write_outcome(run_dir: str, host: str, profile: str, outcome: dict) -> str:
        path = outcome_path(run_dir, host, profile)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        atomic_write_text(path, json.dumps(outcome, indent=1, sort_keys=True, default=str)
                          + "\n")
        return path
