"""Performance figures of the simulator server (printed, never asserted). Standard library only.

    python3 benchmarks/sim_bench.py firehose [--streams 4] [--events-per-write 16] [--seconds 5]
    python3 benchmarks/sim_bench.py level --profile eagle3 --concurrency 250 --time-scale 50
        [--prompt-tokens 2048] [--output-tokens 512] [--seconds 20]

`firehose`: token events per second the server sends to N streaming clients (the client only
counts `data: ` lines, so it stays cheaper than the server). `level`: a closed loop of C clients
against a batched profile; prints live output tok/s next to predict_level() and the server's
CPU use. Starts the server as a child process and ends it by PID.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402
collection_link.importable()
from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import (  # noqa: E402
    predict_level,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (  # noqa: E402
    DEFAULT_OUTPUT_TOKENS, DEFAULT_PROMPT_TOKENS,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.tokens import (  # noqa: E402
    text_for_prompt_tokens,
)
from simproc import ServerProcess, ServerStartError  # noqa: E402


def start_server(*args, truth_log=None):
    try:
        return ServerProcess(*args, truth_log=truth_log)
    except ServerStartError as exc:
        raise SystemExit(f"server did not start: {exc}") from exc


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def stream_request(reader, writer, path, body, on_event):
    data = json.dumps(body).encode()
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(status)
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            await reader.readline()
            return
        chunk = await reader.readexactly(size + 2)
        on_event(chunk)


async def firehose(port, streams, seconds, max_tokens):
    counts = [0]
    stop = time.monotonic() + seconds

    def on_event(chunk):
        counts[0] += chunk.count(b"data: {")

    async def worker():
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        while time.monotonic() < stop:
            await stream_request(reader, writer, "/v1/completions",
                                 {"prompt": "x", "max_tokens": max_tokens, "ignore_eos": True,
                                  "stream": True}, on_event)
        writer.close()

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _i in range(streams)))
    return counts[0] / (time.monotonic() - t0)


async def closed_loop(port, concurrency, prompt_tokens, output_tokens, seconds):
    """C clients, each sending its next request when the last finished, for `seconds`."""
    prompt = text_for_prompt_tokens(prompt_tokens)
    stop = time.monotonic() + seconds

    async def worker():
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
        while time.monotonic() < stop:
            await stream_request(reader, writer, "/v1/completions",
                                 {"prompt": prompt, "max_tokens": output_tokens,
                                  "ignore_eos": True, "stream": True}, lambda chunk: None)
        writer.close()

    await asyncio.gather(*(worker() for _i in range(concurrency)))


def truth_window(path, concurrency, warmup_rounds=2):
    """Server-side output tok/s from the truth log: tokens emitted between the
    (warmup_rounds*C)-th completion and the last completion."""
    with open(path) as fh:
        recs = [json.loads(line) for line in fh if line.strip()]
    ends = sorted(r["t_last_ns"] for r in recs if not r["error"])
    if len(ends) <= warmup_rounds * concurrency + concurrency:
        return None, len(recs)
    t_a, t_b = ends[warmup_rounds * concurrency - 1], ends[-1]
    tokens = sum(k for r in recs for t, k in zip(r["chunk_ns"], r["chunk_tokens"])
                 if t_a < t <= t_b)
    return tokens / (t_b - t_a) * 1e9, len(recs)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("firehose", "level"))
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--events-per-write", type=int, default=16)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--profile", default="eagle3")
    ap.add_argument("--concurrency", type=int, default=250)
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS)
    ap.add_argument("--output-tokens", type=int, default=DEFAULT_OUTPUT_TOKENS)
    args = ap.parse_args(argv)
    if args.what == "firehose":
        with start_server("--profile", "firehose", "--firehose-events-per-write",
                          args.events_per_write, "--tokens-per-chunk",
                          args.tokens_per_chunk) as srv:
            cpu0 = cpu_seconds(srv.pid)
            rate = asyncio.run(firehose(srv.port, args.streams, args.seconds, 20000))
            cpu = cpu_seconds(srv.pid) - cpu0
        print(f"firehose: {rate:,.0f} token events/s to {args.streams} streams "
              f"({args.events_per_write} events/write, {args.tokens_per_chunk} token/event); "
              f"server CPU {cpu / args.seconds:.0%} of one core")
        return 0
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        truth = os.path.join(tmp, "truth.jsonl")
        with start_server("--profile", args.profile, "--time-scale", args.time_scale,
                          truth_log=truth) as srv:
            cpu0 = cpu_seconds(srv.pid)
            asyncio.run(closed_loop(srv.port, args.concurrency, args.prompt_tokens,
                                    args.output_tokens, args.seconds))
            cpu = cpu_seconds(srv.pid) - cpu0
        live, count = truth_window(truth, args.concurrency)
    pred = predict_level(args.profile, args.concurrency, args.prompt_tokens,
                         args.output_tokens, time_scale=args.time_scale)
    if live is None:
        print(f"only {count} requests finished: too few for a window; raise --seconds")
        return 1
    print(f"{args.profile} C={args.concurrency} time_scale={args.time_scale}: "
          f"{count} requests; live {live:,.1f} tok/s (server truth, after 2 rounds), predicted "
          f"{pred.output_tok_s:,.1f} ({live / pred.output_tok_s - 1:+.1%}); server CPU "
          f"{cpu / args.seconds:.0%} of a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
