"""The reaper's memory check with per-process GPU memory, through the NVML backend of
gpu/query.py over a stand-in `pynvml` module (no GPU needed).

What was seen on the H200: with a process protected by bench_reap_protect holding GPU memory,
every profile failed in the reap ("GPU memory not back to baseline"): the check counted the
protected process's own memory. Now what the spared processes hold is left out, per process as
NVML reports it, and the result says how much and why.
"""
from __future__ import annotations

import os
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_reap_helpers import alive  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.gpu.query import (  # noqa: E402
    GpuMemory, GpuProcess, NvmlBackend,
)
from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import (  # noqa: E402
    MemoryExclusion, ReapOptions, reap,
)
from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap_memory import memory_is_clean  # noqa: E402

MIB = 1024 * 1024
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF      # NVML_VALUE_NOT_AVAILABLE (unsigned long long)


class FakeNvml(types.ModuleType):
    """One GPU. `held` maps pid -> MiB; a pid is listed while its process lives (or always,
    for pids in `stuck`: a context the driver has not torn down). used = sum + `other_mib`."""

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.held = {}
        self.stuck = set()
        self.other_mib = 0
        self.per_process = True          # False: nvmlDeviceGetComputeRunningProcesses fails
        self.nvmlMemory_v2 = object()

    def listed(self):
        return {pid: mib for pid, mib in self.held.items() if pid in self.stuck or alive(pid)}

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("handle", i)

    def nvmlDeviceGetUUID(self, handle):
        return b"GPU-fakenvml-0"

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        used = (sum(m or 0 for m in self.listed().values()) + self.other_mib) * MIB
        return types.SimpleNamespace(total=144 * 1024 * MIB, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if not self.per_process:
            raise self.NVMLError("Not Supported")
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mib * MIB if mib is not None
                                      else NOT_AVAILABLE)
                for pid, mib in self.listed().items()]


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def cuda(sp):
    return ["--hold", sp.dev("nvidia0"), "--map-only", sp.dev("nvidia-uvm")]


def opts(sp, **kw) -> ReapOptions:
    base = dict(device_glob=sp.device_glob, compute_device_glob=sp.compute_glob, patterns=[],
                grace=5.0, kill_timeout=10.0, gpu_backend="nvml", memory_timeout=5.0)
    base.update(kw)
    return ReapOptions(**base)


def test_nvml_backend_reports_per_process_memory(nvml):
    nvml.held = {os.getpid(): 2000, 999999: None}
    nvml.stuck = {999999}
    backend = NvmlBackend()
    try:
        (gpu,) = backend.memory()
    finally:
        backend.close()
    assert gpu.used_mib == 2000 and gpu.processes == 2
    assert {p.pid: p.used_mib for p in gpu.process_memory} == {os.getpid(): 2000, 999999: None}
    nvml.per_process = False
    backend = NvmlBackend()
    try:
        (gpu,) = backend.memory()
    finally:
        backend.close()
    assert gpu.processes is None and gpu.process_memory is None


def test_protected_process_holding_2000_mib_does_not_fail_the_check(nvml, sp):
    keep = sp.start("keep", *cuda(sp))
    victim = sp.start("victim", *cuda(sp))
    nvml.held = {keep["pid"]: 2000, victim["pid"]: 8000}
    res = reap(opts(sp, protect=[sp.token + "-keep"]))
    assert [r.pid for r in res.killed] == [victim["pid"]] and alive(keep["pid"])
    assert res.memory_source == "nvml"
    assert res.memory_before[0].used_mib == 10000
    assert res.memory_after[0].used_mib == 2000 and res.memory_after[0].processes == 1
    assert res.memory_clean is True
    (excl,) = res.memory_excluded
    assert excl.uuid == "GPU-fakenvml-0" and excl.excluded_mib == 2000
    assert [(p.pid, p.used_mib) for p in excl.processes] == [(keep["pid"], 2000)]
    assert excl.processes[0].reason == "protect pattern %s-keep" % sp.token
    # with a baseline as well (taken before anything ran): still clean, nothing counted twice
    res = reap(opts(sp, protect=[sp.token + "-keep"], memory_baseline_mib=0,
                    memory_threshold_mib=256))
    assert res.memory_clean is True and not res.changed


def test_an_unprotected_leftover_is_not_clean(nvml, sp):
    keep = sp.start("keep", *cuda(sp))
    victim = sp.start("victim", *cuda(sp))
    # the victim's context outlives the process (a driver teardown that hangs)
    nvml.held = {keep["pid"]: 2000, victim["pid"]: 3000}
    nvml.stuck = {victim["pid"]}
    res = reap(opts(sp, protect=[sp.token + "-keep"], memory_timeout=0.3))
    assert [r.pid for r in res.killed] == [victim["pid"]] and not alive(victim["pid"])
    assert res.memory_clean is False
    assert res.memory_excluded[0].excluded_mib == 2000       # the protected part, not the rest
    # a spared process that holds no CUDA context here is not excused either (a host pid
    # seen from inside a container, another container's process)
    nvml.held = {keep["pid"]: 2000, 999999: 1500}
    nvml.stuck = {999999}
    res = reap(opts(sp, protect=[sp.token + "-keep"], memory_timeout=0.3))
    assert res.memory_clean is False and res.memory_excluded[0].excluded_mib == 2000
    assert "pid 999999 (1500 MiB)" in res.memory_note


def test_without_per_process_memory_the_old_rule_holds_and_says_so(nvml, sp):
    keep = sp.start("keep", *cuda(sp))
    nvml.held = {keep["pid"]: 2000}
    nvml.per_process = False
    res = reap(opts(sp, protect=[sp.token + "-keep"], memory_timeout=0.3))
    assert res.memory_clean is False
    assert res.memory_excluded[0].excluded_mib == 0
    assert "lists no per-process GPU memory" in res.memory_note
    res = reap(opts(sp, protect=[sp.token + "-keep"], memory_baseline_mib=2000,
                    memory_threshold_mib=100, memory_timeout=0.3))
    assert res.memory_clean is True


def test_a_spared_process_with_unknown_memory_is_not_left_out(nvml, sp):
    keep = sp.start("keep", *cuda(sp))
    nvml.held = {keep["pid"]: None}
    res = reap(opts(sp, protect=[sp.token + "-keep"], memory_timeout=0.3))
    # used is 0 here, but a compute process is left that the check cannot account for
    assert res.memory_clean is False
    assert "reports no memory for spared process" in res.memory_note


@pytest.mark.parametrize("used, procs, excluded, baseline, clean", [
    (2000, 1, (2000, 1), None, True),     # only the spared process is left
    (2000, 1, (0, 0), None, False),       # the old rule: a compute process, 2000 MiB
    (2600, 2, (2000, 1), None, False),    # another process is left
    (2400, 1, (2000, 1), None, True),     # 400 MiB (the driver's, a context) <= threshold
    (5000, 1, (2000, 1), 2500, True),     # 3000 <= 2500 + 512
    (5000, 1, (2000, 1), 2000, False),
])
def test_memory_rule(used, procs, excluded, baseline, clean):
    gpu = GpuMemory(index=0, uuid="GPU-x", used_mib=used, total_mib=144000, processes=procs,
                    process_memory=[GpuProcess(pid=1, used_mib=used)])
    excl = MemoryExclusion(index=0, uuid="GPU-x", excluded_mib=excluded[0],
                           processes=[object()] * excluded[1])
    assert memory_is_clean(gpu, baseline, 512, excl) is clean
