# -*- coding: utf-8 -*-
"""bench_lock (action, controller): the run's locks on the task's host.

The module (plugins/modules/bench_lock.py, on the host) reads and writes the records; this side
knows who the run is (ansible-playbook's main process), judges whether a holder still lives
(plugins/plugin_utils/run_locks.py: its pid means something only here), takes over stale
records, refuses live ones with the holder's name, and computes the servers a reap must spare.
"""
from __future__ import annotations

import dataclasses

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.servelab.serving.plugins.module_utils.run.lock import LockError, LockRecord
from ansible_collections.servelab.serving.plugins.modules.bench_lock import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils.run_locks import (
    describe_resource, judge, ours, protect_pids, this_controller,
)

display = Display()
MODULE = "servelab.serving.bench_lock"
USER_OPTIONS = ("run_id", "state", "state_dir", "port", "extra_ports", "lock_dir", "break_lock",
                "owner_pid")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _call(self, task_vars, base, **extra):
        res = self._execute_module(module_name=MODULE, module_args=dict(base, **extra),
                                   task_vars=task_vars)
        if res.get("failed"):
            raise AnsibleActionFail(res.get("msg") or "bench_lock failed on the host",
                                    result=res)
        return res

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        for internal in ("controller", "take_over", "release", "inventory_host"):
            if self._task.args.get(internal):
                raise AnsibleActionFail("bench_lock: %s is filled in by the action plugin; leave "
                                        "it out of the task" % internal)
        me = this_controller(args.get("owner_pid"))
        # The inventory host the locks are for: one run holds locks for each of its GPU servers,
        # and two of them may share a machine (their records must stay apart).
        host = str(self._task.delegate_to or task_vars.get("inventory_hostname") or "the host")
        base = {k: args[k] for k in ("run_id", "state_dir", "port", "extra_ports", "lock_dir")
                if args.get(k) is not None}
        base["inventory_host"] = host
        run_id, state = args["run_id"], args["state"]
        result.update(run_id=run_id, state=state, controller=dataclasses.asdict(me),
                      changed=False, warnings=[])

        if state == "acquired":
            if not (args.get("state_dir") or args.get("port") is not None):
                raise AnsibleActionFail("bench_lock: state=acquired needs state_dir or port (what "
                                        "to hold), e.g. state_dir: \"{{ bench_state_dir }}\"")
            controller = dataclasses.asdict(me)
            res = self._call(task_vars, base, state="acquired", controller=controller)
            if res.get("conflicts"):
                decision = judge(((c["resource"], self._record(c["holder"], c["path"]))
                                  for c in res["conflicts"]), me, args["break_lock"], host)
                if decision.refusals:
                    raise AnsibleActionFail("bench_lock: run %s refused: %s" % (
                        run_id, "; ".join(decision.refusals)),
                        result=dict(conflicts=res["conflicts"]))
                res = self._call(task_vars, base, state="acquired", controller=controller,
                                 take_over=decision.take_over)
                if res.get("conflicts"):
                    holders = ["%s by %s" % (describe_resource(c["resource"], host),
                                             self._record(c["holder"], c["path"]).describe())
                               for c in res["conflicts"]]
                    raise AnsibleActionFail("bench_lock: run %s refused: taken meanwhile: %s"
                                            % (run_id, "; ".join(holders)))
                for note in decision.warnings:
                    display.warning("bench_lock: %s" % note)
                    result["warnings"].append(note)
            result.update(changed=bool(res.get("changed")), acquired=res.get("acquired") or [],
                          taken_over=res.get("taken_over") or [], held=True,
                          lock_dir=res.get("lock_dir"))
            self._describe_mine(result, res, run_id, me)
            return result

        would_hold = False
        res = self._call(task_vars, base, state="held")
        records = [self._record(r, r.get("path", "")) for r in res.get("records") or []]
        mine = [r for r in records if ours(r, run_id, me, host)]
        if state == "held" and (args.get("state_dir") or args.get("port") is not None):
            # The role checks before each reap: a run whose lock was broken must not touch the
            # state directory or port again (the servers there are the other run's now).
            for resource in res.get("resources") or []:
                holder = next((r for r in records if r.resource == resource), None)
                if holder is None and self._task.check_mode:
                    # --check took no lock (it writes nothing); a free resource is one the
                    # run would hold.
                    would_hold = True
                    continue
                if holder is None or not ours(holder, run_id, me, host):
                    by = holder.describe() if holder else "nobody (it was released)"
                    raise AnsibleActionFail(
                        "bench_lock: run %s no longer holds %s: it is held by %s. This run stops "
                        "here without touching that state directory or port again"
                        % (run_id, describe_resource(resource, host), by))
        if state == "released":
            pairs = [{"path": r.path, "token": r.token} for r in mine]
            rel = self._call(task_vars, base, state="released", release=pairs)
            result.update(changed=bool(rel.get("changed")), released=rel.get("released") or [])
            res = rel
        result.update(held=(bool(mine) or would_hold) and state != "released",
                      lock_dir=res.get("lock_dir"))
        self._describe_mine(result, res, run_id, me, records=mine if state != "released" else [])
        result["protect_pids"] = protect_pids(
            [self._record(r, r.get("path", "")) for r in res.get("records") or []],
            res.get("servers") or [], run_id, me, result["state_dirs"], host)
        return result

    @staticmethod
    def _record(data, path):
        try:
            return LockRecord.from_dict(data, path=path)
        except LockError as exc:
            raise AnsibleActionFail("bench_lock: %s" % exc) from None

    def _describe_mine(self, result, res, run_id, me, records=None):
        if records is None:
            records = [self._record(r, r.get("path", "")) for r in res.get("acquired") or []]
        state_dirs = sorted({r.state_dir for r in records if r.state_dir})
        result["state_dirs"] = state_dirs
        result["ports"] = sorted({r.port for r in records if r.port is not None})
        # The servers recorded as running (or still alive) in the run's own state directories:
        # what the interrupt cleanup stops.
        result["servers"] = [
            {"name": s["name"], "state_dir": entry["state_dir"]}
            for entry in res.get("servers") or [] if entry.get("state_dir") in state_dirs
            for s in entry.get("servers") or [] if s.get("alive") or s.get("status") == "running"]
        result.setdefault("protect_pids", [])
