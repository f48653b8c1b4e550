"""A client process's end of a firehose level (loadgen/client.py finish_records: its spool read
back, each record's row with its `itl` text, the reduction with its sample files), CPU time on one
synthetic spool, in one or more checkouts side by side. No asserts: figures.

The firehose's per-event cost in limit_bench has two parts: the window's (row.
client_cpu_us_per_token, the event loop) and the client processes' whole life (RUSAGE_CHILDREN),
which adds the ramp, the tail and this end of level. On a shared machine both move with the
machine's load from run to run; this part alone is a fixed amount of work, measured in CPU time
(process_time) of a fresh process per tree and round, the trees alternated.

The spool, shaped as a C=256 firehose level's was (captured 2026-12-06: 1283 requests, 55 % of
their tokens in the window, 797 with a kernel receive stamp earlier than the chunk before it, a
fifth cancelled at the level's end): `--requests` answers of `--tokens` chunks, each chunk one
token, arriving in runs read at one instant (1 to 23 chunks a read), up to 3 stamps per answer
up to 6 ms earlier than the chunk before; the last `--tail-share` of them cancelled part way;
the window holds the middle `--window-share` of the requests (the others are warmup and tail,
written as rows but not reduced to samples).

Usage: python3 benchmarks/level_end_bench.py [--trees DIR[,DIR...]] [--rounds 3]
       [--requests 300] [--tokens 2000] [--window-share 0.55] [--tail-share 0.2]
       [--write-md PATH]
A tree is a checkout's root (default: this one); each is run with its own code.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

CHILD = textwrap.dedent("""\
    import json, os, random, sys, tempfile, time
    tree, requests, tokens, share, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \\
        float(sys.argv[4]), int(sys.argv[5])
    tail_share = float(sys.argv[6])
    sys.path.insert(0, os.path.join(tree, "tools"))
    import collection_link
    collection_link.importable()
    sys.path.insert(0, os.path.join(tree, "benchmarks"))
    import client_bench
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import client
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
        RequestTiming)
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spool import (
        RecordSpool)
    mine = os.path.realpath(os.path.join(tree, "plugins/module_utils/loadgen/client.py"))
    assert os.path.realpath(client.__file__) == mine, (client.__file__, mine)
    rng = random.Random(7)
    start = 10 ** 12
    records = []
    tail = requests - int(requests * tail_share)
    for i in range(requests):
        t_send = start + i * 5_000_000 + rng.randrange(0, 2_000_000)
        now, times = t_send + 300_000, []
        while len(times) < tokens:
            times.extend([now] * rng.randrange(1, 24))
            now += rng.randrange(20_000, 400_000)
        times = times[:tokens]
        for _early in range(rng.randrange(0, 4)):   # a stamp earlier than the chunk before
            j = rng.randrange(1, tokens)
            times[j] -= rng.randrange(1, 6_000_000)
        kept, error, source = tokens, None, "server"
        if i >= tail:               # cancelled at the level's end: no usage came
            kept = rng.randrange(1, tokens)
            times = times[:kept]
            error, source = "cancelled: level over (tail request)", "chunks"
        records.append(RequestTiming(
            worker=i % 256, request_id=i, t_send=t_send, t_first=times[0], t_last=times[-1],
            prompt_tokens=1, completion_tokens=kept, tokens_source=source, chunks=kept,
            chunk_times=times, error=error, server_id="sim-%d" % i))
    edge = int(requests * (1 - share) / 2)
    ws = start + edge * 5_000_000
    we = start + (requests - edge) * 5_000_000
    window_tokens = sum(1 for r in records for t in r.chunk_times if ws <= t < we)
    cfg = client_bench.level_config("http://127.0.0.1:1", 256, 1, 10.0, tokens)
    cpu = []
    for _rep in range(reps):
        directory = tempfile.mkdtemp(prefix="level-end-bench-")
        spool = RecordSpool(os.path.join(directory, "client-0.spool"))
        for r in records:
            spool.add(r)
        spool.flush()
        c0 = time.process_time()
        part, index = client.finish_records(spool, cfg, ws, we, False, 0)
        cpu.append(time.process_time() - c0)
        getattr(part, "remove_files", lambda: None)()
        os.unlink(index.path)
        os.rmdir(directory)
    print(json.dumps({"cpu_s": cpu, "run_tokens": sum(len(r.chunk_times) for r in records),
                      "window_tokens": window_tokens}))
""")


def one(tree: str, args) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, tree, str(args.requests), str(args.tokens),
                          str(args.window_share), str(args.reps), str(args.tail_share)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", default=REPO, help="checkout roots, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3, help="finish_records runs per process (best)")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--window-share", type=float, default=0.55)
    ap.add_argument("--tail-share", type=float, default=0.2)
    ap.add_argument("--write-md")
    args = ap.parse_args()
    trees = [t for t in args.trees.split(",") if t]
    got = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees:
            res = one(tree, args)
            got[tree].append(res)
            print("round %d %s: CPU s %s" % (r + 1, tree, " ".join("%.3f" % c for c in res["cpu_s"])),
                  flush=True)
    lines = ["# End of a firehose level: finish_records CPU (benchmarks/level_end_bench.py)", "",
             "%d requests x %d chunks (1 token each; the last %.0f %% cancelled part way), window "
             "%d of %d tokens; best of %d runs per process, %d rounds alternated; Python %s." % (
                 args.requests, args.tokens, 100 * args.tail_share,
                 got[trees[0]][0]["window_tokens"], got[trees[0]][0]["run_tokens"], args.reps,
                 args.rounds,
                 sys.version.split()[0]), "",
             "| tree | CPU s per round (best of the process's runs) | median | us per token "
             "(all records) | us per window token |", "|---|---|---|---|---|"]
    for tree in trees:
        best = [min(res["cpu_s"]) for res in got[tree]]
        med = statistics.median(best)
        lines.append("| %s | %s | %.3f | %.3f | %.3f |" % (
            tree, " ".join("%.3f" % b for b in best), med,
            med * 1e6 / got[tree][0]["run_tokens"], med * 1e6 / got[tree][0]["window_tokens"]))
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write_md:
        with open(args.write_md, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
