# -*- coding: utf-8 -*-
"""tune (action, controller): playbooks/tune.yml's steps - check the tune, open its state,
propose the next trial, record a trial.

Thin over plugins/plugin_utils/tune/ (settings.py, state.py, rounds.py, results.py); the
documentation and argument spec are plugins/modules/tune.py. O(state=checked) gathers the GPU
server's tune_* and bench_* variables as the roles will see them, the way bench_preflight does
(its ActionModule's _host_input), over both roles' defaults.
"""
from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail

from ansible_collections.servelab.serving.plugins.action.bench_preflight import (
    ActionModule as PreflightAction,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import PARTS_DIR
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import read_parts
from ansible_collections.servelab.serving.plugins.modules.tune import ARGUMENT_SPEC
from ansible_collections.servelab.serving.plugins.plugin_utils import preflight as pf
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import (
    ManifestError, read_manifest,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.origin import value_origin
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import rounds
from ansible_collections.servelab.serving.plugins.plugin_utils.tune import state as st
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.results import write_results
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.search_plan import (
    read_outcome,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.settings import (
    TUNE_DEFAULTS_FILE, check_tune,
)


def trial_summary(trial: st.Trial) -> dict:
    return {"name": trial.name, "flags": trial.flags, "key": trial.key, "status": trial.status,
            "score": trial.score, "score_ci95": trial.score_ci95, "reason": trial.reason,
            "why": trial.why, "prediction": trial.prediction}


def rows_by_profile(run_dir: str) -> dict:
    out: dict = {}
    for row, _path in read_parts(os.path.join(run_dir, PARTS_DIR)):
        out.setdefault(str(row.get("profile")), []).append(row)
    return out


class ActionModule(PreflightAction):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(PreflightAction, self).run(tmp, task_vars)   # ActionBase.run
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result["changed"] = False
        step = args["state"]
        if step == "checked":
            return self._checked(result, args, task_vars)
        for name in ("results_dir", "settings"):
            if not args.get(name):
                raise AnsibleActionFail("tune state=%s needs %s" % (step, name))
        try:
            if step == "opened":
                return self._opened(result, args)
            if step == "proposed":
                return self._proposed(result, args)
            return self._recorded(result, args)
        except st.StateError as exc:
            raise AnsibleActionFail("tune: %s" % exc) from None

    # -----------------------------------------------------------------------------------------
    def _checked(self, result, args, task_vars):
        hosts = [str(h) for h in args.get("hosts") or []]
        if len(hosts) != 1:
            return self._fail(result, [pf.Problem(
                "gpu_servers", "gpu_servers: a tune runs on one GPU server, the play has %d (%s); "
                               "limit it to one (--limit <host>)" % (len(hosts), ", ".join(hosts)))])
        hostvars = task_vars.get("hostvars")
        if hostvars is None or not hasattr(hostvars, "raw_get"):
            raise AnsibleActionFail("tune: needs ansible-core's hostvars (run it as a task)")
        host = hosts[0]
        defaults = dict(self._load(pf.ROLE_DEFAULTS_FILE, templates=True) or {})
        defaults.update(self._load(TUNE_DEFAULTS_FILE, templates=True) or {})
        raw = dict(hostvars.raw_get(host))
        names = sorted({k for k in list(defaults) + list(raw)
                        if str(k).startswith(("tune_", "bench_"))})
        inp = self._host_input(host, hostvars, defaults, task_vars, names=names)
        given = tuple(sorted(k for k in raw if str(k).startswith("tune_")))
        origins = dict(inp.origins)
        origins.update({k: value_origin(raw[k]) for k in given if value_origin(raw[k])})
        problems = [pf.Problem(k, "%s: cannot be evaluated (%s); %s" % (k, e, pf.FIX),
                               origins.get(k, ""), (host,))
                    for k, e in sorted(inp.errors.items()) if k.startswith("tune_")]
        check = check_tune(inp.values, given, origins, host)
        problems += check.problems
        if problems:
            return self._fail(result, problems, host)
        targets = []
        if check.help_checks:
            targets.append({"host": host, "workloads": [], "servers": [], "executables": [],
                            "ports": [], "help_flags": check.help_checks})
        result.update(
            settings=check.settings, probe_profiles=check.probes, target_checks=targets,
            refused=check.refused, candidates=len(check.candidates),
            msg="tune preflight on %s: %d candidate(s) of %d combinations%s; engine %s, %s"
                % (host, len(check.candidates), len(check.candidates) + len(check.refused),
                   " (%d refused by the engine's rules)" % len(check.refused)
                   if check.refused else "", check.settings["engine"],
                   check.settings["objective"]))
        return result

    def _opened(self, result, args):
        state = st.open_state(args["results_dir"], args["settings"], args["resume"])
        result.update(trials=[trial_summary(t) for t in state.trials],
                      msg="tune state %s: %d trial(s) kept%s" % (
                          st.state_path(args["results_dir"]), len(state.trials),
                          "" if state.running() is None else
                          "; %s was in flight and runs again" % state.running().name))
        return result

    def _proposed(self, result, args):
        run_dir, settings = args["results_dir"], args["settings"]
        chosen = {}

        def change(state):
            trial, why = rounds.next_trial(state, settings)
            chosen.update(trial=trial, why=why)
            if trial is None:
                state.done = why
            elif state.trial(trial.name) is None:
                state.trials.append(trial)
        state = st.update(run_dir, change)
        trial = chosen["trial"]
        result.update(done=trial is None, reason=chosen["why"],
                      trials=[trial_summary(t) for t in state.trials])
        if trial is None:
            result["msg"] = "tune: no further trial: %s" % chosen["why"]
            result["trial"] = {}
            return result
        result["trial"] = {"name": trial.name, "flags": trial.flags, "key": trial.key,
                           "profile": trial.profile, "search": trial.search,
                           "prediction": trial.prediction, "why": trial.why}
        pred = trial.prediction or {}
        result["msg"] = "tune: trial %s (%s): %s%s" % (
            trial.name, trial.key, chosen["why"],
            "; predicted %.4g +-%.0f%%" % (pred["score"], 100 * pred.get("sd", 0))
            if pred.get("score") else "")
        return result

    def _recorded(self, result, args):
        run_dir, name = args["results_dir"], args.get("trial")
        host = args.get("host") or args["settings"].get("host")
        if not name:
            raise AnsibleActionFail("tune state=recorded needs trial")
        try:
            manifest = read_manifest(run_dir)
        except ManifestError as exc:
            raise AnsibleActionFail("tune: %s" % exc) from None
        record_ = ((manifest.get("profiles") or {}).get(name) or {}).get(host) or {}
        outcome = read_outcome(run_dir, host, name)
        by_profile = rows_by_profile(run_dir)
        recorded = {}

        def change(state):
            trial = state.trial(name)
            if trial is None:
                raise st.StateError("no trial %s in the tune's state" % name)
            rounds.record(trial, record_, outcome, by_profile.get(name, []))
            recorded["trial"] = trial
        state = st.update(run_dir, change)
        written = write_results(run_dir, state, by_profile)
        trial = recorded["trial"]
        best = state.best()
        result.update(trial=trial_summary(trial), trials=[trial_summary(t) for t in state.trials],
                      files=written.files, changed=True,
                      best=trial_summary(best) if best else {},
                      msg="tune: trial %s %s%s%s; best so far: %s" % (
                          trial.name, trial.status,
                          " %.4g" % trial.score if trial.score is not None else "",
                          " (%s)" % trial.reason if trial.reason else "",
                          "%s %.4g" % (best.name, best.score) if best else "none"))
        return result
