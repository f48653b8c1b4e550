"""The memory check that ends a reap (gpu/reap.py, step 5): poll GPU memory until every GPU is
back to its baseline or `memory_timeout` passes, leaving out what the processes the reap spared
hold (per process, as NVML reports it), and say what could not be left out.

Standard library only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Sequence, Set, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.gpu.query import GpuMemory
from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import (
    DeviceMatcher, holds_cuda_context,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import read_process


class MemoryOptions(Protocol):
    """The options of gpu/reap.py's ReapOptions this check reads (a Protocol: reap.py imports
    this module, not the other way round)."""
    gpus: Sequence[object]
    memory_baseline_mib: object
    memory_threshold_mib: int
    memory_timeout: float
    poll_interval: float
    container: Optional[str]
    scan_maps: bool
    proc_root: str


@dataclass
class ExcludedProcess:
    """A GPU process the reap spared, whose memory is left out of the memory check."""
    pid: int                                    # as NVML/nvidia-smi lists it (= the local pid)
    name: str
    used_mib: int
    reason: str                                 # why it is not a target


@dataclass
class MemoryExclusion:
    """Per GPU (of memory_after): the memory of spared processes left out of the check."""
    index: int
    uuid: str
    excluded_mib: int
    processes: List[ExcludedProcess] = field(default_factory=list)


def baseline_for(baseline: object, index: int) -> Optional[int]:
    if baseline is None:
        return None
    if isinstance(baseline, int):
        return baseline
    if isinstance(baseline, list):
        return baseline[index] if index < len(baseline) else None
    return baseline.get(index)      # dict, normalised by validate()


def memory_is_clean(gpu: GpuMemory, baseline: Optional[int], threshold: int,
                    exclusion: Optional[MemoryExclusion] = None) -> bool:
    """Back to baseline, leaving out what spared processes hold (exclusion): with a baseline,
    used <= baseline + threshold (other work may stay); without one, no compute process other
    than spared ones and used <= threshold."""
    used = gpu.used_mib - (exclusion.excluded_mib if exclusion else 0)
    if baseline is not None:
        return used <= baseline + threshold
    others = gpu.processes
    if others is not None and exclusion is not None:
        others -= len(exclusion.processes)
    return used <= threshold and not others


def all_clean(mem: List[GpuMemory], opts: MemoryOptions,
              exclusions: Sequence[MemoryExclusion] = ()) -> bool:
    by_index = {e.index: e for e in exclusions}
    return all(memory_is_clean(g, baseline_for(opts.memory_baseline_mib, g.index),
                               opts.memory_threshold_mib, by_index.get(g.index)) for g in mem)


def read_memory(backend, opts: MemoryOptions) -> List[GpuMemory]:
    """Memory of the GPUs the options name (all of them by default)."""
    mem = backend.memory()
    if not opts.gpus:
        return mem
    wanted = {str(g) for g in opts.gpus}
    return [g for g in mem if str(g.index) in wanted or g.uuid in wanted]


class SparedGpuProcesses:
    """Which of the pids NVML lists are processes the reap spared (protected, another user's,
    outside the container, no rule selects them): their memory is theirs to keep, so the check
    leaves it out.

    NVML names processes by host pid. A pid counts only if it is, here and now, a process that
    holds a CUDA context and was never a target: in a container's own pid namespace a host pid
    names some unrelated local process or none (it is then left in, and said so in
    memory_note), and a target's pid is never excused, whatever holds it now."""

    def __init__(self, targets: Set[int], reasons: Dict[int, str], matcher: DeviceMatcher,
                 compute_matcher: Optional[DeviceMatcher], opts: MemoryOptions,
                 scope: Optional[Set[int]]) -> None:
        self.targets = targets
        self.reasons = reasons
        self.matcher = matcher
        self.compute_matcher = compute_matcher
        self.opts = opts
        self.scope = scope
        self._known: Dict[int, Optional[Tuple[str, str]]] = {}    # pid -> (name, reason)

    def spared(self, pid: int) -> Optional[Tuple[str, str]]:
        """(name, why it is not a target) if pid is a spared CUDA process here, else None.
        Decided once per pid: polls come every 20 ms, and a pid is not reused that fast."""
        if pid not in self._known:
            self._known[pid] = self._decide(pid)
        return self._known[pid]

    def _decide(self, pid: int) -> Optional[Tuple[str, str]]:
        if pid in self.targets:
            return None
        info = read_process(pid, self.opts.proc_root)
        if info is None or info.gone or not holds_cuda_context(
                pid, self.matcher, self.compute_matcher, self.opts.scan_maps,
                self.opts.proc_root):
            return None
        if pid in self.reasons:
            why = self.reasons[pid]
        elif self.scope is not None and pid not in self.scope:
            why = "outside container %s (not this reap's to end)" % self.opts.container
        else:
            why = "not a target (no rule selects it)"
        return info.comm, why

    def exclusions(self, mem: List[GpuMemory]) -> List[MemoryExclusion]:
        out: List[MemoryExclusion] = []
        for g in mem:
            kept: List[ExcludedProcess] = []
            for p in g.process_memory or ():
                found = self.spared(p.pid) if p.used_mib is not None else None
                if found is not None:
                    kept.append(ExcludedProcess(pid=p.pid, name=found[0], used_mib=p.used_mib,
                                                reason=found[1]))
            out.append(MemoryExclusion(index=g.index, uuid=g.uuid,
                                       excluded_mib=sum(k.used_mib for k in kept),
                                       processes=kept))
        return out

    def notes(self, mem: List[GpuMemory], source: str) -> List[str]:
        """What the check could not leave out, and why (for memory_note)."""
        if any(g.process_memory is None for g in mem):
            return ["%s lists no per-process GPU memory here: the memory of protected or "
                    "spared processes is not left out of the check (give memory_baseline_mib "
                    "for work that stays)" % source]
        notes: List[str] = []
        foreign = ["GPU%d pid %d (%s MiB)" % (g.index, p.pid, p.used_mib)
                   for g in mem for p in g.process_memory or ()
                   if p.pid not in self.targets and self.spared(p.pid) is None]
        if foreign:
            notes.append("counted, not attributed to a spared process here: %s (not a CUDA "
                         "process of this pid namespace: inside a container NVML reports host "
                         "pids; give memory_baseline_mib for their work, or reap from the "
                         "Proxmox host)" % ", ".join(foreign))
        unknown = ["GPU%d pid %d" % (g.index, p.pid) for g in mem for p in g.process_memory or ()
                   if p.used_mib is None and self.spared(p.pid) is not None]
        if unknown:
            notes.append("the driver reports no memory for spared process(es) %s: not left "
                         "out" % ", ".join(unknown))
        return notes


def wait_memory(backend, opts: MemoryOptions, spared: SparedGpuProcesses
                ) -> Tuple[List[GpuMemory], List[MemoryExclusion]]:
    """Poll until clean or timeout. The driver frees a dead process's memory some hundreds of
    milliseconds after the process is gone, so this is where most of the time goes; NVML reads
    are cheap enough to poll every 20 ms, nvidia-smi runs back off to poll_interval."""
    deadline = time.monotonic() + opts.memory_timeout
    cap = min(opts.poll_interval, getattr(backend, "poll_cap", None) or opts.poll_interval)
    delay = 0.005
    while True:
        mem = read_memory(backend, opts)
        excl = spared.exclusions(mem)
        left = deadline - time.monotonic()
        if all_clean(mem, opts, excl) or left <= 0:
            return mem, excl
        time.sleep(min(delay, left))
        delay = min(delay * 2, cap)
