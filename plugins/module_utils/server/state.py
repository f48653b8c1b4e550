"""The per-server state file `<state_dir>/<name>/state.json` and the per-server lock.

The state file records what was launched exactly (argv, env servelab set, config hash) and how to
find it again (PID + start time, cgroup, env marker), so a later task can tell "same server still
serving" from "different config" from "died", and stop everything it forked.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from typing import Iterator, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import atomic_write_json

STATE_FILE = "state.json"
LOG_FILE = "server.log"
LOCK_FILE = ".lock"


@dataclass
class ServerState:
    name: str
    engine: str
    profile: str
    status: str                       # running | stopped
    config_hash: str
    cmd: List[str]
    env: dict
    host: str
    port: int
    probe_host: str
    base_url: str
    model: Optional[str]
    log_path: str
    marker: str
    pid: Optional[int] = None
    start_time: Optional[int] = None  # /proc/<pid>/stat field 22, guards against PID reuse
    cgroup: Optional[str] = None
    engine_version: Optional[str] = None
    started_at: Optional[float] = None
    ready_seconds: Optional[float] = None
    ready: dict = field(default_factory=dict)


def server_dir(state_dir: str, name: str) -> str:
    return os.path.join(os.path.expanduser(state_dir), name)


def load(state_dir: str, name: str) -> Optional[ServerState]:
    path = os.path.join(server_dir(state_dir, name), STATE_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return None
    known = {f.name for f in dataclasses.fields(ServerState)}
    try:
        return ServerState(**{k: v for k, v in raw.items() if k in known})
    except TypeError:
        return None


def save(state_dir: str, state: ServerState) -> str:
    path = os.path.join(server_dir(state_dir, state.name), STATE_FILE)
    atomic_write_json(path, dataclasses.asdict(state))
    return path


@contextlib.contextmanager
def locked(state_dir: str, name: str, timeout: float = 600.0) -> Iterator[None]:
    """One operation per server at a time (two plays on one host must not both launch it)."""
    directory = server_dir(state_dir, name)
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"another task holds {directory}/{LOCK_FILE} for more "
                                       f"than {timeout:.0f} s") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)
