"""A tune's record of its trials: <run_dir>/tune/state.json, rewritten (atomically, under the
run's lock) when a trial starts and when it ends.

It is what makes a tune resumable. A resumed tune (`bench_resume=<run_id>`) keeps every finished
trial as recorded and runs the trial that was in flight again under its recorded name, profile
and search, so llm_bench keeps that trial's finished levels and its search replays them
(capacity.py); then the proposer goes on from all finished trials. The settings a tune's trials
were measured under (space, objective, workload, axis, base profile: `fingerprint`) must not
change across a resume: a tune whose settings changed is refused, naming the difference.

Controller only, standard library only.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    TUNE_DIR, atomic_write_text,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import run_lock

STATE_FILE = "state.json"
VERSION = 1
# Trial statuses: running (started, not recorded: in flight, or cut off), then one of these.
RUNNING = "running"
FINISHED = "finished"       # the trial has a score (its capacity bracketed, or a lower bound)
PRUNED = "pruned"           # stopped early: it could not beat the best so far
NO_SCORE = "no_score"       # it ended without a full-length level meeting the SLO
FAILED = "failed"           # the server did not start, died, or a level failed (with why)
ENDED = (FINISHED, PRUNED, NO_SCORE, FAILED)
# Settings whose change would mix trials measured under different rules.
FINGERPRINT_KEYS = ("engine", "space", "objective", "axis", "base_profile", "workload",
                    "max_tokens", "level_seconds", "short_level_seconds", "tolerance",
                    "load_min", "load_max", "concurrency_cap", "refused")


class StateError(ValueError):
    """The tune's state cannot be used (corrupt, or its settings changed); the message says
    what to do."""


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def fingerprint(settings: Mapping) -> str:
    picked = {k: settings.get(k) for k in FINGERPRINT_KEYS}
    blob = json.dumps(picked, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class Trial:
    name: str
    flags: Dict[str, Any]
    key: str
    profile: Dict[str, Any]
    search: Dict[str, Any]
    status: str = RUNNING
    why: str = ""                          # why the proposer chose it
    prediction: Dict[str, Any] = field(default_factory=dict)
    outcome: Dict[str, Any] = field(default_factory=dict)
    score: Optional[float] = None
    score_ci95: Optional[float] = None
    # The score is a lower bound: the search ended (max_levels, the maximum load) before a load
    # above it missed the SLO closely enough; the capacity is at least its load.
    lower_bound: bool = False
    reason: str = ""                       # how it ended, in words (failures: the error)
    started_at: str = ""
    started_unix: float = 0.0              # this attempt's start (time.time())
    finished_at: str = ""
    wall_s: float = 0.0                    # started -> recorded, summed over resumes
    attempts: int = 1
    levels: int = 0
    measured_s: float = 0.0                # the levels' windows, summed

    @classmethod
    def from_dict(cls, data: Mapping) -> Trial:
        known = set(cls.__dataclass_fields__)   # pylint: disable=no-member
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def ended(self) -> bool:
        return self.status in ENDED


@dataclass
class TuneState:
    settings: Dict[str, Any]
    trials: List[Trial] = field(default_factory=list)
    started_at: str = ""
    resumed_at: List[str] = field(default_factory=list)
    done: str = ""                         # why the tune stopped proposing ('' while it goes on)
    model: Dict[str, Any] = field(default_factory=dict)   # the last fit (model.py)
    version: int = VERSION

    # -- queries ------------------------------------------------------------------------------
    def trial(self, name: str) -> Optional[Trial]:
        for t in self.trials:
            if t.name == name:
                return t
        return None

    def running(self) -> Optional[Trial]:
        for t in self.trials:
            if t.status == RUNNING:
                return t
        return None

    def best(self) -> Optional[Trial]:
        scored = [t for t in self.trials if t.status == FINISHED and t.score is not None]
        return max(scored, key=lambda t: t.score) if scored else None

    def tried_names(self) -> set:
        return {t.name for t in self.trials}

    def tried_keys(self) -> set:
        return {t.key for t in self.trials}

    def wall_seconds(self) -> float:
        return sum(t.wall_s for t in self.trials)

    def next_name(self) -> str:
        return "t%02d" % (len(self.trials) + 1)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["fingerprint"] = fingerprint(self.settings)
        return out


def state_path(run_dir: str) -> str:
    return os.path.join(run_dir, TUNE_DIR, STATE_FILE)


def load(run_dir: str) -> Optional[TuneState]:
    path = state_path(run_dir)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise StateError("%s is not valid JSON (%s): restore it, or start a new tune (another "
                         "bench_run_id)" % (path, exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        raise StateError("%s is not a tune's state: start a new tune (another bench_run_id)"
                         % path)
    return TuneState(settings=data["settings"],
                     trials=[Trial.from_dict(t) for t in data.get("trials") or []],
                     started_at=data.get("started_at", ""),
                     resumed_at=list(data.get("resumed_at") or []),
                     done=data.get("done", ""), model=dict(data.get("model") or {}),
                     version=int(data.get("version", VERSION)))


def save(run_dir: str, state: TuneState) -> str:
    path = state_path(run_dir)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_text(path, json.dumps(state.as_dict(), indent=1, sort_keys=True, default=str)
                      + "\n")
    return path


def _differences(old: Mapping, new: Mapping) -> List[str]:
    return [k for k in FINGERPRINT_KEYS
            if json.dumps(old.get(k), sort_keys=True, default=str)
            != json.dumps(new.get(k), sort_keys=True, default=str)]


def open_state(run_dir: str, settings: Mapping, resuming: bool) -> TuneState:
    """The tune's state for this run: new, or the one on disk when resuming (its finished trials
    kept, the settings unchanged). Under the run's lock."""
    with run_lock(run_dir):
        state = load(run_dir)
        if state is None:
            state = TuneState(settings=dict(settings), started_at=now())
            save(run_dir, state)
            return state
        changed = _differences(state.settings, settings)
        if changed:
            raise StateError(
                "run %s's tune was measured with other settings (%s changed since): its trials "
                "would not compare. Restore them, or start a new tune (another bench_run_id)"
                % (os.path.basename(run_dir), ", ".join("tune %s" % c for c in changed)))
        if resuming or state.running() is not None:
            state.resumed_at.append(now())
        state.settings = dict(settings)
        state.done = ""
        save(run_dir, state)
        return state


def update(run_dir: str, change) -> TuneState:
    """Load, change (a function of the state), save: under the run's lock."""
    with run_lock(run_dir):
        state = load(run_dir)
        if state is None:
            raise StateError("no tune state in %s: run tune.yml from its start" % run_dir)
        change(state)
        save(run_dir, state)
        return state
