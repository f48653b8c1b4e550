#!/usr/bin/python
# -*- coding: utf-8 -*-
# The logic is plugins/module_utils/apt/ready.py (unit-tested in tests/unit/test_package_ready.py).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: package_ready
short_description: Wait until apt, dpkg and pip are free, and repair an interrupted dpkg
description:
  - Finds the live holders of apt's and dpkg's locks (O(locks); the PID from C(fcntl) F_GETLK, so a holder found is
    alive) and pip (or C(python -m venv), ensurepip) working on one of O(venvs), with their command lines, and waits
    up to O(timeout) seconds for them to end. What a killed controller leaves running in the container - its apt-get,
    dpkg or pip go on to their end - is found this way.
  - With O(dpkg), reads C(dpkg --audit) and dpkg's journal (C(/var/lib/dpkg/updates), what apt calls "dpkg was
    interrupted"). With O(repair) and no holder left, repairs an interrupted dpkg with C(dpkg --configure -a).
  - Never fails for what it finds - RV(ready) and RV(problem) say it, so that the calling role words the refusal
    with its own variables. It reports a change only when it repaired dpkg.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  locks:
    description: Lock files whose holders are waited for; an empty list checks none.
    type: list
    elements: path
    default: [/var/lib/dpkg/lock-frontend, /var/lib/dpkg/lock, /var/cache/apt/archives/lock, /var/lib/apt/lists/lock]
  venvs:
    description: Venv directories (or links to them) whose pip processes are waited for.
    type: list
    elements: path
    default: []
  dpkg:
    description: Read C(dpkg --audit) and dpkg's journal (and repair with O(repair)).
    type: bool
    default: true
  repair:
    description: Run C(dpkg --configure -a) when dpkg was interrupted and nothing holds the locks any more.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for the holders to end (0 - look once).
    type: int
    default: 600
attributes:
  check_mode:
    support: full
    description: Waits and reads as in a real run; does not repair, and reports a change where it would.
  diff_mode:
    support: none
    description: No diff.
"""

EXAMPLES = r"""
- name: Wait for apt, dpkg and pip, repair an interrupted dpkg
  servelab.serving.package_ready:
    venvs: [/opt/sglang/venv]
    repair: true
    timeout: 600
  register: ready

- name: Refuse while something holds them
  ansible.builtin.assert:
    that: ready.ready
    fail_msg: "{{ ready.problem }}"
"""

RETURN = r"""
ready:
  description: No holder left, and dpkg not interrupted (or repaired).
  returned: always
  type: bool
problem:
  description: What is in the way, in words (the holders with PID and command line, dpkg's audit); empty when ready.
  returned: always
  type: str
  sample: >-
    apt, dpkg or pip is busy on the host after 600 s of waiting: PID 4242
    (/usr/bin/apt-get -y install cuda-toolkit-13-0=13.0.1-1) holds /var/lib/dpkg/lock-frontend
holders:
  description: The holders still there at the end of the wait (pid, cmdline, holds).
  returned: always
  type: list
  elements: dict
waited_for:
  description: Every holder seen while waiting, ended or not.
  returned: always
  type: list
  elements: dict
waited:
  description: Seconds waited.
  returned: always
  type: float
interrupted:
  description: dpkg was interrupted (C(dpkg --audit) lists packages, or its journal has entries).
  returned: always
  type: bool
audit:
  description: What C(dpkg --audit) said before any repair.
  returned: always
  type: str
journal:
  description: dpkg's pending journal entries (file names under C(/var/lib/dpkg/updates)).
  returned: always
  type: list
  elements: str
repaired:
  description: C(dpkg --configure -a) ran.
  returned: always
  type: bool
repair_rc:
  description: Its exit status; null when it did not run.
  returned: always
  type: int
repair_output:
  description: Its output (the end).
  returned: always
  type: str
audit_after:
  description: What C(dpkg --audit) said after the repair (empty - repaired).
  returned: always
  type: str
broken:
  description: dpkg is still interrupted (not repaired, or the repair failed).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.servelab.serving.plugins.module_utils.apt.ready import LOCKS, Checker, summary


def main():
    module = AnsibleModule(argument_spec=dict(
        locks=dict(type="list", elements="path", default=list(LOCKS)),
        venvs=dict(type="list", elements="path", default=[]),
        dpkg=dict(type="bool", default=True),
        repair=dict(type="bool", default=False),
        timeout=dict(type="int", default=600),
    ), supports_check_mode=True)
    if module.params["timeout"] < 0:
        module.fail_json(msg="timeout must be 0 or more seconds, not %d" % module.params["timeout"])
    if module.params["dpkg"] and not module.get_bin_path("dpkg"):
        module.fail_json(msg="dpkg is not installed on this host: package_ready's dpkg check needs it")

    def run(argv):
        return module.run_command(list(argv), environ_update={"LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"})

    checker = Checker(run=run, locks=module.params["locks"], venvs=module.params["venvs"],
                      check_dpkg=module.params["dpkg"])
    result = checker.check(module.params["timeout"], module.params["repair"], check_mode=module.check_mode)
    would_repair = module.check_mode and module.params["repair"] and result.interrupted and not result.holders
    problem = "" if would_repair and not result.holders else summary(result)
    module.exit_json(changed=result.repaired or would_repair, ready=not problem, problem=problem, **result.as_dict())


if __name__ == "__main__":
    main()
