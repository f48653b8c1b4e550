"""The CPU a level costs on the bench client, beyond what the client processes report themselves.

A client process measures its own CPU (time.process_time) and stops the clock when its event loop
stops; handing the results to the parent (pickling every request over a pipe) comes after, and
in a firehose that is 8-14% of its CPU. The kernel's account is complete: run_level reaps its
client processes, so their whole CPU lands in this process's RUSAGE_CHILDREN, and the difference
across the level is what they really used (what /proc showed for them, to the microsecond).

Beside the clients, two more consumers share the machine: this module process (the controller
loop, the /metrics sampler) and, when Ansible runs on the bench client itself (the embedded
default, a controller benchmarking a remote server), Ansible's own processes. Ansible is found as
the topmost ancestor whose command is an ansible-* program; its processes are that one and all
its descendants except this process's own subtree and any other load generator's. Their CPU
(utime + stime + the waited-for children's) is read from /proc at the level's start, window
start, window end and end.

A bench client may serve several GPU servers at once (bench.yml over a fleet, one bench_client
for many servers): each sweep's load generator names itself LOADGEN_COMM (its client processes
inherit the name), so another sweep's is neither counted as Ansible's CPU nor missed: the level
says how many others shared the client (`shared_with`).

Standard library only: shipped to targets with the load generator.
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (
    PROC, ProcInfo, read_stat, scan_processes,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.tree import (
    ancestors, children_map, descendants,
)

NS_PER_S = 1_000_000_000
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def children_cpu_ns() -> int:
    """CPU (user + system) of every child this process has reaped so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((usage.ru_utime + usage.ru_stime) * NS_PER_S)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; a cgroup quota is not looked at)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _is_ansible(info: ProcInfo) -> bool:
    # "python3 .../bin/ansible-playbook site.yml", "ansible-runner ...": argv[0] or argv[1].
    # The module itself runs as "python3 .../AnsiballZ_llm_bench.py": not an ansible-* program.
    for word in info.cmdline.split()[:2]:
        if os.path.basename(word).startswith("ansible"):
            return True
    return False


# The name (/proc/<pid>/comm, 15 characters at most) a load generator gives itself while it runs
# a level; the client processes it forks inherit it.
LOADGEN_COMM = "servelab-load"


def mark_load_generator(proc_root: str = PROC) -> None:
    """Name this process LOADGEN_COMM (Linux; elsewhere nothing happens): another sweep on this
    machine then knows it for a load generator, not one of Ansible's processes."""
    try:
        with open(os.path.join(proc_root, "self", "comm"), "w", encoding="ascii") as fh:
            fh.write(LOADGEN_COMM)
    except OSError:
        pass


def _is_load_generator(table: dict, pid: int) -> bool:
    info = table.get(pid)
    return info is not None and info.comm == LOADGEN_COMM


def ansible_pids(proc_root: str = PROC, me: Optional[int] = None) -> List[int]:
    """Ansible's processes on this machine that run us, without our own subtree nor another
    load generator's (a sibling sweep on a shared bench client); [] when no ancestor is Ansible
    (it runs on another machine, or this is a plain Python caller)."""
    me = os.getpid() if me is None else me
    table = scan_processes(proc_root)
    tops = [pid for pid in ancestors(me, table) if pid in table and _is_ansible(table[pid])]
    if not tops:
        return []
    top = tops[-1]
    return [top] + descendants(top, children_map(table),
                               prune=lambda pid: pid == me or _is_load_generator(table, pid))


def other_load_generators(proc_root: str = PROC, me: Optional[int] = None) -> List[int]:
    """The other sweeps' load generators running on this machine now (the processes named
    LOADGEN_COMM whose parent is not one: the sweeps, not their client processes), outside this
    process's own subtree."""
    me = os.getpid() if me is None else me
    table = scan_processes(proc_root)
    mine = set(descendants(me, children_map(table))) | {me}
    return sorted(pid for pid, info in table.items()
                  if pid not in mine and info.comm == LOADGEN_COMM and not info.gone
                  and not _is_load_generator(table, info.ppid))


def processes_cpu_ns(pids: Sequence[int], proc_root: str = PROC) -> int:
    """Summed CPU of `pids` (and of their waited-for children) now; gone ones count 0."""
    ticks = 0
    for pid in pids:
        stat = read_stat(pid, proc_root)
        if stat is not None:
            ticks += stat.cpu_ticks
    return ticks * NS_PER_S // CLK_TCK


def host_cpu_ticks(proc_root: str = PROC) -> Optional[tuple]:
    """(busy, total) clock ticks of all CPUs from /proc/stat's first line (busy: neither idle
    nor iowait); None where there is no /proc/stat."""
    try:
        with open(os.path.join(proc_root, "stat"), encoding="ascii") as fh:
            first = fh.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:9]]
    total = sum(values)
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return total - idle, total


@dataclass(frozen=True)
class CpuSnapshot:
    t_ns: int
    module_ns: int                 # this process's own CPU (all its threads)
    ansible_ns: Optional[int]      # None: Ansible does not run on this machine
    host: Optional[tuple]          # host_cpu_ticks()


class LevelCpu:
    """Snapshots at the level's start, window start, window end and end."""

    def __init__(self, proc_root: str = PROC):
        self.proc_root = proc_root
        self.ansible = ansible_pids(proc_root)
        # Other sweeps on this bench client, at the start and the end of the level.
        self.others = set(other_load_generators(proc_root))
        self.children_start = children_cpu_ns()
        self.start = self.snapshot()
        self.ws: Optional[CpuSnapshot] = None
        self.we: Optional[CpuSnapshot] = None
        self.end: Optional[CpuSnapshot] = None
        self.children_end: Optional[int] = None

    def snapshot(self) -> CpuSnapshot:
        return CpuSnapshot(
            t_ns=time.monotonic_ns(), module_ns=time.process_time_ns(),
            ansible_ns=processes_cpu_ns(self.ansible, self.proc_root) if self.ansible else None,
            host=host_cpu_ticks(self.proc_root))

    def mark_ws(self) -> None:
        self.ws = self.snapshot()

    def mark_we(self) -> None:
        self.we = self.snapshot()

    def finish(self) -> None:
        """After the client processes were reaped."""
        self.end = self.snapshot()
        self.children_end = children_cpu_ns()
        self.others |= set(other_load_generators(self.proc_root))

    @property
    def shared_with(self) -> int:
        """How many other sweeps' load generators ran on this machine during the level (seen at
        its start or its end)."""
        return len(self.others)

    # -- figures ----------------------------------------------------------------------------

    def clients_ns(self) -> Optional[int]:
        if self.children_end is None:
            return None
        return self.children_end - self.children_start

    def module_s(self) -> Optional[float]:
        return None if self.end is None else (self.end.module_ns - self.start.module_ns) / NS_PER_S

    def ansible_s(self) -> Optional[float]:
        if self.end is None or self.start.ansible_ns is None or self.end.ansible_ns is None:
            return None
        return max(0, self.end.ansible_ns - self.start.ansible_ns) / NS_PER_S

    def window_overhead_ns(self) -> int:
        """This module's and Ansible's CPU inside the window (0 when it was not marked)."""
        if self.ws is None or self.we is None:
            return 0
        used = self.we.module_ns - self.ws.module_ns
        if self.ws.ansible_ns is not None and self.we.ansible_ns is not None:
            used += max(0, self.we.ansible_ns - self.ws.ansible_ns)
        return used

    def host_window_util(self) -> Optional[float]:
        """The machine's CPU busy over the window, as a fraction of all its CPUs."""
        if self.ws is None or self.we is None or self.ws.host is None or self.we.host is None:
            return None
        busy = self.we.host[0] - self.ws.host[0]
        total = self.we.host[1] - self.ws.host[1]
        return busy / total if total > 0 else None
