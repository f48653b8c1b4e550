"""The GPU checks, as plain functions: used by pytest (test_gpu.py) and by run_gpu_checks.py.

Each check returns a dict of what it measured and raises CheckFailed with an explicit message
(what was expected, what was found, the PIDs and roles involved) on failure. Every process a
check starts is ended by PID in a finally block.

Safety on a shared GPU machine: the reaper runs with the real device glob (/dev/nvidia*), so
every process that held a GPU before the check started is passed as protect_pids, and a
check-mode pass must select exactly the check's own targets before the real reap is allowed.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_env  # noqa: E402

gpu_env.use_module_utils()

from gpu_fleet import Fleet, alive, proc_state  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.facts import GpuFactsOptions, collect_gpu_facts  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.query import open_backend  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import (  # noqa: E402
    DeviceMatcher, find_device_holders, mapped_device_files, open_device_files,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import scan_processes  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import MemoryExclusion, ReapOptions, reap  # noqa: E402

THRESHOLD_MIB = 256          # a leftover target holds >= 1 GiB + its context: far above this


class CheckFailed(AssertionError):
    pass


class CheckSkipped(Exception):
    """The check cannot say anything on this machine (the reason is the message)."""


def expect(cond: bool, msg: str) -> None:
    if not cond:
        raise CheckFailed(msg)


def gpu_memory() -> List[dict]:
    backend, reasons = open_backend("auto")
    if backend is None:
        raise CheckFailed("cannot read GPU memory: " + "; ".join(reasons))
    try:
        return [{"index": g.index, "used_mib": g.used_mib, "processes": g.processes}
                for g in backend.memory()]
    finally:
        backend.close()


def preexisting_gpu_holders() -> Dict[int, str]:
    """Processes holding /dev/nvidia* before we start anything (not us): never to be touched."""
    table = scan_processes()
    hits = find_device_holders(table, DeviceMatcher.from_glob("/dev/nvidia*"))
    return {pid: table[pid].cmdline[:120] for pid in hits if pid != os.getpid()}


def settle_memory(timeout: float = 30.0) -> List[dict]:
    """Memory once two reads 0.5 s apart agree within a few MiB (contexts finish setting up)."""
    deadline = time.monotonic() + timeout
    prev = gpu_memory()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        cur = gpu_memory()
        if all(abs(a["used_mib"] - b["used_mib"]) <= 4 for a, b in zip(prev, cur)):
            return cur
        prev = cur
    return prev


def device_files(pid: int) -> dict:
    m = DeviceMatcher.from_glob("/dev/nvidia*")
    return {"open": sorted(open_device_files(pid, m)),
            "mapped": sorted(mapped_device_files(pid, m))}


def describe(fleet: Fleet, pids) -> str:
    return ", ".join("%d(%s, %s)" % (p, fleet.role(p), proc_state(p) or "gone")
                     for p in sorted(pids)) or "none"


def check_reap_frees_gpu_memory(gpu_count: int) -> dict:
    """8 TP-like workers (one with a setsid child, one with a double-forked daemon grandchild,
    one ignoring SIGTERM) and a CPU-only detokenizer, orphaned by a killed launcher; a CPU decoy,
    an NVML monitor and a protected GPU process beside them. gpu_reap (default device globs)
    must free all targets' memory, spare the decoy, the monitor and the protected process, and
    report memory back to the baseline."""
    before_us = preexisting_gpu_holders()
    fleet = Fleet(gpu_count=gpu_count)
    try:
        decoy = fleet.start_decoy()
        monitor = fleet.start_monitor()
        protected = fleet.start_protected()
        baseline = settle_memory()
        t0 = time.monotonic()
        launcher = fleet.start_server(workers=8, detached=True, ignore_term=True)
        startup_s = time.monotonic() - t0
        loaded = settle_memory()
        grew = sum(b["used_mib"] - a["used_mib"] for a, b in zip(baseline, loaded))
        expected_growth = 8 * 1024 + 2 * 512
        expect(grew >= expected_growth,
               "the fleet should add >= %d MiB of GPU memory; baseline %s, loaded %s"
               % (expected_growth, baseline, loaded))
        fleet.kill_launcher(launcher)
        targets = set(fleet.server_targets())
        evidence = {"worker0": device_files(fleet.pids("worker0")[0]),
                    "monitor": device_files(monitor["pid"])}
        expect(len(targets) == 11, "expected 11 server processes (8 workers, setsid child, "
               "daemon grandchild, detokenizer), tracked %s" % describe(fleet, targets))
        for role in ("worker1-setsid", "worker2-daemon"):
            pid = fleet.pids(role)[0]
            expect(alive(pid), "%s (%d) is not running" % (role, pid))

        common = dict(patterns=[fleet.tag("detokenizer")], protect=[fleet.tag("protected")],
                      protect_pids=sorted(before_us), grace=3.0, kill_timeout=30.0,
                      memory_baseline_mib=[g["used_mib"] for g in baseline],
                      memory_threshold_mib=THRESHOLD_MIB, memory_timeout=120.0)
        plan = reap(ReapOptions(check_mode=True, **common))
        planned = {r.pid for r in plan.would_kill}
        expect(planned == targets,
               "check mode must select exactly the server's processes; missing: %s; "
               "unexpected (NOT killed, check aborted): %s"
               % (describe(fleet, targets - planned),
                  "; ".join("%d %s found_by=%s (%s) device files %s"
                            % (r.pid, fleet.role(r.pid) if r.pid in fleet.records
                               else r.cmdline[:80], r.found_by, r.detail, device_files(r.pid))
                            for r in plan.would_kill if r.pid not in targets) or "none"))
        for pid in targets:
            expect(alive(pid), "check mode killed %s" % describe(fleet, [pid]))

        res = reap(ReapOptions(**common))
        killed = {r.pid: r for r in res.killed}
        left = [p for p in targets if alive(p)]
        expect(not left, "targets still running after gpu_reap: %s" % describe(fleet, left))
        expect(set(killed) == targets,
               "killed should be the server's processes; missing %s, extra %s"
               % (describe(fleet, targets - set(killed)), describe(fleet, set(killed) - targets)))
        expect(not res.survivors, "survivors reported: %s" % res.survivors)
        stubborn = fleet.pids("worker3")[0]
        expect(killed[stubborn].signal == "SIGKILL",
               "worker3 ignores SIGTERM: expected SIGKILL, got %s" % killed[stubborn].signal)
        for role in ("worker1-setsid", "worker2-daemon"):
            pid = fleet.pids(role)[0]
            expect(killed[pid].found_by == "device_fd",
                   "%s should be found by its /dev/nvidia* fds, was %s"
                   % (role, killed[pid].found_by))
        expect(alive(decoy["pid"]), "the decoy (CPU-only, unrelated) was killed")
        expect(alive(monitor["pid"]), "the NVML monitor (no CUDA context) was killed")
        why = {s["pid"]: s["reason"] for s in res.spared}.get(monitor["pid"], "")
        expect("has no CUDA context" in why,
               "the NVML monitor should be spared for holding no CUDA context; spared reason: "
               "%r; its device files: %s" % (why, device_files(monitor["pid"])))
        expect(alive(protected["pid"]), "the protected GPU process was killed")
        gone_before = [p for p in before_us if not alive(p)]
        expect(not gone_before, "pre-existing GPU processes died: %s"
               % ", ".join("%d %s" % (p, before_us[p]) for p in gone_before))
        expect(res.memory_clean is True,
               "memory not back to baseline (+%d MiB) after %.1f s: baseline %s, after %s"
               % (THRESHOLD_MIB, res.seconds, baseline,
                  [(g.index, g.used_mib) for g in res.memory_after]))
        for g in res.memory_after:
            base = baseline[g.index]["used_mib"]
            expect(g.used_mib <= base + THRESHOLD_MIB,
                   "GPU%d: %d MiB after, baseline %d" % (g.index, g.used_mib, base))
        independent = gpu_memory()
        for g, b in zip(independent, baseline):
            expect(g["used_mib"] <= b["used_mib"] + THRESHOLD_MIB,
                   "independent read: GPU%d %d MiB, baseline %d"
                   % (g["index"], g["used_mib"], b["used_mib"]))

        again = reap(ReapOptions(**common))
        expect(not again.changed and not again.killed,
               "a second reap should find nothing; killed %s" % [r.pid for r in again.killed])
        expect(again.memory_clean is True, "second reap: memory not clean")
        return {"startup_s": round(startup_s, 2), "reap_seconds": round(res.seconds, 3),
                "phases": {k: round(v, 3) for k, v in res.phases.items()},
                "memory_source": res.memory_source, "baseline": baseline, "loaded": loaded,
                "after": [{"index": g.index, "used_mib": g.used_mib} for g in res.memory_after],
                "killed": [{"pid": r.pid, "role": fleet.role(r.pid), "signal": r.signal,
                            "found_by": r.found_by} for r in res.killed],
                "spared": [{"pid": s["pid"], "name": s["name"], "cmdline": s["cmdline"][:160],
                            "reason": s["reason"]} for s in res.spared],
                "preexisting_gpu_holders": before_us, "device_files": evidence}
    finally:
        stuck = fleet.cleanup()
        if stuck:
            print("WARNING: processes of the check would not die: %s" % stuck, file=sys.stderr)


def gpu_processes() -> Dict[int, List[dict]]:
    """GPU index -> [{pid, used_mib}] as NVML (or nvidia-smi) lists the compute processes."""
    backend, reasons = open_backend("auto")
    if backend is None:
        raise CheckFailed("cannot read GPU memory: " + "; ".join(reasons))
    try:
        return {g.index: [{"pid": p.pid, "used_mib": p.used_mib}
                          for p in (g.process_memory or [])] for g in backend.memory()}
    finally:
        backend.close()


def check_protected_gpu_process_does_not_fail_the_reap(gpu_count: int) -> dict:
    """The H200 field failure: a process protected by bench_reap_protect held GPU memory and
    every profile failed in the reap ("GPU memory not back to baseline"), because the check
    counted the protected process's own memory. Here a protected torch process holds 2 GiB on
    GPU 0 beside two orphaned TP-like workers and a CPU detokenizer; gpu_reap runs with protect
    and a memory baseline taken before the protected process started. Expected: the workers and
    the detokenizer killed, the protected process alive, memory_clean true, and its memory
    listed in memory_excluded with the protect reason."""
    before_us = preexisting_gpu_holders()
    fleet = Fleet(gpu_count=gpu_count)
    try:
        baseline = settle_memory()              # before anything of ours holds the GPU
        protected = fleet.start_protected(mib=2048)
        launcher = fleet.start_server(workers=2, detached=False)
        loaded = settle_memory()
        fleet.kill_launcher(launcher)
        targets = set(fleet.server_targets())
        expect(len(targets) == 3, "expected 3 server processes (2 workers, detokenizer), "
               "tracked %s" % describe(fleet, targets))
        listed = gpu_processes()
        nvml_pids = {p["pid"] for procs in listed.values() for p in procs}
        # what the GPUs gained against what NVML attributes to processes (context overheads
        # the per-process figure may not carry would show here)
        accounting = {"device_delta_mib": sum(b["used_mib"] - a["used_mib"]
                                              for a, b in zip(baseline, loaded)),
                      "per_process_sum_mib": sum(p["used_mib"] or 0 for procs in listed.values()
                                                 for p in procs if p["pid"] in fleet.records)}
        protected_mib = next((p["used_mib"] for p in listed.get(0, [])
                              if p["pid"] == protected["pid"]), None)
        common = dict(patterns=[fleet.tag("detokenizer")], protect=[fleet.tag("protected")],
                      protect_pids=sorted(before_us), grace=3.0, kill_timeout=30.0,
                      memory_baseline_mib=[g["used_mib"] for g in baseline],
                      memory_threshold_mib=THRESHOLD_MIB, memory_timeout=120.0)
        plan = reap(ReapOptions(check_mode=True, **common))
        planned = {r.pid for r in plan.would_kill}
        expect(planned == targets,
               "check mode must select exactly the server's processes; missing: %s; "
               "unexpected (NOT killed, check aborted): %s"
               % (describe(fleet, targets - planned),
                  "; ".join("%d %s found_by=%s (%s)" % (r.pid, r.cmdline[:80], r.found_by,
                                                        r.detail)
                            for r in plan.would_kill if r.pid not in targets) or "none"))
        if protected["pid"] not in nvml_pids:
            # NVML names processes by host pid; in a container's own pid namespace none of them
            # is a local process, and the reaper says so instead of guessing
            raise CheckSkipped(
                "NVML does not list the protected process by its pid here (%d; NVML lists %s): "
                "this machine's pid namespace is not the driver's (a container), so per-process "
                "memory cannot be attributed; gpu_reap's memory_note: %r"
                % (protected["pid"], sorted(nvml_pids), plan.memory_note))

        res = reap(ReapOptions(**common))
        left = [p for p in targets if alive(p)]
        expect(not left, "targets still running after gpu_reap: %s" % describe(fleet, left))
        expect({r.pid for r in res.killed} == targets,
               "killed should be the server's processes; got %s"
               % describe(fleet, {r.pid for r in res.killed}))
        expect(alive(protected["pid"]), "the protected GPU process was killed")
        gone_before = [p for p in before_us if not alive(p)]
        expect(not gone_before, "pre-existing GPU processes died: %s"
               % ", ".join("%d %s" % (p, before_us[p]) for p in gone_before))
        excluded = {e.index: e for e in res.memory_excluded}
        kept = [p for p in excluded[0].processes if p.pid == protected["pid"]] \
            if 0 in excluded else []
        expect(res.memory_clean is True,
               "memory not clean with the protected process holding %s MiB: %s; baseline %s, "
               "after %s, excluded %s, note %r"
               % (protected_mib, accounting, [g["used_mib"] for g in baseline],
                  [(g.index, g.used_mib, g.processes) for g in res.memory_after],
                  [(e.index, e.excluded_mib, [(p.pid, p.used_mib, p.reason)
                                              for p in e.processes])
                   for e in res.memory_excluded], res.memory_note))
        expect(len(kept) == 1 and kept[0].used_mib >= 2048
               and kept[0].reason.startswith("protect pattern"),
               "memory_excluded of GPU0 should list the protected process (pid %d) with >= 2048 "
               "MiB and its protect reason; got %s"
               % (protected["pid"], [(p.pid, p.used_mib, p.reason)
                                     for p in excluded.get(0, MemoryExclusion(0, "", 0)).processes]))
        # the old rule (used <= baseline + threshold) would have failed: the protected 2 GiB
        g0 = next(g for g in res.memory_after if g.index == 0)
        expect(g0.used_mib > baseline[0]["used_mib"] + THRESHOLD_MIB,
               "GPU0 used %d MiB after, baseline %d: the protected process should still hold "
               "its memory" % (g0.used_mib, baseline[0]["used_mib"]))
        return {"reap_seconds": round(res.seconds, 3), "memory_source": res.memory_source,
                "baseline": baseline, "loaded": loaded,
                "after": [{"index": g.index, "used_mib": g.used_mib, "processes": g.processes}
                          for g in res.memory_after],
                "excluded": [{"index": e.index, "excluded_mib": e.excluded_mib,
                              "processes": [{"pid": p.pid, "used_mib": p.used_mib,
                                             "reason": p.reason} for p in e.processes]}
                             for e in res.memory_excluded],
                "protected": {"pid": protected["pid"], "nvml_used_mib": protected_mib},
                "accounting": accounting,
                "killed": [{"pid": r.pid, "role": fleet.role(r.pid), "signal": r.signal,
                            "found_by": r.found_by} for r in res.killed],
                "vanished": [{"pid": r.pid, "found_by": r.found_by, "side_effect": r.side_effect}
                             for r in res.vanished],
                "memory_note": res.memory_note}
    finally:
        stuck = fleet.cleanup()
        if stuck:
            print("WARNING: processes of the check would not die: %s" % stuck, file=sys.stderr)


def check_gpu_facts_agrees_with_nvidia_smi() -> dict:
    fields = ["index", "name", "uuid", "compute_cap", "memory.total", "memory.used",
              "driver_version"]
    settle_memory()        # an earlier check's processes may still be releasing memory
    smi_cuda = gpu_env.smi_cuda_version()
    out = {}
    for backend in ("nvml", "nvidia-smi"):
        facts = collect_gpu_facts(GpuFactsOptions(backend=backend))
        smi = gpu_env.smi_query(fields)           # right after: used memory is comparable
        expect(facts.source == backend, "backend %s: source is %s (reason: %s)"
               % (backend, facts.source, facts.reason))
        expect(len(facts.gpus) == len(smi), "backend %s: %d GPUs, nvidia-smi lists %d"
               % (backend, len(facts.gpus), len(smi)))
        for g, s in zip(facts.gpus, smi):
            where = "backend %s GPU%s" % (backend, s["index"])
            expect(str(g.index) == s["index"], "%s: index %s" % (where, g.index))
            expect(g.name == s["name"], "%s: name %r, nvidia-smi %r" % (where, g.name, s["name"]))
            expect(g.uuid == s["uuid"], "%s: uuid %r, nvidia-smi %r" % (where, g.uuid, s["uuid"]))
            expect(g.compute_capability == s["compute_cap"], "%s: compute capability %r, "
                   "nvidia-smi %r" % (where, g.compute_capability, s["compute_cap"]))
            expect(g.memory_total_mib == int(s["memory.total"]), "%s: total %d MiB, nvidia-smi %s"
                   % (where, g.memory_total_mib, s["memory.total"]))
            tol = max(64, int(0.01 * g.memory_total_mib))
            expect(abs(g.memory_used_mib - int(s["memory.used"])) <= tol,
                   "%s: used %d MiB, nvidia-smi %s (tolerance %d)"
                   % (where, g.memory_used_mib, s["memory.used"], tol))
        expect(facts.driver_version == smi[0]["driver_version"], "backend %s: driver %r, "
               "nvidia-smi %r" % (backend, facts.driver_version, smi[0]["driver_version"]))
        expect(facts.cuda_driver_version == smi_cuda, "backend %s: CUDA driver version %r, "
               "nvidia-smi header says %r" % (backend, facts.cuda_driver_version, smi_cuda))
        out[backend] = {"gpus": [{"index": g.index, "name": g.name,
                                  "compute_capability": g.compute_capability,
                                  "memory_total_mib": g.memory_total_mib} for g in facts.gpus],
                        "driver_version": facts.driver_version,
                        "cuda_driver_version": facts.cuda_driver_version,
                        "cuda_selected": facts.cuda_selected, "nvcc_release": facts.nvcc_release,
                        "toolkits": [k.version for k in facts.toolkits]}
    return out


def check_gpu_facts_venv() -> dict:
    """The running interpreter as the 'venv': torch's version and CUDA as torch itself says."""
    import torch
    facts = collect_gpu_facts(GpuFactsOptions(venv=sys.executable))
    v = facts.venv
    expect(v.torch is not None and v.torch.split("+")[0] == torch.__version__.split("+")[0],
           "venv torch %r, torch.__version__ %r" % (v.torch, torch.__version__))
    expect(v.torch_cuda == torch.version.cuda, "venv torch_cuda %r, torch.version.cuda %r"
           % (v.torch_cuda, torch.version.cuda))
    return {"torch": v.torch, "torch_cuda": v.torch_cuda, "sglang": v.sglang,
            "flashinfer": v.flashinfer}


def gpu_count() -> int:
    return len(gpu_memory())
