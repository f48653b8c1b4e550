# -*- coding: utf-8 -*-
"""servelab callback: compact progress lines for servelab tasks and an end-of-run summary.

A notification callback, enabled beside the stdout callback (it never replaces it):

    [defaults]
    callbacks_enabled = servelab.serving.progress
"""

from __future__ import annotations

DOCUMENTATION = r"""
---
name: progress
type: notification
short_description: Live progress lines and an end-of-run summary for servelab plays
description:
  - Prints one compact line when a servelab task starts and when it ends on a host, with the
    task's C(msg) (tasks whose own name starts with O(task_prefix), a role's tasks too, whose
    names Ansible prefixes with the role's name; and the C(llm_bench), C(bench_report),
    C(bench_manifest) actions' failures).
  - "While C(servelab.serving.llm_server) starts a server, prints every O(heartbeat_interval)
    seconds C(servelab | <host> <profile>: server starting, 00:45 elapsed), with the last line of
    the server's log where the controller can read it (a local connection), masked by the
    collection's secret rules."
  - A finished task's result may carry C(progress) (a list of lines) and C(levels) (llm_bench's
    level rows); the callback prints them, one line per level, the line llm_bench prints
    (same figures, same format, the same verdict as bench_report's).
  - At the end of the playbook, prints an aligned table of every level measured in each run the
    playbook touched (host, profile, C, then the live line's figures; read from the run's part
    files, else from llm_bench's results; O(show_levels)), the table and crossover of every
    C(bench_report) task that ran, the report's files, and the servelab tasks that failed.
  - Works beside the default stdout callback (enable it with C(callbacks_enabled)); it never
    raises, so a surprise in a result never breaks a run.
  - Guards a benchmark run (plugins/plugin_utils/interrupt.py) - SIGTERM is handled like Ctrl-C,
    and a run opened by C(servelab.serving.bench_run) that ends without being closed (Ctrl-C,
    SIGTERM, a play that stopped) is cleaned up before ansible-playbook exits by
    C(playbooks/bench_interrupted.yml) - its servers stopped and reaped, its locks released, the
    manifest marked C(interrupted) with the level in flight, the report of what finished written.
author: servelab (!UNKNOWN)
options:
  task_prefix:
    description: Tasks whose name starts with this are reported live.
    type: str
    default: "servelab:"
    env:
      - name: SERVELAB_CALLBACK_PREFIX
    ini:
      - section: callback_servelab
        key: task_prefix
  show_table:
    description: Print the bench_report table at the end of the run.
    type: bool
    default: true
    env:
      - name: SERVELAB_CALLBACK_SHOW_TABLE
    ini:
      - section: callback_servelab
        key: show_table
  show_levels:
    description: Print the table of the run's measured levels at the end of the playbook.
    type: bool
    default: true
    env:
      - name: SERVELAB_CALLBACK_SHOW_LEVELS
    ini:
      - section: callback_servelab
        key: show_levels
  heartbeat_interval:
    description: Seconds between the heartbeat lines while a server starts; 0 turns them off.
    type: float
    default: 15
    env:
      - name: SERVELAB_HEARTBEAT_INTERVAL
    ini:
      - section: callback_servelab
        key: heartbeat_interval
  cleanup_timeout:
    description: Seconds the cleanup of an interrupted run may take before it is stopped.
    type: float
    default: 600
    env:
      - name: SERVELAB_CLEANUP_TIMEOUT
    ini:
      - section: callback_servelab
        key: cleanup_timeout
"""

import atexit
import functools
import os
import threading
import time

from ansible import constants as C
from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.servelab.serving.plugins.module_utils import redact
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import PARTS_DIR
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import level_line
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import LOAD_MODE_RATE
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    read_parts, row_repeat,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.state import (
    LOG_FILE, server_dir,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.interrupt import GUARD, OpenRun
from ansible_collections.servelab.serving.plugins.plugin_utils.progress import (
    bare_task_name, heartbeat_line, is_servelab_task, last_log_line, level_key, levels_table,
)

SERVELAB_ACTIONS = (
    "llm_bench",
    "bench_report",
    "bench_manifest",
    "llm_server",
    "gpu_reap",
    "gpu_facts",
)
MAX_MSG_LINES = 12
LOOP_DONE_MSG = "All items completed"  # ansible-core's msg for a loop: says nothing here
LLM_SERVER_STATE_DIR = "~/.servelab/servers"  # llm_server's default state_dir
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def _never_raise(method):
    """A callback that raises can abort or garble the whole run; report the surprise and go on."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - by design: a callback must not break the run
            try:
                self._display.vvv(f"servelab callback: {method.__name__} ignored {exc!r}")
            except Exception:  # noqa: BLE001
                pass
            return None

    return wrapper


def _attr(result, name):
    """`result.host` on ansible-core >= 2.19, `result._host` before."""
    value = getattr(result, name, None)
    return value if value is not None else getattr(result, "_" + name, None)


def _short_action(task) -> str:
    action = str(getattr(task, "action", "") or "")
    return action.rsplit(".", 1)[-1]


class _Starting:
    """One host whose server is starting: what its heartbeat line says."""

    def __init__(self, host, profile, log_path=None, secrets=(), rules=redact.DEFAULT_RULES):
        self.host, self.profile, self.log_path = host, profile, log_path
        self.secrets, self.rules = tuple(secrets), rules
        self.started = time.monotonic()
        self.started_wall = time.time()


class Heartbeat:
    """A daemon thread that prints a line per starting server every `interval` seconds, until
    stopped (the task ended on every host, the next task, the playbook's end), an interrupt
    (the guard counted a signal) or the main thread's end. It only reads a log file and prints:
    it never waits on Ansible, and Ansible never waits on it."""

    def __init__(self, interval: float, say, interrupted=lambda: False):
        self.interval = float(interval)
        self._say, self._interrupted = say, interrupted
        self._hosts = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="servelab-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, entry: _Starting) -> None:
        with self._lock:
            self._hosts[entry.host] = entry

    def done(self, host: str) -> bool:
        """Forget a host; True when no host is left starting."""
        with self._lock:
            self._hosts.pop(host, None)
            return not self._hosts

    def stop(self) -> None:
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def lines(self) -> list:
        with self._lock:
            entries = list(self._hosts.values())
        out = []
        for entry in entries:
            log = None
            if entry.log_path:
                log = last_log_line(entry.log_path, since=entry.started_wall - 1.0,
                                    secrets=entry.secrets, rules=entry.rules)
            out.append(heartbeat_line(entry.host, entry.profile,
                                      time.monotonic() - entry.started, log))
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self._interrupted() or not threading.main_thread().is_alive():
                return
            try:
                for line in self.lines():
                    if self._stop.is_set():
                        return
                    self._say(line)
            except Exception:  # noqa: BLE001 - a heartbeat never breaks a run
                pass


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "servelab"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._reports = {}  # results_dir -> the last bench_report result for it
        self._failures = []  # (host, task name, first line of msg)
        self._run_dirs = {}  # run dir -> run id, in the order the playbook touched them
        self._result_rows = {}  # run dir -> {level key: row} from llm_bench's results
        self._profiles = []  # profiles in the order their levels came in
        self._play = None
        self._heartbeat = None
        self._heartbeat_task = None
        atexit.register(self._stop_heartbeat)

    def _option(self, name, default):
        try:
            value = self.get_option(name)
        except Exception:  # noqa: BLE001 - options not loaded (e.g. used outside a playbook run)
            return default
        return default if value is None else value

    def _is_servelab(self, task) -> bool:
        return is_servelab_task(self._task_name(task), str(self._option("task_prefix", "servelab:")))

    @staticmethod
    def _task_name(task) -> str:
        return str(task.get_name() if hasattr(task, "get_name") else getattr(task, "name", "") or "")

    def _line(self, text: str, color=None) -> None:
        self._display.display(text, color=color)

    def _msg_lines(self, result: dict, limit: int | None = MAX_MSG_LINES) -> list:
        msg = result.get("msg")
        if isinstance(msg, (list, tuple)):
            lines = [str(m) for m in msg]
        elif msg:
            lines = str(msg).splitlines()
        else:
            lines = []
        if limit is not None and len(lines) > limit:
            lines = lines[:limit] + [f"... ({len(lines) - limit} more lines)"]
        return lines

    def _level_lines(self, result: dict) -> list:
        """One line per llm_bench level row: llm_bench's own progress line."""
        levels = result.get("levels")
        if not isinstance(levels, (list, tuple)):
            return []
        return [level_line(row) for row in levels if isinstance(row, dict)]

    def _track_run(self, action: str, status: str, task, host_name: str, data: dict) -> None:
        """The interrupt guard follows the run: armed once bench_run opened it, told where
        bench_lock took locks, disarmed once bench_run closed it."""
        if status != "ok" or data.get("skipped"):
            return
        if action == "bench_run" and data.get("state") == "opened" and not data.get("check_mode"):
            GUARD.arm(OpenRun(run_id=str(data["run_id"]), results_root=str(data["results_root"]),
                              run_dir=str(data["run_dir"])))
            self._run_dirs.setdefault(os.path.realpath(str(data["run_dir"])), str(data["run_id"]))
        elif action == "bench_run" and data.get("state") == "closed":
            if GUARD.run is not None and GUARD.run.run_id == data.get("run_id"):
                GUARD.disarm()
        elif action == "bench_lock" and data.get("state") == "acquired" and data.get("held"):
            GUARD.note_lock(host_name)

    def _track_levels(self, action: str, data: dict) -> None:
        """Where llm_bench wrote its levels (the end-of-run table reads the run's parts there)
        and the rows it returned (the table's fallback)."""
        if action != "llm_bench" or data.get("skipped") or not data.get("results_dir"):
            return
        run_dir = os.path.realpath(str(data["results_dir"]))
        self._run_dirs.setdefault(run_dir, os.path.basename(run_dir.rstrip(os.sep)))
        rows = self._result_rows.setdefault(run_dir, {})
        levels = data.get("levels")
        for row in levels if isinstance(levels, (list, tuple)) else ():
            if isinstance(row, dict):
                rows[level_key(row)] = row
                if row.get("profile") not in self._profiles:
                    self._profiles.append(row.get("profile"))

    def _finished(self, result, status: str, color) -> None:
        task, host, data = (
            _attr(result, "task"),
            _attr(result, "host"),
            _attr(result, "result") or {},
        )
        host_name = getattr(host, "name", str(host))
        self._heartbeat_done(task, host_name)
        action = _short_action(task)
        self._track_run(action, status, task, host_name, data)
        self._track_levels(action, data)
        if action == "bench_report" and status == "ok" and not data.get("skipped"):
            # Keyed by run: a report run twice (or once per host) is summarised once.
            self._reports[str(data.get("results_dir"))] = dict(data)
        servelab_task = self._is_servelab(task)
        if status == "FAILED" and (servelab_task or action in SERVELAB_ACTIONS):
            first = (self._msg_lines(data) or ["(no message)"])[0]
            self._failures.append((host_name, task.get_name(), first))
        if not servelab_task:
            return
        if status == "ok" and data.get("changed"):
            status = "changed"
        self._line(f"servelab | {host_name} | {bare_task_name(task.get_name())} | {status}",
                   color=color)
        extra = [str(p) for p in data.get("progress") or []] + self._level_lines(data)
        msg_lines = [m for m in self._msg_lines(data) if m != LOOP_DONE_MSG]
        if status.startswith(("FAILED", "failed", "UNREACHABLE")):
            extra += msg_lines[:1]
        elif action != "bench_report":  # its table and crossover are printed at the end
            extra += msg_lines
        for line in extra:
            self._line(f"servelab |   {line}", color=color)

    # -- the heartbeat while a server starts ----------------------------------------------------

    @staticmethod
    def _starts_a_server(task) -> bool:
        if _short_action(task) != "llm_server":
            return False
        state = str((getattr(task, "args", None) or {}).get("state", ""))
        return state == "started" or "{{" in state or "{%" in state

    def _stop_heartbeat(self) -> None:
        beat, self._heartbeat, self._heartbeat_task = self._heartbeat, None, None
        if beat is not None:
            beat.stop()

    def _heartbeat_done(self, task, host_name: str) -> None:
        beat = self._heartbeat
        if beat is None or task is None:
            return
        if getattr(task, "_uuid", None) != self._heartbeat_task:
            return
        if beat.done(host_name):
            self._stop_heartbeat()

    def _server_start(self, host, task):
        """What the heartbeat says about this host's start: its profile, and its log where the
        controller can read it (a local connection), with the secrets to mask in it. The task's
        arguments are templated with the host's variables, as the worker does."""
        host_name = getattr(host, "name", str(host))
        args = dict(getattr(task, "args", None) or {})
        try:
            from ansible.template import Templar

            variables = task.get_variable_manager().get_vars(play=self._play, host=host, task=task)
            templar = Templar(loader=task.get_loader(), variables=variables)

            def value(key, default=None):
                if key not in args:
                    return default
                try:
                    return templar.template(args[key])
                except Exception:  # noqa: BLE001 - an argument this side cannot template
                    return default
            connection = templar.template(variables.get("ansible_connection") or "")
        except Exception:  # noqa: BLE001 - no variables: say what the task is, without a log
            return _Starting(host_name, str(args.get("name", "?")))
        if str(value("state", "")) != "started":
            return None
        name = str(value("name", "?"))
        profile = value("profile", None)
        profile_name = str(profile.get("name") or name) if isinstance(profile, dict) else name
        rules = redact.Rules.of(value("secret_names", None) or ())
        secrets = redact.collect_secrets(
            {"env": value("env", None) or {}, "api_key": value("api_key", None),
             "profile": profile or {}, "extra_args": value("extra_args", None) or []}, rules)
        local = str(connection) == "local" or (not connection and host_name in LOCAL_NAMES)
        log_path = None
        if local:
            state_dir = str(value("state_dir", None) or LLM_SERVER_STATE_DIR)
            log_path = os.path.join(server_dir(state_dir, name), LOG_FILE)
        return _Starting(host_name, profile_name, log_path, secrets, rules)

    @_never_raise
    def v2_playbook_on_play_start(self, play):
        self._play = play

    @_never_raise
    def v2_playbook_on_task_start(self, task, is_conditional):
        interval = float(self._option("heartbeat_interval", 15) or 0)
        if interval <= 0 or not self._starts_a_server(task):
            return
        self._stop_heartbeat()   # a start that never reported its end: this one replaces it
        beat = Heartbeat(interval, lambda text: self._line(f"servelab | {text}"),
                         interrupted=lambda: GUARD.signals > 0)
        self._heartbeat, self._heartbeat_task = beat, getattr(task, "_uuid", None)
        beat.start()

    # -- the end-of-run table -------------------------------------------------------------------

    def _run_rows(self, run_dir: str) -> list:
        """Every level measured in the run: its part files (levels kept from before a resume
        included), and the rows llm_bench returned that have none (a part that could not be
        written)."""
        rows = {}
        try:
            for row, _path in read_parts(os.path.join(run_dir, PARTS_DIR)):
                rows[level_key(row)] = row
        except Exception:  # noqa: BLE001 - a part file that is not one: the results' rows still
            pass
        for key, row in self._result_rows.get(run_dir, {}).items():
            rows.setdefault(key, row)
        order = {p: i for i, p in enumerate(self._profiles)}

        def key(row):
            rate = row.get("load_mode") == LOAD_MODE_RATE
            return (str(row.get("host")), order.get(row.get("profile"), len(order)),
                    str(row.get("profile")), rate, float(row.get("request_rate") or 0) if rate
                    else 0.0, float(row.get("concurrency") or 0), row_repeat(row))

        return sorted(rows.values(), key=key)

    def _levels_summary(self) -> list:
        out = []
        if not self._option("show_levels", True):
            return out
        for run_dir, run_id in self._run_dirs.items():
            rows = self._run_rows(run_dir)
            if rows:
                out.append(f"levels of run {run_id} ({len(rows)}, {run_dir}):")
                out.extend("  " + line for line in levels_table(rows))
        return out

    @_never_raise
    def v2_playbook_on_start(self, playbook):
        # Only ansible-playbook gets here, in its main process, after ansible installed its own
        # signal handlers (which the guard wraps).
        GUARD.install(cliargs=dict(context.CLIARGS), say=self._say_now,
                      cleanup_timeout=self._option("cleanup_timeout", None))

    def _say_now(self, text: str) -> None:
        self._stop_heartbeat()
        self._display.display(text, color=C.COLOR_WARN, stderr=True)

    @_never_raise
    def v2_runner_on_start(self, host, task):
        if self._heartbeat is not None and getattr(task, "_uuid", None) == self._heartbeat_task:
            entry = self._server_start(host, task)
            if entry is not None:
                self._heartbeat.add(entry)
        if self._is_servelab(task):
            self._line(f"servelab | {getattr(host, 'name', host)} | "
                       f"{bare_task_name(task.get_name())} | started")

    @_never_raise
    def v2_runner_on_ok(self, result):
        self._finished(result, "ok", C.COLOR_OK)

    @_never_raise
    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._finished(result, "failed (ignored)" if ignore_errors else "FAILED", C.COLOR_ERROR)

    @_never_raise
    def v2_runner_on_unreachable(self, result):
        self._finished(result, "UNREACHABLE", C.COLOR_UNREACHABLE)

    @_never_raise
    def v2_runner_on_skipped(self, result):
        host = _attr(result, "host")
        self._heartbeat_done(_attr(result, "task"), getattr(host, "name", str(host)))

    @_never_raise
    def v2_playbook_on_stats(self, stats):
        self._stop_heartbeat()
        levels = self._levels_summary()
        if not self._reports and not self._failures and not levels:
            return
        self._line("")
        self._line("servelab summary " + "*" * 60, color=C.COLOR_HIGHLIGHT)
        for line in levels:
            self._line(line)
        for data in self._reports.values():
            self._line(f"report of {data.get('run_id', '?')} ({data.get('results_dir', '?')}):")
            if self._option("show_table", True) and data.get("table"):
                for line in str(data["table"]).splitlines():
                    self._line(line)
            for line in self._msg_lines(data, limit=None):
                self._line(line)
            for path in data.get("files") or []:
                if str(path).endswith((".md", ".html")):
                    self._line(f"  {path}")
        if self._failures:
            self._line("servelab tasks that failed:", color=C.COLOR_ERROR)
            for host_name, task_name, first in self._failures:
                self._line(f"  {host_name} | {task_name} | {first}", color=C.COLOR_ERROR)
