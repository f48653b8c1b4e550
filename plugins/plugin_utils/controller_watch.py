"""Whether the ansible-playbook that an action plugin runs for is still there.

An action plugin runs in an Ansible worker: a process forked by ansible-playbook for the task.
After a SIGKILL of ansible-playbook nothing ends that worker: llm_bench's action went on waiting
for its level's module, wrote the level's complete part file about 4 s later, and bench_resume
then kept that level as finished (issue 26), although nobody had seen it run to its end and the
run's manifest still said `started`. The worker's parent pid is ansible-playbook's: when it
dies the worker is reparented (to init or a subreaper), and getppid() changes. Nothing else
changes a process's parent, so that is the test.

`exit_when_gone` ends the worker at once when that happens (os._exit: no cleanup of this task
can report to anyone, and the in-flight mark it leaves says which level was lost). The module
it was waiting on then sees its caller gone (its stdout pipe, or the SSH channel, closed:
loadgen/caller.py) and stops loading the server within half a second, writing nothing.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

from ansible_collections.servelab.serving.plugins.plugin_utils.ticker import ticking

POLL_S = 0.2
# EX_TEMPFAIL: nobody reads it, but a process list or a core pattern may.
EXIT_CONTROLLER_GONE = 75


class ControllerWatch:
    """The parent of this worker at the start of the task: ansible-playbook."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    def gone(self) -> bool:
        return os.getppid() != self.parent

    @contextlib.contextmanager
    def exit_when_gone(self, what: str, poll_s: float = POLL_S) -> Iterator[None]:
        """While the block runs, end this process as soon as ansible-playbook is gone."""

        def watch() -> bool:
            if self.gone():
                self.exit(what)
            return True

        with ticking(poll_s, watch, "servelab-controller-watch"):
            yield
        if self.gone():          # between the last poll and the block's end
            self.exit(what)

    def exit(self, what: str) -> None:
        try:
            sys.stderr.write("servelab: ansible-playbook (pid %d) is gone; %s stopped, nothing "
                             "written\n" % (self.parent, what))
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(EXIT_CONTROLLER_GONE)
