#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of servelab's proxmox_gpu_passthrough role.
from __future__ import annotations

DOCUMENTATION = r"""
module: pve_lxc_gpu_passthrough
short_description: Write the NVIDIA passthrough block into a Proxmox VE LXC config
description:
  - Reads the NVIDIA device majors from O(proc_devices) (never hard-coded; the C(nvidia-uvm) and
    C(nvidia-caps) majors are dynamic) and writes one block of cgroup allow rules and mount
    entries, one per GPU and control node, into a Proxmox VE container config.
  - The block always goes into the main section, before any C([snapshot]) or C([pve:pending])
    section; snapshot sections are never changed.
  - Older lines in the main section that configure the same nodes (hand-written lines, a block
    whose markers PVE moved into the description) are replaced, so the block is present once.
  - Unlike M(ansible.builtin.blockinfile) with C(insertbefore), which inserts before the B(last)
    match, this never lands inside the first of several snapshot sections.
options:
  path:
    description: The container config, C(/etc/pve/lxc/<vmid>.conf). It must exist.
    type: path
    required: true
  proc_devices:
    description: Where to read the character-device majors from.
    type: path
    default: /proc/devices
  gpu_indexes:
    description: GPU indexes to pass through (C(/dev/nvidia<index>)). Required with O(state=present).
    type: list
    elements: int
    default: []
  control_nodes:
    description: Control nodes to pass through as well.
    type: list
    elements: str
    default: [nvidiactl, nvidia-uvm, nvidia-uvm-tools]
    choices: [nvidiactl, nvidia-modeset, nvidia-uvm, nvidia-uvm-tools, nvidia-caps]
  cgroup_key:
    description: >-
      C(lxc.cgroup2.devices.allow) for cgroup v2 hosts (PVE 7 and later),
      C(lxc.cgroup.devices.allow) for v1.
    type: str
    default: lxc.cgroup2.devices.allow
    choices: [lxc.cgroup2.devices.allow, lxc.cgroup.devices.allow]
  marker:
    description: Text of the C(# BEGIN <marker>) and C(# END <marker>) comment lines around the block.
    type: str
    default: servelab proxmox_gpu_passthrough
  state:
    description: V(absent) removes the block (only lines between our markers).
    type: str
    default: present
    choices: [present, absent]
attributes:
  check_mode:
    support: full
    description: Reports the change it would make, and the diff, without writing.
  diff_mode:
    support: full
    description: The container config before and after.
author: servelab (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Pass GPUs 0-7 through to container 129
  servelab.serving.pve_lxc_gpu_passthrough:
    path: /etc/pve/lxc/129.conf
    gpu_indexes: [0, 1, 2, 3, 4, 5, 6, 7]
  register: passthrough
  notify: proxmox_gpu_passthrough restart containers
"""

RETURN = r"""
nodes:
  description: The device nodes passed through, majors as read from O(proc_devices).
  returned: state=present
  type: list
  elements: dict
  sample: [{path: /dev/nvidia0, major: 195, minor: 0, kind: file, driver: frontend},
           {path: /dev/nvidia-uvm, major: 509, minor: 0, kind: file, driver: nvidia-uvm}]
block:
  description: The block's lines as written (PVE syntax, markers included).
  returned: state=present
  type: list
  elements: str
removed:
  description: Older main-section lines replaced by the block (hand-written or displaced duplicates).
  returned: always
  type: list
  elements: str
snapshot_sections:
  description: Number of section headers (snapshots, pending) after the main section, left untouched.
  returned: always
  type: int
"""

import errno
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.servelab.serving.plugins.module_utils.pve.passthrough import (
    CGROUP_KEYS,
    CONTROL_NODES,
    DEFAULT_MARKER,
    PassthroughError,
    apply_block,
    parse_proc_devices,
    render_block,
    resolve_nodes,
)


def _read(module, path, option):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as err:
        module.fail_json(msg="%s: cannot read %s: %s" % (option, path, err.strerror))


def replace_like_pve(path, text):
    """Write text to path the way PVE's own file_set_contents does: a temp file beside it, then rename.

    /etc/pve is pmxcfs, which refuses chmod/chown that change anything; AnsibleModule.atomic_move
    copies across filesystems with a chmod there and fails (ansible/ansible#70535). A rename in
    the same directory works, and pmxcfs sets owner and mode itself. Elsewhere (a plain
    filesystem) the config keeps its owner and mode.
    """
    info = os.stat(path)
    tmp = "%s.tmp.%d" % (path, os.getpid())  # PVE ignores names other than <vmid>.conf
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        for call, args in ((os.chown, (tmp, info.st_uid, info.st_gid)),
                           (os.chmod, (tmp, stat.S_IMODE(info.st_mode)))):
            try:
                call(*args)
            except OSError as err:
                if err.errno not in (errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            proc_devices=dict(type="path", default="/proc/devices"),
            gpu_indexes=dict(type="list", elements="int", default=[]),
            control_nodes=dict(type="list", elements="str",
                               default=["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"],
                               choices=sorted(CONTROL_NODES)),
            cgroup_key=dict(type="str", default=CGROUP_KEYS[0], choices=list(CGROUP_KEYS)),
            marker=dict(type="str", default=DEFAULT_MARKER),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        required_if=[("state", "present", ("gpu_indexes",))],
        supports_check_mode=True,
    )
    params = module.params
    path = params["path"]
    if not os.path.isfile(path):
        module.fail_json(msg="path: %s does not exist: no such container on this host; check the vmid "
                             "(proxmox_vmid / proxmox_gpu_passthrough_vmids)" % path)

    result = dict(changed=False, removed=[], snapshot_sections=0)
    try:
        block = []
        if params["state"] == "present":
            majors = parse_proc_devices(_read(module, params["proc_devices"], "proc_devices"))
            nodes = resolve_nodes(params["gpu_indexes"], params["control_nodes"], majors)
            block = render_block(nodes, params["cgroup_key"], params["marker"])
            result.update(nodes=[node.as_dict() for node in nodes], block=block)
        before = _read(module, path, "path")
        edit = apply_block(before, block, present=params["state"] == "present", marker=params["marker"])
    except PassthroughError as err:
        module.fail_json(msg=str(err), **result)

    for warning in edit.warnings:
        module.warn(warning)
    result.update(changed=edit.changed, removed=edit.removed, snapshot_sections=edit.snapshot_sections)
    if edit.changed:
        result["diff"] = dict(before=before, after=edit.text, before_header=path, after_header=path)
        if not module.check_mode:
            try:
                replace_like_pve(path, edit.text)
            except OSError as err:
                module.fail_json(msg="path: cannot write %s: %s" % (path, err), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
