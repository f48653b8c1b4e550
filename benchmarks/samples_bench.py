"""A level's ITL figures from files (loadgen/samples.py) against the in-memory computation main
had (issue 26 item 4): time and peak RSS for N per-token ITL samples, p50/p90/p99 and the
token-weighted mean and SD. Each way runs in a fresh process of its own (its peak RSS is its own);
the figures must agree to the bit (printed). No asserts: figures.

Usage: python3 benchmarks/samples_bench.py [--samples 2400000] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = textwrap.dedent("""\
    import json, math, os, random, resource, sys, tempfile, time
    from array import array
    sys.path.insert(0, %r)
    import collection_link
    collection_link.importable()
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import samples as S
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
        weighted_percentile)
    n, way = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(1)
    values = array("d", (float(int(rng.lognormvariate(16.3, 0.2))) for _ in range(n)))
    if way == "files":
        spill = tempfile.mkdtemp()
        series = S.Samples("d", True, os.path.join(spill, "itl"))
        for i in range(0, n, 512):          # as reduce_requests adds a request's samples
            series.extend(values[i:i + 512])
        series.seal()
        del values
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        figures = S.quantiles(series, (50, 90, 99)) + list(S.weighted_sums(series)[1:])
        took = time.perf_counter() - t
        series.remove()
    else:
        weights = array("d", [1.0] * n)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = time.perf_counter()
        pairs = list(zip(values, weights))      # main's level_row
        figures = [weighted_percentile(pairs, q) for q in (50, 90, 99)]
        total = sum(weights)
        mean = sum(v * w for v, w in pairs) / total
        figures += [mean, math.sqrt(sum(w * (v - mean) ** 2 for v, w in pairs) / total)]
        took = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"way": way, "s": took, "rss_mb": base / 1024, "peak_mb": peak / 1024,
                      "figures": figures}))
""") % os.path.join(REPO, "tools")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2_400_000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print("| round | way | seconds | RSS before MB | peak MB | peak - before MB |")
    print("|---:|---|---:|---:|---:|---:|")
    agree = True
    for r in range(1, args.rounds + 1):
        got = {}
        for way in ("memory", "files"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.samples), way],
                                 capture_output=True, text=True, check=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            got[way] = res["figures"]
            print("| %d | %s | %.2f | %.1f | %.1f | %+.1f |" % (
                r, way, res["s"], res["rss_mb"], res["peak_mb"], res["peak_mb"] - res["rss_mb"]))
        agree = agree and got["memory"] == got["files"]
    print("\n%d samples; the figures (p50, p90, p99, mean, SD in ns) agree to the bit: %s"
          % (args.samples, "yes" if agree else "NO"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
