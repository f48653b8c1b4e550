"""Who listens on a TCP port, from /proc/net/tcp{,6} (standard library only).

Used before a launch (a foreign server on the port would answer the readiness probe and be
benchmarked instead of ours) and after a stop (the port must be free for the next profile).
"""
from __future__ import annotations

import os
from typing import Dict, List, Set

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import pids_with_open_file, read_cmdline

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
LISTEN = "0A"


def listening_inodes(port: int, tables=TCP_TABLES) -> Set[str]:
    """Socket inodes in LISTEN state on `port`, any address."""
    inodes = set()
    for table in tables:
        try:
            with open(table, encoding="ascii") as fh:
                next(fh, None)
                for line in fh:
                    fields = line.split()
                    if len(fields) < 10 or fields[3] != LISTEN:
                        continue
                    if int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(fields[9])
        except OSError:
            continue
    return inodes


def is_listening(port: int) -> bool:
    return bool(listening_inodes(port))


def listeners(port: int) -> Dict[int, str]:
    """{pid: cmdline} of processes holding a listening socket on `port` (root sees all)."""
    inodes = listening_inodes(port)
    if not inodes:
        return {}
    wanted = {f"socket:[{inode}]" for inode in inodes}
    return {pid: read_cmdline(pid)
            for pid in pids_with_open_file(lambda fd_path: os.readlink(fd_path) in wanted)}


def describe(holders: Dict[int, str]) -> List[str]:
    """One line per holder: a command line's own newlines and tabs (`python -c` code) are folded
    to spaces, so the message stays one line per problem."""
    return [f"pid {pid} ({' '.join(cmd.split())[:120] or '?'})" for pid, cmd in sorted(holders.items())]
