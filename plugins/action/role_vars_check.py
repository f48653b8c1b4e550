# -*- coding: utf-8 -*-
"""role_vars_check (action, controller): unknown `<role>_*` variables refused before any change.

Reads each host's raw variables (hostvars.raw_get: inventory, group_vars, host_vars, -e, facts;
untemplated, so nothing is evaluated) and hands their names to plugins/plugin_utils/role_vars.py.
Documentation: plugins/modules/role_vars_check.py.
"""
from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.servelab.serving.plugins.modules.role_vars_check import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils import role_vars
from ansible_collections.servelab.serving.plugins.plugin_utils.origin import value_origin


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result["changed"] = False
        elsewhere = {str(k): str(v) for k, v in (args["elsewhere"] or {}).items()}
        try:
            roles = [role_vars.load_role(str(name), elsewhere=elsewhere) for name in args["roles"]]
        except ValueError as exc:
            raise AnsibleActionFail("role_vars_check: %s" % exc) from exc
        roles += [role_vars.RoleVariables(role=str(p), known=(), elsewhere=tuple(sorted(elsewhere.items())))
                  for p in args["prefixes"]]
        hostvars = task_vars.get("hostvars")
        if hostvars is None or not hasattr(hostvars, "raw_get"):
            raise AnsibleActionFail("role_vars_check: needs ansible-core's hostvars (run it as a task of a play)")
        hosts = args["hosts"] if args["hosts"] is not None else [str(task_vars.get("inventory_hostname"))]
        found = []
        for host in hosts:
            raw = dict(hostvars.raw_get(str(host)))
            origins = {}
            for name in raw:
                where = value_origin(raw[name])
                if where:
                    origins[str(name)] = where
            found += role_vars.unknown_variables(raw, roles, host=str(host), origins=origins)
        result["unknown"] = [dict(name=u.name, role=u.role, suggestion=u.suggestion, host=u.host, where=u.where)
                             for u in found]
        if found:
            result.update(failed=True, msg=role_vars.failure_message(found))
        else:
            result["msg"] = "%d host(s): no unknown variable of %s" % (
                len(hosts), ", ".join(r.prefix + "*" for r in roles))
        return result
