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
    task's C(msg) (tasks whose name starts with O(task_prefix), and the C(llm_bench),
    C(bench_report), C(bench_manifest) actions' failures).
  - A finished task's result may carry C(progress) (a list of lines) and C(levels) (llm_bench's
    level rows); the callback prints them, one line per level, the line llm_bench prints
    (same figures, same format, the same verdict as bench_report's).
  - At the end of the playbook, prints the table and crossover of every C(bench_report) task that
    ran, the report's files, and the servelab tasks that failed.
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

import functools

from ansible import constants as C
from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import level_line
from ansible_collections.servelab.serving.plugins.plugin_utils.interrupt import GUARD, OpenRun

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


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "servelab"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._reports = {}  # results_dir -> the last bench_report result for it
        self._failures = []  # (host, task name, first line of msg)

    def _option(self, name, default):
        try:
            value = self.get_option(name)
        except Exception:  # noqa: BLE001 - options not loaded (e.g. used outside a playbook run)
            return default
        return default if value is None else value

    def _is_servelab(self, task) -> bool:
        name = str(
            task.get_name() if hasattr(task, "get_name") else getattr(task, "name", "") or ""
        )
        return name.strip().startswith(str(self._option("task_prefix", "servelab:")))

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
        elif action == "bench_run" and data.get("state") == "closed":
            if GUARD.run is not None and GUARD.run.run_id == data.get("run_id"):
                GUARD.disarm()
        elif action == "bench_lock" and data.get("state") == "acquired" and data.get("held"):
            GUARD.note_lock(host_name)

    def _finished(self, result, status: str, color) -> None:
        task, host, data = (
            _attr(result, "task"),
            _attr(result, "host"),
            _attr(result, "result") or {},
        )
        host_name = getattr(host, "name", str(host))
        action = _short_action(task)
        self._track_run(action, status, task, host_name, data)
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
        self._line(f"servelab | {host_name} | {task.get_name()} | {status}", color=color)
        extra = [str(p) for p in data.get("progress") or []] + self._level_lines(data)
        msg_lines = [m for m in self._msg_lines(data) if m != LOOP_DONE_MSG]
        if status.startswith(("FAILED", "failed", "UNREACHABLE")):
            extra += msg_lines[:1]
        elif action != "bench_report":  # its table and crossover are printed at the end
            extra += msg_lines
        for line in extra:
            self._line(f"servelab |   {line}", color=color)

    @_never_raise
    def v2_playbook_on_start(self, playbook):
        # Only ansible-playbook gets here, in its main process, after ansible installed its own
        # signal handlers (which the guard wraps).
        GUARD.install(cliargs=dict(context.CLIARGS), say=self._say_now,
                      cleanup_timeout=self._option("cleanup_timeout", None))

    def _say_now(self, text: str) -> None:
        self._display.display(text, color=C.COLOR_WARN, stderr=True)

    @_never_raise
    def v2_runner_on_start(self, host, task):
        if self._is_servelab(task):
            self._line(f"servelab | {getattr(host, 'name', host)} | {task.get_name()} | started")

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
    def v2_playbook_on_stats(self, stats):
        if not self._reports and not self._failures:
            return
        self._line("")
        self._line("servelab summary " + "*" * 60, color=C.COLOR_HIGHLIGHT)
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
