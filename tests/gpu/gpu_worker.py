"""A stand-in for an inference worker: takes GPU memory with torch and keeps it until killed.

    python3 gpu_worker.py <tag> --ready FILE [--mib N] [--device K] [--cpu-only | --nvml-monitor]
        [--ignore-term] [--spawn ARGS-JSON]... [--setsid-child ARGS-JSON]...
        [--daemon-child ARGS-JSON]... [--daemonize]

<tag> only lands in the command line (tests match it with patterns and protect).
Children are started by spawn/exec (subprocess), never by fork after CUDA init:
  --spawn         a plain child (same session), like a TP worker under its launcher
  --setsid-child  a child in a new session (setsid)
  --daemon-child  a double-forked, setsid daemon grandchild (reparented to init at once)
--daemonize is how --daemon-child is done: that process forks, the child setsid()s and forks
again, the grandchild execs this script; all before any CUDA call in those processes.
The ready file gets {"pid", "pgid", "sid", "device", "mib", "children": [...], "detached": [...]}
once this process holds its memory and its children are ready.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

READY_TIMEOUT = 300.0


def wait_ready(path: str, proc: subprocess.Popen = None) -> dict:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            with open(path) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            pass
        if proc is not None and proc.poll() not in (None, 0):
            raise SystemExit("child for %s exited with %s" % (path, proc.returncode))
        time.sleep(0.05)
    raise SystemExit("child not ready after %.0f s: %s" % (READY_TIMEOUT, path))


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.rename(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tag")
    ap.add_argument("--ready", required=True)
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--cpu-only", action="store_true")
    ap.add_argument("--nvml-monitor", action="store_true",
                    help="no CUDA: hold NVML open and poll it, like nvidia-smi -l or an exporter")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--spawn", action="append", default=[])
    ap.add_argument("--setsid-child", action="append", default=[])
    ap.add_argument("--daemon-child", action="append", default=[])
    ap.add_argument("--daemonize", action="store_true")
    args = ap.parse_args()
    me = [sys.executable, os.path.abspath(__file__)]

    if args.daemonize:
        # double fork before torch is imported: the grandchild runs this script afresh
        argv = [a for a in sys.argv[1:] if a != "--daemonize"]
        pid = os.fork()
        if pid == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, me + argv)
            os._exit(0)
        os.waitpid(pid, 0)
        return

    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    # children first (they start their own CUDA contexts in parallel with ours)
    pending = []
    for kind, specs in (("spawn", args.spawn), ("setsid", args.setsid_child),
                        ("daemon", args.daemon_child)):
        for i, spec in enumerate(specs):
            cargs = json.loads(spec)
            ready = "%s.%s%d" % (args.ready, kind, i)
            extra = ["--daemonize"] if kind == "daemon" else []
            proc = subprocess.Popen(me + cargs + ["--ready", ready] + extra,
                                    start_new_session=(kind == "setsid"))
            pending.append((kind, ready, proc))

    if args.nvml_monitor:
        import threading
        import pynvml
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                   for i in range(pynvml.nvmlDeviceGetCount())]

        def poll():
            while True:
                for h in handles:
                    pynvml.nvmlDeviceGetMemoryInfo(h)
                time.sleep(0.5)
        threading.Thread(target=poll, daemon=True).start()
    elif not args.cpu_only:
        import torch
        torch.cuda.set_device(args.device)
        block = torch.empty(args.mib * 1024 * 1024, dtype=torch.uint8,
                            device="cuda:%d" % args.device)
        block.fill_(1)
        torch.cuda.synchronize()

    children, detached = [], []
    for kind, ready, proc in pending:
        if kind == "daemon":
            proc.wait()                          # the double-forking helper returns at once
            detached.append(wait_ready(ready))
        else:
            children.append(wait_ready(ready, proc))
    write_json(args.ready, {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
                            "tag": args.tag,
                            "device": None if args.cpu_only or args.nvml_monitor else args.device,
                            "mib": 0 if args.cpu_only or args.nvml_monitor else args.mib,
                            "children": children, "detached": detached})
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
