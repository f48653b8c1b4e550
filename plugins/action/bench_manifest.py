# -*- coding: utf-8 -*-
"""bench_manifest: deep-merge a dict into results/<run_id>/manifest.json, on the controller.

Thin wrapper: the logic is plugins/module_utils/servelab/manifest.py. The documentation is
plugins/modules/bench_manifest.py, as ansible-core does for action-only plugins.
"""

from __future__ import annotations

import dataclasses
import os

import ansible.module_utils
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


def _add_servelab_module_utils() -> None:
    """Make `ansible.module_utils.servelab` importable in the controller process.

    Ansible ships module_utils to targets for modules, but an action plugin runs in the
    controller's own Python, where the `module_utils` setting of ansible.cfg is not on the import
    path; the repo's plugins/module_utils sits beside this file's directory.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    module_utils = os.path.join(os.path.dirname(here), "module_utils")
    if module_utils not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(module_utils)


_add_servelab_module_utils()

from ansible.module_utils.servelab.manifest import ManifestError, merge_into_manifest  # noqa: E402

ARGUMENT_SPEC = {
    "results_dir": {"type": "path", "required": True},
    "merge": {"type": "dict", "default": {}},
    "create_latest_link": {"type": "bool", "default": False},
    "record_git_commit": {"type": "bool", "default": True},
    "lock_timeout": {"type": "float", "default": 120.0},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False  # controller-only: no need to reach the task's host

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        playbook_dir = task_vars.get("playbook_dir") or self._loader.get_basedir()
        results_dir = args["results_dir"]
        if not os.path.isabs(results_dir):
            # Relative to the playbook, like every other servelab results path.
            results_dir = os.path.normpath(os.path.join(playbook_dir, results_dir))
        if args["lock_timeout"] <= 0:
            raise AnsibleActionFail(
                "bench_manifest: lock_timeout must be a positive number of seconds"
            )
        try:
            update = merge_into_manifest(
                results_dir,
                args["merge"],
                record_git_from=playbook_dir if args["record_git_commit"] else None,
                create_latest_link=args["create_latest_link"],
                check_mode=self._task.check_mode,
                lock_timeout=args["lock_timeout"],
            )
        except ManifestError as exc:
            raise AnsibleActionFail(f"bench_manifest: {exc}") from None
        result.update(dataclasses.asdict(update))
        return result
