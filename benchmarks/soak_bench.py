"""Soak (issue 26, item 4): the load generator's memory over one long level, its end included.

What was seen: at C=250 on the embedded default (the simulator's baseline profile, time scale
20, 2048 prompt / 512 output tokens) the load generator's RSS went from 27 MB to 70 MB in 74 s,
linearly, with its file descriptors flat. The goal: RSS flat within 10 % over a 10-minute level,
the end of the level included.

One level of `--minutes` runs in a process of its own (run_level, as llm_bench's module runs it;
its stdout is a pipe this script reads, as Ansible's would be), against the simulator. Every
`--interval` seconds this script prints VmRSS of that process and of its client processes
(its descendants), read from /proc; at the end the growth from the first sample after `--settle`
seconds to the last, per minute and in %.

The end of the level: when the window's last request finished, each client process reduces its
spooled records (loadgen/client.py finish_records: it opens its rows file first, then reduces)
and the controller merges the parts and takes the level's figures. That peak lasts seconds and
falls between samples, so it is measured apart: every 0.2 s this script reads each process's
VmHWM (its peak RSS so far) and keeps the reading taken just before the first rows file appeared
in the level's spool directory ("during the level"); the level process reports its own and its
largest client's whole-life peak (getrusage ru_maxrss) when it is done, and the clients' last
VmHWM readings are kept ("the level's end included"). The verdict compares the peak, end
included, with the first settled sample. No asserts: figures, and a verdict.

Usage: python3 benchmarks/soak_bench.py [--minutes 10] [--concurrency 250] [--interval 10]
       [--settle 30] [--write-md [PATH]]
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402
collection_link.importable()      # simproc builds the simulator from this checkout
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
    import resource
    print(json.dumps({"requests": res.row.requests, "run_requests": res.row.run_requests,
                      "records": len(res.requests), "stop": res.row.stop_reason,
                      "self_maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                      "children_maxrss_kb":
                          resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
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


def status_mb(pid: int, key: str = "VmRSS:") -> float:
    """A /proc/PID/status memory figure (VmRSS, VmHWM) in MB; 0 once the process is gone."""
    try:
        with open("/proc/%d/status" % pid) as fh:
            for line in fh:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def rss_mb(pid: int) -> float:
    return status_mb(pid)


def sample(pid: int) -> Tuple[float, float, int]:
    """(the level process's RSS, its client processes' RSS, how many clients), MB."""
    kids = descendants(pid)
    return rss_mb(pid), sum(rss_mb(k) for k in kids), len(kids)


def level_ended(pid: int) -> bool:
    """A client process began the level's end: its rows file is in the spool directory
    (loadgen/spool.py spool_directory, loadgen/client.py finish_records)."""
    pattern = os.path.join(tempfile.gettempdir(), "servelab-level-%d-*" % pid, "*.rows")
    return bool(glob.glob(pattern))


class Peaks:
    """VmHWM of the level process and of each client process, read every poll; the readings of
    the last poll before the level's end began are the peaks "during the level"."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.hwm: Dict[int, float] = {}
        self.during: Optional[Dict[int, float]] = None
        self.during_rss = 0.0           # highest total VmRSS read before the end
        self.ended_at: Optional[float] = None
        self._before: Dict[int, float] = {}

    def poll(self, t: float) -> None:
        pids = [self.pid] + descendants(self.pid)
        ended = self.during is not None or level_ended(self.pid)
        readings = {p: status_mb(p, "VmHWM:") for p in pids}
        if not ended:
            self.during_rss = max(self.during_rss, sum(rss_mb(p) for p in pids))
        for p, mb in readings.items():
            if mb:
                self.hwm[p] = max(self.hwm.get(p, 0.0), mb)
        if ended and self.during is None:
            self.during = dict(self._before)
            self.ended_at = t
        if not ended:
            self._before = dict(self.hwm)

    def split(self, during: Dict[int, float]) -> Tuple[float, float]:
        """(level process, client processes summed) of a set of readings."""
        return during.get(self.pid, 0.0), sum(v for p, v in during.items() if p != self.pid)


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
        peaks = Peaks(level.pid)
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
                peaks.poll(time.monotonic() - t0)
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
    during = peaks.during or peaks.hwm
    lvl_during, cli_during = peaks.split(during)
    lvl_end = max(result.get("self_maxrss_kb", 0) / 1024.0, peaks.hwm.get(level.pid, 0.0))
    largest = result.get("children_maxrss_kb", 0) / 1024.0
    # A client's last VmHWM reading may precede its last moments (its part pickled to the
    # controller): its whole-life peak, ru_maxrss, is the larger where there is one client.
    cli_end = max(peaks.split(peaks.hwm)[1], largest)
    say("")
    say("| peak RSS (VmHWM), MB | level process | client processes | total |")
    say("|---|---:|---:|---:|")
    say("| during the level (last reading before its end, t=%s s) | %.1f | %.1f | %.1f |"
        % ("%.0f" % peaks.ended_at if peaks.ended_at is not None else "-", lvl_during,
           cli_during, lvl_during + cli_during))
    say("| the level's end included (whole life) | %.1f | %.1f | %.1f |"
        % (lvl_end, cli_end, lvl_end + cli_end))
    say("")
    say("The end adds %+.1f MB (%+.1f %%) to the peak during the level; the largest client "
        "process's whole-life peak (ru_maxrss): %.1f MB; highest total VmRSS sampled before the "
        "end: %.1f MB." % (lvl_end + cli_end - lvl_during - cli_during,
                           100.0 * (lvl_end + cli_end - lvl_during - cli_during)
                           / max(lvl_during + cli_during, 1e-9), largest, peaks.during_rss))
    peak_growth = 100.0 * (lvl_end + cli_end - total0) / total0 if total0 else float("nan")
    say("Peak, end included, against the first settled sample (%.1f MB): %+.1f %% (target: "
        "within %.0f %%): %s" % (total0, peak_growth, TARGET_GROWTH,
                                 "ok" if abs(peak_growth) <= TARGET_GROWTH else "MISS"))
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
