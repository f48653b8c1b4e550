#!/usr/bin/python
# -*- coding: utf-8 -*-
# bench_run runs on the controller, as the action plugin plugins/action/bench_run.py. This file
# holds its documentation and its argument spec, which the action validates the task's arguments
# with; main() only answers that the module is not meant to run on a host.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_run
short_description: Open and close a servelab benchmark run on the controller
description:
  - Runs on the controller (action plugin); the task's host is never contacted.
  - "O(state=opened): checks the run id against the results on disk and holds it for this
    ansible-playbook (C(<results_root>/.locks/run-<run_id>.json)); writes nothing into the run's
    directory. A run id whose directory already holds measured levels is refused unless
    O(resume) names it: a finished level is never silently measured again. With O(resume) the
    run continues: RV(finished_levels) is C(keep) (llm_bench skips every level that has a
    complete part file) or, with O(remeasure), C(remeasure)."
  - "O(state=closed): merges C(status) (O(status)) and C(<status>_at) into the manifest; for an
    interrupted or aborted run also C(level_in_flight) (what llm_bench was measuring on each host
    when the run stopped) and C(interrupt_reason); releases the run id. Returns the profiles that
    did not finish."
  - The servelab.serving.progress callback watches these tasks; a run that was opened and never
    closed (Ctrl-C, SIGTERM, a play that stopped) is cleaned up at exit by
    C(playbooks/bench_interrupted.yml).
version_added: "0.2.0"
author: servelab (!UNKNOWN)
options:
  results_root:
    description: The controller directory that holds one directory per run.
    type: path
    required: true
  run_id:
    description: The run.
    type: str
    required: true
  state:
    description: Open or close the run.
    type: str
    choices: [opened, closed]
    default: opened
  resume:
    description: Continue this earlier run (must equal O(run_id)); its finished levels are kept.
    type: str
  remeasure:
    description: With O(resume), measure the levels that already have part files again.
    type: bool
    default: false
  break_lock:
    description: Take over a run id held from another controller machine (shared results root).
    type: bool
    default: false
  status:
    description: How the run ended (O(state=closed)).
    type: str
    choices: [finished, interrupted, aborted]
    default: finished
  resume_command:
    description:
      - O(state=closed) with a status other than C(finished), the command that continues the
        run (the interrupted ansible-playbook's own options with C(-e bench_resume=<run_id>),
        secrets masked), recorded as C(resume_command) in the manifest for the report. The
        interrupt cleanup passes it; empty leaves the report to build one from the manifest.
    type: str
    default: ""
  reason:
    description: Why the run stopped (C(SIGINT), C(SIGTERM), a failed play), recorded with an interrupted run.
    type: str
    default: ""
  owner_pid:
    description: The ansible-playbook process the run belongs to (default the one running this task).
    type: int
attributes:
  check_mode:
    support: full
    description: Checks the run id and the lock; writes nothing.
  action:
    support: full
    description: Runs on the controller only; the task's host is never contacted.
"""

EXAMPLES = r"""
- name: Open the run (refuses a reused run id that already has measured levels)
  servelab.serving.bench_run:
    results_root: "{{ bench_results_root }}"
    run_id: "{{ bench_run_id }}"
    resume: "{{ bench_resume | default(omit) }}"
    remeasure: "{{ bench_remeasure | default(false) }}"
  register: bench_run_open

- name: Close the run
  servelab.serving.bench_run:
    results_root: "{{ bench_results_root }}"
    run_id: "{{ bench_run_id }}"
    state: closed
    status: finished
  register: bench_run_closed
"""

RETURN = r"""
run_id:
  description: The run.
  returned: always
  type: str
run_dir:
  description: The run's directory.
  returned: always
  type: str
resumed:
  description: Whether an earlier run is continued.
  returned: state=opened
  type: bool
finished_levels:
  description: What llm_bench does with an already measured level, C(keep) or C(remeasure).
  returned: state=opened
  type: str
measured_levels:
  description: Levels with a complete part file in the run directory.
  returned: always
  type: int
measured:
  description: "The measured levels: C({host: {profile: [concurrency, ...]}})."
  returned: state=opened
  type: dict
started_at:
  description: The resumed run's start time (null for a new run).
  returned: state=opened
  type: str
resumed_at:
  description: When the run was resumed, this time included.
  returned: state=opened
  type: list
  elements: str
level_in_flight:
  description: "C([{host, profile, level, concurrency, started_at}]): the levels running when the run stopped."
  returned: state=closed
  type: list
  elements: dict
failed_profiles:
  description: "C([{profile, host, status, error, failed_task}]): profiles that did not finish on a host."
  returned: state=closed
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    results_root=dict(type="path", required=True),
    run_id=dict(type="str", required=True),
    state=dict(type="str", choices=["opened", "closed"], default="opened"),
    resume=dict(type="str"),
    remeasure=dict(type="bool", default=False),
    break_lock=dict(type="bool", default=False),
    status=dict(type="str", choices=["finished", "interrupted", "aborted"], default="finished"),
    reason=dict(type="str", default=""),
    resume_command=dict(type="str", default=""),
    owner_pid=dict(type="int"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="bench_run is an action plugin: it runs on the controller, never as a "
                         "module on a host (is servelab.serving's plugins/action/bench_run.py missing?)")


if __name__ == "__main__":
    main()
