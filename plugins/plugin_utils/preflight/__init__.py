"""bench.yml's preflight: every bench_* setting of every GPU server, checked on the controller
before any server starts, any run directory is made or results/latest moves.

The values checked are the ones the bench role will see: the host's variables (inventory,
group_vars, -e) over the role's defaults (roles/bench/defaults/main.yml), templated in the host's
context (the action plugin, plugins/action/bench_preflight.py, gathers them and runs the target
checks through module_utils/preflight.py, on the machines that hold what is checked). The rules,
module by module:

- options.py: the one definition of the bench options (roles/bench/meta/argument_specs.yml);
  every bench_* variable a host (or the controller) has must be declared there, anything else
  is a typo, reported with the nearest known name;
- typecheck.py: the declared types, strictly (a list given as a string is an error), and
  ansible-core's own validation of the role's spec;
- host.py: one host - ranges of what llm_bench never sees, the workload's shape, then
  llm_bench's own option check (loadgen/config.level_configs: LevelConfig.validate) over the
  options the role will pass;
- profiles.py, urls.py: the profiles and external endpoints; derived.py: bench_derived_profiles;
  fleet.py: where the load comes from (a bench client on another machine);
- run.py: the fleet, the controller's names, the report's baseline and comparison run.

All problems are collected (not just the first) and deduplicated across hosts; each message
names the variable and the fix. Pure: nothing here touches a host.
"""
from __future__ import annotations

from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.model import (
    EXTERNAL, FIX, HostInput, Preflight, Problem, TargetCheck,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import (
    PLAYBOOK_SET, ROLE_DEFAULTS_FILE, ROLE_DIR, ROLE_SPEC_FILE, VariableSpec, known_names,
    llm_bench_args, llm_bench_variables, role_spec,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.profiles import (
    EXTERNAL_PROFILE_KEYS, PROFILE_ROLE_KEYS,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.run import (
    compare_to_dir, failure_lines, run_preflight,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.typecheck import (
    check_type, plain, unknown_variables, validator_messages,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.urls import base_url_problem

__all__ = [
    "EXTERNAL", "EXTERNAL_PROFILE_KEYS", "FIX", "PLAYBOOK_SET", "PROFILE_ROLE_KEYS",
    "ROLE_DEFAULTS_FILE", "ROLE_DIR", "ROLE_SPEC_FILE", "HostInput", "Preflight", "Problem",
    "TargetCheck", "VariableSpec", "base_url_problem", "check_type", "compare_to_dir",
    "failure_lines", "known_names", "llm_bench_args", "llm_bench_variables", "plain",
    "role_spec", "run_preflight", "unknown_variables", "validator_messages",
]
