"""Request records with their inter-token gaps (issue 28 item 6b): how much bigger the part files
(and requests.jsonl, and llm_bench's result that carries them) get per 1,000 generated tokens.

One level per simulator profile (baseline: one token per chunk; eagle3: speculative decoding,
several tokens per chunk), run as llm_bench runs it (run_level); its request rows are the part
file's lines (loadgen/spool.py RequestRows.lines). The same rows without `itl` and `itl_basis`
(module_utils/results/request_itl.py) are what a record was before: the difference, over the
level's generated tokens (the server's counts), is the cost. No asserts: figures.

Usage: python3 benchmarks/record_size_bench.py [--concurrency 16] [--seconds 5]
       [--profiles baseline,eagle3] [--time-scales 20,1] [--write-md [PATH]]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402
collection_link.importable()
from simproc import ServerProcess  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table  # noqa: E402

NEW_FIELDS = ("itl", "itl_basis")


def measure(profile: str, concurrency: int, seconds: float, max_tokens: int,
            time_scale: str) -> list:
    with ServerProcess("--profile", profile, "--time-scale", time_scale) as sim:
        cfg = LevelConfig(base_url=sim.url, model="servelab-sim", concurrency=concurrency,
                          max_tokens=max_tokens, level_seconds=seconds,
                          level_timeout=seconds * 4 + 120, server_metrics=False)
        res = run_level(cfg, load({"kind": "synthetic", "input_tokens": 256,
                                   "output_tokens": max_tokens}))
        lines = list(res.requests.lines())
        res.requests.close()
    rows = [json.loads(line) for line in lines]
    with_gaps = sum(len(line.encode("utf-8")) for line in lines)
    without = sum(len((json.dumps({k: v for k, v in row.items() if k not in NEW_FIELDS},
                                  sort_keys=True, default=str) + "\n").encode("utf-8"))
                  for row in rows)
    tokens = sum(row.get("completion_tokens") or 0 for row in rows)
    chunks = sum(row.get("chunks") or 0 for row in rows)
    gaps = sorted(int(item.partition("x")[0]) for row in rows
                  for item in (row.get("itl") or "").split())
    return [profile, time_scale, "%.0f" % (gaps[len(gaps) // 2] if gaps else 0), str(len(rows)),
            str(tokens), "%.2f" % (tokens / chunks if chunks else 0),
            "%.0f" % (without / len(rows)), "%.0f" % (with_gaps / len(rows)),
            "%.2f" % (with_gaps / without), "%.0f" % ((with_gaps - without) / tokens * 1000)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--profiles", default="baseline,eagle3")
    ap.add_argument("--time-scales", default="20,1",
                    help="simulator time scales (1: real time, the gaps a real engine's)")
    ap.add_argument("--write-md", nargs="?", const="", default=None)
    args = ap.parse_args()
    table = Table(["simulator profile", "time scale", "median gap us", "records",
                   "generated tokens", "tokens per chunk",
                   "bytes per record before", "bytes per record with gaps", "x",
                   "bytes more per 1k tokens"],
                  [measure(p, args.concurrency, args.seconds, args.max_tokens, scale)
                   for scale in args.time_scales.split(",") if scale
                   for p in args.profiles.split(",") if p])
    text = table.to_markdown()
    print(text)
    if args.write_md is not None:
        path = args.write_md or os.path.join(
            HERE, "results", "record-size-%s.md" % datetime.date.today().isoformat())
        head = ["# Request records with their inter-token gaps: part file size", "",
                "- date: %s" % datetime.datetime.now(datetime.UTC).isoformat(
                    timespec="seconds"),
                "- machine: %s, %d CPUs, Python %s" % (platform.node(), os.cpu_count() or 0,
                                                       platform.python_version()),
                "- command: python3 benchmarks/record_size_bench.py %s" % " ".join(sys.argv[1:]),
                "- one level per profile and time scale, C=%d, %d-token answers, 256-token "
                "prompts" % (args.concurrency, args.max_tokens), ""]
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(head) + "\n" + text + "\n")
        print("written to", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
