"""ansible-playbook in its own process group with its output collected line by line, for the
integration tests that watch a run as it goes (wait for a line, interrupt, kill the group)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time


class PlaybookProcess:
    """`argv` started in a new session (so the whole group can be signalled), stdout and stderr
    read by a thread into `lines`."""

    def __init__(self, argv: list, env: dict, cwd: str):
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
            start_new_session=True)
        self.lines: list = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, pattern: str, timeout: float = 180) -> None:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(regex.search(line) for line in list(self.lines)):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError("no line matching %r; output ends with:\n%s"
                             % (pattern, "\n".join(self.lines[-80:])))

    def wait(self, timeout: float = 600) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        self.seconds = time.monotonic() - self.started
        return rc

    def kill(self):
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
