"""bench.yml's preflight over the fleet: every GPU server (host.py), the controller's own bench_*
names, the report's baseline and comparison run; problems merged across hosts, each once."""
from __future__ import annotations

import difflib
import os
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVELS, PARTS_DIR
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.host import check_host
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.model import (
    HostInput, Preflight, Problem, TargetCheck,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import (
    known_names, role_spec,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.typecheck import unknown_variables


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
