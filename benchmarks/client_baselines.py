"""Reference clients for benchmarks/client_bench.py: the raw-socket floor and a naive client.

- raw_floor(): the least a client can do: C blocking sockets driven by `selectors`, each sending a
  streaming request, counting `data: ` events in every read with bytes.count, no parsing, no
  timestamps per event. Against a firehose server its events/s is the ceiling any client can
  reach on this machine (the server and the OS, not the client, set it).
- naive_level(): how common benchmark clients are written (one aiohttp ClientSession per
  request, `json.loads` of every chunk, one coroutine per request gated by a semaphore, the clock
  started before the request is scheduled). It measures TTFT/TPOT/tok/s its way, so the benchmark
  can hold both clients against the simulator's truth in the same run.
Not part of servelab's runtime (aiohttp is only a test/bench dependency).
"""
from __future__ import annotations

import asyncio
import json
import selectors
import socket
import time
from typing import Dict, List


def _request_bytes(host: str, port: int, path: str, body: dict) -> bytes:
    raw = json.dumps(body).encode()
    return (b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (path.encode(), host.encode(), port, len(raw))) + raw


def raw_floor(host: str, port: int, concurrency: int, body: dict, seconds: float,
              path: str = "/v1/chat/completions") -> Dict[str, float]:
    """Closed loop at `concurrency` with plain sockets; returns events/s over `seconds` after a
    0.5 s ramp, and the CPU it took."""
    wire = _request_bytes(host, port, path, body)
    sel = selectors.DefaultSelector()
    socks = []
    for _i in range(concurrency):
        s = socket.create_connection((host, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, {"tail": b""})
        s.sendall(wire)
        socks.append(s)
    start = time.monotonic()
    measure_from = start + 0.5
    stop_at = measure_from + seconds
    events = 0
    cpu0 = None
    while True:
        now = time.monotonic()
        if cpu0 is None and now >= measure_from:
            cpu0 = time.process_time()
            events = 0
        if now >= stop_at:
            break
        for key, _events in sel.select(0.5):
            s = key.fileobj
            data = s.recv(262144)
            if not data:
                raise RuntimeError("server closed the connection")
            events += data.count(b"data: ")
            tail = key.data["tail"] + data[-8:]
            key.data["tail"] = tail[-8:]
            if tail.endswith(b"0\r\n\r\n"):          # end of the chunked body: next request
                key.data["tail"] = b""
                s.sendall(wire)
    cpu = time.process_time() - (cpu0 or 0.0)
    for s in socks:
        sel.unregister(s)
        s.close()
    return {"events_s": events / seconds, "cpu_util": cpu / seconds}


async def _naive_request(url: str, body: dict, results: List[dict], sem) -> None:
    import aiohttp
    async with sem:
        t_start = time.perf_counter()     # the clock starts when the coroutine is scheduled
        rec = {"t_start": t_start, "ttft": None, "itl": [], "tokens": 0, "error": None}
        try:
            async with aiohttp.ClientSession() as session:  # one session per request
                async with session.post(url, json=body) as resp:
                    last = None
                    async for line in resp.content:
                        line = line.strip()
                        if not line.startswith(b"data: ") or line == b"data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])       # full parse of every chunk
                        now = time.perf_counter()
                        if chunk.get("usage"):
                            rec["tokens"] = chunk["usage"]["completion_tokens"]
                        choices = chunk.get("choices") or []
                        if choices and (choices[0].get("delta") or {}).get("content"):
                            if rec["ttft"] is None:
                                rec["ttft"] = now - t_start
                            else:
                                rec["itl"].append(now - last)
                            last = now
                    rec["latency"] = time.perf_counter() - t_start
        except Exception as exc:  # noqa: BLE001 - recorded, like the tools it imitates
            rec["error"] = repr(exc)
        rec["t_end"] = time.perf_counter()
        results.append(rec)


async def _naive(url: str, body: dict, concurrency: int, seconds: float) -> List[dict]:
    results: List[dict] = []
    sem = asyncio.Semaphore(concurrency)
    deadline = time.perf_counter() + seconds
    tasks = set()

    async def feeder():
        # Keep `concurrency` requests in flight until the deadline (the semaphore gates them).
        while time.perf_counter() < deadline:
            while len(tasks) < concurrency * 2:
                t = asyncio.ensure_future(_naive_request(url, body, results, sem))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
            await asyncio.sleep(0.001)
    await feeder()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    return results


def naive_level(base_url: str, model: str, concurrency: int, max_tokens: int, prompt: str,
                seconds: float) -> Dict[str, float]:
    """Run the naive client; figures computed the common way (duration = first start to last
    end, TPOT = (latency - ttft) / (tokens - 1) per request, medians)."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    results = asyncio.run(_naive(base_url.rstrip("/") + "/v1/chat/completions", body,
                                 concurrency, seconds))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    ok = [r for r in results if r["error"] is None and r["ttft"] is not None]
    ttft = sorted(r["ttft"] for r in ok)
    tpot = sorted((r["latency"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1)
    tokens = sum(r["tokens"] for r in ok)
    span = max(r["t_end"] for r in ok) - min(r["t_start"] for r in ok) if ok else 0.0

    def med(v):
        return v[len(v) // 2] if v else float("nan")

    return {"requests": len(ok), "errors": len(results) - len(ok),
            "output_tok_s": tokens / span if span else float("nan"),
            "ttft_p50_ms": med(ttft) * 1e3, "tpot_p50_ms": med(tpot) * 1e3,
            "cpu_us_per_token": cpu / tokens * 1e6 if tokens else float("nan"),
            "cpu_util": cpu / wall}
