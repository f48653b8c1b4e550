"""Run the GPU checks without pytest or Ansible (the GPU machine has neither, maybe).

    python3 tests/gpu/run_gpu_checks.py [--out results.json] [--only NAME]...

Prints one line per check (PASS / FAIL / SKIP with the reason), writes every measurement to
--out as JSON, and exits 1 if any check failed, 0 otherwise (also when skipped for want of a GPU,
which is printed loudly).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpu_env  # noqa: E402

os.environ.update(gpu_env.NO_MULTICAST_ENV)   # inherited by every GPU process started here


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write results as JSON here")
    ap.add_argument("--only", action="append", default=[],
                    help="run only these checks (reap, protect, facts, venv)")
    args = ap.parse_args()

    report = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "host": platform.node(), "python": sys.version.split()[0], "checks": {}}
    ok, why = gpu_env.gpu_present()
    report["gpu"] = why
    if not ok:
        print("SKIP all GPU checks: no NVIDIA GPU with a working driver here (%s)" % why)
        report["skipped"] = why
        _write(args.out, report)
        return 0

    import gpu_checks
    n = gpu_checks.gpu_count()
    checks = [
        ("reap", "gpu_reap frees the memory of 8 orphaned TP-like workers and their detached "
                 "children, spares decoy, NVML monitor and protected",
         lambda: gpu_checks.check_reap_frees_gpu_memory(n)),
        ("protect", "protected GPU process does not fail the reap: its memory is left out of "
                    "the memory check, per process (NVML)",
         lambda: gpu_checks.check_protected_gpu_process_does_not_fail_the_reap(n)),
        ("facts", "gpu_facts agrees with nvidia-smi --query-gpu (NVML and nvidia-smi backends)",
         gpu_checks.check_gpu_facts_agrees_with_nvidia_smi),
        ("venv", "gpu_facts reads torch's version and CUDA from the interpreter's packages",
         gpu_checks.check_gpu_facts_venv),
    ]
    failed = 0
    for name, title, fn in checks:
        if args.only and name not in args.only:
            continue
        t0 = time.monotonic()
        entry = {"title": title}
        try:
            entry["result"] = fn()
            entry["status"] = "PASS"
        except gpu_checks.CheckFailed as exc:
            entry["status"] = "FAIL"
            entry["error"] = str(exc)
        except gpu_checks.CheckSkipped as exc:       # nothing to say here, and why
            entry["status"] = "SKIP"
            entry["error"] = str(exc)
        except Exception as exc:                     # a crash is a failure with its traceback
            entry["status"] = "FAIL"
            entry["error"] = "%s: %s" % (type(exc).__name__, exc)
            entry["traceback"] = traceback.format_exc()
        entry["seconds"] = round(time.monotonic() - t0, 2)
        report["checks"][name] = entry
        failed += entry["status"] == "FAIL"
        print("%s %-6s %5.1fs  %s" % (entry["status"], name, entry["seconds"], title))
        if entry["status"] in ("FAIL", "SKIP"):
            print("     " + entry["error"].replace("\n", "\n     "))
            if "traceback" in entry:
                print(entry["traceback"])
        else:
            print("     " + json.dumps(entry["result"], default=str)[:1500])
    report["failed"] = failed
    _write(args.out, report)
    skipped = [n for n, e in report["checks"].items() if e["status"] == "SKIP"]
    print("%d check(s) failed" % failed if failed else "all GPU checks passed")
    if skipped:
        print("skipped (see above why): %s" % ", ".join(skipped))
    return 1 if failed else 0


def _write(path, report) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2, default=str)


if __name__ == "__main__":
    sys.exit(main())
