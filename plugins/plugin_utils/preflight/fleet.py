"""bench.yml's preflight rules for where the load comes from (docs/architecture.md, section 1):
each GPU server is benchmarked from its own `bench_client` (default the first host of
`bench_clients`, else the controller), and a bench client on another machine reaches the server
over the network, at `bench_target_host:bench_server_port`.

The mistake caught here is the quiet one: a client on another machine pointed at a loopback
address (the role's default, right for the embedded inventory where the controller is every
host) would connect to its own loopback, not to the GPU server, and a server bound to loopback
cannot be reached from another machine at all. Both fail here, before anything starts, naming
the host, its client and the fix.

Whether two inventory hosts are one machine is decided from the inventory alone: the same
name, or both reached with `ansible_connection: local` (the implicit localhost is local).
Anything else counts as another machine. Pure functions; host.py (and the action) call them.
"""
from __future__ import annotations

import ipaddress
from typing import Callable, List, Mapping, Optional, Tuple

LOCAL = "local"
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1 or a name that always means this machine."""
    text = str(address or "").strip().strip("[]").lower()
    if text in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def same_machine(host: str, client: str, connection_of: Callable[[str], Optional[str]]) -> bool:
    """Whether `client` runs on `host`'s machine, as far as the inventory says: the same name, or
    both local connections. connection_of(name): the host's ansible_connection (None: unset)."""
    if host == client:
        return True
    return connection_of(host) == LOCAL and connection_of(client) == LOCAL


def launches_server(values: Mapping) -> bool:
    """Whether the host starts a server: a profile whose engine is not external (roles/bench
    vars/main.yml's __bench_launches)."""
    profiles = values.get("bench_profiles")
    if not isinstance(profiles, (list, tuple)):
        return False
    default = values.get("bench_engine")
    return any(isinstance(p, Mapping) and p.get("engine", default) != "external"
               for p in profiles)


def client_problems(host: str, values: Mapping,
                    client_is_local: Optional[bool]) -> List[Tuple[str, str]]:
    """(variable, message) for a GPU server whose bench client cannot reach the server it
    launches. client_is_local None (not known): nothing to say; a host whose profiles are all
    external endpoints launches nothing here (their base_url is checked elsewhere)."""
    if client_is_local is not False or not launches_server(values):
        return []
    client = str(values.get("bench_client") or "localhost")
    target = str(values.get("bench_target_host") or "")
    bind = str(values.get("bench_server_bind") or "")
    out = []
    if is_loopback(target):
        out.append(("bench_target_host", (
            "bench_target_host: %s is a loopback address, but %s is benchmarked from %s, another "
            "machine: the load would go to %s's own loopback, not to %s. Set bench_target_host "
            "to %s's address as %s reaches it (e.g. host_vars/%s.yml), and bench_server_bind to "
            "0.0.0.0 or that address" % (target, host, client, client, host, host, client, host))))
    if is_loopback(bind):
        out.append(("bench_server_bind", (
            "bench_server_bind: %s makes %s's server listen on its own loopback only, where its "
            "bench client %s (another machine) cannot reach it. Set bench_server_bind to 0.0.0.0 "
            "or the address in bench_target_host" % (bind, host, client))))
    return out
