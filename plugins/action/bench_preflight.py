# -*- coding: utf-8 -*-
"""bench_preflight (action, controller): bench.yml's settings checked before anything starts.

Controller mode (`hosts`): gathers each GPU server's bench_* variables as the bench role will see
them (the host's raw variables over the role's defaults, templated in the host's context) and
hands them to plugins/plugin_utils/preflight/ (the package); the checks that need another machine (a jsonl
workload on the bench client, the installed SGLang or HAProxy on a GPU server) run through the
bench_preflight module: inline when that machine is this task's own host, otherwise they are
returned as `target_checks` for bench.yml's next task. Target mode (`workloads`, `servers`,
`executables`, the task delegated to a host): runs the module there. Documentation: plugins/modules/bench_preflight.py.
"""
from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.servelab.serving.plugins.modules.bench_preflight import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils import preflight as pf
from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.fleet import same_machine
from ansible_collections.servelab.serving.plugins.plugin_utils.results_root import results_root_problem
from ansible_collections.servelab.serving.plugins.plugin_utils.origin import value_origin


MODULE = "servelab.serving.bench_preflight"


def _first_line(exc: Exception) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0]


def _addresses(hostvars, groups) -> dict:
    """Every inventory host's address as the others reach it (ansible_host, else its name): rank 0's
    is a multi-node profile's dist-init address."""
    hosts = {host for members in groups.values() for host in members}
    found = {}
    for host in sorted(hosts):
        try:
            value = hostvars.raw_get(host).get("ansible_host")
        except Exception:  # noqa: BLE001 - a host without variables is reached by its name
            value = None
        found[host] = str(value) if isinstance(value, str) and value and "{" not in value else host
    return found


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    # -----------------------------------------------------------------------------------------
    # Variables as the role will see them

    def _load(self, path: str, templates: bool):
        try:
            # Role defaults hold templates ({{ playbook_dir }}, {{ groups[...] }}): 2.19 renders
            # only templates from trusted sources, which the role's own files are.
            return self._loader.load_from_file(path, trusted_as_template=templates)
        except TypeError:   # cores before 2.19 have no trust and no such argument
            return self._loader.load_from_file(path)

    def _templar_for(self, variables: dict):
        copy = getattr(self._templar, "copy_with_new_env", None)
        if copy is not None:
            return copy(available_variables=variables)
        from ansible.template import Templar   # pylint: disable=import-outside-toplevel
        return Templar(loader=self._loader, variables=variables)

    def _host_input(self, host: str, hostvars, defaults: dict, task_vars: dict,
                    names=None) -> pf.HostInput:
        # raw_get: the host's variables untemplated (inventory, group_vars, host_vars, -e,
        # facts), so that the role's defaults sit under them and templates see both.
        raw = dict(hostvars.raw_get(host))
        given = tuple(sorted(k for k in raw if str(k).startswith("bench_")))
        variables = dict(defaults)
        variables.update(raw)
        # The role runs in playbooks/bench.yml's plays: their playbook_dir, not the top file's.
        variables["playbook_dir"] = task_vars.get("playbook_dir", variables.get("playbook_dir"))
        for name in pf.PLAYBOOK_SET:
            variables.setdefault(name, "preflight")     # set by bench.yml after the preflight
        templar = self._templar_for(variables)
        values, errors = {}, {}
        for name in sorted(set(defaults) | set(given) if names is None else names):
            if name not in variables:
                continue
            try:
                values[name] = pf.plain(templar.template(variables[name]))
            except Exception as exc:  # noqa: BLE001 - any templating error is the user's to fix
                errors[name] = _first_line(exc)
        origins = {name: value_origin(raw[name]) for name in given}
        profiles = raw.get("bench_profiles")
        if isinstance(profiles, list):
            for i, item in enumerate(profiles):
                origins["bench_profiles[%d]" % i] = value_origin(item) or origins["bench_profiles"]
        groups = {str(k): [str(h) for h in v] for k, v in (task_vars.get("groups") or {}).items()}
        return pf.HostInput(host=host, values=values, given=given,
                            origins={k: v for k, v in origins.items() if v}, errors=errors,
                            groups=groups, addresses=_addresses(hostvars, groups))

    # -----------------------------------------------------------------------------------------
    # Checks on a host, through the module

    def _on_host(self, host: str, check: dict, task_vars) -> list:
        res = self._execute_module(module_name=MODULE, task_vars=task_vars,
                                   module_args={"workloads": check.get("workloads") or [],
                                                "servers": check.get("servers") or [],
                                                "executables": check.get("executables") or [],
                                                "ports": check.get("ports") or [],
                                                "help_flags": check.get("help_flags") or []})
        problems = [pf.Problem(str(p.get("variable")), str(p.get("message")),
                               str(p.get("where") or ""), tuple(p.get("hosts") or ()))
                    for p in res.get("problems") or ()]
        if res.get("failed") and not problems:
            detail = res.get("msg") or "failed"
            stderr = (res.get("module_stderr") or "").strip()
            if stderr:
                detail += ": " + stderr[-600:]
            problems.append(pf.Problem("bench_client", "bench_preflight could not check on %s: "
                                                       "%s" % (host, detail)))
        return problems

    def _fail(self, result: dict, problems, where: str = "") -> dict:
        lines = pf.failure_lines(problems, where)
        result.update(failed=True, changed=False, msg="\n".join(lines), progress=lines[1:],
                      problems=[p.as_dict() for p in problems])
        return result

    # -----------------------------------------------------------------------------------------

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result["changed"] = False
        if args["hosts"] is None:
            # Target mode: bench.yml delegates this task to the host the checks are about.
            host = str(self._task.delegate_to or task_vars.get("inventory_hostname"))
            problems = self._on_host(host, args, task_vars)
            if problems:
                return self._fail(result, problems, host)
            result.update(problems=[], msg="bench preflight on %s: %d workload(s), %d server "
                                           "profile(s), %d program(s), %d port(s), %d command "
                                           "flag set(s) checked"
                                           % (host, len(args["workloads"]), len(args["servers"]),
                                              len(args["executables"]), len(args["ports"]),
                                              len(args["help_flags"])))
            return result

        hostvars = task_vars.get("hostvars")
        if hostvars is None or not hasattr(hostvars, "raw_get"):
            raise AnsibleActionFail("bench_preflight: needs ansible-core's hostvars (run it as a "
                                    "task of a play)")
        defaults = self._load(pf.ROLE_DEFAULTS_FILE, templates=True) or {}
        spec_doc = self._load(pf.ROLE_SPEC_FILE, templates=False) or {}
        options = spec_doc.get("argument_specs", {}).get("main", {}).get("options") or {}
        if not options:
            raise AnsibleActionFail("bench_preflight: no options in %s" % pf.ROLE_SPEC_FILE)
        inventory_hosts = [str(h) for h in hostvars]
        inputs = [self._host_input(str(h), hostvars, defaults, task_vars) for h in args["hosts"]]
        if args.get("profiles") is not None:
            # tune.yml: its trial profiles are checked in place of the hosts' bench_profiles.
            for inp in inputs:
                inp.values["bench_profiles"] = pf.plain(args["profiles"])
        connections = {}

        def connection_of(name):
            # The implicit localhost (not in the inventory) is a local connection.
            if name not in connections:
                raw = hostvars.raw_get(name) if name in inventory_hosts else {}
                connections[name] = str(raw.get("ansible_connection") or (
                    "local" if name == "localhost" and name not in inventory_hosts else ""))
            return connections[name] or None

        for inp in inputs:
            client = inp.values.get("bench_client")
            if isinstance(client, str) and client:
                inp.client_is_local = same_machine(inp.host, client, connection_of)
        me = str(task_vars.get("inventory_hostname", "localhost"))
        controller = self._host_input(me, hostvars, {}, task_vars)
        report = pf.run_preflight(inputs, options, inventory_hosts, controller=controller)
        root_problem = results_root_problem(args["results_root"]) if args.get(
            "results_root") else None

        # Checks on this task's own host (the controller: the embedded default's bench client)
        # run now, so that they are reported with the rest; the others wait for bench.yml's
        # delegated task, which runs only once everything here passed.
        problems = list(report.problems)
        if root_problem:
            problems.append(pf.Problem("bench_results_root", root_problem,
                                       controller.origins.get("bench_results_root", ""), (me,)))
        remaining, inline = [], 0
        for check in report.target_checks:
            if check.host == me:
                inline += check.count()
                problems += self._on_host(me, check.as_dict(), task_vars)
            else:
                remaining.append(check)
        if problems:
            return self._fail(result, problems)
        later = sum(check.count() for check in remaining)
        result.update(
            problems=[], target_checks=[check.as_dict() for check in remaining],
            msg="bench preflight: %d host(s), %d profile(s) checked on the controller, %d on %s%s"
                % (len(inputs), report.profiles, inline, me,
                   "; %d check(s) follow on %s" % (later, ", ".join(c.host for c in remaining))
                   if remaining else ""))
        return result
