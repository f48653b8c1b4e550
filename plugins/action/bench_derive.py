# -*- coding: utf-8 -*-
"""bench_derive: the profile that switches speculation by load, from the run's crossover.

Thin wrapper over plugins/plugin_utils/derive.py; documentation and argument spec in
plugins/modules/bench_derive.py.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.servelab.serving.plugins.modules.bench_derive import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils.controller_requirements import (
    install_command,
)

try:
    from ansible_collections.servelab.serving.plugins.plugin_utils.derive import DeriveError, derive
    from ansible_collections.servelab.serving.plugins.plugin_utils.report.data import ReportError
except ImportError as exc:
    DERIVE_IMPORT_ERROR = str(exc)
else:
    DERIVE_IMPORT_ERROR = None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if DERIVE_IMPORT_ERROR is not None:
            raise AnsibleActionFail("bench_derive needs pandas on the controller "
                                    "(requirements.txt): %s; install it with: %s"
                                    % (DERIVE_IMPORT_ERROR, install_command()))
        try:
            derived = derive(**args)
        except (DeriveError, ReportError, ValueError) as exc:
            raise AnsibleActionFail("bench_derive: %s" % exc) from None
        result.update(derived.as_dict())
        result["changed"] = False
        return result
