#!/usr/bin/python
# -*- coding: utf-8 -*-
# bench_derive runs on the controller, as the action plugin plugins/action/bench_derive.py. This
# file holds its documentation and its argument spec; main() only answers that the module is not
# meant to run on a host.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_derive
short_description: Derive the profile that switches speculation by load from a measured crossover
description:
  - Runs on the controller (action plugin). Reads the run's levels of one host, finds where the
    speculative profile O(source) falls below O(baseline) (the report's crossover; where it only
    tied at low load, the level after which it stops paying) and derives the largest batch that
    still speculates.
  - O(kind=schedule) returns a profile to run like any other; for vLLM the speculative profile
    with C(speculative.tokens_per_batch_size) (vLLM's C(num_speculative_tokens_per_batch_size)),
    for the simulator its dynamic mode standing in for it.
  - O(kind=router) returns two half profiles (each on half the GPUs) and the HAProxy
    configuration that sends a request to the speculative one while it has fewer than that batch
    in flight.
  - Where the source never fell below the baseline after holding it, C(skipped) says why and
    nothing is to run.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  results_dir:
    description: The run directory (C(results/<run_id>)).
    type: path
    required: true
  host:
    description: The host label whose levels decide.
    type: str
    required: true
  kind:
    description: C(schedule) (vLLM, simulator) or C(router) (two servers behind HAProxy).
    type: str
    required: true
    choices: [schedule, router]
  engine:
    description: The engine of the static profiles.
    type: str
    required: true
  profiles:
    description: The static profiles (bench_profiles).
    type: list
    elements: dict
    required: true
  source:
    description: The speculative profile the derived one is built from.
    type: str
    required: true
  baseline:
    description: The profile without speculation.
    type: str
    default: baseline
  listen_host:
    description: Where the router listens.
    type: str
    default: 127.0.0.1
  port:
    description: The router's port; the two servers take the next two.
    type: int
    default: 30000
  simulator_schedule:
    description: The simulator's dynamic mode, C(threshold) (healthy) or C(thrash) (pathological).
    type: str
    default: threshold
    choices: [threshold, thrash]
  total_gpus:
    description: The host's GPU count, for the statement of the split.
    type: int
"""

EXAMPLES = r"""
- name: Derive the schedule from the crossover
  servelab.serving.bench_derive:
    results_dir: "results/{{ bench_run_id }}"
    host: "{{ inventory_hostname }}"
    kind: schedule
    engine: vllm
    profiles: "{{ bench_profiles }}"
    source: eagle3
  register: derived
"""

RETURN = r"""
name:
  description: The derived profile's name in the results (C(<source>_<kind>)).
  returned: success
  type: str
skipped:
  description: Why nothing is to run (empty when something is).
  returned: success
  type: str
max_batch:
  description: The largest batch that still speculates.
  returned: success
  type: int
profile:
  description: O(kind=schedule) the profile to run.
  returned: success
  type: dict
spec_profile:
  description: O(kind=router) the speculative half.
  returned: success
  type: dict
base_profile:
  description: O(kind=router) the baseline half.
  returned: success
  type: dict
router_config:
  description: O(kind=router) HAProxy's configuration.
  returned: success
  type: str
marker:
  description: What the manifest records under C(profiles.<name>.<host>.derived).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    results_dir=dict(type="path", required=True),
    host=dict(type="str", required=True),
    kind=dict(type="str", required=True, choices=["schedule", "router"]),
    engine=dict(type="str", required=True),
    profiles=dict(type="list", elements="dict", required=True),
    source=dict(type="str", required=True),
    baseline=dict(type="str", default="baseline"),
    listen_host=dict(type="str", default="127.0.0.1"),
    port=dict(type="int", default=30000),
    simulator_schedule=dict(type="str", default="threshold", choices=["threshold", "thrash"]),
    total_gpus=dict(type="int"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="bench_derive is an action plugin: it runs on the controller, never as a "
                         "module on a host")


if __name__ == "__main__":
    main()
