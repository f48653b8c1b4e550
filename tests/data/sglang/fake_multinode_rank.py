"""A stand-in for one rank of a multi-node SGLang server (standard library only), for the bench
role's multi-node test. It behaves as the pinned SGLang does where the orchestration can see it:

- rank 0 listens at --dist-init-addr (SGLang's torch.distributed TCP store) and serves nothing
  until every other rank has connected; then it becomes servelab's simulator (exec, keeping the
  ranks' connections open), which generates: ready is /health_generate, as for SGLang.
- a rank > 0 connects to --dist-init-addr, retrying until --join-timeout (the store's client
  does), then serves GET /health on --host:--port (SGLang's stand-in health server of a
  non-zero rank); it ignores SIGTERM (0.5.23) and exits when rank 0's connection closes (SGLang:
  rank 0's shutdown broadcast).

Every step is appended to --events as "<unix time> rank=<r> <event>".
"""
import argparse
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--dist-init-addr", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--simulator", required=True, help="servelab's simulator zipapp (rank 0 execs it)")
    parser.add_argument("--join-timeout", type=float, default=60.0)
    return parser.parse_known_args()


def event(args, text):
    with open(args.events, "a", encoding="utf-8") as handle:
        handle.write("%.6f rank=%d %s\n" % (time.time(), args.node_rank, text))


def rank_zero(args, rest):
    host, port = args.dist_init_addr.rsplit(":", 1)
    store = socket.create_server((host, int(port)))
    peers = []
    while len(peers) < args.nnodes - 1:
        conn, _addr = store.accept()
        rank = conn.recv(16).decode().strip()
        event(args, "peer rank=%s joined" % rank)
        conn.set_inheritable(True)   # the group lives as long as rank 0's process
        peers.append(conn)
    event(args, "all %d ranks joined; serving" % args.nnodes)
    store.close()
    os.execv(sys.executable, [sys.executable, args.simulator, "--host", args.host, "--port", str(args.port)] + rest)


class Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path in ("/health", "/health_generate") else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def rank_other(args):
    signal.signal(signal.SIGTERM, lambda *_: event(args, "SIGTERM ignored, waiting for rank 0"))
    host, port = args.dist_init_addr.rsplit(":", 1)
    deadline = time.monotonic() + args.join_timeout
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                event(args, "could not join %s" % args.dist_init_addr)
                return 1
            time.sleep(0.2)
    conn.settimeout(None)
    conn.sendall(b"%d\n" % args.node_rank)
    event(args, "joined %s" % args.dist_init_addr)
    server = ThreadingHTTPServer((args.host, args.port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    while conn.recv(1024):
        pass
    event(args, "rank 0 gone; exiting")
    return 0


def main():
    args, rest = parse()
    event(args, "launched pid=%d" % os.getpid())
    return rank_zero(args, rest) if args.node_rank == 0 else rank_other(args)


if __name__ == "__main__":
    sys.exit(main())
