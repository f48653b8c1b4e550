# -*- coding: utf-8 -*-
"""Filter of the bench role's multi-node profiles: a profile's `nodes` (an inventory group or a host
list) -> the resolved mapping llm_server renders --nnodes/--node-rank/--dist-init-addr from.

The logic is module_utils/server/multinode.py (resolve_nodes), shared with llm_server's own check;
this filter only reads the inventory: the group's hosts in order and each host's ansible_host.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.module_utils.server.multinode import NodesError, resolve_nodes


def multinode_nodes(nodes, this, groups, hostvars, default_port=None, profile="?"):
    """nodes: the profile's `nodes`; this: inventory_hostname; groups, hostvars: Ansible's."""
    hosts = nodes.get("hosts") if isinstance(nodes, dict) and nodes.get("hosts") else []
    if isinstance(nodes, dict) and nodes.get("group") in groups:
        hosts = list(groups[nodes["group"]])
    addresses = {}
    for host in hosts:
        variables = hostvars[host] if host in hostvars else {}
        addresses[host] = str(variables.get("ansible_host") or host)
    try:
        return resolve_nodes(nodes, this, groups, addresses,
                             default_port=default_port if default_port is not None else 50000,
                             where="bench_profiles %s: nodes" % profile)
    except NodesError as err:
        raise AnsibleFilterError(str(err)) from None


class FilterModule:
    def filters(self):
        return {"multinode_nodes": multinode_nodes}
