# -*- coding: utf-8 -*-
"""bench_report: tables, plots, crossover and recommendation for one run, on the controller.

Thin wrapper: the logic is plugins/plugin_utils/report/ (build.py). The documentation
and the argument spec are plugins/modules/bench_report.py, as ansible-core does for action-only
plugins.
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.servelab.serving.plugins.modules.bench_report import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils.controller_requirements import (
    install_command,
    missing,
    requirements_error,
)

# The report needs pandas, matplotlib and pyarrow on the controller (requirements.txt). Without them the
# plugin still loads (ansible-doc, --syntax-check, the sanity import test) and the task fails
# saying what is missing.
try:
    from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import (
        ReportError,
        build_report,
        write_report,
    )
except ImportError as exc:
    REPORT_IMPORT_ERROR = str(exc)
    build_report = write_report = None

    class ReportError(Exception):
        """Stands in for report.build.ReportError when the report cannot be imported."""
else:
    REPORT_IMPORT_ERROR = None


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
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        # The report modules guard their pandas/matplotlib imports: name what is missing and the
        # command that installs it (plugin_utils/controller_requirements.py).
        problem = requirements_error("bench_report", missing())
        if problem is None and REPORT_IMPORT_ERROR is not None:
            problem = "bench_report cannot load the report (%s); install its requirements: %s" % (
                REPORT_IMPORT_ERROR, install_command())
        if problem is not None:
            raise AnsibleActionFail(problem)
        if any(c <= 0 for c in args["cdf_levels"] or ()):
            raise AnsibleActionFail(
                "bench_report: cdf_levels must be positive concurrency levels, got %s"
                % args["cdf_levels"]
            )
        results_dir = self._absolute(args["results_dir"], task_vars)
        compare_to = self._absolute(args["compare_to"], task_vars)
        try:
            report = build_report(
                results_dir,
                baseline=args["baseline"],
                compare_to=compare_to,
                with_plots=args["plots"],
                max_error_rate=args["max_error_rate"],
                cdf_levels=args["cdf_levels"],
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
