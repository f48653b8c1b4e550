"""The next trial: the untried candidate with the best optimistic prediction, or the end.

Every candidate of the space (space.py) that the engine's rules allow gets a prediction of its
score in three layers:

1. the model's (model.py: the simulator fitted to the trials measured so far; without one, the
   same value for every candidate);
2. a correction learnt from the measured trials: each trial's log ratio of measured to
   predicted score, spread to its neighbours in the space by a Gaussian kernel (length
   `LENGTH` in the flags' unit positions) and shrunk towards 0 by a prior weight - what the model
   misses near where it was measured;
3. an uncertainty that is small next to a measured trial and grows away from them.

The proposal is the untried candidate with the highest optimistic prediction (score times
exp(KAPPA * uncertainty)); the tune ends when no untried candidate's optimistic prediction beats
the best measured score by more than the tolerance (after at least MIN_TRIALS), or when the
budget is spent (tune role). A pruned trial counts with the bound its search proved, one that
found no passing load with a score far below, a failed one (OOM, a refused flag, a readiness
timeout) as a strong penalty at half the weight, so that its neighbours are tried later.

Controller only, standard library only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.servelab.serving.plugins.plugin_utils.tune.space import Space, key

KAPPA = 1.0          # how optimistic: predictions plus this many uncertainties
LENGTH = 0.3         # the kernel's length, in the flags' unit positions
PRIOR_WEIGHT = 0.5   # the correction's shrinkage towards the model
NOISE = 0.03         # log-units of a measured score's own noise (a level's window)
MIN_TRIALS = 3
FAILED_PENALTY = -1.0    # log ratio a failed trial counts with (its score e^-1 of predicted)
NO_SCORE_PENALTY = -2.0


@dataclass(frozen=True)
class Observation:
    """A measured trial as the proposer sees it."""
    flags: Mapping[str, Any]
    score: Optional[float]         # measured (finished), bound (pruned), None otherwise
    status: str                    # finished | pruned | no_score | failed
    weight: float = 1.0
    lo: Optional[float] = None     # the capacity bracket its search measured (loads)
    hi: Optional[float] = None


@dataclass(frozen=True)
class Prediction:
    score: Optional[float]         # the model's, before the correction
    x: Optional[float] = None      # the load it expects the capacity at
    source: str = "none"           # what predicted it


@dataclass
class Ranked:
    flags: Dict[str, Any]
    key: str
    predicted: float               # model x correction
    sd: float                      # log units
    optimistic: float
    model: Prediction
    correction: float = 0.0


@dataclass
class Proposal:
    done: bool
    reason: str
    flags: Dict[str, Any] = field(default_factory=dict)
    key: str = ""
    prediction: Dict[str, Any] = field(default_factory=dict)
    ranked: List[Ranked] = field(default_factory=list)


class Flat:
    """No model: every candidate predicted alike (the correction and uncertainty do the work)."""
    name = "none"

    def fit(self, observations: Sequence[Observation]) -> Dict[str, Any]:
        scores = [o.score for o in observations if o.status == "finished" and o.score]
        self.level = math.exp(sum(math.log(s) for s in scores) / len(scores)) if scores else 1.0
        return {"model": "none", "note": "no model of these flags: the proposer learns from the "
                                         "trials alone"}

    def predict(self, flags: Mapping[str, Any]) -> Prediction:
        return Prediction(getattr(self, "level", 1.0), None, "none")

    @property
    def spread(self) -> float:
        """The prior uncertainty (log units) of a prediction far from every measured trial."""
        return 0.7


def _distance(a: Sequence[float], b: Sequence[float]) -> float:
    if not a:
        return 0.0
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)) / len(a))


def _log_ratio(obs: Observation, predicted: float) -> float:
    if obs.status == "failed":
        return FAILED_PENALTY
    if obs.status == "no_score" or obs.score is None or obs.score <= 0:
        return NO_SCORE_PENALTY
    return math.log(obs.score / predicted) if predicted > 0 else 0.0


def rank(space: Space, candidates: Sequence[Mapping[str, Any]], model,
         observations: Sequence[Observation], tried: set) -> List[Ranked]:
    """Every untried candidate with its prediction, best optimistic first."""
    spread = getattr(model, "spread", 0.7)
    measured = []
    for obs in observations:
        pred = model.predict(obs.flags)
        base = pred.score if pred.score and pred.score > 0 else 1.0
        measured.append((space.position(obs.flags), _log_ratio(obs, base),
                         obs.weight * (0.5 if obs.status == "failed" else 1.0)))
    out = []
    for flags in candidates:
        k = key(flags)
        if k in tried:
            continue
        pred = model.predict(flags)
        base = pred.score if pred.score and pred.score > 0 else 1e-9
        pos = space.position(flags)
        weights = [(math.exp(-(_distance(pos, p) ** 2) / (2 * LENGTH ** 2)) * w, r)
                   for p, r, w in measured]
        total = PRIOR_WEIGHT + sum(w for w, _r in weights)
        correction = sum(w * r for w, r in weights) / total
        sd = math.sqrt(NOISE ** 2 + spread ** 2 * PRIOR_WEIGHT / total)
        predicted = base * math.exp(correction)
        out.append(Ranked(dict(flags), k, predicted, sd, predicted * math.exp(KAPPA * sd), pred,
                          correction))
    # Ties (no model, nothing measured): the middle of the space first, then by name.
    centre = tuple(0.5 for _ in space.dims)
    out.sort(key=lambda r: (-round(r.optimistic, 9), _distance(space.position(r.flags), centre),
                            r.key))
    return out


def propose(space: Space, candidates: Sequence[Mapping[str, Any]], model,
            observations: Sequence[Observation], tried: set, best: Optional[float],
            tolerance: float) -> Proposal:
    """The next candidate, or done with the reason."""
    ranked = rank(space, candidates, model, observations, tried)
    if not ranked:
        return Proposal(True, "every candidate of the space was tried")
    top = ranked[0]
    finished = sum(1 for o in observations if o.status != "failed")
    if best is not None and finished >= MIN_TRIALS and top.optimistic <= best * (1 + tolerance):
        return Proposal(True, "no untried candidate is expected to beat the best (%.4g) by more "
                              "than %g%%: the most optimistic one, %s, is predicted %.4g (at "
                              "most %.4g)" % (best, 100 * tolerance, top.key, top.predicted,
                                              top.optimistic), ranked=ranked)
    if not observations:
        why = ("the model's best candidate (%s)" % top.model.source
               if top.model.source != "none" else "the first trial: the middle of the space")
    elif top.optimistic > top.predicted * 1.2 and top.sd > 0.2:
        why = "exploration: far from every measured trial (uncertainty %.0f%%)" % (100 * top.sd)
    else:
        why = "the best predicted candidate (%.4g, +-%.0f%%)" % (top.predicted, 100 * top.sd)
    return Proposal(False, why, top.flags, top.key,
                    {"score": top.predicted, "sd": top.sd, "optimistic": top.optimistic,
                     "model_score": top.model.score, "x": top.model.x,
                     "source": top.model.source, "correction": top.correction}, ranked)


def observation_of(trial) -> Optional[Observation]:
    """A recorded trial (state.Trial) as an observation; None while it runs."""
    status = trial.status
    if status == "running":
        return None
    out = trial.outcome or {}
    lo, hi = out.get("lo"), out.get("hi")
    if status == "finished":
        return Observation(trial.flags, trial.score, "finished", lo=lo, hi=hi)
    if status == "pruned":
        bound = out.get("bound")
        return Observation(trial.flags, bound, "pruned" if bound else "no_score", lo=lo, hi=hi)
    return Observation(trial.flags, None, status, lo=lo if status != "failed" else None,
                       hi=hi if status != "failed" else None)
