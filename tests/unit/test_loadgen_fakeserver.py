"""A small stdlib streaming server with known truth, for the load generator's tests.

Run as a script (the tests start it as a subprocess and end it by PID):
  python tests/unit/test_loadgen_fakeserver.py --port 0 --ttft-ms 30 --step-ms 10 \
      --tokens-per-chunk 3 --truth-log /tmp/truth.jsonl
It prints `fakeserver listening on http://127.0.0.1:PORT` and serves /v1/chat/completions,
/v1/completions and /generate (SGLang-style, cumulative meta_info.completion_tokens), plus
/metrics. Knobs vary what real servers vary: SSE separators, HTTP framing, usage reporting, JSON
spacing, chunks split across writes, HTTP errors, no /metrics at all (`--metrics none`, like
transformers serve), and work that goes on after a client disconnected (`--busy-after-disconnect-ms
M --busy-ttft-ms X`: for M ms after a stream's client went away, the abandoned request still counts
in `sglang:num_running_reqs` and every new request's TTFT is X ms longer). The truth log has one JSON line per request:
t_recv_ns, t_first_ns, t_last_ns, chunks [[t_emit_ns, tokens], ...] (CLOCK_MONOTONIC, shared with
the client on the same machine).

The simulator (plugins/module_utils/simulator/) is the reference server for accuracy;
this one exists to exercise protocol corners the simulator does not produce.
"""
import argparse
import asyncio
import json
import os
import sys
import time


def _chunk(obj_bytes: bytes, framing: str) -> bytes:
    if framing == "chunked":
        return b"%x\r\n%s\r\n" % (len(obj_bytes), obj_bytes)
    return obj_bytes


class FakeServer:
    def __init__(self, args):
        self.a = args
        self.truth = open(args.truth_log, "a", buffering=1) if args.truth_log else None
        self.requests = 0
        self.tokens = 0
        self.streaming = 0          # streams in progress
        self.abandoned = []         # monotonic end times of work left by disconnected clients

    def busy_abandoned(self) -> int:
        """Abandoned requests still being worked on (--busy-after-disconnect-ms)."""
        now = time.monotonic()
        self.abandoned = [t for t in self.abandoned if t > now]
        return len(self.abandoned)

    async def handle(self, reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                t_recv = time.monotonic_ns()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _version = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                body = json.loads(await reader.readexactly(length)) if length else {}
                if path == "/metrics":
                    if self.a.metrics == "none":
                        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                        await writer.drain()
                        continue
                    text = ("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs"
                            "{model_name=\"m\"} %d\nsglang:num_queue_reqs{model_name=\"m\"} 0\n"
                            "sglang:generation_tokens_total{model_name=\"m\"} %d\n"
                            % (self.streaming + self.busy_abandoned(), self.tokens)).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(text), text))
                    await writer.drain()
                    continue
                keep = await self.stream(writer, path, body, t_recv)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def stream(self, writer, path, body, t_recv):
        self.streaming += 1
        try:
            return await self._stream(writer, path, body, t_recv)
        except ConnectionError:
            if self.a.busy_after_disconnect_ms:
                self.abandoned.append(time.monotonic() + self.a.busy_after_disconnect_ms / 1e3)
            raise
        finally:
            self.streaming -= 1

    async def _stream(self, writer, path, body, t_recv):
        a = self.a
        self.requests += 1
        if a.exit_after and self.requests > a.exit_after:
            os._exit(0)         # the server dies: connections reset, nothing listens any more
        if a.fail_every and self.requests % a.fail_every == 0:
            msg = b'{"error":{"message":"injected failure"}}'
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n%s" % (len(msg), msg))
            await writer.drain()
            return True
        generate = path == "/generate"
        if generate:
            n = int(body.get("sampling_params", {}).get("max_new_tokens", 16))
        else:
            n = int(body.get("max_tokens", 16))
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        framing = a.framing
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        if framing == "chunked":
            head += b"Transfer-Encoding: chunked\r\n\r\n"
        else:
            head += b"Connection: close\r\n\r\n"
        writer.write(head)
        sep = b"\r\n\r\n" if a.sep == "crlf" else b"\n\n"
        dumps = ((lambda o: json.dumps(o).encode()) if a.json_style == "spaced"
                 else (lambda o: json.dumps(o, separators=(",", ":")).encode()))
        chat = path == "/v1/chat/completions"

        def event(obj):
            data = b"data: " + (obj if isinstance(obj, bytes) else dumps(obj)) + sep
            return _chunk(data, framing)

        if chat and not generate:
            writer.write(event({"id": "x", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": ""},
                 "finish_reason": None}]}))
        chunks = []
        sent = 0
        start = time.monotonic()
        ttft_ms = a.ttft_ms + (a.busy_ttft_ms if self.busy_abandoned() else 0.0)
        await asyncio.sleep(ttft_ms / 1000.0)
        text = ""
        i = 0
        while sent < n:
            k = min(a.tokens_per_chunk, n - sent)
            if i > 0:
                target = start + ttft_ms / 1000.0 + i * a.step_ms * a.tokens_per_chunk / 1000.0
                delay = target - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            i += 1
            sent += k
            piece = " tok" * k
            text += piece
            if generate:
                obj = {"text": text, "output_ids": list(range(sent)),
                       "meta_info": {"prompt_tokens": 7, "completion_tokens": sent,
                                     "finish_reason": None if sent < n else {"type": "length"}},
                       "index": 0}
            elif chat:
                obj = {"id": "x", "object": "chat.completion.chunk", "choices": [
                    {"index": 0, "delta": {"role": None, "content": piece,
                                           "reasoning_content": None},
                     "finish_reason": None}], "usage": None}
            else:
                obj = {"id": "x", "object": "text_completion", "choices": [
                    {"index": 0, "text": piece, "finish_reason": None}], "usage": None}
            if continuous and not generate and a.usage != "none":
                obj["usage"] = {"prompt_tokens": 7, "completion_tokens": sent,
                                "total_tokens": 7 + sent}
            data = event(obj)
            t_emit = time.monotonic_ns()
            if a.split and len(data) > 8:
                mid = len(data) // 2
                writer.write(data[:mid])
                await writer.drain()
                await asyncio.sleep(0.001)
                writer.write(data[mid:])
            else:
                writer.write(data)
            await writer.drain()
            chunks.append([t_emit, k])
            self.tokens += k
        if not generate:
            writer.write(event({"id": "x", "object": "chat.completion.chunk", "choices": [
                {"index": 0, "delta": {}, "finish_reason": "length"}], "usage": None}))
            if a.usage != "none":
                writer.write(event({"id": "x", "choices": [], "usage": {
                    "prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}}))
        writer.write(event(b"[DONE]"))
        if framing == "chunked":
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        if self.truth:
            self.truth.write(json.dumps({"t_recv_ns": t_recv, "t_first_ns": chunks[0][0],
                                         "t_last_ns": chunks[-1][0], "chunks": chunks,
                                         "completion_tokens": n}) + "\n")
        return framing == "chunked"


async def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--step-ms", type=float, default=5.0, help="time per token")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--sep", choices=("lf", "crlf"), default="lf")
    p.add_argument("--framing", choices=("chunked", "close"), default="chunked")
    p.add_argument("--usage", choices=("final", "none"), default="final")
    p.add_argument("--json-style", choices=("compact", "spaced"), default="compact")
    p.add_argument("--split", action="store_true", help="split every event over two writes")
    p.add_argument("--fail-every", type=int, default=0, help="every Nth request gets HTTP 500")
    p.add_argument("--exit-after", type=int, default=0, help="exit at request N+1")
    p.add_argument("--metrics", choices=("sglang", "none"), default="sglang",
                   help="none: /metrics answers 404 (a server without a running-requests gauge)")
    p.add_argument("--busy-after-disconnect-ms", type=float, default=0.0,
                   help="a stream whose client disconnected keeps the server busy this long")
    p.add_argument("--busy-ttft-ms", type=float, default=0.0,
                   help="extra TTFT of requests that arrive while abandoned work is going on")
    p.add_argument("--truth-log")
    a = p.parse_args(argv)
    server = FakeServer(a)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", a.port)
    port = srv.sockets[0].getsockname()[1]
    print("fakeserver listening on http://127.0.0.1:%d" % port, flush=True)
    async with srv:
        await srv.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1:]))
    except KeyboardInterrupt:
        pass
