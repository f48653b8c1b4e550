"""One model over several hosts (SGLang's --nnodes / --node-rank / --dist-init-addr), as data.

A profile's `nodes` names the hosts that serve it together, in rank order: an inventory group
(`group`, resolved on the controller by `resolve_nodes`, which knows the inventory) or a list
(`hosts`). Each host's rank is its position in that list; the distributed init address is rank
0's address and `port` (rank 0 hosts torch.distributed's TCP store there: SGLang passes
`tcp://<dist-init-addr>` as the init method and the other ranks connect to it).

`resolve_nodes` runs on the controller (filter servelab.serving.multinode_nodes); `parse_nodes`
runs in llm_server on each host and checks the resolved mapping again before anything starts.
Standard library only: this is module_utils.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

NODES_KEYS = ("group", "hosts", "addresses", "nnodes", "port", "this")
DEFAULT_DIST_INIT_PORT = 50000


class NodesError(ValueError):
    """Invalid `nodes`; the message names the key and the fix."""


@dataclass(frozen=True)
class NodeGroup:
    hosts: Tuple[str, ...]          # inventory names, rank order
    addresses: Mapping[str, str]    # inventory name -> address the other ranks reach it at
    port: int                       # dist-init port on rank 0
    this: str                       # the host this server runs on
    group: Optional[str] = None

    @property
    def nnodes(self) -> int:
        return len(self.hosts)

    @property
    def rank(self) -> int:
        return self.hosts.index(self.this)

    @property
    def dist_init_addr(self) -> str:
        address = self.addresses.get(self.hosts[0], self.hosts[0])
        host = f"[{address}]" if ":" in address and not address.startswith("[") else address
        return f"{host}:{self.port}"


def _port(value, where: str) -> int:
    try:
        port = int(str(value).strip())
    except ValueError:
        raise NodesError(f"{where}.port must be a port number (1024-65530), got {value!r}") from None
    if not 1024 <= port <= 65530:
        raise NodesError(f"{where}.port must be in 1024-65530 (SGLang also uses the next few ports "
                         f"above it on rank 0), got {port}")
    return port


def _hosts(value, where: str) -> Tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(h, str) and h for h in value):
        raise NodesError(f"{where}.hosts must be a list of inventory host names in rank order")
    hosts = tuple(value)
    duplicates = sorted({h for h in hosts if hosts.count(h) > 1})
    if duplicates:
        raise NodesError(f"{where}.hosts lists {', '.join(duplicates)} more than once: one rank per host")
    if len(hosts) < 2:
        raise NodesError(f"{where}: {len(hosts)} host(s) in the node list; a multi-node profile needs at "
                         f"least 2 (for one host, drop `nodes`)")
    return hosts


def _check_nnodes(raw: Mapping, hosts: Tuple[str, ...], where: str, source: str) -> None:
    if raw.get("nnodes") is None:
        return
    try:
        nnodes = int(str(raw["nnodes"]).strip())
    except ValueError:
        raise NodesError(f"{where}.nnodes must be an integer, got {raw['nnodes']!r}") from None
    if nnodes != len(hosts):
        raise NodesError(f"{where}.nnodes is {nnodes} but {source} has {len(hosts)} host(s) "
                         f"({', '.join(hosts)}): make them agree (or drop nnodes: it is the "
                         f"number of hosts)")


def resolve_nodes(raw: Any, this: str, groups: Mapping[str, Any], addresses: Mapping[str, str],
                  default_port: Any = DEFAULT_DIST_INIT_PORT, where: str = "nodes") -> dict:
    """Controller side: `nodes` with `group` or `hosts` -> the mapping llm_server takes (hosts in
    rank order, their addresses, port, this host). Raises NodesError."""
    if not isinstance(raw, Mapping):
        raise NodesError(f"{where} must be a mapping with `group` (an inventory group, hosts in rank "
                         f"order) or `hosts` (a list), and optionally nnodes and port")
    unknown = sorted(str(k) for k in raw if k not in NODES_KEYS)
    if unknown:
        raise NodesError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: group, hosts, nnodes, port")
    group = raw.get("group")
    if group and raw.get("hosts"):
        raise NodesError(f"{where}: give group or hosts, not both")
    if group:
        if group not in groups:
            raise NodesError(f"{where}.group {group!r} is not a group of the inventory: add it with the "
                             f"hosts in rank order (rank 0 first), or list them in {where}.hosts")
        hosts = _hosts(list(groups[group]), f"{where} (group {group!r})")
        source = f"group {group!r}"
    elif raw.get("hosts") is not None:
        hosts = _hosts(raw["hosts"], where)
        source = f"{where}.hosts"
    else:
        raise NodesError(f"{where} needs `group` (an inventory group, hosts in rank order) or `hosts`")
    if this not in hosts:
        raise NodesError(f"{where}: {this} is not in {source} ({', '.join(hosts)}): run the profile on "
                         f"one of its hosts (rank 0, {hosts[0]}, drives it) or add {this} to the group")
    _check_nnodes(raw, hosts, where, source)
    return {
        "group": str(group) if group else None,
        "hosts": list(hosts),
        "addresses": {h: str(addresses.get(h) or h) for h in hosts},
        "port": _port(raw.get("port", default_port), where),
        "nnodes": len(hosts),
        "this": this,
    }


def parse_nodes(raw: Any, where: str) -> Optional[NodeGroup]:
    """Target side (llm_server): the resolved mapping -> NodeGroup, checked again. None: one host."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise NodesError(f"{where}.nodes must be a mapping (see docs/contracts.md: nodes)")
    unknown = sorted(str(k) for k in raw if k not in NODES_KEYS)
    if unknown:
        raise NodesError(f"{where}.nodes: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(NODES_KEYS)}")
    if raw.get("hosts") is None:
        hint = f" (group {raw['group']!r} was not resolved)" if raw.get("group") else ""
        raise NodesError(f"{where}.nodes has no hosts{hint}: the bench role resolves nodes.group on the "
                         f"controller; calling llm_server directly, give nodes.hosts (rank order) and nodes.this")
    hosts = _hosts(raw["hosts"], f"{where}.nodes")
    this = raw.get("this")
    if not this:
        raise NodesError(f"{where}.nodes.this is required: the inventory name of the host this server runs on")
    if this not in hosts:
        raise NodesError(f"{where}.nodes: {this} is not in nodes.hosts ({', '.join(hosts)})")
    _check_nnodes(raw, hosts, f"{where}.nodes", "nodes.hosts")
    addresses = raw.get("addresses") or {}
    if not isinstance(addresses, Mapping):
        raise NodesError(f"{where}.nodes.addresses must be a mapping of host: address")
    return NodeGroup(hosts=hosts, addresses={str(k): str(v) for k, v in addresses.items()},
                     port=_port(raw.get("port", DEFAULT_DIST_INIT_PORT), f"{where}.nodes"),
                     this=str(this), group=raw.get("group"))
