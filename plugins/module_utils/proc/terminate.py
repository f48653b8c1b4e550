"""End a set of processes: the one function in servelab that signals a process tree to stop.

Both llm_server's stop (server/launcher.py) and gpu_reap (gpu/reap.py) select what to end in
their own way (a launched server's members; GPU holders, patterns and cgroups grown to their
trees) and hand the selection to `terminate(plan)`, which owns the signalling rules:

1. SIGTERM to every target, then wait up to `grace` for them to exit (the wait ends as soon as
   they have); members the plan's `discover` finds meanwhile (children forked during shutdown)
   get SIGTERM too;
2. SIGKILL to what is left; a cgroup of the plan is killed whole with `cgroup.kill` (which also
   takes processes forked a moment ago) only when nothing protected is inside; wait up to
   `kill_timeout`;
3. report what ended after which signal (`killed`), what is still running (`survivors`, with its
   state: D is stuck in the kernel), and what exited without a signal of ours having a say
   (`vanished`: gone before it was signalled, or it ignored SIGTERM and left on its own).

Never signalled, whatever the plan lists: a protected pid (`plan.protected`, and with
`protect_caller` this process and its ancestors, the Ansible connection that runs it). A process
is pinned by its identity as selected (pid + start time, a pidfd where the kernel has them) and
re-checked before each signal, so a pid recycled meanwhile is never hit. A zombie counts as gone:
it has released its memory and device files, only its parent can reap it.

`end_children(pids, wait, ...)` is the same for this process's own children that were told to
stop some other way (the load generator's client and sender processes poll a shared stop flag):
it waits for them to exit by themselves, and hands what is left to `terminate`.
Standard library only.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.proc import cgroup as proc_cgroup
from ansible_collections.servelab.serving.plugins.module_utils.proc.lifetime import (
    PinnedProcess, collect_exited_children,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (
    PROC, ProcInfo, read_process, read_stat, scan_processes,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.tree import caller_lineage

SIGTERM = "SIGTERM"
SIGKILL = "SIGKILL"
CGROUP_KILL = "cgroup.kill"
SIGNAL_NAMES = {signal.SIGTERM: SIGTERM, signal.SIGKILL: SIGKILL}

# Where a tracked process came from.
ORIGIN_TARGET = "target"           # listed in plan.targets
ORIGIN_DISCOVERED = "discovered"   # returned by plan.discover during the call
ORIGIN_CGROUP = "cgroup"           # found in one of plan.cgroups when it was killed

# What happened to each of plan.cgroups.
CGROUP_KILLED = "cgroup.kill"      # killed whole with one write to cgroup.kill
CGROUP_PER_PROCESS = "cgroup.procs"  # its members listed and SIGKILLed one by one
CGROUP_PROTECTED = "protected"     # something protected inside: only the targets were killed
CGROUP_NOT_NEEDED = "not_needed"   # nothing of ours left inside when the SIGKILL step came
CGROUP_ABSENT = "absent"           # no such directory

_POLL_FIRST = 0.005                # most processes exit within milliseconds of SIGTERM
_POLL_MAX = 0.05


@dataclass(frozen=True)
class TerminationPlan:
    """What to end and how. `targets` are already selected (snapshots with their start time:
    the identity that is re-checked before each signal)."""
    targets: Sequence[ProcInfo]
    protected: Mapping[int, str] = field(default_factory=dict)   # pid -> why: never signalled
    cgroups: Sequence[str] = ()        # cgroup dirs that may be killed whole (see module doc)
    grace: float = 10.0                # seconds after SIGTERM before SIGKILL
    kill_timeout: float = 10.0         # seconds after SIGKILL before giving up (survivors)
    # Called every `discover_interval` while waiting, and once more whenever all tracked
    # processes have gone: members of the tree that appeared since (children forked during
    # shutdown). The caller's selection rules apply there; protection is still checked here.
    discover: Optional[Callable[[], Iterable[ProcInfo]]] = None
    discover_interval: float = 0.2
    collect_children: bool = False     # waitpid() targets that are our own children
    protect_caller: bool = True        # this process and its ancestors are protected too
    proc_root: str = PROC


@dataclass(frozen=True)
class ProcessOutcome:
    info: ProcInfo                     # the snapshot it was selected (or found) with
    origin: str                        # target | discovered | cgroup
    # killed: what ended it (SIGTERM | SIGKILL | cgroup.kill); survivors: the last signal sent
    # that could end it (None: it could not be signalled, e.g. not ours to signal); vanished: None
    signal: Optional[str] = None
    cgroup: Optional[str] = None       # origin cgroup: the directory it was found in
    state: Optional[str] = None        # survivors: the state when we gave up (D = in the kernel)

    @property
    def pid(self) -> int:
        return self.info.pid


@dataclass(frozen=True)
class Refusal:
    """A process the plan (or its discovery) named that is protected: never signalled."""
    pid: int
    reason: str


@dataclass(frozen=True)
class CgroupOutcome:
    path: str
    action: str                        # one of the CGROUP_* values above
    note: Optional[str] = None         # why it was not killed whole


@dataclass
class TerminationResult:
    killed: List[ProcessOutcome] = field(default_factory=list)
    survivors: List[ProcessOutcome] = field(default_factory=list)
    vanished: List[ProcessOutcome] = field(default_factory=list)
    refused: List[Refusal] = field(default_factory=list)
    cgroups: List[CgroupOutcome] = field(default_factory=list)
    term_seconds: float = 0.0          # SIGTERM and the grace wait
    kill_seconds: float = 0.0          # SIGKILL / cgroup.kill and the wait after it
    seconds: float = 0.0

    @property
    def signalled(self) -> List[ProcessOutcome]:
        """Everything a signal of ours reached, ended or not."""
        return self.killed + [s for s in self.survivors if s.signal is not None]


def terminate(plan: TerminationPlan) -> TerminationResult:
    """SIGTERM, grace, SIGKILL (cgroup.kill where allowed), wait; see the module doc."""
    run = _Termination(plan)
    try:
        return run.execute()
    finally:
        run.close()


def end_children(pids: Iterable[int], wait: float, grace: float = 5.0,
                 kill_timeout: float = 5.0, reap: bool = True,
                 proc_root: str = PROC) -> Optional[TerminationResult]:
    """Children of this process that were told to stop: wait up to `wait` for them to exit by
    themselves, then end what is left with terminate() (SIGTERM, `grace`, SIGKILL). `reap`:
    waitpid() them (children of os.fork); False leaves that to their owner (a
    multiprocessing.Process, whose join() must do it: a waitpid here would leave it believing
    the child alive). None when every one exited by itself."""
    infos = [read_process(pid, proc_root, stat_only=True) for pid in pids]
    pins = [PinnedProcess(info, proc_root) for info in infos
            if info is not None and not info.gone]
    live: List[PinnedProcess] = []
    try:
        reaped: Set[int] = set()
        deadline = time.monotonic() + wait
        delay = _POLL_FIRST
        while True:
            live = [p for p in pins if p.alive()]
            if reap:
                exited = [p.pid for p in pins if p.pid not in reaped and p not in live]
                collect_exited_children(exited)
                reaped.update(exited)
            left = deadline - time.monotonic()
            if not live or left <= 0:
                break
            time.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)
    finally:
        for p in pins:
            p.close()
    if not live:
        return None
    return terminate(TerminationPlan(targets=[p.info for p in live], grace=grace,
                                     kill_timeout=kill_timeout, collect_children=reap,
                                     proc_root=proc_root))


class _Tracked:
    """A process this call is ending, and the signal that may have ended it."""

    def __init__(self, pin: PinnedProcess, origin: str, cgroup: Optional[str] = None) -> None:
        self.pin = pin
        self.origin = origin
        self.cgroup = cgroup
        self.signal: Optional[str] = None
        self.collected = False

    def outcome(self, state: Optional[str] = None) -> ProcessOutcome:
        return ProcessOutcome(info=self.pin.info, origin=self.origin, signal=self.signal,
                              cgroup=self.cgroup, state=state)


class _Termination:
    def __init__(self, plan: TerminationPlan) -> None:
        self.plan = plan
        self.protected: Dict[int, str] = dict(plan.protected)
        if plan.protect_caller:
            for pid in caller_lineage(plan.proc_root):
                self.protected.setdefault(pid, "the caller or one of its ancestors")
        self.tracked: Dict[Tuple[int, int], _Tracked] = {}     # by identity, in order found
        self.refused: Dict[int, Refusal] = {}
        self.cgroups: Dict[str, CgroupOutcome] = {}
        self.per_process_cgroups: List[str] = []                # swept while waiting
        self.next_discovery = 0.0

    # -- tracking --------------------------------------------------------------------------

    def admit(self, info: ProcInfo, origin: str, cgroup: Optional[str] = None
              ) -> Optional[_Tracked]:
        key = (info.pid, info.start_time)
        if key in self.tracked:
            return None
        if info.pid in self.protected:
            self.refused.setdefault(info.pid, Refusal(info.pid, self.protected[info.pid]))
            return None
        tracked = _Tracked(PinnedProcess(info, self.plan.proc_root), origin, cgroup)
        self.tracked[key] = tracked
        return tracked

    def cgroup_paths(self) -> List[str]:
        return list(dict.fromkeys(self.plan.cgroups))     # each once, in the plan's order

    def live(self) -> List[_Tracked]:
        return [t for t in self.tracked.values() if t.pin.alive()]

    def tracked_pids(self) -> Set[int]:
        return {t.pin.pid for t in self.tracked.values()}

    def send(self, tracked: _Tracked, signum: int) -> None:
        # SIGKILL cannot be ignored; a SIGTERM the process ignores cannot be what ended it.
        ignored = signum != signal.SIGKILL and tracked.pin.ignores(signum)
        if tracked.pin.send(signum) and not ignored:
            tracked.signal = SIGNAL_NAMES[signum]

    def collect(self) -> None:
        if not self.plan.collect_children:
            return
        exited = [t for t in self.tracked.values() if not t.collected and not t.pin.alive()]
        collect_exited_children(t.pin.pid for t in exited)
        for t in exited:
            t.collected = True

    def discover(self, signum: Optional[int]) -> List[_Tracked]:
        """New members from the plan's discovery (and, in the SIGKILL step, new members of
        cgroups killed one by one), signalled with `signum`."""
        fresh: List[_Tracked] = []
        if self.plan.discover is not None:
            for info in self.plan.discover():
                tracked = self.admit(info, ORIGIN_DISCOVERED)
                if tracked is not None:
                    fresh.append(tracked)
        if signum == signal.SIGKILL:
            for path in self.per_process_cgroups:
                fresh += self.admit_cgroup_members(path)
        if signum is not None:
            for tracked in fresh:
                self.send(tracked, signum)
        self.next_discovery = time.monotonic() + self.plan.discover_interval
        return fresh

    def admit_cgroup_members(self, path: str) -> List[_Tracked]:
        """Members of `path` not tracked yet; none while something protected is inside (a new
        member may be a protected process's child, which its caller would protect)."""
        inside = proc_cgroup.member_pids(path)
        if any(pid in self.protected for pid in inside):
            return []
        fresh: List[_Tracked] = []
        for pid in sorted(inside - self.tracked_pids()):
            info = read_process(pid, self.plan.proc_root)
            if info is not None and not info.gone:
                tracked = self.admit(info, ORIGIN_CGROUP, path)
                if tracked is not None:
                    fresh.append(tracked)
        return fresh

    # -- the steps -------------------------------------------------------------------------

    def wait(self, timeout: float, signum: int) -> None:
        """Until every tracked process has gone (confirmed by one more discovery, if any) or
        `timeout` passes. Starts polling fast and backs off."""
        deadline = time.monotonic() + timeout
        delay = _POLL_FIRST
        may_discover = self.plan.discover is not None or (
            signum == signal.SIGKILL and bool(self.per_process_cgroups))
        while True:
            self.collect()
            live = self.live()
            if may_discover and (not live or time.monotonic() >= self.next_discovery):
                live += [t for t in self.discover(signum) if t.pin.alive()]
            left = deadline - time.monotonic()
            if not live or left <= 0:
                return
            time.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)

    def kill_cgroup(self, path: str) -> None:
        if not os.path.isdir(path):
            self.cgroups[path] = CgroupOutcome(path, CGROUP_ABSENT, "no such cgroup")
            return
        inside = proc_cgroup.member_pids(path)
        live_inside = [t for t in self.live() if t.pin.pid in inside]
        untracked = inside - self.tracked_pids()
        if not live_inside and not untracked:
            self.cgroups[path] = CgroupOutcome(path, CGROUP_NOT_NEEDED)
            return
        blocked = sorted(pid for pid in inside if pid in self.protected)
        if blocked:
            self.cgroups[path] = CgroupOutcome(
                path, CGROUP_PROTECTED,
                "not using cgroup.kill: protected process(es) %s inside; killed per process"
                % ", ".join(str(p) for p in blocked))
            return
        # Record the members that appeared since the selection before they die.
        victims = [t for t in live_inside + self.admit_cgroup_members(path) if t.pin.alive()]
        if proc_cgroup.has_kill(path):
            # Once the write returns they may already be gone, so what ended them is noted
            # first, and put back if the write fails.
            previous = [t.signal for t in victims]
            for t in victims:
                t.signal = CGROUP_KILL
            if proc_cgroup.kill(path):
                self.cgroups[path] = CgroupOutcome(path, CGROUP_KILLED)
                return
            for t, sig in zip(victims, previous):
                t.signal = sig
            note = "writing cgroup.kill failed: killed per process"
        else:
            note = "no cgroup.kill here (cgroup v1 or kernel < 5.14): killed per process"
        self.cgroups[path] = CgroupOutcome(path, CGROUP_PER_PROCESS, note)
        self.per_process_cgroups.append(path)

    def execute(self) -> TerminationResult:
        started = time.monotonic()
        for info in self.plan.targets:
            self.admit(info, ORIGIN_TARGET)
        for tracked in list(self.tracked.values()):
            self.send(tracked, signal.SIGTERM)
        self.next_discovery = time.monotonic() + self.plan.discover_interval
        self.wait(self.plan.grace, signal.SIGTERM)
        term_seconds = time.monotonic() - started

        kill_started = time.monotonic()
        for path in self.cgroup_paths():
            self.kill_cgroup(path)
        for tracked in self.live():
            if tracked.signal != CGROUP_KILL:
                self.send(tracked, signal.SIGKILL)
        self.wait(self.plan.kill_timeout, signal.SIGKILL)
        self.collect()
        result = self.result()
        result.term_seconds = term_seconds
        result.kill_seconds = time.monotonic() - kill_started
        result.seconds = time.monotonic() - started
        return result

    def result(self) -> TerminationResult:
        result = TerminationResult(refused=list(self.refused.values()),
                                   cgroups=[self.cgroups[p] for p in self.cgroup_paths()
                                            if p in self.cgroups])
        for tracked in self.tracked.values():
            if tracked.pin.alive():
                stat = read_stat(tracked.pin.pid, self.plan.proc_root)
                result.survivors.append(tracked.outcome(state=stat.state if stat else None))
            elif tracked.signal is not None:
                result.killed.append(tracked.outcome())
            else:
                result.vanished.append(tracked.outcome())
        return result

    def close(self) -> None:
        for tracked in self.tracked.values():
            tracked.pin.close()


def end_group(pgid: int, grace: float = 10.0, kill_timeout: float = 10.0,
              collect_children: bool = True, proc_root: str = PROC) -> TerminationResult:
    """End process group `pgid` (a child started in its own session: its pid is the group's id)
    with terminate(): SIGTERM to every member, `grace`, SIGKILL to what is left, `kill_timeout`.
    Members that join the group meanwhile are found and ended too, and the wait lasts until the
    whole group has gone, not only its leader (the old killpg loops stopped waiting when the
    leader exited, and left its children running)."""
    def members() -> List[ProcInfo]:
        return [info for info in scan_processes(proc_root, stat_only=True).values()
                if info.pgid == pgid and not info.gone]

    return terminate(TerminationPlan(targets=members(), grace=grace, kill_timeout=kill_timeout,
                                     discover=members, collect_children=collect_children,
                                     proc_root=proc_root))
