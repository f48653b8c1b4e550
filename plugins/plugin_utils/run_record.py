"""A run's life on the controller (docs/architecture.md, "The run lifecycle"): open it (a new run
id, or `bench_resume` of an earlier one; a run id that already holds measured levels is never
reused silently), hold its run id (one ansible-playbook per run id), note the level in flight on
each host, and close it (finished, interrupted or aborted), saying which profiles failed.

Controller only, standard library only. The manifest is written through manifest.py (its lock);
the run-id lock is module_utils/run/lock.py's record under <results_root>/.locks/.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    MANIFEST, PARTS_DIR, atomic_write_json,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    PartError, part_stem, read_parts,
)
from ansible_collections.servelab.serving.plugins.module_utils.run import lock
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import (
    ManifestError, merge_into_manifest, read_manifest,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.run_locks import judge, ours

IN_FLIGHT_DIR = "in_flight"      # <run_dir>/in_flight/<host>.json while a level runs there
# The manifest's word on what llm_bench does with a level that already has a complete part file
# (the run was resumed): keep it, or measure it again. Without it (a run not opened by
# bench.yml) such a level is refused: a finished level is never silently overwritten.
FINISHED_LEVELS_KEY = "finished_levels"
KEEP, REMEASURE = "keep", "remeasure"
STATUSES = ("finished", "interrupted", "aborted")
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")


class RunError(Exception):
    """The run cannot be opened or closed as asked; the message names the variable and the fix."""


@dataclass
class OpenedRun:
    run_id: str
    run_dir: str
    resumed: bool
    finished_levels: str                        # keep | remeasure
    measured_levels: int                        # complete part files already there
    measured: Dict[str, Dict[str, List[int]]]   # host -> profile -> concurrencies measured
    started_at: Optional[str]                   # the earlier run's, when resuming
    previous_status: Optional[str]
    resumed_at: List[str] = field(default_factory=list)
    lock_path: str = ""
    notes: List[str] = field(default_factory=list)     # stale run-id lock taken over, ...


@dataclass
class ClosedRun:
    run_id: str
    run_dir: str
    status: str
    manifest_written: bool
    level_in_flight: List[dict]
    failed_profiles: List[dict]
    measured_levels: int
    released: List[str] = field(default_factory=list)


def run_lock_dir(results_root: str) -> str:
    return os.path.join(results_root, lock.RUN_LOCK_DIR)


def _measured(run_dir: str) -> Dict[str, Dict[str, List[int]]]:
    out: Dict[str, Dict[str, List[int]]] = {}
    try:
        parts = read_parts(os.path.join(run_dir, PARTS_DIR))
    except PartError as exc:
        raise RunError(str(exc)) from None
    for row, _jsonl in parts:
        levels = out.setdefault(str(row.get("host")), {}).setdefault(str(row.get("profile")), [])
        levels.append(int(row.get("concurrency") or 0))
    for profiles in out.values():
        for name in profiles:
            profiles[name] = sorted(set(profiles[name]))
    return out


def _count(measured: Dict[str, Dict[str, List[int]]]) -> int:
    return sum(len(levels) for profiles in measured.values() for levels in profiles.values())


def _newest_runs(results_root: str, limit: int = 5) -> List[str]:
    try:
        names = [n for n in os.listdir(results_root)
                 if not n.startswith(".") and os.path.isfile(os.path.join(results_root, n, MANIFEST))
                 and not os.path.islink(os.path.join(results_root, n))]
    except OSError:
        return []
    return sorted(names)[-limit:]


def open_run(results_root: str, run_id: str, controller: lock.Controller, *,
             resume: Optional[str] = None, remeasure: bool = False, break_lock: bool = False,
             now: str = "", check_mode: bool = False) -> OpenedRun:
    """Check the run id against what is on disk and take the run-id lock. Nothing is written to
    the run directory: a run refused here (or by a host's lock after this) leaves no trace but
    the run-id record, which closing it removes."""
    if not run_id or not RUN_ID_RE.match(run_id) or run_id == "latest":
        raise RunError("bench_run_id %r must be a plain directory name (letters, digits, . _ : + -,"
                       " not starting with '.', not 'latest')" % run_id)
    run_dir = os.path.join(results_root, run_id)
    if resume and resume != run_id:
        raise RunError("bench_resume=%s but bench_run_id=%s: bench_resume names the run to "
                       "continue; leave bench_run_id out" % (resume, run_id))
    manifest = {}
    if os.path.isfile(os.path.join(run_dir, MANIFEST)):
        try:
            manifest = read_manifest(run_dir)
        except ManifestError as exc:
            raise RunError(str(exc)) from None
    measured = _measured(run_dir)
    count = _count(measured)
    if resume and not manifest:
        newest = _newest_runs(results_root)
        raise RunError("bench_resume=%s: there is no run %s under %s (newest runs there: %s)"
                       % (resume, resume, results_root, ", ".join(newest) or "none"))
    if remeasure and not resume:
        raise RunError("bench_remeasure=true re-measures the finished levels of a resumed run; "
                       "give the run with -e bench_resume=<run_id>")
    if count and not resume:
        raise RunError(
            "run id %s already has %d measured level(s) in %s. Continue that run with "
            "-e bench_resume=%s (its finished levels are kept), or leave bench_run_id out for a "
            "new run; -e bench_resume=%s -e bench_remeasure=true measures them again"
            % (run_id, count, run_dir, run_id, run_id))
    opened = OpenedRun(
        run_id=run_id, run_dir=run_dir, resumed=bool(resume),
        finished_levels=REMEASURE if remeasure else KEEP, measured_levels=count,
        measured=measured, started_at=manifest.get("started_at") if resume else None,
        previous_status=manifest.get("status") if manifest else None,
        resumed_at=list(manifest.get("resumed_at") or []) + ([now] if resume and now else []))
    lock_dir = run_lock_dir(results_root)
    resource = lock.run_resource(lock_dir, run_id)
    outcome = lock.acquire(lock_dir, [resource], run_id, controller, check_mode=check_mode)
    if outcome.conflicts:
        decision = judge(((c.resource, c.holder) for c in outcome.conflicts), controller,
                         break_lock, "this controller")
        if decision.refusals:
            raise RunError("; ".join(decision.refusals))
        outcome = lock.acquire(lock_dir, [resource], run_id, controller,
                               take_over=decision.take_over, check_mode=check_mode)
        if outcome.conflicts:
            raise RunError("run id %s was taken meanwhile by %s" % (
                run_id, outcome.conflicts[0].holder.describe()))
        opened.notes += decision.warnings
    opened.lock_path = resource[1]
    return opened


# ---------------------------------------------------------------------------------------------
# The level in flight (llm_bench's action writes it before a level and removes it after)


def _in_flight_path(run_dir: str, host: str) -> str:
    return os.path.join(run_dir, IN_FLIGHT_DIR, re.sub(r"[^A-Za-z0-9._-]+", "_", host) + ".json")


def mark_in_flight(run_dir: str, host: str, profile: str, level: str, concurrency: int,
                   started_at: str, repeat: int = 1) -> str:
    """Note the measurement about to start on `host` (`level`: its label, with the repeat when
    the level is measured more than once); an interrupt loses that one only."""
    path = _in_flight_path(run_dir, host)
    atomic_write_json(path, {"host": host, "profile": profile, "level": level,
                             "concurrency": concurrency, "repeat": repeat,
                             "started_at": started_at})
    return path


def clear_in_flight(run_dir: str, host: str) -> None:
    path = _in_flight_path(run_dir, host)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    with contextlib.suppress(OSError):     # another host's level may still be in flight
        os.rmdir(os.path.dirname(path))


def levels_in_flight(run_dir: str) -> List[dict]:
    directory = os.path.join(run_dir, IN_FLIGHT_DIR)
    out = []
    if not os.path.isdir(directory):
        return out
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            with open(os.path.join(directory, name), encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def finished_levels_policy(run_dir: str) -> Optional[str]:
    """keep | remeasure as the run's manifest says; None for a run not opened by bench.yml."""
    try:
        value = read_manifest(run_dir).get(FINISHED_LEVELS_KEY)
    except ManifestError:
        return None
    return value if value in (KEEP, REMEASURE) else None


def measured_part(parts_dir: str, row_key: dict) -> Optional[str]:
    """The complete part file of (host, profile, level, repeat) if there is one (`row_key`: the
    row fields part_stem names it by; no `repeat`: repeat 1). A .json part exists only
    once its requests file is written (parts.write_level_files), so it means a complete level."""
    path = os.path.join(parts_dir, part_stem(row_key) + ".json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            json.load(fh)["level"]
    except (OSError, ValueError, KeyError, TypeError):
        return None        # torn or foreign: not a finished level, measure it
    return path


# ---------------------------------------------------------------------------------------------
# Close


def failed_profiles(manifest: dict) -> List[dict]:
    """Profiles that did not finish on a host: failed (with the error), or planned for the host
    and never finished (the host died, the run was cut short)."""
    out = []
    profiles = manifest.get("profiles") or {}
    planned = {host: list((data.get("bench") or {}).get("profiles") or [])
               for host, data in (manifest.get("hosts") or {}).items()}
    pairs = {(p, h) for p, hosts in profiles.items() for h in (hosts or {})}
    pairs |= {(p, h) for h, names in planned.items() for p in names}
    for profile, host in sorted(pairs):
        record = (profiles.get(profile) or {}).get(host) or {}
        status = record.get("status")
        if status == "finished":
            continue
        error = record.get("error") or ("never started" if not status else
                                        "did not finish (status %s)" % status)
        out.append({"profile": profile, "host": host, "status": status or "missing",
                    "error": error, "failed_task": record.get("failed_task") or ""})
    # A GPU server of the run that recorded nothing (it failed or went unreachable before its
    # first profile, e.g. gathering its GPU facts): named too, or only Ansible's recap would.
    seen = set(planned) | {h for _p, h in pairs}
    listed = manifest.get("gpu_servers") if isinstance(manifest.get("gpu_servers"), list) else []
    for host in sorted({str(h) for h in listed} - seen):
        out.append({"profile": "*", "host": host, "status": "missing",
                    "error": "no profile started: the host failed or was unreachable before "
                             "its first profile (the play's output names the task)",
                    "failed_task": ""})
    return out


def close_run(results_root: str, run_id: str, controller: lock.Controller, status: str, *,
              now: str, reason: str = "", check_mode: bool = False,
              resume_command: str = "") -> ClosedRun:
    if status not in STATUSES:
        raise RunError("status must be one of %s, got %r" % (", ".join(STATUSES), status))
    run_dir = os.path.join(results_root, run_id)
    in_flight = levels_in_flight(run_dir)
    manifest_exists = os.path.isfile(os.path.join(run_dir, MANIFEST))
    manifest: dict = {}
    if manifest_exists:
        merge = {"status": status, status + "_at": now}
        if status != "finished":
            merge.update(level_in_flight=in_flight, interrupt_reason=reason or status,
                         resume_command=resume_command or None)
        else:
            # bench.yml records finished_at before the report, which states it: keep that one.
            # A resumed run that finishes has no level in flight any more (interrupted_at and
            # resumed_at stay, as its history).
            try:
                earlier = read_manifest(run_dir).get("finished_at")
            except ManifestError:
                earlier = None      # the merge below reports an unreadable manifest
            if earlier:
                merge["finished_at"] = earlier
            merge.update(level_in_flight=[], interrupt_reason=None, resume_command=None)
        try:
            manifest = merge_into_manifest(run_dir, merge, check_mode=check_mode).manifest
        except ManifestError as exc:
            raise RunError(str(exc)) from None
    if not check_mode:
        for record in in_flight:
            clear_in_flight(run_dir, str(record.get("host")))
    lock_dir = run_lock_dir(results_root)
    _name, path = lock.run_resource(lock_dir, run_id)
    released = []
    holder = lock.read_record(path) if os.path.isdir(lock_dir) else None
    if holder is not None and ours(holder, run_id, controller):
        released = lock.release(lock_dir, [(path, holder.token)], check_mode=check_mode)
    return ClosedRun(run_id=run_id, run_dir=run_dir, status=status,
                     manifest_written=manifest_exists, level_in_flight=in_flight,
                     failed_profiles=failed_profiles(manifest) if manifest_exists else [],
                     measured_levels=_count(_measured(run_dir)), released=released)
