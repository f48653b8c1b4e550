#!/usr/bin/python
# -*- coding: utf-8 -*-
# role_vars_check runs on the controller, as the action plugin plugins/action/role_vars_check.py;
# the rule is plugins/plugin_utils/role_vars.py. This file holds its documentation and argument
# spec; main() only answers that the module is not meant to run on a host.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: role_vars_check
short_description: Refuse unknown and misspelled role variables before anything is changed
description:
  - Runs on the controller (action plugin), reads nothing from and writes nothing to any host.
  - For every host of O(hosts), every variable the host has (inventory, group_vars, host_vars,
    C(-e)) whose name starts with a role's prefix (C(<role>_), for each role of O(roles)) must be
    an option of that role (any entry point of C(roles/<role>/meta/argument_specs.yml)), a key of
    its C(defaults/main.yml), or one of O(elsewhere). Anything else fails, naming the variable, the
    closest known name (for C(cuda_toolkit_verison), "unknown variable; did you mean
    cuda_toolkit_version?"), where it was set when Ansible knows it, and the hosts.
  - C(bench_*) names are bench.yml's own check (bench_preflight); this is the same rule for the
    roles of upgrade-cuda.yml.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  roles:
    description: The roles whose prefixes are checked (names of the collection's roles).
    type: list
    elements: str
    required: true
  hosts:
    description: The hosts whose variables are checked; default, the task's own host.
    type: list
    elements: str
  prefixes:
    description: Other prefixes to check (a playbook's own, e.g. C(gpu_stack)), known only through O(elsewhere).
    type: list
    elements: str
    default: []
  elsewhere:
    description: Names with a checked prefix that something other than the role's options reads or sets, with who does.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Refuse unknown role variables
  servelab.serving.role_vars_check:
    roles: [proxmox_gpu_passthrough, cuda_toolkit, sglang]
    hosts: "{{ groups['proxmox_hosts'] | default([]) + groups['gpu_servers'] | default([]) }}"
    prefixes: [gpu_stack]
    elsewhere:
      gpu_stack_serial: upgrade-cuda.yml's rollout batch size
"""

RETURN = r"""
unknown:
  description: The unknown variables found (C(name), C(role), C(suggestion), C(host), C(where)).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

ARGUMENT_SPEC = dict(
    roles=dict(type="list", elements="str", required=True),
    hosts=dict(type="list", elements="str"),
    prefixes=dict(type="list", elements="str", default=[]),
    elsewhere=dict(type="dict", default={}),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.fail_json(msg="role_vars_check is an action plugin: it runs on the controller, never as a "
                         "module on a host")


if __name__ == "__main__":
    main()
