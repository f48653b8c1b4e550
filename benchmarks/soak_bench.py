"""Soak (issue 26, item 4): the load generator's memory over one long level.

What was seen: at C=250 on the embedded default (the simulator's baseline profile, time scale
20, 2048 prompt / 512 output tokens) the load generator's RSS went from 27 MB to 70 MB in 74 s,
linearly, with its file descriptors flat. The goal: RSS flat within 10 % over a 10-minute level.

One level of `--minutes` runs in a process of its own (run_level, as llm_bench's module runs it;
its stdout is a pipe this script reads, as Ansible's would be), against the simulator. Every
`--interval` seconds this script reads VmRSS of that process and of its client processes
(its descendants) from /proc, and prints one line; at the end the growth from the first sample
after `--settle` seconds to the last, per minute and in %. No asserts: a figure, and a verdict.

Usage: python3 benchmarks/soak_bench.py [--minutes 10] [--concurrency 250] [--interval 10]
       [--settle 30] [--write-md [PATH]]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
from simproc import ServerProcess  # noqa: E402

TARGET_GROWTH = 10.0      # %, first settled sample to the last

LEVEL = textwrap.dedent("""\
    import json, sys
    sys.path.insert(0, %r)
    import collection_link
    collection_link.importable()
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load
    url, c, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    cfg = LevelConfig(base_url=url, model="servelab-sim", concurrency=c, max_tokens=512,
                      level_seconds=seconds, level_timeout=seconds * 2 + 120,
                      server_metrics=False)
    res = run_level(cfg, load({"kind": "synthetic", "input_tokens": 2048,
                               "output_tokens": 512}))
    print(json.dumps({"requests": res.row.requests, "run_requests": res.row.run_requests,
                      "records": len(res.requests), "stop": res.row.stop_reason}))
""") % os.path.join(REPO, "tools")


def descendants(pid: int) -> List[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open("/proc/%d/task/%d/children" % (p, p)) as fh:
                kids = [int(k) for k in fh.read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def rss_mb(pid: int) -> float:
    try:
        with open("/proc/%d/status" % pid) as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def sample(pid: int) -> Tuple[float, float, int]:
    """(the level process's RSS, its client processes' RSS, how many clients), MB."""
    kids = descendants(pid)
    return rss_mb(pid), sum(rss_mb(k) for k in kids), len(kids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=250)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=30.0,
                    help="seconds of warmup and ramp before the first sample that counts")
    ap.add_argument("--time-scale", default="20")
    ap.add_argument("--write-md", nargs="?", const="", default=None)
    args = ap.parse_args()

    lines: List[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    samples: List[Tuple[float, float, float, int]] = []
    sim = ServerProcess("--profile", "baseline", "--time-scale", args.time_scale)
    try:
        level = subprocess.Popen([sys.executable, "-c", LEVEL, sim.url, str(args.concurrency),
                                  str(args.minutes * 60)], stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        say("| t (s) | level process MB | client processes MB | clients | total MB |")
        say("|---:|---:|---:|---:|---:|")
        while level.poll() is None:
            parent, clients, n = sample(level.pid)
            t = time.monotonic() - t0
            if n:
                samples.append((t, parent, clients, n))
                total = parent + clients
                say("| %.0f | %.1f | %.1f | %d | %.1f |" % (t, parent, clients, n, total))
            deadline = time.monotonic() + args.interval
            while level.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        result: Dict = json.loads(level.stdout.read().strip().splitlines()[-1] or "{}")
    finally:
        sim.stop()
    settled = [s for s in samples if s[0] >= args.settle] or samples
    first, last = settled[0], settled[-1]
    total0, total1 = first[1] + first[2], last[1] + last[2]
    minutes = max((last[0] - first[0]) / 60.0, 1e-9)
    growth = 100.0 * (total1 - total0) / total0 if total0 else float("nan")
    say("")
    say("level: C=%d for %.1f min, %s requests in the window (%s in the run), %s request "
        "records, stop: %s" % (args.concurrency, args.minutes, result.get("requests"),
                               result.get("run_requests"), result.get("records"),
                               result.get("stop")))
    say("RSS (level process + clients) %.1f MB at %.0f s -> %.1f MB at %.0f s: %+.1f MB/min, "
        "%+.1f %% (target: within %.0f %%): %s" % (
            total0, first[0], total1, last[0], (total1 - total0) / minutes, growth,
            TARGET_GROWTH, "ok" if abs(growth) <= TARGET_GROWTH else "MISS"))
    if args.write_md is not None:
        path = args.write_md or os.path.join(
            HERE, "results", "soak-%s.md" % datetime.date.today().isoformat())
        head = ["# Soak: load generator RSS over one level", "",
                "- date: %s" % datetime.datetime.now(datetime.UTC).isoformat(
                    timespec="seconds"),
                "- machine: %s, %d CPUs, Python %s" % (platform.node(), os.cpu_count() or 0,
                                                       platform.python_version()),
                "- command: python3 benchmarks/soak_bench.py %s" % " ".join(sys.argv[1:]),
                "- simulator: baseline profile, time scale %s, 2048/512 tokens"
                % args.time_scale, ""]
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(head + lines) + "\n")
        print("written to %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
