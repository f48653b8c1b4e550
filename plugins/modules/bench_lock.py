#!/usr/bin/python
# -*- coding: utf-8 -*-
"""bench_lock: one benchmark run at a time per server state directory and per server port.

The module is the target side (reads and writes the lock records under a flock); the action
plugin plugins/action/bench_lock.py is the controller side (who this run is, whether a holder is
still alive, take-over, the messages). The logic is plugins/module_utils/run/lock.py.
"""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_lock
short_description: Hold a server state directory and port for one benchmark run
description:
  - Takes, checks or releases the locks of one servelab run on a host that serves. A lock is a
    JSON record (run id, the controller's host name, machine id, boot id, ansible-playbook's pid
    and its start time, the state directory, the port, when it was taken) created atomically
    (C(link(2)) of a complete file, so of two runs racing for a free resource exactly one wins).
  - "O(state=acquired): takes the lock of O(state_dir) (C(<state_dir>/run.lock.json)) and of
    O(port) (C(<lock_dir>/port-<port>.json)), both or neither. A resource held by another run
    whose ansible-playbook still runs on this controller is refused, naming that run. A holder
    whose process is gone (same controller machine) is stale: it is taken over, with a warning.
    A holder started from another controller machine cannot be checked from here and is refused
    unless O(break_lock)."
  - "O(state=held): checks that this run still holds its locks (fails naming the run that took
    them) and returns RV(protect_pids), the servers of the other live runs on this machine, which
    a reap must spare. Without O(state_dir) and O(port) (the interrupt cleanup): returns the
    run's own locks, state directories and recorded servers, and does not fail."
  - "O(state=released): removes the records this run holds for this inventory host (every one
    of O(run_id) on this machine taken for it: its port records and the state directories they
    name; another GPU server of the run on the same machine keeps its own)."
  - The controller side is the action plugin (the controller identity is filled in there; a
    holder's liveness is judged there, where its pid means something).
version_added: "0.2.0"
author: servelab (!UNKNOWN)
options:
  run_id:
    description: The run that takes, checks or releases the locks.
    type: str
    required: true
  state:
    description: What to do.
    type: str
    choices: [acquired, held, released]
    default: acquired
  state_dir:
    description: The server state directory (llm_server's O(servelab.serving.llm_server#module:state_dir)).
    type: path
  port:
    description: The server port.
    type: int
  extra_ports:
    description:
      - The other ports the run binds on this host, held with O(port), all or none (a router
        derived profile's two halves, C(bench_server_port + 1) and C(+ 2)). A second run on one
        of them is refused here, before it makes a run directory.
    type: list
    elements: int
    default: []
  share_run:
    description:
      - A record of this same run (and ansible-playbook process) taken for another of its
        inventory hosts counts as held here, not as a conflict. For the other ranks of a
        multi-node profile (roles/bench/tasks/lock.yml). Each binds rank 0's port on its own
        address, so two ranks on one machine meet at one port record.
    type: bool
    default: false
  lock_dir:
    description:
      - Machine-wide directory of the port records (sticky, world-writable; created when
        missing). Every run on a machine must use the same one.
      - Default C(<tmp>/servelab-locks) (Python's C(tempfile.gettempdir())).
    type: path
  break_lock:
    description:
      - Take over a lock held by a run from another controller machine, whose liveness cannot be
        checked from here. A live holder on this controller is never broken.
      - Action plugin only.
    type: bool
    default: false
  owner_pid:
    description:
      - The ansible-playbook process this run belongs to (default the one running this task).
        The interrupt cleanup (playbooks/bench_interrupted.yml) passes the interrupted run's.
      - Action plugin only.
    type: int
  controller:
    description: The controller identity of the record. Filled in by the action plugin.
    type: dict
  take_over:
    description: Tokens of records to replace. Filled in by the action plugin.
    type: list
    elements: str
    default: []
  release:
    description: C({path, token}) of the records to remove. Filled in by the action plugin.
    type: list
    elements: dict
    default: []
  inventory_host:
    description:
      - The inventory host the locks are taken for (the task's host, or the one it is delegated
        to). Filled in by the action plugin.
      - One run holds locks for each of its GPU servers; a record this run took for another
        inventory host (two GPU servers on one machine with the same state directory or port) is
        a conflict, not this host's own.
    type: str
    default: ""
attributes:
  check_mode:
    support: full
    description: Says what it would take or release; writes nothing.
notes:
  - A dead host's locks stay until its controller's process is gone; the next run from the same
    controller then takes them over as stale.
"""

EXAMPLES = r"""
- name: Hold the state directory and the port for this run
  servelab.serving.bench_lock:
    run_id: "{{ bench_run_id }}"
    state_dir: "{{ bench_state_dir }}"
    port: "{{ bench_server_port }}"
    break_lock: "{{ bench_break_lock }}"

- name: Check the locks and find the other runs' servers
  servelab.serving.bench_lock:
    run_id: "{{ bench_run_id }}"
    state: held
    state_dir: "{{ bench_state_dir }}"
    port: "{{ bench_server_port }}"
  register: lock

- name: Release every lock of the run on this host
  servelab.serving.bench_lock:
    run_id: "{{ bench_run_id }}"
    state: released
"""

RETURN = r"""
acquired:
  description: The records this run holds after the task (state=acquired).
  returned: always
  type: list
  elements: dict
taken_over:
  description: Stale or broken records that were replaced.
  returned: always
  type: list
  elements: dict
released:
  description: Paths of the records removed (state=released).
  returned: always
  type: list
  elements: str
held:
  description: Whether this run holds a lock on this host.
  returned: always
  type: bool
protect_pids:
  description: Server pids of the other live runs on this machine (state=held).
  returned: always
  type: list
  elements: int
state_dirs:
  description: The state directories this run holds on this host.
  returned: always
  type: list
  elements: str
ports:
  description: The ports this run holds on this host.
  returned: always
  type: list
  elements: int
servers:
  description: "C([{name, state_dir}]): the servers recorded as running under this run's state directories."
  returned: always
  type: list
  elements: dict
conflicts:
  description: "C([{resource, path, holder}]): the records that stood in the way (state=acquired)."
  returned: when a lock was refused
  type: list
  elements: dict
lock_dir:
  description: The machine-wide lock directory used.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.run import lock  # noqa: E402

ARGUMENT_SPEC = dict(
    run_id=dict(type="str", required=True),
    state=dict(type="str", choices=["acquired", "held", "released"], default="acquired"),
    state_dir=dict(type="path"),
    port=dict(type="int"),
    extra_ports=dict(type="list", elements="int", default=[]),
    share_run=dict(type="bool", default=False),
    lock_dir=dict(type="path"),
    break_lock=dict(type="bool", default=False),
    owner_pid=dict(type="int"),
    controller=dict(type="dict"),
    take_over=dict(type="list", elements="str", default=[]),
    release=dict(type="list", elements="dict", default=[]),
    inventory_host=dict(type="str", default=""),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result = dict(changed=False, acquired=[], taken_over=[], conflicts=[], released=[])
    if module.params["state"] == "acquired" and not module.params["controller"]:
        module.fail_json(msg="bench_lock: controller is missing: run bench_lock as a task "
                             "(its action plugin fills it in), not as a bare module")
    try:
        lock.run_task(module.params, module.check_mode, result)
    except lock.LockError as exc:
        module.fail_json(msg="bench_lock: %s" % exc, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
