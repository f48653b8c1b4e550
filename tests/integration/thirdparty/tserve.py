"""`transformers serve` as the tests marked `thirdparty` run it: a real OpenAI-compatible server from
PyPI (its venv: tserve_venv.py), on the CPU, serving a tiny random Llama built at start
(build_tiny_llama.py) in a Hugging Face cache of its own, with the hub switched off.

    with TransformersServe(tmp_path) as srv:
        ...srv.url ("http://127.0.0.1:PORT"), srv.model, srv.pgid, srv.log_lines()...
        srv.stop()        # its process group: SIGTERM, then SIGKILL; returns the exit status

The server runs in a session (so a process group) of its own and is ended through that group,
by its id; it listens on port 0 and the port is read from uvicorn's "Uvicorn running on
http://HOST:PORT" line (uvicorn/server.py:228-229 resolves port 0 to the bound port). Ready means
GET /v1/models answered and a 1-token chat completion went through (the first generation, not
only an open port).
"""
from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import List, Optional

import tserve_venv

HERE = os.path.dirname(os.path.abspath(__file__))
BUILDER = os.path.join(HERE, "build_tiny_llama.py")
MODEL = "servelab/tiny-random-llama"
RUNNING = re.compile(r"Uvicorn running on (http://127\.0\.0\.1:(\d+))")
# On 2 busy cores the import of torch and transformers alone took up to ~20 s; generous.
READY_TIMEOUT = 240.0
LOG_LINES = 4000


class ServeError(RuntimeError):
    """The server did not come up; the message holds the tail of its output."""


def offline_env(hf_home: str) -> dict:
    """No hub: HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE, the cache in the test's own directory; one
    thread for torch (two busy cores shared with the bench client and other tests: more threads
    only contend for them, and a tiny model gains nothing from them)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HOME=hf_home, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HF_HUB_DISABLE_TELEMETRY="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def build_model(python: str, hf_home: str, model: str = MODEL) -> dict:
    done = subprocess.run([python, BUILDER, hf_home, model], capture_output=True, text=True,
                          timeout=300, check=False, env=offline_env(hf_home))
    if done.returncode != 0:
        raise ServeError("build_tiny_llama.py failed: %s" % (done.stdout + done.stderr)[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


class TransformersServe:
    """Builds the model, starts the server, returns once it is ready (or raises ServeError with
    the server already ended)."""

    def __init__(self, workdir, ready_timeout: float = READY_TIMEOUT, extra_args=()):
        self.venv = tserve_venv.ensure()
        self.hf_home = os.path.join(str(workdir), "hf-home")
        self.model = MODEL
        self.built = build_model(self.venv.python, self.hf_home)
        self.url: Optional[str] = None
        self.port: Optional[int] = None
        self.ready_seconds: Optional[float] = None
        self.argv = [os.path.join(self.venv.venv, "bin", "transformers"), "serve", MODEL,
                     "--device", "cpu", "--host", "127.0.0.1", "--port", "0", *extra_args]
        started = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=offline_env(self.hf_home), cwd=str(workdir),
                                     start_new_session=True)
        self.pgid = self.proc.pid           # a new session: its leader's pid is the group's id
        self._lines = collections.deque(maxlen=LOG_LINES)
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        try:
            self._wait_ready(started, ready_timeout)
        except BaseException:
            self.stop()
            raise
        self.ready_seconds = time.monotonic() - started

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self._lines.append(line.rstrip("\n"))
            match = self.url is None and RUNNING.search(line)
            if match:
                self.url, self.port = match.group(1), int(match.group(2))
                self._listening.set()
        self._listening.set()               # EOF: the process is gone

    def log_lines(self) -> List[str]:
        return list(self._lines)

    def _fail(self, why: str) -> None:
        raise ServeError("transformers serve %s; its output ends with:\n%s"
                         % (why, "\n".join(self.log_lines()[-40:])))

    def _wait_ready(self, started: float, timeout: float) -> None:
        deadline = started + timeout
        if not self._listening.wait(timeout) or self.url is None:
            self._fail("exited with status %s" % self.proc.poll() if self.proc.poll() is not None
                       else "printed no 'Uvicorn running on' line within %.0f s" % timeout)
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail("exited with status %s" % self.proc.returncode)
            try:
                self.request("GET", "/v1/models", timeout=30)
                self.chat("Hello", max_tokens=1, timeout=60)
                return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
                time.sleep(0.5)
        self._fail("listened but did not generate within %.0f s (%s)" % (timeout, last))

    def request(self, method: str, path: str, body: Optional[dict] = None,
                timeout: float = 60) -> tuple:
        """(status, parsed JSON body); an HTTP error status is returned, not raised."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def chat(self, text: str, max_tokens: int, timeout: float = 60, **extra) -> tuple:
        status, body = self.request("POST", "/v1/chat/completions", dict(
            model=self.model, messages=[{"role": "user", "content": text}],
            max_tokens=max_tokens, **extra), timeout=timeout)
        if status != 200 and not extra:
            raise OSError("chat completion answered HTTP %d: %s" % (status, body))
        return status, body

    def group_members(self) -> List[int]:
        """PIDs still in the server's process group (zombies not counted: they have exited)."""
        from ansible_collections.servelab.serving.plugins.module_utils.proc.table import scan_processes
        return sorted(pid for pid, info in scan_processes().items()
                      if info.pgid == self.pgid and not info.gone)

    def stop(self, timeout: float = 30) -> Optional[int]:
        """Ends the process group (SIGTERM, SIGKILL after `timeout`), by its id; the exit status.
        Safe to call again."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pgid, signal.SIGKILL)
                self.proc.wait(10)
        # A child the server left behind in its group (none expected): killed too.
        if self.group_members():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
        self._reader.join(10)
        return self.proc.returncode

    def __enter__(self) -> TransformersServe:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
