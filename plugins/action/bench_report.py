# -*- coding: utf-8 -*-
"""bench_report: tables, plots, crossover and recommendation for one run, on the controller.

Thin wrapper: the logic is plugins/module_utils/servelab/report*.py (see report.py). The
documentation is plugins/modules/bench_report.py, as ansible-core does for action-only plugins.
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase



from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import ReportError, build_report, write_report

ARGUMENT_SPEC = {
    "results_dir": {"type": "path", "required": True},
    "baseline": {"type": "str", "default": "baseline"},
    "compare_to": {"type": "path"},
    "plots": {"type": "bool", "default": True},
    "max_error_rate": {"type": "float", "default": 0.1},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False

    def _absolute(self, path: str | None, task_vars: dict) -> str | None:
        """Relative paths are taken from the playbook's directory, not from the shell's cwd."""
        if not path or os.path.isabs(path):
            return path
        base = task_vars.get("playbook_dir") or self._loader.get_basedir()
        return os.path.normpath(os.path.join(base, path))

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        results_dir = self._absolute(args["results_dir"], task_vars)
        compare_to = self._absolute(args["compare_to"], task_vars)
        try:
            report = build_report(
                results_dir,
                baseline=args["baseline"],
                compare_to=compare_to,
                with_plots=args["plots"],
                max_error_rate=args["max_error_rate"],
            )
            changed = write_report(report, check_mode=self._task.check_mode)
        except ReportError as exc:
            raise AnsibleActionFail(f"bench_report: {exc}") from None
        result.update(report.as_result())
        result["changed"] = bool(changed)
        result["changed_files"] = changed
        if not report.warnings:
            result.pop("warnings", None)
        return result
