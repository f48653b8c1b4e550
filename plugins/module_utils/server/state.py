"""The per-server state file `<state_dir>/<name>/state.json` and the per-server lock.

The state file records what was launched (argv, env servelab set, config hash) and how to find
it again (PID + start time, cgroup, env marker), so a later task can tell "same server still
serving" from "different config" from "died", and stop everything it forked.

It never holds a secret: argv and env are stored redacted (module_utils/redact.py), and "the same
config" is decided by the config hash, keyed with `hash_salt` when the config has secrets (the
manifest shows that hash; unkeyed, a weak API key could be guessed from it offline). The file is
0600 and the server's directory 0700 all the same: the engine's own log in it may quote its
command line, secrets included.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Iterator, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils import redact
from ansible_collections.servelab.serving.plugins.module_utils.flock import held_file
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import atomic_write_text

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
    hash_salt: Optional[str] = None   # keys config_hash when the config has secrets


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


def _private_directory(directory: str) -> None:
    """The server's directory, 0700: its log may hold what the engine prints of its secrets."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    try:
        os.chmod(directory, 0o700)
    except OSError:   # not ours to change (someone else's state dir): the files stay 0600
        pass


def save(state_dir: str, state: ServerState, rules: redact.Rules = redact.DEFAULT_RULES) -> str:
    """Atomic and 0600 (mkstemp's mode, kept); argv and env redacted even if the caller forgot,
    which also cleans a state file an older servelab wrote with secrets in it."""
    directory = server_dir(state_dir, state.name)
    _private_directory(directory)
    data = dataclasses.asdict(state)
    data["cmd"] = redact.redact_tree(data["cmd"], rules=rules)
    data["env"] = redact.redact_tree(data["env"], rules=rules)
    path = os.path.join(directory, STATE_FILE)
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n",
                      mode=0o600)
    return path


@contextlib.contextmanager
def locked(state_dir: str, name: str, timeout: float = 600.0) -> Iterator[None]:
    """One operation per server at a time (two plays on one host must not both launch it)."""
    directory = server_dir(state_dir, name)
    _private_directory(directory)
    with held_file(os.path.join(directory, LOCK_FILE), timeout, 0.2, lambda: TimeoutError(
            f"another task holds {directory}/{LOCK_FILE} for more than {timeout:.0f} s")):
        yield
