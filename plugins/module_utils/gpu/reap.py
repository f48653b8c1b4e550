"""gpu_reap's logic: free the GPUs of a stopped inference server, and prove they are free.

The field fix was `kill -9` of every python3 process, `fuser -k /dev/nvidia*` and `sleep 3`:
it kills unrelated work and guesses at timing. Here:
1. select (proc/select.py): GPU compute processes (holders of /dev/nvidia* with a CUDA context,
   i.e. /dev/nvidia-uvm mapped), SGLang/vLLM worker names, the server's cgroups,
   grown to their trees and orphaned groups; never our own ancestry, protected work or
   infrastructure;
2. end them through proc/terminate.py, the one function that signals (SIGTERM, wait up to
   `grace` for each to exit, then SIGKILL, or `cgroup.kill` for a cgroup with nothing protected
   inside, wait up to `kill_timeout`; a pid reused meanwhile is never hit; a zombie whose parent
   is not us counts as gone: it has released its memory and device files);
3. rescan (a process may have forked while we waited) for a bounded number of rounds;
4. poll GPU memory until every GPU is back to the baseline or `memory_timeout` passes: no
   fixed sleeps anywhere; every wait ends as soon as its condition holds.

Standard library only; pynvml is used when importable (see gpu/query.py).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.gpu.query import BACKENDS, GpuMemory, open_backend
from ansible_collections.servelab.serving.plugins.module_utils.proc import terminate as proc_terminate
from ansible_collections.servelab.serving.plugins.module_utils.proc.cgroup import (
    DEFAULT_CONTAINER_CGROUP_GLOBS, CgroupDir, container_bases, container_cgroup_dirs,
    member_pids, resolve_cgroup_dirs, v2_root,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import (
    DeviceHit, DeviceMatcher, find_device_holders, mapped_device_files,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (
    ProcInfo, read_stat, scan_processes, still_running,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.select import (
    DEFAULT_PATTERNS, Candidate, Selection, SelectionPolicy, compile_patterns, select_targets,
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


@dataclass
class ReapResult:
    changed: bool
    killed: List[ProcessReport] = field(default_factory=list)
    would_kill: List[ProcessReport] = field(default_factory=list)
    survivors: List[ProcessReport] = field(default_factory=list)
    # targets that exited while the reap ran without a signal of ours ending them (gone before
    # it was signalled, or it ignored SIGTERM and left on its own)
    vanished: List[ProcessReport] = field(default_factory=list)
    spared: List[Dict[str, object]] = field(default_factory=list)
    memory_before: List[GpuMemory] = field(default_factory=list)
    memory_after: List[GpuMemory] = field(default_factory=list)
    memory_clean: Optional[bool] = None         # None: no GPU to check
    memory_source: str = "none"
    memory_note: Optional[str] = None
    cgroups: List[CgroupDir] = field(default_factory=list)
    container_cgroups: List[str] = field(default_factory=list)
    seconds: float = 0.0
    phases: Dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Options


def baseline_for(baseline: object, index: int) -> Optional[int]:
    if baseline is None:
        return None
    if isinstance(baseline, int):
        return baseline
    if isinstance(baseline, list):
        return baseline[index] if index < len(baseline) else None
    return baseline.get(index)      # dict, normalised by validate()


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
            raise ReapInputError(fix)
    elif isinstance(b, (list, tuple)):
        try:
            opts.memory_baseline_mib = [int(v) for v in b]
        except (TypeError, ValueError):
            raise ReapInputError(fix)
    elif b is not None and not isinstance(b, int):
        try:
            opts.memory_baseline_mib = int(b)
        except (TypeError, ValueError):
            raise ReapInputError(fix)
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


def _split_compute(holders: Dict[int, DeviceHit], compute_matcher: Optional[DeviceMatcher],
                   opts: ReapOptions):
    """(compute holders, the others): only processes with a CUDA context are GPU users, and
    what tells a context from an NVML client is the mapping, not the open file."""
    if compute_matcher is None:
        return holders, {}
    compute: Dict[int, DeviceHit] = {}
    others: Dict[int, DeviceHit] = {}
    for pid, hit in holders.items():
        if mapped_device_files(pid, compute_matcher, opts.proc_root):
            compute[pid] = hit
        else:
            others[pid] = hit
    return compute, others


# ---------------------------------------------------------------------------------------------
# Memory


def memory_is_clean(gpu: GpuMemory, baseline: Optional[int], threshold: int) -> bool:
    """Back to baseline: with a baseline, used <= baseline + threshold (other work may stay);
    without one, no compute process and used <= threshold."""
    if baseline is not None:
        return gpu.used_mib <= baseline + threshold
    return gpu.used_mib <= threshold and not gpu.processes


def _all_clean(mem: List[GpuMemory], opts: ReapOptions) -> bool:
    return all(memory_is_clean(g, baseline_for(opts.memory_baseline_mib, g.index),
                               opts.memory_threshold_mib) for g in mem)


def _read_memory(backend, opts: ReapOptions) -> List[GpuMemory]:
    """Memory of the GPUs the options name (all of them by default)."""
    mem = backend.memory()
    if not opts.gpus:
        return mem
    wanted = {str(g) for g in opts.gpus}
    return [g for g in mem if str(g.index) in wanted or g.uuid in wanted]


def _wait_memory(backend, opts: ReapOptions) -> List[GpuMemory]:
    """Poll until clean or timeout. The driver frees a dead process's memory some hundreds of
    milliseconds after the process is gone, so this is where most of the time goes; NVML reads
    are cheap enough to poll every 20 ms, nvidia-smi runs back off to poll_interval."""
    deadline = time.monotonic() + opts.memory_timeout
    cap = min(opts.poll_interval, getattr(backend, "poll_cap", None) or opts.poll_interval)
    delay = 0.005
    while True:
        mem = _read_memory(backend, opts)
        left = deadline - time.monotonic()
        if _all_clean(mem, opts) or left <= 0:
            return mem
        time.sleep(min(delay, left))
        delay = min(delay * 2, cap)


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
                result.memory_before = _read_memory(backend, opts)
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
            holders, no_compute = _split_compute(holders, compute_matcher, opts)
            policy = SelectionPolicy(
                self_pid=self_pid, patterns=compiled["patterns"], protect=compiled["protect"],
                protect_pids=list(opts.protect_pids), builtin_protect=opts.builtin_protect,
                scope=scope, cgroup_members=members, exclude=handled,
                owned_groups=owned_groups, owned_sessions=owned_sessions)
            sel = select_targets(table, holders, policy)
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
                break
            if not sel.targets:
                break
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
            if opts.wait_memory and not opts.check_mode:
                result.memory_after = _wait_memory(backend, opts)
            else:
                result.memory_after = _read_memory(backend, opts)
            result.phases["memory_wait_s"] = time.monotonic() - t0
            result.memory_clean = _all_clean(result.memory_after, opts)
    finally:
        if backend is not None:
            backend.close()
    result.seconds = time.monotonic() - started
    return result


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
