"""The preflight's records: one host's settings in, problems and target checks out."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

FIX = "fix it where it is set (group_vars, host_vars or -e)"
EXTERNAL = "external"               # the engine of an endpoint servelab did not start


@dataclass(frozen=True)
class Problem:
    variable: str                 # bench_profiles[1] (eagle3).engine, bench_slo.ttft_ms, ...
    message: str                  # the whole sentence, starting with the variable
    where: str = ""               # file:line the value came from, when Ansible knows it
    hosts: Tuple[str, ...] = ()

    def text(self) -> str:
        out = self.message
        if self.where:
            out += " (set at %s)" % self.where
        if self.hosts:
            out += " [%s]" % ", ".join(self.hosts)
        return out

    def as_dict(self) -> dict:
        return {"variable": self.variable, "message": self.message, "where": self.where,
                "hosts": list(self.hosts)}


@dataclass
class HostInput:
    """One GPU server's settings, as the bench role will see them."""
    host: str
    values: Dict[str, Any]                                    # defaults applied, templated
    given: Tuple[str, ...] = ()                               # bench_* names the host has set
    origins: Dict[str, str] = field(default_factory=dict)     # name (or name[i]) -> file:line
    errors: Dict[str, str] = field(default_factory=dict)      # name -> templating error
    # Whether its bench_client is this host's machine (fleet.same_machine; None: unknown).
    client_is_local: Optional[bool] = None
    # The inventory, for multi-node profiles (nodes.group): groups -> hosts, host -> ansible_host.
    groups: Dict[str, List[str]] = field(default_factory=dict)
    addresses: Dict[str, str] = field(default_factory=dict)


@dataclass
class TargetCheck:
    """What must be checked on one host (bench client, GPU server) by the bench_preflight module."""
    host: str
    workloads: List[dict] = field(default_factory=list)
    servers: List[dict] = field(default_factory=list)
    executables: List[dict] = field(default_factory=list)
    ports: List[dict] = field(default_factory=list)      # ports the run binds there: free?

    def as_dict(self) -> dict:
        return {"host": self.host, "workloads": self.workloads, "servers": self.servers,
                "executables": self.executables, "ports": self.ports}

    def count(self) -> int:
        return (len(self.workloads) + len(self.servers) + len(self.executables)
                + len(self.ports))


@dataclass
class Preflight:
    problems: List[Problem]
    target_checks: List[TargetCheck]
    hosts: Tuple[str, ...]
    profiles: int

    @property
    def ok(self) -> bool:
        return not self.problems
