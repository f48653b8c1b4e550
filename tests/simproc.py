"""A test server (the simulator, or another script that prints the same kind of line) run as a
child process, the way tests and benchmarks need it: started on port 0, ready once it printed
`... listening on http://HOST:PORT`, ended by its PID. Standard library only (benchmarks use it
on machines without Ansible or pytest).

    with ServerProcess("--profile", "fixed", truth_log=tmp_path / "truth.jsonl") as srv:
        ...srv.url, srv.port, srv.pid...
        srv.stop()                  # the truth log is complete once the server has exited
        records = srv.truth_records()

The simulator runs as the zipapp llm_server ships (simulator_script(); the collection must be
importable, as tools/collection_link.importable() makes it). Another script:
ServerProcess(..., script=path). Only `--port 0` (and `--truth-log PATH` when
truth_log is given) are added to the command; everything else is the caller's arguments.
"""
from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import threading
import time
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# `servelab-simulator listening on http://127.0.0.1:PORT`, `fakeserver listening on ...`
LISTENING = re.compile(r"listening on (http://\S+:(\d+))\s*$")
OUTPUT_TAIL_LINES = 40


def simulator_script() -> str:
    """The simulator as llm_server ships it: the checkout's zipapp (server/simulator_file.py),
    written once per content under the temp dir, so every test runs what a target runs."""
    import tempfile
    from ansible_collections.servelab.serving.plugins.module_utils.server import simulator_file
    archive = simulator_file.simulator_archive()
    directory = os.path.join(tempfile.gettempdir(), "servelab-simproc-%d" % os.getuid(),
                             simulator_file.digest(archive))
    return simulator_file.materialise(directory, archive)[0]


class ServerStartError(RuntimeError):
    """The server exited or stayed silent instead of printing its listening line."""


class ServerProcess:
    """Starts the server at construction and returns once it listens (or raises
    ServerStartError with the tail of its output, the process already ended)."""

    def __init__(self, *args, script: Optional[str] = None, truth_log=None,
                 start_timeout: float = 60.0, stop_timeout: float = 30.0):
        script = script or simulator_script()
        self.script = script
        self.truth_log = None if truth_log is None else str(truth_log)
        self.stop_timeout = stop_timeout
        self.url: Optional[str] = None
        self.port: Optional[int] = None
        cmd = [sys.executable, script, "--port", "0"]
        if self.truth_log is not None:
            cmd += ["--truth-log", self.truth_log]
        cmd += [str(a) for a in args]
        # stderr joins stdout, and a thread drains both for the life of the process: a server
        # that logs a lot can never block on a full pipe, and a failure can show what it said.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self._tail = collections.deque(maxlen=OUTPUT_TAIL_LINES)
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        output_ended = self._ready.wait(start_timeout)
        if self.url is None:
            self.stop()
            why = ("exited with status %s" % self.proc.returncode if output_ended
                   else "printed no listening line within %.0f s" % start_timeout)
            raise ServerStartError("%s %s; its output ends with:\n%s"
                                   % (os.path.basename(script), why, self.output_tail()))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self._tail.append(line.rstrip("\n"))
            match = self.url is None and LISTENING.search(line)
            if match:
                self.url, self.port = match.group(1), int(match.group(2))
                self._ready.set()
        self._ready.set()                   # EOF: the process is gone (or closed its output)

    def output_tail(self) -> str:
        """The last lines the server wrote (stdout and stderr together)."""
        return "\n".join(self._tail)

    def stop(self) -> Optional[int]:
        """Ends the process by PID (SIGTERM, then SIGKILL if it does not exit in stop_timeout)
        and returns its exit status. Safe to call again, and after the process exited itself."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(10)
        if not self._reader.is_alive():
            self.proc.stdout.close()
        return self.proc.returncode

    def truth_records(self, wait_for: int = 0, timeout: float = 10.0) -> List[dict]:
        """Records of the truth log; waits (bounded) until at least `wait_for` are there. A
        running simulator flushes its log about every second, an ended one has flushed it all."""
        deadline = time.monotonic() + timeout
        while True:
            records = []
            if self.truth_log is not None and os.path.exists(self.truth_log):
                with open(self.truth_log, encoding="utf-8") as fh:
                    records = [json.loads(line) for line in fh if line.strip()]
            if len(records) >= wait_for or time.monotonic() > deadline:
                return records
            time.sleep(0.1)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
