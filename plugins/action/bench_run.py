# -*- coding: utf-8 -*-
"""bench_run (action, controller): open and close a benchmark run.

Thin wrapper: the logic is plugins/plugin_utils/run_record.py; the documentation and the
argument spec are plugins/modules/bench_run.py.
"""
from __future__ import annotations

import dataclasses
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.servelab.serving.plugins.module_utils.run.lock import LockError, utc_now
from ansible_collections.servelab.serving.plugins.modules.bench_run import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils.interrupt import GUARD
from ansible_collections.servelab.serving.plugins.plugin_utils.run_locks import this_controller
from ansible_collections.servelab.serving.plugins.plugin_utils.run_record import (
    RunError, close_run, open_run,
)

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        root = os.path.expanduser(args["results_root"])
        if not os.path.isabs(root):
            root = os.path.normpath(os.path.join(
                task_vars.get("playbook_dir") or self._loader.get_basedir(), root))
        me = this_controller(args.get("owner_pid"))
        check = bool(self._task.check_mode)
        result["state"] = args["state"]     # the progress callback's interrupt guard reads it
        try:
            if args["state"] == "opened":
                outcome = open_run(root, args["run_id"], me, resume=args.get("resume") or None,
                                   remeasure=args["remeasure"], break_lock=args["break_lock"],
                                   now=utc_now(), check_mode=check)
                for note in outcome.notes:
                    display.warning("bench_run: %s" % note)
                # The worker running this task is a fork of ansible-playbook's main process: it
                # sees whether the progress callback installed the guard there.
                if not GUARD.installed and not check:
                    note = ("the servelab.serving.progress callback is not enabled, so an "
                            "interrupted run (Ctrl-C, SIGTERM) will not stop its servers or "
                            "write its report by itself: add `callbacks_enabled = "
                            "servelab.serving.progress` to ansible.cfg, or afterwards run "
                            "ansible-playbook playbooks/bench_interrupted.yml -e bench_run_id=%s"
                            % outcome.run_id)
                    display.warning("bench_run: %s" % note)
                    outcome.notes.append(note)
                result.update(dataclasses.asdict(outcome), changed=not check,
                              results_root=root, controller=dataclasses.asdict(me),
                              check_mode=check)
            else:
                closed = close_run(root, args["run_id"], me, args["status"], now=utc_now(),
                                   reason=args["reason"], check_mode=check,
                                   resume_command=args["resume_command"])
                result.update(dataclasses.asdict(closed), changed=closed.manifest_written
                              or bool(closed.released), results_root=root)
        except (RunError, LockError) as exc:
            raise AnsibleActionFail("bench_run: %s" % exc) from None
        return result
