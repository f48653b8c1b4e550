"""One round of a tune: the next trial (from the state, the model and the budget), and a trial
recorded from what its sweep left in the run directory.

The action plugin (plugins/action/tune.py) calls these between the bench role's profile runs;
everything here works from the run directory and the state (state.py), so the same round after
a resume gives the same answer. Controller only.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.servelab.serving.plugins.plugin_utils.tune import state as st
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.capacity import (
    AT_MAXIMUM, FOUND, MAX_LEVELS, PRUNED as SEARCH_PRUNED,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.proposer import (
    Flat, observation_of, propose,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.simulator import (
    simulator_fields,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.space import (
    Space, apply, key,
)

# A trial's search: the bracket is screened with short levels down to this width (at least
# SHORT_TOLERANCE_FACTOR x the final tolerance), then finished at full length.
SHORT_TOLERANCE = 0.25
SHORT_TOLERANCE_FACTOR = 3.0
MARGIN = 0.1


def budget_spent(state: st.TuneState, settings: Mapping) -> str:
    """Why no new trial may start ('' while the budget lasts)."""
    budget = settings.get("budget") or {}
    trials, minutes = budget.get("trials"), budget.get("minutes")
    if trials is not None and len(state.trials) >= int(trials):
        return "the budget of %d trial(s) is spent" % int(trials)
    if minutes is not None and state.wall_seconds() >= float(minutes) * 60:
        return ("the budget of %g minute(s) is spent (%.1f min in trials)"
                % (float(minutes), state.wall_seconds() / 60))
    return ""


def candidates(settings: Mapping) -> Tuple[Space, List[Dict[str, Any]]]:
    space = Space.parse(settings["space"])
    refused = set(settings.get("refused") or ())
    return space, [c for c in space.candidates() if key(c) not in refused]


def model_for(settings: Mapping):
    """The model that predicts a candidate's score: the simulator's (model.py) where it models
    every searched flag, otherwise none (Flat)."""
    try:
        # pylint: disable-next=import-outside-toplevel
        from ansible_collections.servelab.serving.plugins.plugin_utils.tune.model import (
            simulator_model,
        )
    except ImportError:
        return Flat()
    return simulator_model(settings) or Flat()


def search_spec(settings: Mapping, best: Optional[st.Trial], predicted_x: Optional[float],
                modelled: bool) -> dict:
    """The trial's capacity search: started at the best trial's load (a trial that cannot beat
    it is pruned after one short level), or at the predicted capacity, else tune_first_load."""
    tolerance = float(settings["tolerance"])
    spec = {
        "axis": settings["axis"], "objective": settings["objective"],
        "full_seconds": settings["level_seconds"], "tolerance": tolerance,
        "minimum": settings["load_min"], "maximum": settings["load_max"],
        "max_levels": settings["max_levels"], "margin": MARGIN,
        "short_tolerance": max(SHORT_TOLERANCE, SHORT_TOLERANCE_FACTOR * tolerance),
    }
    if settings.get("short_level_seconds"):
        spec["short_seconds"] = settings["short_level_seconds"]
    best_x = (best.outcome or {}).get("best_x") if best is not None else None
    if best is not None and best_x:
        spec.update(start=best_x, beat=best.score)
        # Up from the best load towards the predicted capacity in one step where the model expects more.
        ratio = (predicted_x / best_x) if predicted_x else 0
        spec["expand"] = min(4.0, max(1.25, ratio * 1.05)) if ratio > 1 else 1.25
    elif predicted_x:
        spec.update(start=predicted_x, expand=1.5 if modelled else 2.0)
    else:
        spec.update(start=settings["first_load"], expand=2.0)
    if settings["axis"] == "concurrency":
        spec["start"] = max(1, int(round(spec["start"])))
    return spec


def next_trial(state: st.TuneState, settings: Mapping, model=None) -> Tuple[Optional[st.Trial], str]:
    """(the trial to run now, why) or (None, why the tune ends). A trial left running by an
    interruption is run again as recorded."""
    running = state.running()
    if running is not None:
        running.attempts += 1
        running.started_unix = time.time()
        return running, "resumed: %s was in flight when the tune was interrupted" % running.name
    spent = budget_spent(state, settings)
    if spent:
        return None, spent
    space, pool = candidates(settings)
    tried = state.tried_keys()
    best = state.best()
    engine = settings["engine"]
    if settings.get("strategy") == "grid":
        left = [c for c in pool if key(c) not in tried]
        if not left:
            return None, "every candidate of the space was tried"
        flags, why, prediction, modelled = left[0], "the grid, in order", {}, False
    else:
        model = model or model_for(settings)
        observations = [o for o in (observation_of(t) for t in state.trials) if o is not None]
        state.model = dict(model.fit(observations) or {}, observations=len(observations))
        min_trials = int(settings.get("min_trials") or 1)
        proposal = propose(space, pool, model, observations, tried,
                           best.score if best else None, float(settings["tolerance"]),
                           (settings.get("budget") or {}).get("trials"))
        finished = sum(1 for o in observations if o.status != "failed")
        if proposal.done and (finished >= min_trials or not proposal.ranked):
            return None, proposal.reason
        if proposal.done:      # too few trials to trust the model's "done": its best guess
            top = proposal.ranked[0]
            proposal.flags, proposal.key = top.flags, top.key
            proposal.reason = "fewer than tune_min_trials (%d) measured: the best predicted" \
                              % min_trials
            proposal.prediction = {"score": top.predicted, "sd": top.sd,
                                   "optimistic": top.optimistic, "x": top.model.x,
                                   "source": top.model.source}
        flags, why, prediction = proposal.flags, proposal.reason, proposal.prediction
        modelled = prediction.get("source", "none") != "none"
    name = state.next_name()
    fields = simulator_fields() if engine == "simulator" else None
    profile = apply(settings["base_profile"], engine, flags, name, fields)
    search = search_spec(settings, best, prediction.get("x"), modelled)
    return st.Trial(name=name, flags=dict(flags), key=key(flags), profile=profile,
                    search=search, why=why, prediction=prediction,
                    started_at=st.now(), started_unix=time.time()), why


def record(trial: st.Trial, profile_record: Mapping, outcome: Optional[Mapping],
           rows: List[Mapping]) -> st.Trial:
    """The trial's end, from its manifest record (profiles.<name>.<host>: finished or failed,
    with the error), the capacity search's outcome and its levels. Its wall time: this
    attempt's, from its proposal (server start included) to now, added to earlier attempts'."""
    if trial.started_unix:
        trial.wall_s = round(trial.wall_s + max(0.0, time.time() - trial.started_unix), 3)
    trial.finished_at = st.now()
    trial.levels = len(rows)
    trial.measured_s = round(sum(float(r.get("window_s") or 0) for r in rows), 3)
    trial.outcome = dict(outcome or {})
    status = str(profile_record.get("status") or "")
    search_status = (outcome or {}).get("status")
    if status == "failed" or outcome is None or search_status == "failed":
        trial.status = st.FAILED
        error = profile_record.get("error") or (outcome or {}).get("reason") or (
            "the trial did not finish (server status %s)" % (status or "unknown"))
        task = profile_record.get("failed_task")
        trial.reason = ("%s (in '%s')" % (error, task) if task else str(error))[:2000]
        tail = profile_record.get("log_tail")
        if tail:
            trial.reason += " | server log: " + str(tail).strip().splitlines()[-1][:300]
        return trial
    trial.score = outcome.get("score")
    trial.score_ci95 = outcome.get("score_ci95")
    trial.reason = str(outcome.get("reason") or "")
    if search_status == SEARCH_PRUNED:
        trial.status = st.PRUNED
        trial.score = None
    elif trial.score is None:
        trial.status = st.NO_SCORE
        if search_status == MAX_LEVELS and outcome.get("passed_levels"):
            trial.reason += ": raise tune_max_levels"
    elif search_status in (FOUND, AT_MAXIMUM, MAX_LEVELS):
        trial.status = st.FINISHED
        trial.lower_bound = bool(outcome.get("lower_bound"))
        if search_status == AT_MAXIMUM:
            trial.reason += ": raise tune_load_max for the capacity itself"
        elif search_status == MAX_LEVELS:
            trial.reason += ": raise tune_max_levels (or a tune_first_load nearer the capacity)"
    else:
        trial.status = st.NO_SCORE
    return trial
