"""gpu_reap's logic: free the GPUs of a stopped inference server, and prove they are free.

The field fix was `kill -9` of every python3 process, `fuser -k /dev/nvidia*` and `sleep 3`:
it kills unrelated work and guesses at timing. Here:
1. select (proc/select.py): GPU compute processes (holders of /dev/nvidia* with a CUDA context,
   i.e. /dev/nvidia-uvm mapped), the server's cgroups, and SGLang/vLLM worker names within
   `pattern_scope` (by default the reaping user's processes that hold a CUDA context or live in
   a servelab server cgroup: a name alone is not enough), grown to their trees and orphaned
   groups; never our own ancestry, protected work, infrastructure or a terminal multiplexer's
   other windows;
2. end them through proc/terminate.py, the one function that signals (SIGTERM, wait up to
   `grace` for each to exit, then SIGKILL, or `cgroup.kill` for a cgroup with nothing protected
   inside, wait up to `kill_timeout`; a pid reused meanwhile is never hit; a zombie whose parent
   is not us counts as gone: it has released its memory and device files);
3. rescan (a process may have forked while we waited) for a bounded number of rounds;
4. report every process that disappeared meanwhile: targets (killed, survivors, vanished) and
   the non-targets tied to them (a child that died with its parent, a launcher that quit when
   its workers died: vanished, `side_effect`);
5. poll GPU memory until every GPU is back to the baseline or `memory_timeout` passes, leaving
   out what the processes the reap spared (protected work, other users' jobs) hold, per process
   as NVML reports it (gpu/reap_memory.py): no fixed sleeps anywhere; every wait ends as soon
   as its condition holds.

Standard library only; pynvml is used when importable (see gpu/query.py).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.gpu import reap_memory
from ansible_collections.servelab.serving.plugins.module_utils.gpu.query import BACKENDS, GpuMemory, open_backend
from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap_memory import MemoryExclusion
from ansible_collections.servelab.serving.plugins.module_utils.proc import terminate as proc_terminate
from ansible_collections.servelab.serving.plugins.module_utils.proc.cgroup import (
    DEFAULT_CONTAINER_CGROUP_GLOBS, PARENT as SERVER_CGROUP_PARENT, CgroupDir, container_bases,
    container_cgroup_dirs, member_pids, resolve_cgroup_dirs, v2_root,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import (
    DeviceMatcher, find_device_holders, split_compute_holders,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (
    ProcInfo, read_stat, scan_processes, still_running,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.select import (
    DEFAULT_PATTERNS, PATTERN_SCOPE_OWN_GPU, PATTERN_SCOPES, Candidate, Selection,
    SelectionPolicy, compile_patterns, select_targets,
)

GPU_BACKENDS = BACKENDS + ("none",)


class ReapInputError(ValueError):
    """Bad options: the message names the option and the fix. Raised before anything is done."""


@dataclass
class ReapOptions:
    device_glob: str = "/dev/nvidia*"
    # A holder of device_glob counts only if it also *maps* a file matching this. Seen on an
    # H200 with driver 580: a CUDA context maps /dev/nvidia-uvm (and nvidia0, nvidiactl);
    # NVML users (nvidia-smi, DCGM, exporters) open the same nodes, uvm included, but map at
    # most nvidiactl; a process that only ran cuInit maps nvidia0 but not uvm (and holds no
    # GPU memory). "" = every holder of device_glob counts, as with fuser.
    compute_device_glob: str = "/dev/nvidia-uvm"
    patterns: Sequence[str] = DEFAULT_PATTERNS
    # How far a pattern match alone reaches (proc/select.py): own_gpu = the reaping user's
    # processes with a CUDA context or in a servelab server cgroup; own = the reaping user's;
    # any = everyone's.
    pattern_scope: str = PATTERN_SCOPE_OWN_GPU
    protect: Sequence[str] = ()
    protect_pids: Sequence[int] = ()
    grace: float = 10.0
    kill_timeout: float = 10.0
    cgroups: Sequence[str] = ()
    container: Optional[str] = None
    container_cgroup_globs: Sequence[str] = DEFAULT_CONTAINER_CGROUP_GLOBS
    scan_maps: bool = True
    wait_memory: bool = True
    memory_threshold_mib: int = 512
    memory_baseline_mib: object = None          # None | int | [int per GPU] | {index: int}
    memory_timeout: float = 60.0
    poll_interval: float = 0.25
    gpus: Sequence[object] = ()                 # GPU indices or UUIDs to check (default all)
    gpu_backend: str = "auto"                   # auto | nvml | nvidia-smi | none
    nvidia_smi: str = "nvidia-smi"
    builtin_protect: bool = True
    check_mode: bool = False
    rounds: int = 3                             # selection passes (escapees forked meanwhile)
    proc_root: str = "/proc"
    self_pid: Optional[int] = None              # default: os.getpid()


@dataclass
class ProcessReport:
    pid: int
    name: str
    cmdline: str
    found_by: str
    seed_pid: Optional[int]
    detail: str
    container_pid: Optional[int] = None         # pid inside its container (host variant)
    signal: Optional[str] = None                # SIGTERM | SIGKILL | cgroup.kill (what ended it)
    state: Optional[str] = None                 # survivors: state when we gave up (D = in kernel)
    # vanished only: not a target, tied to one (found_by says how: descendant, parent,
    # process_group, session, spared), and it exited during the reap without a signal of ours
    side_effect: bool = False


@dataclass
class ReapResult:
    changed: bool
    killed: List[ProcessReport] = field(default_factory=list)
    would_kill: List[ProcessReport] = field(default_factory=list)
    survivors: List[ProcessReport] = field(default_factory=list)
    # processes that exited while the reap ran without a signal of ours ending them: targets
    # (gone before they were signalled, or they ignored SIGTERM and left on their own), and the
    # non-targets tied to a target (side_effect: a child that died with its parent, ...)
    vanished: List[ProcessReport] = field(default_factory=list)
    spared: List[Dict[str, object]] = field(default_factory=list)
    memory_before: List[GpuMemory] = field(default_factory=list)
    memory_after: List[GpuMemory] = field(default_factory=list)
    memory_clean: Optional[bool] = None         # None: no GPU to check
    memory_excluded: List[MemoryExclusion] = field(default_factory=list)
    memory_source: str = "none"
    memory_note: Optional[str] = None
    cgroups: List[CgroupDir] = field(default_factory=list)
    container_cgroups: List[str] = field(default_factory=list)
    seconds: float = 0.0
    phases: Dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Options


def validate(opts: ReapOptions) -> Dict[str, list]:
    """Check every option before anything is touched; return the compiled patterns."""
    compiled = {
        "patterns": compile_patterns("patterns", opts.patterns),
        "protect": compile_patterns("protect", opts.protect),
    }
    if not opts.device_glob or not opts.device_glob.startswith("/"):
        raise ReapInputError("device_glob: %r must be an absolute path glob such as "
                             "/dev/nvidia*" % (opts.device_glob,))
    if opts.compute_device_glob and not opts.compute_device_glob.startswith("/"):
        raise ReapInputError("compute_device_glob: %r must be an absolute path glob such as "
                             "/dev/nvidia-uvm, or empty" % (opts.compute_device_glob,))
    for name in ("grace", "kill_timeout", "memory_timeout"):
        if getattr(opts, name) < 0:
            raise ReapInputError("%s: must be >= 0 seconds (got %r)" % (name, getattr(opts, name)))
    if opts.poll_interval <= 0:
        raise ReapInputError("poll_interval: must be > 0 seconds (got %r)" % opts.poll_interval)
    if opts.memory_threshold_mib < 0:
        raise ReapInputError("memory_threshold_mib: must be >= 0 (got %r)"
                             % opts.memory_threshold_mib)
    if opts.pattern_scope not in PATTERN_SCOPES:
        raise ReapInputError("pattern_scope: %r is not one of %s" % (
            opts.pattern_scope, ", ".join(PATTERN_SCOPES)))
    if opts.gpu_backend not in GPU_BACKENDS:
        raise ReapInputError("gpu_backend: %r is not one of %s"
                             % (opts.gpu_backend, ", ".join(GPU_BACKENDS)))
    for g in opts.gpus:
        if not (isinstance(g, int) or str(g).isdigit() or str(g).startswith(("GPU-", "MIG-"))):
            raise ReapInputError("gpus: %r is neither a GPU index nor a UUID (GPU-...)" % (g,))
    for pid in opts.protect_pids:
        if not isinstance(pid, int) or pid <= 0:
            raise ReapInputError("protect_pids: %r is not a process id (positive integer)" % pid)
    b = opts.memory_baseline_mib
    fix = ("memory_baseline_mib: give MiB as one integer (all GPUs), a list (per GPU index) or a "
           "mapping {index: MiB}; got %r" % (b,))
    if isinstance(b, bool):
        raise ReapInputError(fix)
    if isinstance(b, dict):
        try:
            opts.memory_baseline_mib = {int(k): int(v) for k, v in b.items()}
        except (TypeError, ValueError):
            raise ReapInputError(fix) from None
    elif isinstance(b, (list, tuple)):
        try:
            opts.memory_baseline_mib = [int(v) for v in b]
        except (TypeError, ValueError):
            raise ReapInputError(fix) from None
    elif b is not None and not isinstance(b, int):
        try:
            opts.memory_baseline_mib = int(b)
        except (TypeError, ValueError):
            raise ReapInputError(fix) from None
    if opts.container is not None:
        if not str(opts.container).strip().isdigit():
            raise ReapInputError("container: %r must be the container's numeric vmid, e.g. 129"
                                 % (opts.container,))
        if not container_cgroup_dirs(str(opts.container), opts.container_cgroup_globs):
            raise ReapInputError(
                "container: no cgroup directory of container %s matched %s; is it running on "
                "this host (run the task on the Proxmox host with delegate_to)? Otherwise set "
                "container_cgroup_globs to where this host keeps it"
                % (opts.container, ", ".join(opts.container_cgroup_globs)))
    return compiled


# ---------------------------------------------------------------------------------------------
# Reports


def _candidate_report(info: ProcInfo, cand: Candidate, container: bool) -> ProcessReport:
    return ProcessReport(
        pid=info.pid, name=info.comm, cmdline=info.cmdline, found_by=cand.found_by,
        seed_pid=cand.seed_pid, detail=cand.detail,
        container_pid=info.namespace_pid if (container or info.namespace_pid != info.pid)
        else None)


def _outcome_report(o: proc_terminate.ProcessOutcome, cand: Candidate,
                    container: bool) -> ProcessReport:
    rep = _candidate_report(o.info, cand, container)
    rep.signal = o.signal
    return rep


def _owner_uid(table: Dict[int, ProcInfo], scope: Optional[Set[int]]) -> int:
    """The user the reap acts for, whose pattern matches it may take: the reaper's effective
    uid; from the Proxmox host, the container's root as the host sees it (its init's uid:
    100000 in an unprivileged PVE container, 0 in a privileged one), since that is who would
    reap from inside."""
    if scope is not None:
        inits = [table[p] for p in scope if p in table and table[p].namespace_init]
        if inits:
            init = min(inits, key=lambda i: len(i.nspid))     # the container's, not a nested one
            if init.uid is not None:
                return init.uid
    return os.geteuid()


def _server_cgroup_members(bases: Sequence[str]) -> Dict[int, str]:
    """pid -> servelab server cgroup (`<base>/servelab/<name>`, where llm_server starts each
    server) for every process in one."""
    members: Dict[int, str] = {}
    for base in bases:
        parent = os.path.join(base, SERVER_CGROUP_PARENT)
        try:
            names = sorted(os.listdir(parent))
        except OSError:
            continue
        for name in names:
            path = os.path.join(parent, name)
            if os.path.isdir(path):
                for pid in member_pids(path):
                    members.setdefault(pid, path)
    return members


# ---------------------------------------------------------------------------------------------
# The reap


def reap(opts: ReapOptions) -> ReapResult:
    started = time.monotonic()
    compiled = validate(opts)
    self_pid = opts.self_pid or os.getpid()
    container = opts.container is not None
    result = ReapResult(changed=False)

    backend = None
    try:
        if opts.gpu_backend != "none":
            t0 = time.monotonic()
            backend, reasons = open_backend(opts.gpu_backend, opts.nvidia_smi)
            result.phases["gpu_open_s"] = time.monotonic() - t0
            if backend is None:
                result.memory_note = "no GPU to check: " + "; ".join(reasons)
            else:
                result.memory_source = backend.source
                result.memory_before = reap_memory.read_memory(backend, opts)
                if opts.gpus and not result.memory_before:
                    seen = ", ".join("%d %s" % (g.index, g.uuid) for g in backend.memory())
                    raise ReapInputError("gpus: none of %s is a GPU here (index and UUID of "
                                         "those seen: %s)" % (list(opts.gpus), seen))
        else:
            result.memory_note = "gpu_backend: none (memory not checked)"

        # where the server's cgroups are; for the host variant, which processes are in scope
        if container:
            cdirs = container_cgroup_dirs(str(opts.container), opts.container_cgroup_globs)
            result.container_cgroups = cdirs
            bases = container_bases(cdirs)
        else:
            root = v2_root()
            bases = [root] if root else []
        matcher = DeviceMatcher.from_glob(opts.device_glob)
        matcher.stat_all = container
        compute_matcher = None
        if opts.compute_device_glob:
            compute_matcher = DeviceMatcher.from_glob(opts.compute_device_glob)
            compute_matcher.stat_all = container
        handled: Set[int] = set()
        owned_groups: Set[int] = set()     # groups/sessions of reaped trees: what appears in
        owned_sessions: Set[int] = set()   # them later was forked by a target meanwhile
        unsettled: List[Tuple[proc_terminate.ProcessOutcome, Candidate]] = []   # survivors
        why_not: Dict[int, str] = {}       # pid -> why it is not a target (memory exclusions)
        watched: Dict[int, Tuple[ProcInfo, Candidate]] = {}   # non-targets tied to targets
        planned: Set[int] = set()          # check mode: what would be signalled
        scope: Optional[Set[int]] = None
        for round_no in range(max(1, opts.rounds)):
            t0 = time.monotonic()
            table = scan_processes(opts.proc_root)
            scope = None
            if container:
                scope = set()
                for d in result.container_cgroups:
                    scope |= member_pids(d)
            cgdirs = resolve_cgroup_dirs(opts.cgroups, bases) if opts.cgroups else []
            members = {pid: d.path for d in cgdirs for pid in d.pids}
            holders = find_device_holders(
                [p for p in table if scope is None or p in scope], matcher,
                scan_maps=opts.scan_maps, proc_root=opts.proc_root)
            holders, no_compute = split_compute_holders(holders, compute_matcher, opts.proc_root)
            policy = SelectionPolicy(
                self_pid=self_pid, patterns=compiled["patterns"], protect=compiled["protect"],
                protect_pids=list(opts.protect_pids), builtin_protect=opts.builtin_protect,
                scope=scope, cgroup_members=members, exclude=handled,
                owned_groups=owned_groups, owned_sessions=owned_sessions,
                pattern_scope=opts.pattern_scope, owner_uid=_owner_uid(table, scope),
                server_cgroup_members=_server_cgroup_members(bases))
            sel = select_targets(table, holders, policy)
            for pid, why in list(sel.never.items()) + list(sel.spared.items()):
                why_not.setdefault(pid, why)
            if round_no == 0:
                result.cgroups = cgdirs
                spared = dict(sel.spared)
                for pid, hit in no_compute.items():
                    if pid in sel.never and pid not in spared:
                        spared[pid] = sel.never[pid]
                    elif pid not in sel.targets and pid not in spared:
                        spared[pid] = ("holds %s but maps no %s, i.e. has no CUDA context: "
                                       "an NVML/monitoring or display client"
                                       % (", ".join(hit.paths), opts.compute_device_glob))
                result.spared = [{"pid": pid, "name": table[pid].comm,
                                  "cmdline": table[pid].cmdline, "reason": why}
                                 for pid, why in sorted(spared.items()) if pid in table]
            result.phases["scan_s"] = result.phases.get("scan_s", 0.0) + time.monotonic() - t0
            if opts.check_mode:
                result.would_kill = [_candidate_report(table[c.pid], c, container)
                                     for c in sel.targets.values()]
                planned = set(sel.targets)
                break
            if not sel.targets:
                break
            for pid, cand in sel.related.items():
                watched.setdefault(pid, (table[pid], cand))
            handled.update(sel.targets)
            for pid in sel.targets:
                info = table[pid]
                if info.pgid == info.pid or info.pgid not in table:
                    owned_groups.add(info.pgid)
                if info.sid == info.pid:
                    owned_sessions.add(info.sid)
            outcome = _terminate(table, sel, cgdirs, opts, result)
            cands = _candidates(outcome, sel, handled)
            result.killed += [_outcome_report(o, cands[o.pid], container) for o in outcome.killed]
            result.vanished += [_outcome_report(o, cands[o.pid], container)
                                for o in outcome.vanished]
            unsettled += [(o, cands[o.pid]) for o in outcome.survivors]
        # A survivor of an early round may have exited while later rounds ran.
        for o, cand in unsettled:
            rep = _outcome_report(o, cand, container)
            if still_running(o.pid, o.info.start_time, opts.proc_root):
                stat = read_stat(o.pid, opts.proc_root)
                rep.state = stat.state if stat else None
                result.survivors.append(rep)
            elif o.signal is not None:
                result.killed.append(rep)
            else:
                result.vanished.append(rep)
        result.changed = bool(result.killed)

        if backend is not None:
            t0 = time.monotonic()
            spared_gpu = reap_memory.SparedGpuProcesses(handled | planned, why_not, matcher,
                                                        compute_matcher, opts, scope)
            if opts.wait_memory and not opts.check_mode:
                result.memory_after, result.memory_excluded = reap_memory.wait_memory(
                    backend, opts, spared_gpu)
            else:
                result.memory_after = reap_memory.read_memory(backend, opts)
                result.memory_excluded = spared_gpu.exclusions(result.memory_after)
            result.phases["memory_wait_s"] = time.monotonic() - t0
            result.memory_clean = reap_memory.all_clean(result.memory_after, opts, result.memory_excluded)
            notes = spared_gpu.notes(result.memory_after, backend.source)
            if notes:
                result.memory_note = "; ".join(notes)
        # last, after the memory wait: a process that dies because a target died (its pipe
        # closed, its parent-death signal) may take a moment to go
        result.vanished += _side_effects(watched, handled, result, container, opts.proc_root)
    finally:
        if backend is not None:
            backend.close()
    result.seconds = time.monotonic() - started
    return result


def _side_effects(watched: Dict[int, Tuple[ProcInfo, Candidate]], handled: Set[int],
                  result: ReapResult, container: bool, proc_root: str) -> List[ProcessReport]:
    """Non-targets tied to a target (select.related) that are gone now: no signal of ours
    reached them, ending a target did (or they left on their own meanwhile: the reap cannot
    tell, and says only that they disappeared while it ran)."""
    reported = {r.pid for r in result.killed + result.survivors + result.vanished}
    out: List[ProcessReport] = []
    for pid in sorted(watched):
        info, cand = watched[pid]
        if pid in handled or pid in reported:
            continue
        if not still_running(pid, info.start_time, proc_root):
            rep = _candidate_report(info, cand, container)
            rep.side_effect = True
            out.append(rep)
    return out


def _candidates(outcome: proc_terminate.TerminationResult, sel: Selection,
                handled: Set[int]) -> Dict[int, Candidate]:
    """How each process of the outcome was found: the selection's candidate, or the server
    cgroup it appeared in after the scan (killed with it; later rounds leave it alone)."""
    cands = dict(sel.targets)
    for o in outcome.killed + outcome.survivors + outcome.vanished:
        if o.origin == proc_terminate.ORIGIN_CGROUP:
            cands[o.pid] = Candidate(o.pid, "cgroup", None, o.cgroup or "")
            handled.add(o.pid)
    return cands


def _terminate(table: Dict[int, ProcInfo], sel: Selection, cgdirs: List[CgroupDir],
               opts: ReapOptions, result: ReapResult) -> proc_terminate.TerminationResult:
    """End one round's targets; what was never to be touched stays protected, including
    against a whole-cgroup kill."""
    outcome = proc_terminate.terminate(proc_terminate.TerminationPlan(
        targets=[table[pid] for pid in sel.targets], protected=sel.never,
        cgroups=[d.path for d in cgdirs if d.exists], grace=opts.grace,
        kill_timeout=opts.kill_timeout, proc_root=opts.proc_root))
    by_path = {c.path: c for c in outcome.cgroups}
    for d in cgdirs:
        done = by_path.get(d.path)
        if done is None or done.action == proc_terminate.CGROUP_NOT_NEEDED:
            continue
        d.killed_with_cgroup_kill = done.action == proc_terminate.CGROUP_KILLED
        if done.note:
            d.note = done.note
    result.phases["terminate_s"] = result.phases.get("terminate_s", 0.0) + outcome.term_seconds
    result.phases["kill_s"] = result.phases.get("kill_s", 0.0) + outcome.kill_seconds
    return outcome
