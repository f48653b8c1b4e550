"""Whether whoever will read this level's result is still there.

llm_bench runs on the bench client as a child of Ansible's connection: its stdout is a pipe (the
local connection, a pipelined SSH session's channel) that Ansible reads the module's JSON from.
When ansible-playbook is interrupted or killed on the controller that connection goes away, but
nothing signals the module: a load generator on a remote bench client would go on loading the
server to the end of its level (up to level_timeout), then drain it. A pipe whose reader is gone
(or a socket whose peer closed) shows POLLERR or POLLHUP on our end, without anything being
written to it; a terminal, a file or /dev/null never does, so a plain Python caller is not
affected.

Standard library only: shipped to bench clients with the load generator.
"""
from __future__ import annotations

import select

STDOUT = 1


def caller_gone(fd: int = STDOUT) -> bool:
    """True when the reader of `fd` (the module's stdout: Ansible) has gone away."""
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    try:
        poller.register(fd, 0)        # no events asked: only errors and hang-ups come back
        events = poller.poll(0)
    except (OSError, ValueError):
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _fd, mask in events)
