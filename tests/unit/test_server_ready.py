"""Readiness waits for a generation, not for the port; it fails fast when the process dies."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import ReadyCheck
from ansible_collections.servelab.serving.plugins.module_utils.server.ready import NotReady, log_tail, probe, wait_ready
from testports import free_port  # tests/testports.py

HEALTH = ReadyCheck(path="/health_generate")
COMPLETION = ReadyCheck(path="/v1/completions", method="POST",
                        body={"model": "m", "prompt": "hi", "max_tokens": 1})


class Backend:
    """A server that listens at once but refuses generation for the first `refusals` requests."""

    def __init__(self, refusals=0, choices=True):
        self.refusals = refusals
        self.choices = choices
        self.seen = []          # (path, status) in order
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status = 503 if len(backend.seen) < backend.refusals else 200
                backend.seen.append((self.command, self.path, status, body))
                payload = {"choices": [{"text": "x"}] if backend.choices else []}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_waits_through_refusals_until_a_generation_succeeds(tmp_path):
    with Backend(refusals=3) as backend:
        seconds = wait_ready("127.0.0.1", backend.port, HEALTH, timeout=120,
                             log_path=str(tmp_path / "log"), exit_code=lambda: None, poll=0.05)
    statuses = [s[2] for s in backend.seen]
    assert statuses == [503, 503, 503, 200]       # returned on the first success, not before
    assert seconds >= 0


def test_posts_the_completion_body(tmp_path):
    with Backend() as backend:
        wait_ready("127.0.0.1", backend.port, COMPLETION, timeout=60,
                   log_path=str(tmp_path / "log"), exit_code=lambda: None)
    method, path, status, body = backend.seen[0]
    assert (method, path, status) == ("POST", "/v1/completions", 200)
    assert json.loads(body)["max_tokens"] == 1


def test_a_200_without_choices_is_not_ready():
    with Backend(choices=False) as backend:
        result = probe("127.0.0.1", backend.port, COMPLETION, timeout=10)
    assert not result.ok and "no choices" in result.detail


def test_a_process_that_exits_fails_at_once_with_its_log_tail(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)) + "FATAL: CUDA out of memory\n")
    with pytest.raises(NotReady) as err:
        wait_ready("127.0.0.1", free_port(), HEALTH, timeout=600, log_path=str(log),
                   exit_code=lambda: 3)
    assert err.value.exit_code == 3
    assert "exited with status 3" in err.value.reason
    assert err.value.log_tail.endswith("FATAL: CUDA out of memory")
    assert "line 0\n" not in err.value.log_tail          # a tail, not the whole log


def test_timeout_names_the_last_probe_result(tmp_path):
    with Backend(refusals=10 ** 6) as backend:
        with pytest.raises(NotReady) as err:
            wait_ready("127.0.0.1", backend.port, HEALTH, timeout=0.5,
                       log_path=str(tmp_path / "log"), exit_code=lambda: None, poll=0.05)
    assert "not ready after" in err.value.reason and "HTTP 503" in err.value.reason
    assert err.value.exit_code is None


def test_nothing_listening_is_a_failed_probe_not_an_exception():
    result = probe("127.0.0.1", free_port(), HEALTH, timeout=2)
    assert not result.ok and "Connection" in result.detail


def test_log_tail_of_a_missing_file_is_empty(tmp_path):
    assert log_tail(str(tmp_path / "absent")) == ""
