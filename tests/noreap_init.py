"""A PID 1 that never reaps orphans, as in a container whose init is `sleep infinity`.

    unshare --fork --pid --mount-proc python3 tests/noreap_init.py -- COMMAND [ARG...]

In a fresh pid namespace this process is PID 1: every process orphaned inside it (a daemonised
server, a double-forked worker, a stopped test child's children) is re-parented here, and is never
waited for, so once it exits it stays a zombie with its /proc/<pid> entry. That is what `docker
run` without --init and many CI runners give. Code and tests that take "/proc/<pid> exists" for
"still running" fail under it; servelab's one rule (proc/lifetime.is_alive: a zombie is gone) does
not. `make test-noreap` runs the fast tier this way, and CI runs that target.

COMMAND is this process's only waited-for child; its exit status is ours. SIGINT, SIGTERM and
SIGHUP are passed on to it (PID 1 has no default action for them). Standard library only.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: unshare --fork --pid --mount-proc python3 noreap_init.py -- COMMAND",
              file=sys.stderr)
        return 2
    if os.getpid() != 1:
        print("noreap_init: not PID 1 (pid %d): run it under `unshare --fork --pid "
              "--mount-proc`; orphans would be reaped by the real init" % os.getpid(),
              file=sys.stderr)
        return 2
    child = subprocess.Popen(argv)

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    # Popen.wait is waitpid(child.pid): it collects this one child and no orphan.
    rc = child.wait()
    zombies = _zombies()
    print("noreap_init: %s exited %d; %d unreaped zombie(s) left in the namespace, as under a "
          "non-reaping init" % (argv[0], rc, len(zombies)), file=sys.stderr)
    return rc if rc >= 0 else 128 - rc


def _zombies() -> list:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == b"Z":
            out.append(int(entry))
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
