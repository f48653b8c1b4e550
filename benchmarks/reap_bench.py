"""gpu_reap against the field method: time from the call to GPU memory verified free.

    python3 benchmarks/reap_bench.py --json OUT.json [--repeat 3] [--workers 8] [--mib 1024]

Each trial starts a stopped-server stand-in (tests/gpu/gpu_fleet.py): a launcher with N GPU
workers (torch, --mib each, spread over the GPUs) and a CPU-only detokenizer, the launcher then
SIGKILLed so the rest are orphans; beside it a CPU-only decoy and a protected GPU process
(someone else's work). Then one of:

- servelab: gpu_reap's logic (reaper.reap) with the real /dev/nvidia* scan, protect pattern for
  the protected process, memory baseline = memory before the server started; the clock stops
  when reap() returns, i.e. when it has verified memory back to the baseline.
- field:    `kill -9` of the targets (given their exact PIDs, the field's best case), `sleep 3`,
  one `nvidia-smi --query-gpu=memory.used` check against the same baseline. A background NVML
  poller notes when memory was actually back (informational: how much of the 3 s was a guess).

Collateral = processes that were not targets and died (the decoy, the protected one). The
field's literal commands (`kill -9` of every python3, `fuser -k /dev/nvidia*`) would also have
hit the decoy and the protected process; that count is reported as `field_literal_would_hit`,
computed from the processes, never executed. Methods alternate across trials.
Goal: servelab under 1.5 s with 0 collateral. Needs: python3, torch with CUDA, an NVIDIA GPU;
pynvml optional (nvidia-smi is used otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "gpu"))
import gpu_env  # noqa: E402

os.environ.update(gpu_env.NO_MULTICAST_ENV)   # inherited by every GPU process started here

gpu_env.use_module_utils()
from gpu_fleet import Fleet, alive  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.facts import GpuFactsOptions, collect_gpu_facts  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.query import open_backend  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import DeviceMatcher, find_device_holders  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import scan_processes  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import ReapOptions, reap  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table  # noqa: E402

GOAL_SECONDS = 1.5
THRESHOLD_MIB = 256
FIELD_SLEEP = 3.0


def memory_used():
    backend, reasons = open_backend("auto")
    if backend is None:
        raise SystemExit("cannot read GPU memory: " + "; ".join(reasons))
    try:
        return [g.used_mib for g in backend.memory()]
    finally:
        backend.close()


def settle(timeout=30.0):
    deadline = time.monotonic() + timeout
    prev = memory_used()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        cur = memory_used()
        if all(abs(a - b) <= 4 for a, b in zip(prev, cur)):
            return cur
        prev = cur
    return prev


def smi_used():
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             stdout=subprocess.PIPE, text=True, timeout=60, check=False).stdout
        return [int(x.strip()) for x in out.split()]
    return memory_used()


def preexisting_holders():
    table = scan_processes()
    hits = find_device_holders(table, DeviceMatcher.from_glob("/dev/nvidia*"))
    return sorted(p for p in hits if p != os.getpid())


class FreePoller(threading.Thread):
    """Notes when memory first got back under baseline + threshold (informational)."""

    def __init__(self, baseline, t0):
        super().__init__(daemon=True)
        self.baseline, self.t0 = baseline, t0
        self.freed_at = None
        self.stop = threading.Event()

    def run(self):
        backend, _reason = open_backend("auto")
        if backend is None:
            return
        try:
            while not self.stop.is_set():
                used = [g.used_mib for g in backend.memory()]
                if all(u <= b + THRESHOLD_MIB for u, b in zip(used, self.baseline)):
                    self.freed_at = time.perf_counter() - self.t0
                    return
                time.sleep(0.01)
        finally:
            backend.close()


def trial(method, args, gpus, protect_pids):
    fleet = Fleet(gpu_count=gpus)
    row = {"method": method}
    try:
        decoy = fleet.start_decoy()
        protected = fleet.start_protected(mib=512)
        baseline = settle()
        launcher = fleet.start_server(workers=args.workers, mib=args.mib, detached=False)
        loaded = settle()
        fleet.kill_launcher(launcher)
        targets = set(fleet.server_targets())
        bystanders = [decoy["pid"], protected["pid"]]
        row.update(baseline_mib=baseline, loaded_mib=loaded, targets=len(targets))
        # what the field's literal commands would also have hit: python3 processes and GPU holders
        row["field_literal_would_hit"] = len(bystanders)

        if method == "servelab":
            opts = dict(patterns=[fleet.tag("detokenizer")], protect=[fleet.tag("protected")],
                        protect_pids=protect_pids, grace=10.0, kill_timeout=30.0,
                        memory_baseline_mib=baseline, memory_threshold_mib=THRESHOLD_MIB,
                        memory_timeout=60.0)
            plan = reap(ReapOptions(check_mode=True, **opts))       # safety gate, not timed
            planned = {r.pid for r in plan.would_kill}
            if planned != targets:
                raise SystemExit("selection differs from the fleet's targets: unexpected %s, "
                                 "missing %s; nothing killed"
                                 % (sorted(planned - targets), sorted(targets - planned)))
            t0 = time.perf_counter()
            res = reap(ReapOptions(**opts))
            row["seconds"] = time.perf_counter() - t0
            row["verified"] = bool(res.memory_clean)
            row["phases"] = {k: round(v, 4) for k, v in res.phases.items()}
            row["after_mib"] = [g.used_mib for g in res.memory_after]
            row["memory_source"] = res.memory_source
        else:
            t0 = time.perf_counter()
            poller = FreePoller(baseline, t0)
            for pid in sorted(targets):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            poller.start()
            time.sleep(FIELD_SLEEP)
            after = smi_used()
            row["seconds"] = time.perf_counter() - t0
            poller.stop.set()
            poller.join(timeout=5)
            row["verified"] = all(u <= b + THRESHOLD_MIB for u, b in zip(after, baseline))
            row["after_mib"] = after
            row["actually_freed_at_s"] = poller.freed_at
        row["survivors"] = len([p for p in targets if alive(p)])
        row["collateral"] = len([p for p in bystanders if not alive(p)])
        return row
    finally:
        fleet.cleanup()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--mib", type=int, default=1024)
    args = ap.parse_args()

    ok, why = gpu_env.gpu_present()
    if not ok:
        print("no NVIDIA GPU with a working driver here: %s" % why)
        return 2
    facts = collect_gpu_facts(GpuFactsOptions())
    gpus = len(facts.gpus)
    protect_pids = preexisting_holders()
    order = []
    for i in range(args.repeat):
        order += ["servelab", "field"] if i % 2 == 0 else ["field", "servelab"]
    rows = []
    for i, method in enumerate(order):
        row = trial(method, args, gpus, protect_pids)
        row["trial"] = i
        rows.append(row)
        print("trial %d %-8s %.3f s verified=%s collateral=%d survivors=%d%s" % (
            i, method, row["seconds"], row["verified"], row["collateral"], row["survivors"],
            "" if method == "servelab" else " (memory actually back at %s s)"
            % ("%.3f" % row["actually_freed_at_s"] if row["actually_freed_at_s"] else "n/a")))

    summary = {}
    for method in ("servelab", "field"):
        rs = [r for r in rows if r["method"] == method]
        secs = [r["seconds"] for r in rs]
        summary[method] = {
            "trials": len(rs), "median_s": statistics.median(secs), "min_s": min(secs),
            "max_s": max(secs), "all_verified": all(r["verified"] for r in rs),
            "collateral": sum(r["collateral"] for r in rs),
            "survivors": sum(r["survivors"] for r in rs)}
    fr = [r["actually_freed_at_s"] for r in rows if r["method"] == "field"
          and r.get("actually_freed_at_s") is not None]
    summary["field"]["actually_freed_median_s"] = statistics.median(fr) if fr else None
    summary["field"]["literal_commands_would_hit_per_trial"] = rows[0]["field_literal_would_hit"]
    s = summary["servelab"]
    met = s["median_s"] < GOAL_SECONDS and s["collateral"] == 0 and s["all_verified"] \
        and s["survivors"] == 0

    print()
    table = Table(["method", "trials", "median s", "min s", "max s", "verified", "collateral",
                   "survivors"], [])
    for method in ("servelab", "field"):
        m = summary[method]
        table.rows.append([method, "%d" % m["trials"], "%.3f" % m["median_s"],
                           "%.3f" % m["min_s"], "%.3f" % m["max_s"], str(m["all_verified"]),
                           "%d" % m["collateral"], "%d" % m["survivors"]])
    print(table.to_markdown(right=[False, True, True, True, True, False, True, True]))
    print()
    print("field: memory was actually back after %s s (median); its literal commands (kill -9 "
          "of every python3, fuser -k /dev/nvidia*) would also have hit %d bystanders per trial"
          % ("%.3f" % summary["field"]["actually_freed_median_s"]
             if summary["field"]["actually_freed_median_s"] is not None else "n/a",
             summary["field"]["literal_commands_would_hit_per_trial"]))
    print("goal (servelab < %.1f s, 0 collateral, verified): %s"
          % (GOAL_SECONDS, "MET" if met else "NOT MET"))

    out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
           "gpus": [{"index": g.index, "name": g.name, "memory_total_mib": g.memory_total_mib}
                    for g in facts.gpus],
           "driver_version": facts.driver_version, "cuda_driver_version": facts.cuda_driver_version,
           "settings": {"workers": args.workers, "mib": args.mib, "repeat": args.repeat,
                        "threshold_mib": THRESHOLD_MIB, "field_sleep_s": FIELD_SLEEP},
           "goal": {"seconds": GOAL_SECONDS, "collateral": 0, "met": met},
           "summary": summary, "trials": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=2)
    print("wrote %s" % args.json)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
