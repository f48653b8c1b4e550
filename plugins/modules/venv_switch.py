#!/usr/bin/python
# -*- coding: utf-8 -*-
# The logic is plugins/module_utils/venv/switch.py (unit-tested in tests/unit/test_venv_switch.py).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: venv_switch
short_description: Point the venv path servers use at a venv built beside it, in one rename, and put it back
description:
  - A venv cannot be moved (its C(bin/) scripts name its python by absolute path), so a new one is built where it
    stays and O(path) (the path servers run, e.g. C(/opt/sglang/venv)) becomes a symbolic link to it.
  - V(switched) makes O(path) a link to O(target) in one rename. A real venv directory at O(path) (built in place by
    an earlier release) is exchanged with the link in one C(renameat2(RENAME_EXCHANGE)) and kept at O(park), whole,
    so that V(restored) can put it back where its scripts work. Where the file system cannot exchange two names
    (NFS, ZFS before 2.2) it takes two renames, and O(path) is absent between them (RV(atomic) says which).
  - V(restored) puts back what O(previous) (RV(previous) of the switch, or V(query)'s RV(plan), recorded before
    it) says O(path) was; it also finishes a restore, or a switch, that was interrupted half-way.
  - V(query) changes nothing and returns what is at O(path) and the RV(plan) a switch would record.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  path:
    description: The venv path servers run (C(<path>/bin/python)); a link, a venv directory, or absent.
    type: path
    required: true
  state:
    description: V(query), V(switched) (O(path) -> O(target)) or V(restored) (O(path) as O(previous) says).
    type: str
    choices: [query, switched, restored]
    default: query
  target:
    description: With V(switched), the venv directory (holding C(bin/python)) to point O(path) at.
    type: path
  park:
    description:
      - Where a venv directory at O(path) is kept while O(path) is a link (V(switched)); on the same file system.
        Must not exist. Also what V(query)'s RV(plan) records.
    type: path
  previous:
    description: With V(restored), what O(path) was before the switch (kind V(link), V(dir) or V(absent), link, parked).
    type: dict
attributes:
  check_mode:
    support: full
    description: Says whether it would change O(path), and changes nothing.
  diff_mode:
    support: none
    description: No diff.
"""

EXAMPLES = r"""
- name: What is at the venv path, and what a switch would record
  servelab.serving.venv_switch:
    path: /opt/sglang/venv
    park: /opt/sglang/venvs/previous
  register: venv_now

- name: Serve from the venv built beside it
  servelab.serving.venv_switch:
    path: /opt/sglang/venv
    target: /opt/sglang/venvs/sglang-0.5.23-cu130-1a2b3c4d5e
    park: /opt/sglang/venvs/previous
    state: switched

- name: Put the venv back as it was before the switch
  servelab.serving.venv_switch:
    path: /opt/sglang/venv
    previous: "{{ venv_now.plan }}"
    state: restored
"""

RETURN = r"""
venv:
  description: What is at O(path) after the task.
  returned: always
  type: dict
  contains:
    path:
      description: O(path).
      type: str
    kind:
      description: V(link), V(dir), V(absent) or V(other).
      type: str
    link:
      description: The link's text (kind V(link)).
      type: str
    resolved:
      description: The directory O(path) ends in; null when it ends nowhere.
      type: str
  sample: {"path": "/opt/sglang/venv", "kind": "link", "link": "/opt/sglang/venvs/sglang-0.5.23-cu130-1a2b3c4d5e",
           "resolved": "/opt/sglang/venvs/sglang-0.5.23-cu130-1a2b3c4d5e"}
plan:
  description: With V(query), what a switch would record as RV(previous) (O(park) for a directory).
  returned: state is query
  type: dict
  sample: {"kind": "dir", "link": null, "parked": "/opt/sglang/venvs/previous"}
previous:
  description: With V(switched), what O(path) was before (give it to V(restored)).
  returned: state is switched
  type: dict
atomic:
  description: Whether the change was one rename (false - the file system could not exchange two names).
  returned: state is switched or restored
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.servelab.serving.plugins.module_utils.venv.switch import (Previous, SwitchError, Switcher,
                                                                                   inspect, plan)


def main():
    module = AnsibleModule(argument_spec=dict(
        path=dict(type="path", required=True),
        state=dict(type="str", choices=["query", "switched", "restored"], default="query"),
        target=dict(type="path"),
        park=dict(type="path"),
        previous=dict(type="dict"),
    ), required_if=[("state", "switched", ("target", "park")), ("state", "restored", ("previous",))],
        supports_check_mode=True)
    path, state = module.params["path"].rstrip("/") or "/", module.params["state"]
    try:
        if state == "query":
            planned = plan(path, module.params["park"] or "") if inspect(path).kind != "other" else None
            module.exit_json(changed=False, venv=inspect(path).as_dict(),
                             plan=planned.as_dict() if planned else None)
        switcher = Switcher()
        if state == "switched":
            result = switcher.switch(path, module.params["target"], module.params["park"], check=module.check_mode)
        else:
            result = switcher.restore(path, Previous.from_dict(module.params["previous"]), check=module.check_mode)
    except (SwitchError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (path, exc), venv=inspect(path).as_dict())
    module.exit_json(venv=inspect(path).as_dict(), **result)


if __name__ == "__main__":
    main()
