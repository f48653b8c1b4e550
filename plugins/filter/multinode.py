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


def multinode_steps(nodes):
    """The start sequence of a resolved node group: every rank launched in rank order (rank 0 first:
    it hosts the store the others join), then waited for, the other ranks first and rank 0 last
    (ready when it generates, which needs them all). [{host, rank, wait}, ...]"""
    hosts = list(nodes["hosts"])
    launch = [{"host": host, "rank": rank, "wait": False} for rank, host in enumerate(hosts)]
    ready = [{"host": host, "rank": rank, "wait": True} for rank, host in enumerate(hosts) if rank > 0]
    return launch + ready + [{"host": hosts[0], "rank": 0, "wait": True}]


def multinode_rank_records(results):
    """The waited-for results of the start loop -> {host: what that rank runs}, for the manifest."""
    records = {}
    for result in results or []:
        step = result.get("__bench_step") or {}
        if not step.get("wait"):
            continue
        records[step["host"]] = {
            "rank": step["rank"], "cmdline": result.get("cmdline"), "config_hash": result.get("config_hash"),
            "pid": result.get("pid"), "ready_seconds": result.get("ready_seconds"),
        }
    return records


def multinode_dist_init_ports(profiles, this, groups, default_port=None):
    """The dist-init ports `this` host binds as rank 0 of a multi-node profile (the first host of
    its `nodes`): locked with the run (roles/bench/tasks/lock.yml extra_ports), as the preflight
    checks them free. A profile whose nodes do not resolve is left to the preflight's message."""
    default = default_port if default_port is not None else 50000
    ports = []
    for profile in profiles or []:
        nodes = profile.get("nodes") if isinstance(profile, dict) else None
        if not isinstance(nodes, dict) or str(profile.get("engine", "")) == "external":
            continue
        hosts = list(groups[nodes["group"]]) if nodes.get("group") in groups else list(nodes.get("hosts") or [])
        if not hosts or hosts[0] != this:
            continue
        try:
            port = int(str(nodes.get("port", default)).strip())
        except ValueError:
            continue
        if port not in ports:
            ports.append(port)
    return ports


class FilterModule:
    def filters(self):
        return {"multinode_nodes": multinode_nodes, "multinode_steps": multinode_steps,
                "multinode_rank_records": multinode_rank_records,
                "multinode_dist_init_ports": multinode_dist_init_ports}
