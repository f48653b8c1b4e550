"""A stand-in OpenAI-compatible server for llm_server's tests (standard library only).

It misbehaves on request, the way real engines do:
  --listen-early S    listen at once but answer 503 to generation for S seconds (model loading)
  --exit-after S      print --exit-message and exit with --exit-code after S seconds
  --double-fork FILE  fork a child that forks a grandchild in a new session (a daemon escaping
                      the process group) which writes its PID to FILE and sleeps
  --ignore-term       ignore SIGTERM (only SIGKILL ends it)
  --generations N     answer N generations, then refuse (503) forever: up, but not serving
  --log-line TEXT     print TEXT at start (repeatable), e.g. an SGLang "Skipping ..." line
Unknown arguments are accepted (so it can stand in for the simulator's or SGLang's CLI).
Every generation answered prints "generated <path>", every refusal "refused <path> 503".
"""
import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-name", default="fake")
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--listen-early", type=float, default=0.0)
    parser.add_argument("--exit-after", type=float, default=None)
    parser.add_argument("--exit-code", type=int, default=3)
    parser.add_argument("--exit-message", default="FATAL: CUDA out of memory (fake)")
    parser.add_argument("--double-fork", default=None)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--generations", type=int, default=None)
    parser.add_argument("--log-line", action="append", default=[])
    args, _unknown = parser.parse_known_args()
    return args


def double_fork(pid_file):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pid_file + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.replace(pid_file + ".tmp", pid_file)
            while True:
                time.sleep(1)
        os._exit(0)


def main():
    args = parse()
    model = args.served_model_name or args.model_name
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.double_fork:
        double_fork(args.double_fork)
    for line in args.log_line:
        print(line, flush=True)
    t_ready = time.monotonic() + args.listen_early
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, status, obj):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _generate(self):
            exhausted = args.generations is not None and served[0] >= args.generations
            if time.monotonic() < t_ready or exhausted:
                print(f"refused {self.path} 503", flush=True)
                self._send(503, {"error": "loading"})
                return
            served[0] += 1
            print(f"generated {self.path}", flush=True)
            if self.path == "/health_generate":
                self._send(200, {})
            else:
                self._send(200, {"model": model, "choices": [{"index": 0, "text": "x"}],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

        def do_GET(self):
            if self.path == "/health_generate":
                self._generate()
            elif self.path == "/v1/models":
                self._send(200, {"data": [{"id": model}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path in ("/v1/completions", "/v1/chat/completions"):
                self._generate()
            else:
                self._send(404, {"error": "not found"})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"fake server listening on http://{args.host}:{args.port} model={model}", flush=True)
    if args.exit_after is not None:
        server.timeout = 0.1
        deadline = time.monotonic() + args.exit_after
        while time.monotonic() < deadline:
            server.handle_request()
        print(args.exit_message, flush=True)
        sys.exit(args.exit_code)
    server.serve_forever()


if __name__ == "__main__":
    main()
