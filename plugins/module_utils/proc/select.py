"""Which processes the reaper may kill: a pure function of a process table and a policy.

Seeds are found three ways: processes holding the GPU device files, processes whose command line
(or kernel name) matches a pattern, processes in the server's cgroups. The selection then grows
to what belongs to a seed:
- its descendants;
- the process group and the session it leads;
- the process group it sits in when that group's leader is gone (an orphaned server tree:
  the launcher died, its workers were reparented to init but kept their group id).
A group or session led by a live process that is not a target is never taken as a whole: that
leader is the user's shell or script, and its other jobs are not ours.

Never selected, whatever matches: PID 1 and the init of any nested pid namespace (a container's
init), kernel threads, the reaper itself and its ancestors (the Ansible connection that runs it),
built-in infrastructure (sshd, Ansible, the NVIDIA daemons, LXC: those processes themselves, not
what runs under them), and whatever `protect` patterns or `protect_pids` name, with their
descendants (protecting a job protects its workers).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Pattern, Sequence, Set

from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import DeviceHit
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import ProcInfo
from ansible_collections.servelab.serving.plugins.module_utils.proc.tree import (
    ancestors, children_map, descendants,
)

# Process names of SGLang and vLLM workers. Both rename their processes with setproctitle, which
# rewrites /proc/<pid>/cmdline (and comm, cut to 15 chars):
#   SGLang: sglang::scheduler[_DP<d>]_TP<r>, sglang::detokenizer,
#           sglang::gpu_worker_TP<r>_PP<p>, sglang::tokenizer_worker:<pid>,
#           sglang::async_draft_runner(...), sglang::data_parallel_*;
#           the launcher is `python -m sglang.launch_server ...` or `sglang serve ...`.
#   vLLM:   VLLM::EngineCore[_DP<r>], VLLM::Worker[_TP<r>...], VLLM::APIServer_<i>,
#           VLLM::DPCoordinator (prefix VLLM_PROCESS_NAME_PREFIX, default VLLM); older releases
#           title workers "VllmWorker TP<r>"; the launcher is `vllm serve` or
#           `python -m vllm.entrypoints.openai.api_server`.
DEFAULT_PATTERNS = (
    r"^sglang::",
    r"(^|\s)-m\s+sglang\.launch_server(\s|$)",
    r"(^|[\s/])sglang\s+serve(\s|$)",
    r"^VLLM::",
    r"^VllmWorker",
    r"(^|[\s/])vllm\s+serve(\s|$)",
    r"(^|\s)-m\s+vllm\.entrypoints\.",
)

# Kernel names (comm) that are never targets: the connection Ansible came in on, GPU
# infrastructure daemons that legitimately hold /dev/nvidia* (killing nv-fabricmanager takes an
# NVSwitch system's GPUs down), and LXC plumbing. Exact match on comm.
BUILTIN_PROTECTED_NAMES = frozenset((
    "sshd", "sshd-session", "sshd-auth", "ssh", "systemd", "init", "login", "su", "sudo",
    "nvidia-persistenced", "nv-fabricmanager", "nvidia-fabricmanager", "nv-hostengine",
    "nvidia-powerd", "nvidia-smi", "dcgm-exporter", "dcgmi", "Xorg", "Xwayland",
    "lxc-start", "lxc-attach", "lxc-monitord", "lxcfs", "pct",
))
# Command lines that are Ansible itself (controller, runner, a module on its way to run).
BUILTIN_PROTECTED_CMDLINE = re.compile(
    r"(^|[\s/])ansible(-playbook|-runner|-connection|-pull|-console)?(\s|$)|AnsiballZ_")


@dataclass(frozen=True)
class Candidate:
    pid: int
    # device_fd, device_mmap, pattern, cgroup (seeds); descendant, process_group, session
    found_by: str
    seed_pid: Optional[int]       # the seed it was reached from (None for seeds)
    detail: str                   # device path, pattern, cgroup dir, or how it relates


@dataclass
class SelectionPolicy:
    self_pid: int
    patterns: Sequence[Pattern] = ()
    protect: Sequence[Pattern] = ()
    protect_pids: Sequence[int] = ()
    builtin_protect: bool = True
    scope: Optional[Set[int]] = None                       # host variant: the container's pids
    cgroup_members: Dict[int, str] = field(default_factory=dict)   # pid -> cgroup dir
    exclude: Set[int] = field(default_factory=set)         # already handled (earlier rounds)
    owned_groups: Set[int] = field(default_factory=set)    # groups/sessions of earlier rounds'
    owned_sessions: Set[int] = field(default_factory=set)  # targets (members are their forks)


@dataclass
class Selection:
    targets: Dict[int, Candidate]
    spared: Dict[int, str]        # pid -> why it is never touched (only those that matched)
    never: Dict[int, str]         # pid -> why, for every process that must not be signalled


def compile_patterns(field_name: str, patterns: Iterable[str]) -> List[Pattern]:
    """Compile regexes; a bad one is a ValueError naming the option and the culprit."""
    out: List[Pattern] = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise ValueError("%s: %r is not a valid regular expression (%s); fix or quote it"
                             % (field_name, p, exc))
    return out


def _matches(patterns: Sequence[Pattern], info: ProcInfo) -> Optional[str]:
    for pat in patterns:
        if pat.search(info.cmdline) or pat.search(info.comm):
            return pat.pattern
    return None


def never_touch(table: Dict[int, ProcInfo], policy: SelectionPolicy) -> Dict[int, str]:
    """pid -> reason for every process that must not be signalled."""
    never: Dict[int, str] = {}
    never[policy.self_pid] = "the reaper itself"
    for pid in ancestors(policy.self_pid, table):
        never.setdefault(pid, "ancestor of the reaper (its Ansible connection)")
    kids = children_map(table)
    protected_roots: Dict[int, str] = {}
    for info in table.values():
        if info.pid == 1:
            never.setdefault(1, "init")
        elif info.kernel_thread:
            never.setdefault(info.pid, "kernel thread")
        elif info.namespace_init:
            never.setdefault(info.pid, "init of a pid namespace (a container's init)")
        pat = _matches(policy.protect, info)
        if pat is not None:
            protected_roots[info.pid] = "protect pattern %s" % pat
        elif info.pid in policy.protect_pids:
            protected_roots[info.pid] = "protect_pids"
        elif policy.builtin_protect and (info.comm in BUILTIN_PROTECTED_NAMES or
                                         BUILTIN_PROTECTED_CMDLINE.search(info.cmdline)):
            # the process only: every login descends from sshd, every service from systemd
            never.setdefault(info.pid, "built-in protection (%s)" % info.comm)
    for pid, why in protected_roots.items():
        never.setdefault(pid, why)
        for d in descendants(pid, kids):
            never.setdefault(d, "descendant of protected %d (%s)" % (pid, why))
    return never


def select_targets(table: Dict[int, ProcInfo], device_hits: Dict[int, DeviceHit],
                   policy: SelectionPolicy) -> Selection:
    never = never_touch(table, policy)
    spared: Dict[int, str] = {}
    targets: Dict[int, Candidate] = {}

    def eligible(pid: int) -> bool:
        info = table.get(pid)
        if info is None or info.gone or pid in policy.exclude:
            return False
        if policy.scope is not None and pid not in policy.scope:
            return False
        if pid in never:
            spared[pid] = never[pid]
            return False
        return True

    def add(cand: Candidate) -> bool:
        if cand.pid in targets or not eligible(cand.pid):
            return False
        targets[cand.pid] = cand
        return True

    # 1. seeds
    for pid in sorted(device_hits):
        hit = device_hits[pid]
        add(Candidate(pid, hit.how, None, ", ".join(hit.paths)))
    for pid in sorted(policy.cgroup_members):
        add(Candidate(pid, "cgroup", None, policy.cgroup_members[pid]))
    if policy.patterns:
        for pid in sorted(table):
            pat = _matches(policy.patterns, table[pid])
            if pat is not None:
                add(Candidate(pid, "pattern", None, pat))
    for pid in sorted(table):
        info = table[pid]
        if info.pgid in policy.owned_groups and info.pgid > 1:
            add(Candidate(pid, "process_group", None, "group %d of reaped processes" % info.pgid))
        elif info.sid in policy.owned_sessions and info.sid > 1:
            add(Candidate(pid, "session", None, "session %d of reaped processes" % info.sid))

    # 2. grow to a fixpoint: descendants, led groups/sessions, orphaned groups
    kids = children_map(table)
    by_pgid: Dict[int, List[int]] = {}
    by_sid: Dict[int, List[int]] = {}
    for info in table.values():
        by_pgid.setdefault(info.pgid, []).append(info.pid)
        by_sid.setdefault(info.sid, []).append(info.pid)

    def root_of(pid: int) -> int:
        cand = targets[pid]
        return cand.seed_pid if cand.seed_pid is not None else pid

    def grow_descendants() -> None:
        for pid in list(targets):
            for d in descendants(pid, kids):
                add(Candidate(d, "descendant", root_of(pid), "descendant of %d" % pid))

    def grow_groups() -> bool:
        grown = False
        for pid in list(targets):
            info = table[pid]
            if info.pgid == pid:
                for m in by_pgid.get(pid, ()):
                    grown |= add(Candidate(m, "process_group", root_of(pid),
                                           "group led by %d" % pid))
            if info.sid == pid:
                for m in by_sid.get(pid, ()):
                    grown |= add(Candidate(m, "session", root_of(pid), "session led by %d" % pid))
            if info.pgid > 1 and info.pgid not in table:
                # the leader has exited: the group is what is left of a dead launcher's tree
                for m in by_pgid.get(info.pgid, ()):
                    grown |= add(Candidate(m, "process_group", root_of(pid),
                                           "orphaned group %d (leader gone) with %d"
                                           % (info.pgid, pid)))
        return grown

    # descendants first, so each process is reported by its closest relation
    while True:
        grow_descendants()
        if not grow_groups():
            break
    return Selection(targets=targets, spared=spared, never=never)
