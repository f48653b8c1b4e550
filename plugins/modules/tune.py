#!/usr/bin/python
# -*- coding: utf-8 -*-
# tune runs on the controller, as the action plugin plugins/action/tune.py (playbooks/tune.yml's
# steps). This file holds its documentation and its argument spec; main() only answers that the
# module is not meant to run on a host.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: tune
short_description: The steps of playbooks/tune.yml - check the tune, propose a trial, record it
description:
  - Runs on the controller (action plugin); the logic is plugins/plugin_utils/tune/ and
    docs/tune.md describes the search.
  - O(state=checked) - the preflight of the C(tune_*) variables of O(hosts) (one GPU server)
    over the tune role's defaults - unknown names (with the nearest known one), types, the base
    profile, the objective (C(tune_objective), its SLO else C(bench_slo)), the space
    (C(tune_space)), the numbers and budget, and every candidate made into its trial profile and
    held to the engine's rules; combinations the engine refuses are left out and returned in
    RV(refused). Returns the tune's RV(settings), the RV(probe_profiles) the bench preflight
    checks (the installed SGLang's flags, the simulator's keys) and the RV(target_checks) that
    only the GPU server can answer (a command engine's own C(--help)). Nothing is started or
    written.
  - O(state=opened) - the tune's state in the run directory, new or resumed (its finished trials
    kept; refused when the settings changed since).
  - O(state=proposed) - the next trial (RV(trial)), or RV(done) with the reason - the budget is
    spent, every candidate was tried, or no untried candidate is expected to beat the best by
    more than C(tune_tolerance). The trial is recorded as running before it starts.
  - O(state=recorded) - the trial O(trial) recorded from what its sweep left (the manifest's
    profile record, the capacity search's outcome, its levels) - finished with its score,
    pruned, without a score, or failed with the reason; then C(tune/trials.csv),
    C(tune/trials.json) and C(tune/best.yml) are rewritten.
version_added: "0.3.0"
author: servelab (!UNKNOWN)
options:
  state:
    description: The step.
    type: str
    required: true
    choices: [checked, opened, proposed, recorded]
  hosts:
    description: O(state=checked) - the GPU servers of the play (a tune runs on exactly one).
    type: list
    elements: str
  results_dir:
    description: The run directory (C(<bench_results_root>/<bench_run_id>)); not for O(state=checked).
    type: path
  settings:
    description: The tune's settings, as O(state=checked) returned them.
    type: dict
  resume:
    description: O(state=opened) - the run is resumed (C(bench_resume)).
    type: bool
    default: false
  trial:
    description: O(state=recorded) - the trial's name.
    type: str
  host:
    description: O(state=recorded) - the inventory host the trial ran on.
    type: str
"""

EXAMPLES = r"""
- name: Check the tune's settings
  servelab.serving.tune:
    state: checked
    hosts: "{{ groups['gpu_servers'] }}"
  register: tune_check

- name: Propose the next trial
  servelab.serving.tune:
    state: proposed
    results_dir: "{{ bench_results_root }}/{{ bench_run_id }}"
    settings: "{{ tune_check.settings }}"
  register: tune_next
"""

RETURN = r"""
settings:
  description: O(state=checked) - the tune's settings (the space, objective, axis, budget, base
    profile, windows, bounds, the refused combinations' keys).
  returned: success
  type: dict
probe_profiles:
  description: O(state=checked) - trial profiles with every searched flag set, for the bench
    preflight's rendering and flag checks.
  returned: success
  type: list
  elements: dict
target_checks:
  description: O(state=checked) - checks that run on the GPU server through
    M(servelab.serving.bench_preflight) (O(servelab.serving.bench_preflight#module:help_flags)).
  returned: success
  type: list
  elements: dict
refused:
  description: O(state=checked) - the combinations the engine's rules refuse, each with the
    reason; they are never run.
  returned: success
  type: list
  elements: dict
candidates:
  description: O(state=checked) - how many combinations the tune may try.
  returned: success
  type: int
done:
  description: O(state=proposed) - true when no trial is to run; RV(reason) says why.
  returned: success
  type: bool
reason:
  description: O(state=proposed) - why this trial (or why none).
  returned: success
  type: str
trial:
  description: O(state=proposed) - the trial to run - C(name), C(flags), C(profile) (run by the
    bench role's profile path), C(search) (llm_bench's C(capacity_search)), C(prediction).
  returned: success
  type: dict
trials:
  description: The trials so far (name, flags, status, score, reason).
  returned: success
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    state=dict(type="str", required=True, choices=["checked", "opened", "proposed", "recorded"]),
    hosts=dict(type="list", elements="str"),
    results_dir=dict(type="path"),
    settings=dict(type="dict"),
    resume=dict(type="bool", default=False),
    trial=dict(type="str"),
    host=dict(type="str"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC)
    module.fail_json(msg="servelab.serving.tune runs on the controller as an action plugin; "
                         "it is not meant to run on a host")


if __name__ == "__main__":
    main()
