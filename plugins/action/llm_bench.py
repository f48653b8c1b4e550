# -*- coding: utf-8 -*-
"""llm_bench (action, controller): run the sweep level by level through the llm_bench module.

For each level (each of its `repeats`, in rounds: plugin_utils/sweep_plan.py) it calls the
module on the task's host (the bench client, usually through `delegate_to`), prints a progress
line, writes the measurement's part files under the controller's results/<run_id>/parts/
atomically and rebuilds levels.csv and requests.jsonl under the run's lock (levels.parquet and
requests.parquet too, where pandas and pyarrow are installed: plugin_utils/run_exports.py). A
finished level (or repeat) is never lost: not to Ctrl-C, not to a server that dies mid-sweep. A level whose
requests all failed is recorded (with its errors) and ends the sweep for this profile: the task
fails with the reason. The documentation is plugins/modules/llm_bench.py.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    BenchOptionsError, level_configs,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import level_verdict
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import level_line
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import (
    ACTION_ARGUMENT_SPEC, ACTION_ONLY_OPTIONS,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    rebuild_run_files, write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.controller_watch import ControllerWatch
from ansible_collections.servelab.serving.plugins.plugin_utils.live_watch import live_watch
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import (
    ManifestError, read_manifest, run_lock,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.progress import (
    estimate_eta, guess_level_seconds, level_walls_from_parts, progress_line, run_started,
    server_start_seconds, sweep_stem,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import PARTS_DIR
from ansible_collections.servelab.serving.plugins.module_utils.run.lock import utc_now
from ansible_collections.servelab.serving.plugins.plugin_utils.run_exports import (
    ParquetOutcome, write_parquet_exports,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.run_record import (
    KEEP, REMEASURE, clear_in_flight, finished_levels_policy, mark_in_flight, measured_part,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.sweep_plan import (
    RepeatsError, check_repeats, part_key, sweep_order,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.search_plan import (
    FixedPlan, SearchPlan, SearchPlanError,
)

display = Display()
EXTERNAL_ENGINE = "external"    # the engine of an endpoint servelab did not start (bench role)


# A dict of llm_bench options under the task's own (the bench role's lookup llm_bench_args):
# the action's alone, merged before validation, so the module never sees it.
SETTINGS = "settings"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True

    def _results_dir(self, args: dict, task_vars: dict) -> str:
        root = args.get("results_root")
        base = task_vars.get("playbook_dir") or self._loader.get_basedir()
        if not root:
            root = os.path.join(base, "results")
        elif not os.path.isabs(os.path.expanduser(root)):
            root = os.path.join(base, root)
        return os.path.normpath(os.path.join(os.path.expanduser(root), args["run_id"]))

    def _merge_settings(self) -> None:
        """`settings` (a dict of options: the bench role passes lookup llm_bench_args) under the
        task's own options, which win; then validated like options given one by one."""
        args = dict(self._task.args)
        settings = args.pop(SETTINGS, None)
        if settings is None:
            return
        if not isinstance(settings, Mapping):
            raise AnsibleActionFail("llm_bench: settings must be a dict of llm_bench options, "
                                    "got %s" % type(settings).__name__)
        self._task.args = dict(settings, **args)

    def run(self, tmp=None, task_vars=None):
        self._live = None
        try:
            return self._run(tmp, task_vars)
        finally:
            if self._live is not None:
                self._live.close()

    def _run(self, tmp, task_vars):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        self._merge_settings()
        # The module's own argument spec (plus the action's options): unknown options, wrong
        # types and missing required ones fail here, on the controller, before any level runs.
        _validation, validated = self.validate_argument_spec(argument_spec=ACTION_ARGUMENT_SPEC)
        args = {k: v for k, v in validated.items() if v is not None}
        if not args.get("run_id"):
            args["run_id"] = time.strftime("%Y%m%dT%H%M%S")
        if "/" in str(args["run_id"]) or str(args["run_id"]).startswith("."):
            raise AnsibleActionFail("llm_bench: run_id %r must be a plain directory name (no '/', "
                                    "not starting with '.')" % args["run_id"])
        stop_on_failure = args["stop_on_failure"]
        if "host_label" not in self._task.args:
            # Rows are labelled with the server's inventory name, not the spec's generic default.
            args["host_label"] = task_vars.get("inventory_hostname", "localhost")
        module_args = {k: v for k, v in args.items() if k not in ACTION_ONLY_OPTIONS}
        # Every option is checked here, before the first level sends anything; a workload file
        # is read and checked where it is, on the bench client, by the module's first call.
        search = args.get("capacity_search")
        try:
            if search:
                plan = SearchPlan.build(search, module_args, args.get("repeats", 1))
                module_args = plan.module_args
            configs, _workload = level_configs(module_args, read_workload=False)
            repeats = check_repeats(args.get("repeats", 1))
        except (BenchOptionsError, SearchPlanError) as exc:
            raise AnsibleActionFail("llm_bench: %s" % exc) from None
        except RepeatsError as exc:
            raise AnsibleActionFail("llm_bench: %s" % exc) from None
        run_dir = self._results_dir(args, task_vars)
        parts_dir = os.path.join(run_dir, PARTS_DIR)
        if module_args.get("ignore_eos") is None and self._external(run_dir, args):
            # ignore_eos is not an OpenAI field: an endpoint servelab did not start gets it only
            # when asked (bench_ignore_eos: true); a strict server refuses it (HTTP 422).
            module_args["ignore_eos"] = False
            display.display("llm_bench %s/%s: an external endpoint: no request asks for "
                            "ignore_eos (set bench_ignore_eos: true to send it)"
                            % (args["host_label"], args.get("profile", "default")))
        if self._task.check_mode:
            module_args["concurrency"] = module_args["concurrency"][:1]
            checked = self._execute_module(module_name="servelab.serving.llm_bench", module_args=module_args,
                                           task_vars=task_vars)
            result.update(checked)
            result.update(changed=False, levels=[], results_dir=run_dir)
            return result

        levels, warnings = [], []
        rate_mode = module_args.get("load_mode") == "rate"
        if not search:
            # Every level `repeats` times, in rounds (plugin_utils/sweep_plan.py says why).
            plan = FixedPlan(sweep_order(configs, repeats, rate_mode))
        result.update(changed=False, levels=levels, results_dir=run_dir, warnings_text=warnings)
        # The Parquet files this task wrote (run_exports.py), on every way out of the sweep.
        result["exports"] = exports = []
        # What to do with a level that already has a complete part file: the run's manifest
        # says (bench.yml's bench_run writes it: keep on bench_resume, remeasure with
        # bench_remeasure); a run without that word never has a finished level overwritten.
        # Each repeat is its own part file, so a resume keeps the finished repeats.
        policy = finished_levels_policy(run_dir)
        result["kept_levels"] = kept = []
        watch = ControllerWatch()
        # A line of figures during each level, where the module runs here (live_watch.py);
        # its directory is removed by run().
        live = self._live = live_watch(self._connection, display.display)
        sweep_started, own_walls = time.time(), []   # for the progress line only
        for step in plan:
            # One measurement per module call: each but the sweep's last drains the server after
            # it (a capacity search does not know its last: it drains after each). Repeat r
            # sends with seed + r - 1: its own prompt order and arrivals.
            level_args = dict(module_args, drain_after=plan.drains_after(step),
                              repeat=step.repeat, **step.step)
            level_args["seed"] = int(module_args.get("seed", 1)) + step.repeat - 1
            label = step.where
            where = "%s/%s %s" % (args["host_label"], args.get("profile", "default"), label)
            earlier = self._finished_level(parts_dir, args, step, rate_mode)
            if earlier is not None:
                path, row = earlier
                verdict = level_verdict(row)
                if policy is None:
                    result.update(failed=True, msg=(
                        "llm_bench %s is already measured in run %s (%s); a finished level is "
                        "never overwritten silently: give a new run_id, or continue the run "
                        "with bench.yml -e bench_resume=%s (add -e bench_remeasure=true to "
                        "measure its finished levels again)" % (where, args["run_id"], path,
                                                                args["run_id"])))
                    return result
                if policy == KEEP and not verdict.failed:
                    display.display("llm_bench %s: measured earlier in this run, kept (%s)"
                                    % (where, os.path.relpath(path, run_dir)))
                    levels.append(row)
                    kept.append(label)
                    plan.record(step, [row])
                    continue
                display.display("llm_bench %s: measured earlier%s, measuring it again%s" % (
                    where, " but failed (%s)" % verdict.reason if verdict.failed else "",
                    " (remeasure)" if policy == REMEASURE else ""))
            display.display("llm_bench %s: %s" % (args["host_label"], self._progress_line(
                run_dir, parts_dir, args, step, plan.level_count(len(configs)), plan.count,
                own_walls, sweep_started)))
            if plan.why(step):
                display.display("llm_bench %s: %s" % (where, plan.why(step)))
            level_started = time.monotonic()
            display.display("llm_bench %s/%s %s: running (window %ss) on %s" % (
                args["host_label"], args.get("profile", "default"), label,
                level_args.get("level_seconds", 30), task_vars.get("inventory_hostname")))
            # Named before it runs, so an interrupted run can say which level it lost; a worker
            # ended by the interrupt never gets to remove it.
            mark_in_flight(run_dir, args["host_label"], args.get("profile", "default"), label,
                           step.cfg.concurrency, utc_now(), repeat=step.repeat)
            try:
                # After a SIGKILL of ansible-playbook this worker lives on: it must not wait for
                # the level and write it as complete (plugin_utils/controller_watch.py).
                if live is not None:
                    level_args["progress_file"] = live.path
                with watch.exit_when_gone("llm_bench %s" % where), (
                        live.watching("llm_bench " + where) if live is not None
                        else contextlib.nullcontext()):
                    res = self._execute_module(module_name="servelab.serving.llm_bench",
                                               module_args=level_args, task_vars=task_vars)
                rows = res.get("levels") or []
                for row in rows:
                    exported = self._record_level(run_dir, parts_dir, row,
                                                  res.get("requests") or [],
                                                  res.get("warnings_text") or [])
                    exports.extend(rel for rel in exported.written if rel not in exports)
                    if exported.note and exported.note not in warnings:   # said once a task
                        warnings.append(exported.note)
                        display.warning("llm_bench: %s" % exported.note)
            finally:
                clear_in_flight(run_dir, args["host_label"])
            own_walls.append(time.monotonic() - level_started)
            plan.record(step, rows)
            for row in rows:
                levels.append(row)
                result["changed"] = True
                display.display("llm_bench " + level_line(row, repeats))
            for note in res.get("warnings_text") or []:
                warnings.append(note)
                display.warning("llm_bench: %s" % note)
            failure = None
            if res.get("failed"):
                failure = res.get("msg") or "module failed"
                stderr = (res.get("module_stderr") or "").strip()
                if stderr:
                    failure += " (module stderr: %s)" % stderr[-800:]
            elif rows:
                verdict = level_verdict(rows[-1])   # the sweep's stop rule, the report's too
                if verdict.failed:
                    failure = "%s: %s" % (label, verdict.reason)
            if failure:
                msg = ("llm_bench %s/%s: %s. The sweep for this profile stopped; %d finished "
                       "level(s) are in %s" % (args["host_label"], args.get("profile", "default"),
                                               failure, len(levels), run_dir))
                if stop_on_failure or res.get("failed") or search:
                    self._search_outcome(plan, run_dir, args, result, failure)
                    result.update(failed=True, msg=msg)
                    return result
                warnings.append(msg)
        if self._search_outcome(plan, run_dir, args, result):
            return result
        result["msg"] = "%d level(s) written to %s" % (len(levels) - len(kept), run_dir) + (
            " (%d level(s) x %d repeats)" % (len(configs), repeats) if repeats > 1 else "") + (
            ", %d kept from earlier in the run (%s)" % (len(kept), ", ".join(kept)) if kept else "")
        return result

    @staticmethod
    def _search_outcome(plan, run_dir: str, args: dict, result: dict, failure: str = "") -> bool:
        """A capacity search's outcome: written to <run_dir>/capacity/<host>__<profile>.json
        (the tuner and the report read it) and returned as `capacity`, with the task's msg.
        False for a fixed sweep."""
        outcome = plan.outcome(failure)
        if outcome is None:
            return False
        path = plan.write_outcome(run_dir, args["host_label"], args.get("profile", "default"),
                                  outcome)
        result["capacity"] = outcome
        result["msg"] = "capacity search %s: %s (%d level(s); %s)" % (
            outcome["status"], outcome["reason"], outcome["levels"], path)
        display.display("llm_bench %s/%s: %s" % (args["host_label"],
                                                 args.get("profile", "default"), result["msg"]))
        return True

    @staticmethod
    def _external(run_dir: str, args: dict) -> bool:
        """Whether the run's manifest records this sweep's profile on this host as an external
        endpoint (roles/bench/tasks/external.yml writes it before the sweep)."""
        try:
            manifest = read_manifest(run_dir)
        except ManifestError:
            return False
        profiles = manifest.get("profiles")
        entry = profiles.get(args.get("profile", "default")) if isinstance(profiles, dict) else None
        record = entry.get(args["host_label"]) if isinstance(entry, dict) else None
        return isinstance(record, dict) and record.get("engine") == EXTERNAL_ENGINE

    @staticmethod
    def _progress_line(run_dir, parts_dir, args, step, level_count, measurements, own_walls,
                       sweep_started):
        """'profile 2/2 eagle3 · level 3/8 C=5 · repeat 2/3 · 01:42 elapsed · ETA 02:10'
        (plugin_utils/progress.py): elapsed since the run started (its manifest), else since
        this sweep did; the ETA from the wall time of the measurements made in this run so far
        (the other sweeps' part files, this sweep's own), times the measurements left (levels x
        repeats), plus the servers' start times the manifest recorded, per profile left. Never
        fails a sweep: a line it cannot make says so."""
        profile = args.get("profile", "default")
        profile_index, profile_count = args.get("profile_index"), args.get("profile_count")
        try:
            try:
                manifest = read_manifest(run_dir)
            except ManifestError:
                manifest = {}
            started = run_started(manifest)
            elapsed = time.time() - (started if started is not None else sweep_started)
            walls = level_walls_from_parts(parts_dir, since=started,
                                           skip=sweep_stem(args["host_label"], profile))
            eta = estimate_eta(
                walls + own_walls, step.position + 1, measurements, profile_index, profile_count,
                guess_s=guess_level_seconds(args.get("level_seconds", 30),
                                            args.get("warmup_requests", 0)),
                profile_overhead_s=server_start_seconds(manifest))
            return progress_line(step.level_index + 1, level_count, step.label, elapsed, eta,
                                 profile, profile_index, profile_count,
                                 repeat=step.repeat, repeats=step.repeats)
        except Exception as exc:  # noqa: BLE001 - a progress line never stops a sweep
            return "level %d/%d %s (no progress figures: %s)" % (step.level_index + 1,
                                                                 level_count, step.where, exc)

    @staticmethod
    def _finished_level(parts_dir, args, step, rate_mode):
        """(path, row) of this measurement's complete part file, if the run already has one."""
        key = part_key(args["host_label"], args.get("profile", "default"), step, rate_mode)
        path = measured_part(parts_dir, key)
        if path is None:
            return None
        with open(path, encoding="utf-8") as fh:
            return path, json.load(fh)["level"]

    def _record_level(self, run_dir, parts_dir, row, requests, notes) -> ParquetOutcome:
        """Part files first (atomic), then levels.csv/requests.jsonl and the Parquet exports
        (where pandas and pyarrow are installed) under the run's lock."""
        os.makedirs(parts_dir, exist_ok=True)
        write_level_files(parts_dir, row, requests, notes)
        try:
            with run_lock(run_dir):
                rebuild_run_files(run_dir)
                return write_parquet_exports(run_dir)
        except ManifestError as exc:
            raise AnsibleActionFail("llm_bench: level written to %s but levels.csv not rebuilt: "
                                    "%s" % (parts_dir, exc)) from None
