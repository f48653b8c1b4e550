"""Which processes the reaper may kill: a pure function of a process table and a policy.

Seeds are found three ways:
- processes holding the GPU device files with a CUDA context (whoever owns them: a context
  pins GPU memory, and the GPU is what the reap frees);
- processes in the server's cgroups (`cgroups`);
- processes whose executed command (or kernel name) matches a pattern: what the process runs
  (proc/executes.py: the program, a Python interpreter's script or `-m` module and its
  subcommand, a shell's script, a setproctitle title), not any word of its argv, so
  `tail -f .../servelab_simulator.pyz`, an editor on it, or the `bash -c "python ...; sleep"`
  around a server (the python child is the match) are bystanders, reported in `spared`. A
  pattern is still only a name, and names are easy to share: another user's own `vllm serve`,
  a CPU-only launcher of the same name, a tmux server started as `tmux new 'vllm serve ...'`
  (its comm is "tmux: server", so it is a session manager, never a target). So a match alone
  takes a process only within `pattern_scope`:
    own_gpu (default): it runs as the user the reap acts for (the reaper's effective uid; from
             the Proxmox host, the container's root) AND it holds a CUDA context or lives in a
             servelab server's cgroup (`<cgroup root>/servelab/...`, where llm_server starts
             servers);
    own:     it runs as that user, GPU or not;
    any:     every match (the behaviour before pattern_scope existed).
  Every match left out is reported in `spared` with the reason.

The selection then grows to what belongs to a seed:
- its descendants, never below a terminal multiplexer, login/session manager or login shell
  (a tmux server's windows are the user's sessions, not the seed's tree);
- the process group and the session it leads;
- the process group it sits in when that group's leader is gone (an orphaned server tree:
  the launcher died, its workers were reparented to init but kept their group id).
The rule behind it: a group or session is taken whole only when its leader is itself a target
(the seed leads it: its members are its forks) or, for a group, gone. A group or session led by
a live process that is not a target is never taken as a whole: that leader is the user's shell,
tmux pane or script, and its other jobs (sibling windows, the next command) are not ours. So a
seed inside a tmux window takes its own subtree and its own job's group, never sibling windows.

Never selected, whatever matches: PID 1 and the init of any nested pid namespace (a container's
init), kernel threads, the reaper itself and its ancestors (the Ansible connection that runs it),
built-in infrastructure (sshd, Ansible, the NVIDIA daemons, LXC, terminal multiplexers and
session managers: those processes themselves, not what runs under them), and whatever `protect`
patterns or `protect_pids` name, with their descendants (protecting a job protects its workers).

For the report, the selection also lists the non-targets whose fate is tied to a target's
(`related`: its other descendants, its parent, its group and session, the spared matches): when
one of them exits during the reap (a child killed by its parent's exit, a launcher that quits
when its workers die, a group hung up), the reaper reports it instead of losing it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Pattern, Sequence, Set

from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import DeviceHit
from ansible_collections.servelab.serving.plugins.module_utils.proc.executes import executed
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

# How far a pattern match alone reaches (see the module doc).
PATTERN_SCOPE_OWN_GPU = "own_gpu"
PATTERN_SCOPE_OWN = "own"
PATTERN_SCOPE_ANY = "any"
PATTERN_SCOPES = (PATTERN_SCOPE_OWN_GPU, PATTERN_SCOPE_OWN, PATTERN_SCOPE_ANY)

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

# Processes that hold other people's sessions: terminal multiplexers (tmux renames its server
# "tmux: server", keeping the command line it was started with, which may well say
# `vllm serve`), login and session managers, `systemd --user` and its (sd-pam). Exact match on
# comm. Such a process is never a target, and its subtree is never a seed's tree.
SESSION_MANAGER_COMM = re.compile(
    r"^(tmux(: (server|client))?|tmate|screen|SCREEN|zellij|dtach|abduco|mosh-server|"
    r"sshd(-session|-auth)?|login|su|sudo|systemd|\(sd-pam\)|agetty|getty|script|"
    r"gdm-session-wor|sddm-helper|lightdm|xrdp|xrdp-sesman)$")


@dataclass(frozen=True)
class Candidate:
    pid: int
    # seeds: device_fd, device_mmap, pattern, cgroup; growth: descendant, process_group,
    # session; related (non-targets, Selection.related): descendant, parent, process_group,
    # session, spared
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
    pattern_scope: str = PATTERN_SCOPE_OWN_GPU
    # The user the reap acts for (a pattern match of another user is spared); None = unknown,
    # which spares every match outside pattern_scope `any`.
    owner_uid: Optional[int] = None
    # pid -> servelab server cgroup dir (`<cgroup root>/servelab/<name>`): where llm_server
    # starts servers, so a match in one is a server's process even without a CUDA context.
    server_cgroup_members: Dict[int, str] = field(default_factory=dict)


@dataclass
class Selection:
    targets: Dict[int, Candidate]
    spared: Dict[int, str]        # pid -> why it is not taken (only those that matched)
    never: Dict[int, str]         # pid -> why, for every process that must not be signalled
    # non-targets whose fate is tied to a target's: watched, so that one that exits during the
    # reap is reported (vanished) instead of silently missing
    related: Dict[int, Candidate] = field(default_factory=dict)


def compile_patterns(field_name: str, patterns: Iterable[str]) -> List[Pattern]:
    """Compile regexes; a bad one is a ValueError naming the option and the culprit."""
    out: List[Pattern] = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as exc:
            raise ValueError("%s: %r is not a valid regular expression (%s); fix or quote it"
                             % (field_name, p, exc)) from exc
    return out


def _matches(patterns: Sequence[Pattern], info: ProcInfo) -> Optional[str]:
    for pat in patterns:
        if pat.search(info.cmdline) or pat.search(info.comm):
            return pat.pattern
    return None


def _executes(patterns: Sequence[Pattern], info: ProcInfo) -> Optional[str]:
    """The first pattern matching what info executes (its kernel name or the executed view of
    its argv), or None. Patterns that pick targets go through here; protect patterns keep
    matching the whole command line (protecting too much is safe, killing too much is not)."""
    view = executed(info.cmdline)
    for pat in patterns:
        if pat.search(view) or pat.search(info.comm):
            return pat.pattern
    return None


def session_manager(info: ProcInfo) -> Optional[str]:
    """Why `info` holds other people's sessions (a terminal multiplexer, a login or session
    manager, a login shell), or None."""
    if SESSION_MANAGER_COMM.match(info.comm):
        return "terminal multiplexer or session manager (%s)" % info.comm
    if info.cmdline.startswith("-"):          # argv[0] "-bash": how login(1) starts a shell
        return "login shell (%s)" % info.cmdline.split()[0]
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
        elif policy.builtin_protect and session_manager(info):
            # the process only: a GPU job in one of its windows is still a GPU job
            never.setdefault(info.pid, "%s: its sessions are the user's"
                             % session_manager(info))
    for pid, why in protected_roots.items():
        never.setdefault(pid, why)
        for d in descendants(pid, kids):
            never.setdefault(d, "descendant of protected %d (%s)" % (pid, why))
    return never


def pattern_refusal(info: ProcInfo, holds_cuda: bool, policy: SelectionPolicy) -> Optional[str]:
    """Why a pattern match is not a seed under policy.pattern_scope, or None if it is."""
    scope = policy.pattern_scope
    if scope == PATTERN_SCOPE_ANY:
        return None
    if policy.owner_uid is None or info.uid != policy.owner_uid:
        return ("runs as uid %s, not as uid %s the reap acts for (pattern_scope %s; `any` "
                "takes every user's matches)" % (info.uid, policy.owner_uid, scope))
    if scope == PATTERN_SCOPE_OWN or holds_cuda or info.pid in policy.server_cgroup_members:
        return None
    return ("holds no CUDA context and is in no servelab server cgroup (pattern_scope %s; "
            "`own` takes the reaping user's matches without a GPU)" % scope)


def _subtree(pid: int, kids: Dict[int, List[int]], table: Dict[int, ProcInfo]) -> List[int]:
    """Descendants of pid, not entering a session manager's subtree (its windows and logins
    belong to the user, even when the manager itself was started from a seed)."""
    def is_manager(p: int) -> bool:
        info = table.get(p)
        return info is not None and session_manager(info)
    return descendants(pid, kids, prune=is_manager)


def select_targets(table: Dict[int, ProcInfo], device_hits: Dict[int, DeviceHit],
                   policy: SelectionPolicy) -> Selection:
    """The targets (device_hits: the CUDA-context holders, see gpu/reap.py) and why the
    matches left out are left out."""
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
            info = table[pid]
            pat = _executes(policy.patterns, info)
            if pat is None:
                named = _matches(policy.patterns, info)
                if named is not None and pid not in targets and eligible(pid):
                    spared[pid] = ("names %s in its arguments but does not execute it (it runs "
                                   "%s): a bystander" % (named, executed(info.cmdline)))
                continue
            if pid in targets:
                continue
            refusal = pattern_refusal(info, pid in device_hits, policy)
            if refusal is not None:
                if eligible(pid):          # a protected match reports its protection instead
                    spared[pid] = "matches %s but %s" % (pat, refusal)
                continue
            detail = pat
            if pid in policy.server_cgroup_members:
                detail += " (in servelab server cgroup %s)" % policy.server_cgroup_members[pid]
            add(Candidate(pid, "pattern", None, detail))
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
            if session_manager(table[pid]):    # only with builtin_protect off
                continue
            for d in _subtree(pid, kids, table):
                add(Candidate(d, "descendant", root_of(pid), "descendant of %d" % pid))

    def grow_groups() -> bool:
        grown = False
        for pid in list(targets):
            info = table[pid]
            if session_manager(info):
                # only with builtin_protect off: a multiplexer's session is still the user's
                continue
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
    for pid in targets:
        spared.pop(pid, None)      # a refused match that belongs to a target's tree after all
    sel = Selection(targets=targets, spared=spared, never=never)
    sel.related = related_processes(table, sel, policy, kids, by_pgid, by_sid)
    return sel


def related_processes(table: Dict[int, ProcInfo], sel: Selection, policy: SelectionPolicy,
                      kids: Dict[int, List[int]], by_pgid: Dict[int, List[int]],
                      by_sid: Dict[int, List[int]]) -> Dict[int, Candidate]:
    """Non-targets whose fate is tied to a target's: every descendant (also below a session
    manager or protected), the parent, the members of its group and session, and the spared
    matches. Ending a target can end them too (a child with a parent-death signal or a pipe to
    its parent, a launcher that exits when its workers die, a group hung up with its leader);
    the reaper does not signal them, but it reports those that exit during the reap."""
    skip = {policy.self_pid} | set(ancestors(policy.self_pid, table))

    def why(pid: int) -> str:
        if pid in sel.never:
            return sel.never[pid]
        if pid in sel.spared:
            return sel.spared[pid]
        if policy.scope is not None and pid not in policy.scope:
            return "outside the container"
        return "no rule selects it"

    related: Dict[int, Candidate] = {}

    def note(pid: int, relation: str, target: Optional[int]) -> None:
        info = table.get(pid)
        if (pid in sel.targets or pid in related or pid in skip or pid <= 1 or info is None
                or info.gone or info.kernel_thread or pid in policy.exclude):
            return
        rel = "spared" if target is None else "%s of target %d" % (relation, target)
        related[pid] = Candidate(pid, relation, target, "%s; not a target: %s" % (rel, why(pid)))

    for pid in sorted(sel.targets):
        info = table[pid]
        for d in descendants(pid, kids):
            note(d, "descendant", pid)
        note(info.ppid, "parent", pid)
        for m in by_pgid.get(info.pgid, ()):
            note(m, "process_group", pid)
        for m in by_sid.get(info.sid, ()):
            note(m, "session", pid)
    for pid in sorted(sel.spared):
        note(pid, "spared", None)
    return related
