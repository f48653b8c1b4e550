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
        hosts = _profile_hosts(profile, groups)
        if not hosts or hosts[0] != this:
            continue
        nodes = profile["nodes"]
        try:
            port = int(str(nodes.get("port", default)).strip())
        except ValueError:
            continue
        if port not in ports:
            ports.append(port)
    return ports


def _profile_hosts(profile, groups):
    """A multi-node profile's hosts in rank order ([] for any other profile)."""
    nodes = profile.get("nodes") if isinstance(profile, dict) else None
    if not isinstance(nodes, dict) or str(profile.get("engine", "")) == "external":
        return []
    if nodes.get("group") in groups:
        return list(groups[nodes["group"]])
    return list(nodes.get("hosts") or [])


def multinode_rank_hosts(profiles, this, groups, play_hosts=None):
    """The hosts of the other ranks (1 and up) of the multi-node profiles `this` host runs as
    rank 0, except those in `play_hosts` (GPU servers of the play take their own locks and are
    cleaned up as such). Their state directory and port are locked with the run from rank 0
    (roles/bench/tasks/lock.yml), released by bench.yml and cleaned up after an interrupt."""
    skip = set(play_hosts or ())
    out = []
    for profile in profiles or []:
        hosts = _profile_hosts(profile, groups)
        if not hosts or hosts[0] != this:
            continue
        out.extend(h for h in hosts[1:] if h not in skip and h not in out and h != this)
    return out


def multinode_fleet_rank_hosts(hosts, hostvars, groups, default_state_dir=None):
    """multinode_rank_hosts of every host in `hosts` (each with its own bench_profiles), with
    `hosts` themselves left out: the other hosts whose run locks bench.yml releases at its end,
    as [{host, state_dir}], state_dir as lock.yml locked it (the rank host's bench_state_dir,
    else its rank 0's, else `default_state_dir`). The state directory is named because two ranks
    on one machine share one port record, which then does not lead to the rank's own."""
    out = []
    for host in hosts or []:
        variables = hostvars[host] if host in hostvars else {}
        for rank_host in multinode_rank_hosts(variables.get("bench_profiles") or [], host, groups,
                                              hosts):
            rank_vars = hostvars[rank_host] if rank_host in hostvars else {}
            entry = {"host": rank_host,
                     "state_dir": (rank_vars.get("bench_state_dir")
                                   or variables.get("bench_state_dir") or default_state_dir)}
            if entry not in out:
                out.append(entry)
    return out


class FilterModule:
    def filters(self):
        return {"multinode_nodes": multinode_nodes, "multinode_steps": multinode_steps,
                "multinode_rank_records": multinode_rank_records,
                "multinode_dist_init_ports": multinode_dist_init_ports,
                "multinode_rank_hosts": multinode_rank_hosts,
                "multinode_fleet_rank_hosts": multinode_fleet_rank_hosts}
