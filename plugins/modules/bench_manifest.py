#!/usr/bin/python
# -*- coding: utf-8 -*-
# bench_manifest runs on the controller, as the action plugin plugins/action/bench_manifest.py. This file holds
# its documentation and its argument spec, which the action validates the task's arguments with
# (so ansible-doc, ansible-test's validate-modules and the action agree); main() only answers
# that the module is not meant to run on a host.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_manifest
short_description: Record facts about a servelab run in results/<run_id>/manifest.json
description:
  - Runs on the controller (action plugin); the task's host is never contacted, so it can run for
    every host of a play (each fork recording its own part) without C(delegate_to).
  - Deep-merges O(merge) into C(<results_dir>/manifest.json) under an exclusive C(fcntl.flock) on
    C(<results_dir>/.lock) (the lock llm_bench also takes), then writes the file atomically
    (temporary file and rename). Several forks merging at once lose nothing.
  - "Dicts merge key by key, recursively; any other value (lists too) replaces the old one, so
    running the same task twice gives the same manifest."
  - "The layout servelab's playbooks and bench_report use: C(run_id), C(started_at),
    C(finished_at), C(git) ({commit, dirty, reason}), C(bench) (settings: C(concurrency) list,
    workload, SLOs, seeds), C(hosts.<host>.gpu_facts), and per profile and host
    C(profiles.<profile>.<host>) with C(engine), C(cmdline), C(env), C(features_skipped),
    C(time_scale), C(status) (started, finished, failed), C(error), C(failed_task), C(log_tail)."
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  results_dir:
    description:
      - The run's directory, C(results/<run_id>); created when missing. Relative paths are taken
        from the playbook's directory.
    type: path
    required: true
  merge:
    description: The dict to deep-merge into the manifest. Must be JSON-serialisable.
    type: dict
    default: {}
  create_latest_link:
    description:
      - Point C(<results_dir>/../latest) at this run (relative symlink, replaced atomically).
        Fails when C(latest) exists and is not a symlink.
    type: bool
    default: false
  record_git_commit:
    description:
      - When the manifest has no C(git) key yet, record C(git rev-parse HEAD) of the playbook's
        directory and whether its tree is dirty (C(commit) null with a C(reason) outside a git
        checkout). Recorded once per run.
    type: bool
    default: true
  lock_timeout:
    description: Seconds to wait for the run's lock before failing.
    type: float
    default: 120
attributes:
  check_mode:
    support: full
    description: Returns the manifest as it would be and whether it would change; writes nothing.
  action:
    support: full
    description: Runs on the controller only; the task's host is never contacted.
"""

EXAMPLES = r"""
- name: Open the run and point results/latest at it
  servelab.serving.bench_manifest:
    results_dir: "{{ playbook_dir }}/results/{{ bench_run_id }}"
    create_latest_link: true
    merge:
      run_id: "{{ bench_run_id }}"
      started_at: "{{ now(utc=true).isoformat() }}"
      bench:
        concurrency: "{{ bench_concurrency }}"

- name: Record this host's GPU facts (every host of the play at once)
  servelab.serving.bench_manifest:
    results_dir: "{{ bench_results_root }}/{{ bench_run_id }}"
    merge:
      hosts: "{{ {inventory_hostname: {'gpu_facts': gpu.gpu_facts}} }}"
"""

RETURN = r"""
path:
  description: The manifest's path.
  returned: always
  type: str
manifest:
  description: The manifest after the merge (as it would be, in check mode).
  returned: always
  type: dict
changed:
  description: Whether the manifest's content or the latest link changed.
  returned: always
  type: bool
latest_link:
  description: Path of the C(latest) link (with O(create_latest_link)).
  returned: always
  type: str
latest_changed:
  description: Whether the C(latest) link was (or would be) replaced.
  returned: always
  type: bool
recorded:
  description: Keys this task added by itself (C(git) the first time).
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    results_dir=dict(type="path", required=True),
    merge=dict(type="dict", default={}),
    create_latest_link=dict(type="bool", default=False),
    record_git_commit=dict(type="bool", default=True),
    lock_timeout=dict(type="float", default=120.0),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="bench_manifest is an action plugin: it runs on the controller, never as a module "
                         "on a host (is servelab.serving's plugins/action/bench_manifest.py missing?)")


if __name__ == "__main__":
    main()
