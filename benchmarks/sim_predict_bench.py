"""How fast the simulator predicts a level (printed, never asserted): milliseconds per
runs.predict_run call, closed loop C=1..250 and open loop 1..20 req/s, at the default workload
(2048 prompt, 512 output tokens), for the tuner's budget. Standard library only.

    python3 benchmarks/sim_predict_bench.py [--requests 200] [--repeat 3] [--timeout-s 600]
        [--out FILE.md]

Each figure is the median of --repeat calls in this process (one core); the predictions are
deterministic, so the repeats time the same work. --timeout-s is predict_run's (the load
generator's level_timeout, 600 s by default there; 0: unbounded), for the open loops: it bounds
what an overloaded one costs (a closed loop is never overloaded: it runs unbounded). Also prints
the window's figures, so a change in speed can be told from a change in the model.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402
collection_link.importable()
from ansible_collections.servelab.serving.plugins.module_utils.simulator.runs import (  # noqa: E402
    predict_run,
)

LEVELS = (1, 2, 5, 10, 30, 70, 130, 250)
RATES = (1, 2, 5, 10, 20)
SLO = {"ttft_ms": 5000, "tpot_ms": 100}


def timed(repeat, **kw):
    times, run = [], None
    for _i in range(repeat):
        t0 = time.perf_counter()
        run = predict_run(slo=SLO, **kw)
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times), run


def row(profile, load, ms, run) -> str:
    ttft = run.mean("ttft_ms")
    return (f"| {profile} | {load} | {ms:.0f} | {run.output_tok_s:.1f} | {run.request_s:.3f} | "
            f"{run.goodput:.3f} | {'-' if ttft is None else f'{ttft:.0f}'} | {run.failed} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200, help="window requests per prediction")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=600.0,
                    help="predict_run's timeout_s (0: unbounded)")
    ap.add_argument("--out", help="also append the table (markdown) to this file")
    args = ap.parse_args(argv)
    timeout = args.timeout_s or None
    lines = [f"# predict_run speed ({time.strftime('%Y-%m-%d')})", "",
             f"`python3 benchmarks/sim_predict_bench.py --requests {args.requests} --repeat "
             f"{args.repeat}` on {platform.processor() or platform.machine()}, Python "
             f"{platform.python_version()}, one process; default workload (2048 prompt, 512 "
             f"output tokens), {args.requests} window requests, SLO {SLO}, open loops with "
             f"timeout_s {timeout}; median of {args.repeat} calls.", "",
             "| profile | load | ms/call | output tok/s | req/s | goodput | mean TTFT ms | failed |",
             "|---|---|---|---|---|---|---|---|"]
    total = []
    for profile in ("baseline", "eagle3"):
        for c in LEVELS:
            ms, run = timed(args.repeat, profile_or_params=profile, concurrency=c,
                            requests=args.requests)
            total.append(ms)
            lines.append(row(profile, f"C={c}", ms, run))
        for rate in RATES:
            ms, run = timed(args.repeat, profile_or_params=profile, rate=float(rate),
                            requests=args.requests, timeout_s=timeout)
            total.append(ms)
            lines.append(row(profile, f"{rate} req/s", ms, run))
    lines += ["", f"{len(total)} loads: median {statistics.median(total):.0f} ms, max "
                  f"{max(total):.0f} ms per call."]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
