"""How accurate, how cheap and how fast is servelab's load generator? (prints figures; no asserts)

Against the simulator (plugins/module_utils/simulator/), which logs when it really
received every request and emitted every chunk (server CLOCK_MONOTONIC, the same clock as the
client's on one machine), it measures:

1. Accuracy in the `fixed` setting (first chunk 50 ms after the request, then one chunk every
   12 ms) at C = 1..256: window output tok/s, TPOT p50 and TTFT p50 of llm_bench against the
   truth over the same window. Targets: tok/s and TPOT within 0.5 %, TTFT within 5 % or 2 ms.
2. Cost: client CPU per streamed token (window CPU of the client processes / window tokens).
   Target at C=256: <= 24 us.
3. Capacity in the `firehose` setting (the server writes chunks as fast as it can): token events
   per second sustained with that accuracy, for 1, 2, ... client processes, beside the raw-socket
   floor (a client that only counts events) and a naive client (one aiohttp session per request,
   json.loads of every chunk) measured in the same run. Target: >= 120k events/s.

Usage: python3 benchmarks/client_bench.py [--quick] [--write-md] [--cpus 0,1]
`--cpus` pins the simulator and the clients to those CPUs (emulates a 2-core machine on a bigger
one). Results go to stdout and, with --write-md, to benchmarks/results/client-<date>.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))


sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402
collection_link.importable()
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import percentile  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import synthetic  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table  # noqa: E402

import client_baselines  # noqa: E402
# The simulator as a child process, ended by PID; it inherits this process's CPU affinity (--cpus).
from simproc import ServerProcess  # noqa: E402

TARGET_TOK = 0.5      # %
TARGET_TPOT = 0.5     # %
TARGET_TTFT = 5.0     # % (or 2 ms)
TARGET_TTFT_MS = 2.0
TARGET_CPU_US = 24.0
TARGET_EVENTS = 120_000


def truth_window(records: List[dict], ws: int, we: int) -> Dict[str, float]:
    """The server's figures over [ws, we): tokens emitted in it per second; TTFT and TPOT p50 of
    the requests it received in it."""
    tokens = 0
    for rec in records:
        for t, k in zip(rec["chunk_ns"], rec["chunk_tokens"]):
            if ws <= t < we:
                tokens += k
    inside = [r for r in records if ws <= r["t_recv_ns"] < we and not r.get("error")
              and r.get("t_first_ns") is not None]
    ttft = sorted(r["t_first_ns"] - r["t_recv_ns"] for r in inside)
    tpot = sorted((r["t_last_ns"] - r["t_first_ns"]) / (r["completion_tokens"] - 1)
                  for r in inside if r["completion_tokens"] > 1)
    return {"output_tok_s": tokens / ((we - ws) / 1e9),
            "ttft_p50_ms": (percentile(ttft, 50) or 0) / 1e6,
            "tpot_p50_ms": (percentile(tpot, 50) or 0) / 1e6, "requests": len(inside)}


def err(measured: Optional[float], truth: float) -> Optional[float]:
    if measured is None or not truth:
        return None
    return 100.0 * (measured / truth - 1.0)


@dataclass
class Row:
    label: str
    c: int
    procs: int
    tok: float
    tok_truth: float
    tpot: float
    tpot_truth: float
    ttft: float
    ttft_truth: float
    cpu_us: Optional[float]
    cpu_util: Optional[float]
    lag_p99: Optional[float]
    window_s: float
    requests: int

    def verdict(self, check_tok=True) -> str:
        bad = []
        if check_tok and abs(err(self.tok, self.tok_truth) or 99) > TARGET_TOK:
            bad.append("tok/s")
        if abs(err(self.tpot, self.tpot_truth) or 99) > TARGET_TPOT:
            bad.append("TPOT")
        e = err(self.ttft, self.ttft_truth)
        off_ms = abs(self.ttft - self.ttft_truth)
        if e is None or (abs(e) > TARGET_TTFT and off_ms > TARGET_TTFT_MS):
            bad.append("TTFT")
        return "ok" if not bad else "MISS " + ",".join(bad)


def fmt(v, spec="%.2f"):
    return "-" if v is None else spec % v


def level_config(url: str, c: int, procs: int, seconds: float, max_tokens: int,
                 min_window=None, rcvbuf: int = 65536, **overrides) -> LevelConfig:
    """The benchmark's LevelConfig; `overrides` set any other LevelConfig field (or replace one
    of these)."""
    fields = dict(base_url=url, model="servelab-sim", api="openai_chat", concurrency=c,
                  max_tokens=max_tokens, ignore_eos=True, level_seconds=seconds,
                  level_timeout=max(120.0, seconds * 6), processes=procs,
                  min_window_requests=min_window, server_metrics=False,
                  warmup_requests=1, socket_rcvbuf=rcvbuf)
    fields.update(overrides)
    return LevelConfig(**fields)


def level(url: str, c: int, procs: int, seconds: float, max_tokens: int, min_window=None,
          rcvbuf: int = 65536, input_tokens: int = 64, **overrides):
    cfg = level_config(url, c, procs, seconds, max_tokens, min_window, rcvbuf, **overrides)
    return run_level(cfg, synthetic(input_tokens, max_tokens, count=64, seed=c))


def bench_fixed(args, out: List[str]) -> List[Row]:
    sim = ServerProcess("--profile", "fixed",
                        truth_log=os.path.join(args.tmp, "truth-fixed.jsonl"))
    rows, levels = [], []
    try:
        for c in args.levels:
            res = level(sim.url, c, 1, args.seconds, args.max_tokens, rcvbuf=args.rcvbuf[0])
            row = res.row
            levels.append((row, res.requests))
            print("  fixed C=%d done: %.1f tok/s" % (c, row.output_tok_s or 0), flush=True)
        naive = []
        for c in args.naive_levels:
            t0 = time.monotonic_ns()
            fig = client_baselines.naive_level(sim.url, "servelab-sim", c, args.max_tokens,
                                               "hello " * 64, args.seconds + 2)
            naive.append((c, t0, time.monotonic_ns(), fig))
            print("  naive C=%d done" % c, flush=True)
    finally:
        sim.stop()
    truth = sim.truth_records()
    by_id = {rec["id"]: rec for rec in truth}
    read_delay = {}
    for row, reqs in levels:
        # Server-side read delay: client send -> the server has the request (the simulator's
        # t_recv, same clock). It is in the client's TTFT and not in the server's truth TTFT.
        d = sorted(by_id[r["server_id"]]["t_recv_ns"] - r["t_send"] for r in reqs
                   if r["in_window"] and r.get("server_id") in by_id)
        read_delay[row.concurrency] = (percentile(d, 50) or 0) / 1e6
        t = truth_window(truth, row.window_start_ns, row.window_end_ns)
        rows.append(Row("servelab", row.concurrency, 1, row.output_tok_s, t["output_tok_s"],
                        row.tpot_p50_ms, t["tpot_p50_ms"], row.ttft_p50_ms, t["ttft_p50_ms"],
                        row.client_cpu_us_per_token, row.client_cpu_util, row.loop_lag_p99_ms,
                        row.window_s, row.requests))
    out.append("### 1-2. Accuracy and cost, `fixed` setting (50 ms TTFT, 12 ms per chunk, "
               "%d tokens per request, window %.0f s)\n" % (args.max_tokens, args.seconds))
    table = Table([
        "client", "C", "tok/s", "truth", "err %", "TPOT p50 ms", "truth", "err %", "TTFT p50 ms",
        "truth", "err %", "server read delay p50 ms", "client CPU us/token", "CPU util",
        "loop lag p99 ms", "verdict",
    ], [])
    for r in rows:
        table.rows.append([
            "servelab", "%d" % r.c, "%.1f" % r.tok, "%.1f" % r.tok_truth,
            fmt(err(r.tok, r.tok_truth), "%+.3f"), "%.3f" % r.tpot, "%.3f" % r.tpot_truth,
            fmt(err(r.tpot, r.tpot_truth), "%+.3f"), "%.2f" % r.ttft, "%.2f" % r.ttft_truth,
            fmt(err(r.ttft, r.ttft_truth), "%+.1f"), "%.2f" % read_delay[r.c],
            fmt(r.cpu_us, "%.1f"), fmt(r.cpu_util, "%.2f"), fmt(r.lag_p99, "%.2f"),
            str(r.verdict()),
        ])
    for c, t0, t1, fig in naive:
        # The naive client has no window: hold it against the truth of its whole run minus the
        # first and last second (its own figures span the run).
        t = truth_window(truth, t0 + 1_000_000_000, t1 - 1_000_000_000)
        table.rows.append([
            "naive (aiohttp, session/request, json per chunk)", "%d" % c,
            "%.1f" % fig["output_tok_s"], "%.1f" % t["output_tok_s"],
            fmt(err(fig["output_tok_s"], t["output_tok_s"]), "%+.2f"), "%.3f" % fig["tpot_p50_ms"],
            "%.3f" % t["tpot_p50_ms"], fmt(err(fig["tpot_p50_ms"], t["tpot_p50_ms"]), "%+.2f"),
            "%.2f" % fig["ttft_p50_ms"], "%.2f" % t["ttft_p50_ms"],
            fmt(err(fig["ttft_p50_ms"], t["ttft_p50_ms"]), "%+.1f"), "-",
            "%.1f" % fig["cpu_us_per_token"], "%.2f" % fig["cpu_util"], "-", "-",
        ])
    out.append(table.to_markdown())
    out.append("")
    return rows


def bench_firehose(args, out: List[str]) -> None:
    sim = ServerProcess("--profile", "firehose", "--firehose-events-per-write",
                        args.events_per_write,
                        truth_log=os.path.join(args.tmp, "truth-firehose.jsonl"))
    body = {"model": "servelab-sim", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": args.firehose_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    results = []
    try:
        floor = client_baselines.raw_floor("127.0.0.1", sim.port, args.firehose_c, body,
                                           args.seconds)
        print("  raw floor: %.0f events/s" % floor["events_s"], flush=True)
        for rcvbuf in args.rcvbuf:
            for procs in args.procs:
                row = level(sim.url, args.firehose_c, procs, args.seconds, args.firehose_tokens,
                            min_window=1, rcvbuf=rcvbuf).row
                results.append((rcvbuf, row))
                print("  firehose rcvbuf=%d procs=%d: %.0f tok/s" % (
                    rcvbuf, procs, row.output_tok_s or 0), flush=True)
        t0 = time.monotonic_ns()
        naive = client_baselines.naive_level(sim.url, "servelab-sim", args.firehose_c,
                                             args.firehose_tokens, "hi", args.seconds + 2)
        t1 = time.monotonic_ns()
    finally:
        sim.stop()
    truth = sim.truth_records()
    out.append("### 3. Capacity, `firehose` setting (%d events per server write, 1 token per "
               "event, C=%d, %d tokens per request)\n"
               % (args.events_per_write, args.firehose_c, args.firehose_tokens))
    table = Table([
        "client", "processes", "events/s (window)", "truth", "err %", "TPOT p50 us", "truth",
        "err %", "TTFT p50 ms", "truth", "CPU us/event", "loop lag p99 ms", "client_limited",
    ], [])
    table.rows.append([
        "raw-socket floor (counts events, no parsing)", "1", "%.0f" % floor["events_s"], "-", "-",
        "-", "-", "-", "-", "-", "%.2f" % (floor["cpu_util"] * 1e6 / max(floor["events_s"], 1)),
        "-", "-",
    ])
    best = None
    for rcvbuf, row in results:
        t = truth_window(truth, row.window_start_ns, row.window_end_ns)
        table.rows.append([
            "servelab (rcvbuf %d KiB)" % (rcvbuf // 1024), "%d" % row.client_processes,
            "%.0f" % row.output_tok_s, "%.0f" % t["output_tok_s"],
            fmt(err(row.output_tok_s, t["output_tok_s"]), "%+.3f"),
            "%.2f" % (row.tpot_p50_ms * 1e3), "%.2f" % (t["tpot_p50_ms"] * 1e3),
            fmt(err(row.tpot_p50_ms, t["tpot_p50_ms"]), "%+.1f"), "%.2f" % row.ttft_p50_ms,
            "%.2f" % t["ttft_p50_ms"], fmt(row.client_cpu_us_per_token, "%.2f"),
            fmt(row.loop_lag_p99_ms, "%.1f"), str(row.client_limited),
        ])
        if best is None or row.output_tok_s > best.output_tok_s:
            best = row
    t = truth_window(truth, t0 + 1_000_000_000, t1 - 1_000_000_000)
    table.rows.append([
        "naive (aiohttp, session/request, json per chunk)", "1", "%.0f" % naive["output_tok_s"],
        "%.0f" % t["output_tok_s"], fmt(err(naive["output_tok_s"], t["output_tok_s"]), "%+.2f"),
        "%.2f" % (naive["tpot_p50_ms"] * 1e3), "%.2f" % (t["tpot_p50_ms"] * 1e3),
        fmt(err(naive["tpot_p50_ms"], t["tpot_p50_ms"]), "%+.1f"), "%.2f" % naive["ttft_p50_ms"],
        "%.2f" % t["ttft_p50_ms"], "%.2f" % naive["cpu_us_per_token"], "-", "-",
    ])
    out.append(table.to_markdown())
    if best is not None:
        out.append("\nservelab / naive events/s: %.2fx; servelab best / raw floor: %.1f %%\n" % (
            best.output_tok_s / max(naive["output_tok_s"], 1),
            100 * best.output_tok_s / max(floor["events_s"], 1)))


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0, 0, 0)
    return "%s, %d CPUs (%s), Python %s, load average before the run %.2f" % (
        platform.platform(), os.cpu_count() or 0, cpu, platform.python_version(), load[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="fewer levels, shorter windows")
    ap.add_argument("--write-md", nargs="?", const="", default=None, metavar="PATH",
                    help="append the tables to PATH (default benchmarks/results/client-<date>.md)")
    ap.add_argument("--cpus", help="taskset CPU list for the simulator and the clients, e.g. 0,1")
    ap.add_argument("--seconds", type=float, default=6.0, help="window per level")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--events-per-write", type=int, default=2)
    ap.add_argument("--firehose-c", type=int, default=8)
    ap.add_argument("--firehose-tokens", type=int, default=4000)
    ap.add_argument("--rcvbuf", default="65536",
                    help="socket receive buffer(s) in bytes, comma-separated (firehose runs each)")
    ap.add_argument("--tmp", default="/tmp/servelab-client-bench")
    ap.add_argument("--only", choices=["fixed", "firehose"])
    args = ap.parse_args(argv)
    args.rcvbuf = [int(v) for v in args.rcvbuf.split(",")]
    args.levels = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    args.naive_levels = [1, 64, 256]
    args.procs = [1, 2, 4]
    if args.quick:
        args.levels = [1, 16, 256]
        args.naive_levels = [256]
        args.procs = [1, 2]
        args.seconds = min(args.seconds, 4.0)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    os.makedirs(args.tmp, exist_ok=True)
    for name in os.listdir(args.tmp):
        os.unlink(os.path.join(args.tmp, name))
    header = ["## servelab load generator: accuracy, cost, capacity",
              "", "Date: %s  " % datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
              "Machine: %s  " % machine(),
              "Pinned to CPUs: %s  " % (args.cpus or "no (shared with whatever else runs)"),
              "Command: `python3 benchmarks/client_bench.py %s`" % " ".join(argv or sys.argv[1:]),
              ""]
    out: List[str] = []
    started = time.monotonic()
    if args.only in (None, "fixed"):
        bench_fixed(args, out)
    if args.only in (None, "firehose"):
        bench_firehose(args, out)
    out.append("Targets: tok/s and TPOT p50 within %.1f %%, TTFT p50 within %.0f %% or %.0f ms "
               "of the truth; <= %.0f us client CPU per token at C=256 (fixed); >= %d events/s "
               "in the firehose. Took %.0f s."
               % (TARGET_TOK, TARGET_TTFT, TARGET_TTFT_MS, TARGET_CPU_US, TARGET_EVENTS,
                  time.monotonic() - started))
    text = "\n".join(header + out) + "\n"
    print(text)
    if args.write_md is not None:
        path = args.write_md or os.path.join(HERE, "results",
                                             "client-%s.md" % datetime.date.today().isoformat())
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
        print("appended to", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
