# -*- coding: utf-8 -*-
"""bench_lock (action, controller): the run's locks on the task's host.

The module (plugins/modules/bench_lock.py, on the host) reads and writes the records; this side
knows who the run is (ansible-playbook's main process), judges whether a holder still lives (its
pid means something only here), takes over stale records, refuses live ones with the holder's
name, and computes the servers a reap must spare: all of it plugins/plugin_utils/run_locks.py's
bench_lock_task; this file only runs the module for it.
"""
from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.servelab.serving.plugins.modules.bench_lock import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils.run_locks import (
    LockRefused, bench_lock_task, this_controller,
)

display = Display()
MODULE = "servelab.serving.bench_lock"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        for internal in ("controller", "take_over", "release", "inventory_host"):
            if self._task.args.get(internal):
                raise AnsibleActionFail("bench_lock: %s is filled in by the action plugin; leave "
                                        "it out of the task" % internal)
        # The inventory host the locks are for: one run holds locks for each of its GPU servers,
        # and two of them may share a machine (their records must stay apart).
        host = str(self._task.delegate_to or task_vars.get("inventory_hostname") or "the host")
        base = {k: args[k] for k in ("run_id", "state_dir", "port", "extra_ports", "share_run", "lock_dir")
                if args.get(k) is not None}
        base["inventory_host"] = host

        def call(**extra):
            res = self._execute_module(module_name=MODULE, module_args=dict(base, **extra),
                                       task_vars=task_vars)
            if res.get("failed"):
                raise AnsibleActionFail(res.get("msg") or "bench_lock failed on the host",
                                        result=res)
            return res

        try:
            outcome = bench_lock_task(call, args, this_controller(args.get("owner_pid")), host,
                                      self._task.check_mode)
        except LockRefused as exc:
            raise AnsibleActionFail(str(exc), result=exc.result) from None
        for note in outcome["warnings"]:
            display.warning("bench_lock: %s" % note)
        result.update(outcome)
        return result
