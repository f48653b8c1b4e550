# -*- coding: utf-8 -*-
"""bench_manifest: deep-merge a dict into results/<run_id>/manifest.json, on the controller.

Thin wrapper: the logic is plugins/plugin_utils/manifest.py. The documentation and the argument
spec are plugins/modules/bench_manifest.py, as ansible-core does for action-only plugins.
"""

from __future__ import annotations

import dataclasses
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.servelab.serving.plugins.modules.bench_manifest import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import (
    ManifestError,
    merge_into_manifest,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False  # controller-only: no need to reach the task's host

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
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
