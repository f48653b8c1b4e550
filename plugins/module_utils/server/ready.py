"""Readiness: the server generates, not merely listens.

An engine opens its port long before the model is loaded and the CUDA graphs are captured; a
port check would start the benchmark against a server that is not serving. The probe is a real
generation (SGLang's /health_generate runs a 1-token request through the scheduler; others get a
1-token completion), repeated until it succeeds, the process dies (fail at once, quoting the log)
or the timeout passes. Standard library only.
"""
from __future__ import annotations

import http.client
import json
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import ReadyCheck

LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 64 * 1024


class NotReady(RuntimeError):
    """The server did not become ready; `reason` says why, `log_tail` shows its last words."""

    def __init__(self, reason: str, log_tail: str, exit_code: Optional[int] = None,
                 seconds: float = 0.0):
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail
        self.exit_code = exit_code
        self.seconds = seconds


@dataclass
class ProbeResult:
    ok: bool
    detail: str


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - LOG_TAIL_BYTES))
            data = fh.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def probe(host: str, port: int, check: ReadyCheck, timeout: float) -> ProbeResult:
    """One readiness request. OK only on the expected status and, for completions, a choice."""
    body = json.dumps(check.body).encode() if check.body is not None else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn = http.client.HTTPConnection(host, port, timeout=max(0.5, timeout))
    try:
        conn.request(check.method, check.path, body=body, headers=headers)
        response = conn.getresponse()
        payload = response.read(1 << 20)
    except (OSError, http.client.HTTPException) as exc:
        return ProbeResult(False, f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    if response.status != check.status:
        text = payload[:200].decode("utf-8", "replace").strip()
        return ProbeResult(False, f"HTTP {response.status} {text}")
    if check.body is not None:
        # A completion endpoint must have produced something: a 200 with no choices is an
        # engine that accepted the request but did not generate.
        try:
            answer = json.loads(payload)
        except ValueError:
            return ProbeResult(False, "HTTP 200 but the body is not JSON")
        if isinstance(answer, dict) and "choices" in answer and not answer["choices"]:
            return ProbeResult(False, "HTTP 200 but no choices were generated")
    return ProbeResult(True, f"HTTP {response.status}")


def wait_ready(host: str, port: int, check: ReadyCheck, timeout: float, log_path: str,
               exit_code: Callable[[], Optional[int]], poll: float = 1.0,
               probe_timeout: float = 60.0) -> float:
    """Probe until ready; return the seconds it took. `exit_code()` returns the process's exit
    status once it has exited (None while it runs). Raises NotReady."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    first = True
    while True:
        code = exit_code()
        if code is not None:
            raise NotReady(f"the server exited with status {code} before it was ready",
                           log_tail(log_path), exit_code=code, seconds=time.monotonic() - t0)
        remaining = deadline - time.monotonic()
        # At least one full probe, even with no time left: "is it ready now?" is a valid question
        # (check mode asks it), and a busy engine may take a while to answer it.
        per_probe = probe_timeout if first else max(1.0, min(probe_timeout, remaining))
        first = False
        result = probe(host, port, check, per_probe)
        if result.ok and exit_code() is None:
            return round(time.monotonic() - t0, 3)
        if time.monotonic() >= deadline:
            raise NotReady(f"not ready after {timeout:.0f} s (last probe: {result.detail})",
                           log_tail(log_path), seconds=time.monotonic() - t0)
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
