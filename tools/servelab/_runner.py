"""bench.yml and upgrade-cuda.yml through ansible-runner: events to a callback, errors raised.

ansible-runner starts ansible-playbook (the one beside this Python first) in a pty of its own and
hands every event it emits to `_Watch.on_event`, which keeps what the result and the error need
(the first failed host and task, the run directory bench_run opened) and passes the event on.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import _paths

FAILED_EVENTS = ("runner_on_failed", "runner_on_unreachable")
# bench.yml's run-opening/closing action: its result names the run directory.
RUN_ACTIONS = ("servelab.serving.bench_run", "bench_run")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ERROR_TAIL = 20    # lines of ansible-playbook's output kept for an error that no task reports


class BenchError(Exception):
    """The play failed. `host` and `task` name the first host that failed and its task (None when
    ansible-playbook stopped before any task, e.g. a syntax or inventory error); `message` is that
    task's message, secrets masked. `result` is the run's RunResult (status, rc, results_dir)."""

    def __init__(self, host: Optional[str], task: Optional[str], message: str,
                 result: RunResult | None = None):
        self.host, self.task, self.message, self.result = host, task, message, result
        where = ("%s: %s: " % (host, task) if host and task
                 else "%s: " % (task or host) if (task or host) else "")
        super().__init__(where + message)


@dataclass
class RunResult:
    playbook: str
    status: str                 # ansible-runner's: successful, failed, canceled, timeout
    rc: int
    results_dir: Optional[str] = None   # the run directory bench.yml wrote (bench only)
    run_id: Optional[str] = None
    stats: dict = field(default_factory=dict)   # playbook_on_stats: ok/changed/failures/... by host
    failures: list = field(default_factory=list)  # (host, task, message) of every failed task

    @property
    def ok(self) -> bool:
        return self.status == "successful" and self.rc == 0


def _message(res: Any, secrets, extravars_file: str = "") -> str:
    from ansible_collections.servelab.serving.plugins.module_utils.redact import redact_text
    text = _text(res)
    if extravars_file:
        # ansible-runner hands the extra vars over in a file of its own, removed afterwards: say
        # where they really came from.
        text = text.replace(extravars_file, "the extra vars (-e, extravars=)")
    return redact_text(text, secrets)


def _text(res: Any) -> str:
    if not isinstance(res, dict):
        return str(res)
    parts = [str(res.get("msg") or res.get("reason") or "").strip()]
    for key in ("stderr", "module_stderr"):
        text = str(res.get(key) or "").strip()
        if text and text not in parts[0]:
            parts.append(text[-2000:])
    return "\n".join(p for p in parts if p) or "failed (no message)"


class _Watch:
    """The event handler: keeps failures, the run dir, the playbook's pid; forwards events."""

    def __init__(self, on_event: Optional[Callable[[dict], Any]], secrets,
                 extravars_file: str = ""):
        self.on_event, self.secrets, self.extravars_file = on_event, secrets, extravars_file
        self.failures: list = []          # (order, host, task, message)
        self.run_dir: Optional[str] = None
        self.run_id: Optional[str] = None
        self.stats: dict = {}
        self.playbook_pid: Optional[int] = None
        self.tail: list = []
        self.callback_error: Optional[BaseException] = None

    def __call__(self, event: dict) -> bool:
        kind = event.get("event")
        data = event.get("event_data") or {}
        if kind == "playbook_on_start" and event.get("pid"):
            self.playbook_pid = int(event["pid"])
        elif kind in FAILED_EVENTS and not data.get("ignore_errors"):
            self.failures.append((len(self.failures), data.get("host"), data.get("task"),
                                  _message(data.get("res"), self.secrets, self.extravars_file)))
        elif kind == "runner_on_ok" and data.get("task_action") in RUN_ACTIONS:
            res = data.get("res") or {}
            self.run_dir = res.get("run_dir") or self.run_dir
            self.run_id = res.get("run_id") or self.run_id
        elif kind == "playbook_on_stats":
            self.stats = {key: data.get(key) or {} for key in
                          ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored")}
        for line in (event.get("stdout") or "").splitlines():
            if line.strip():
                self.tail = (self.tail + [line])[-ERROR_TAIL:]
        if self.on_event is not None and self.callback_error is None:
            try:
                self.on_event(event)
            except Exception as exc:  # noqa: BLE001 - a caller's bug must not hang the run
                self.callback_error = exc
        return True

    def first_failure(self):
        """The first host whose failure was not rescued (playbook_on_stats' failures/dark), with
        its last failed task: a rescued failure (a profile recorded as failed) lets the host go
        on, so the failure that stopped it is its last one."""
        failed_hosts = set(self.stats.get("failures") or {}) | set(self.stats.get("dark") or {})
        last = {}
        for order, host, task, message in self.failures:
            if not self.stats or host in failed_hosts:
                last[host] = (order, host, task, message)
        if not last:
            return None
        return min(last.values())[1:]


class _Cancel:
    """ansible-runner's cancel_callback. Ctrl-C / SIGTERM (or the caller's cancel_callback
    saying True) first sends SIGTERM to ansible-playbook, whose servelab.serving.progress callback
    then stops the run's servers, releases its locks and writes the report before it exits; a
    second request (or `grace` seconds later) lets ansible-runner kill it."""

    def __init__(self, watch: _Watch, user: Optional[Callable[[], bool]], grace: float = 300.0):
        self.watch, self.user, self.grace = watch, user, grace
        self.requests = 0
        self.first_at: Optional[float] = None
        self.old = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._signal)

    def _signal(self, _signum, _frame):
        self.requests += 1

    def restore(self):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

    def __call__(self) -> bool:
        import time
        if self.user is not None and self.user() and self.requests == 0:
            self.requests = 1
        if not self.requests:
            return False
        if self.first_at is None:
            self.first_at = time.monotonic()
            if self.watch.playbook_pid:
                try:
                    os.kill(self.watch.playbook_pid, signal.SIGTERM)
                except OSError:
                    return True
                return False
            return True
        return self.requests > 1 or time.monotonic() - self.first_at > self.grace


def run_playbook(playbook: str, inventory: Optional[str] = None, extravars: Optional[dict] = None,
                 on_event: Optional[Callable[[dict], Any]] = None, limit: Optional[str] = None,
                 verbosity: int = 0, envvars: Optional[dict] = None,
                 cancel_callback: Optional[Callable[[], bool]] = None,
                 private_data_dir: Optional[str] = None, timeout: Optional[int] = None,
                 check: bool = False) -> RunResult:
    """Run one of the collection's playbooks (bench.yml, upgrade-cuda.yml) with ansible-runner.
    Raises BenchError when it fails."""
    import ansible_runner

    coll = _paths.importable()
    from ansible_collections.servelab.serving.plugins.module_utils.redact import collect_secrets

    extravars = dict(extravars or {})
    secrets = collect_secrets(extravars)
    path = playbook if os.path.isabs(playbook) else os.path.join(coll.root, playbook)
    if inventory is None:
        inventory = os.path.join(coll.root, "inventory", "local")
    inventory = os.path.abspath(os.path.expanduser(inventory)) if os.path.exists(
        os.path.expanduser(inventory)) else inventory       # a path, or a host list "a,b,"
    bindir = os.path.dirname(sys.executable)
    env = {
        "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_CONFIG": os.path.join(coll.root, "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(coll.collections_paths),
    }
    env.update(envvars or {})

    own_dir = private_data_dir is None
    pdd = private_data_dir or tempfile.mkdtemp(prefix="servelab-runner-")
    watch = _Watch(on_event, secrets, os.path.join(pdd, "env", "extravars"))
    cancel = _Cancel(watch, cancel_callback)
    try:
        runner = ansible_runner.run(
            private_data_dir=pdd, project_dir=coll.root, playbook=path, inventory=inventory,
            extravars=extravars, envvars=env, limit=limit, verbosity=verbosity or None,
            event_handler=watch, cancel_callback=cancel, quiet=True, timeout=timeout,
            cmdline="--check" if check else None)
    finally:
        cancel.restore()
        if own_dir:
            shutil.rmtree(pdd, ignore_errors=True)
    status = runner.status
    if cancel.requests and status != "successful":
        status = "canceled"       # ansible-playbook exited by itself after the cleanup (rc 99)
    result = RunResult(playbook=path, status=status, rc=runner.rc if runner.rc is not None
                       else -1, results_dir=watch.run_dir, run_id=watch.run_id,
                       stats=watch.stats,
                       failures=[f[1:] for f in watch.failures])
    if watch.callback_error is not None:
        raise watch.callback_error
    if not result.ok:
        from ansible_collections.servelab.serving.plugins.module_utils.redact import redact_text
        first = watch.first_failure()
        if first is not None:
            host, task, message = first
            if result.status == "canceled":
                message = "interrupted (Ctrl-C, SIGTERM or cancel_callback): " + message
            raise BenchError(host, task, message, result=result)
        why = {"canceled": "was interrupted (Ctrl-C, SIGTERM or cancel_callback; rc %s)"
                           % result.rc,
               "timeout": "timed out"}.get(result.status, "failed (rc %s)" % result.rc)
        tail = redact_text(ANSI.sub("", "\n".join(watch.tail)), secrets)
        raise BenchError(None, None, "ansible-playbook %s %s%s" % (
            os.path.basename(path), why, (":\n" + tail) if tail else ""), result=result)
    return result
