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

The first trials are an initial design: the model's best, then (one per searched flag, at most
a quarter of a budget in trials) the untried candidate farthest from every trial so far, so
that the model is fitted on trials that differ in every flag. Then the proposal is the untried
candidate with the highest optimistic prediction (score times
exp(KAPPA * uncertainty)) times its chance not to fail; the tune ends when no untried candidate's
so weighted optimistic prediction beats the best measured score by more than the tolerance (after
at least MIN_TRIALS), or when the budget is spent (tune role). A pruned trial
counts with the bound its search proved, one that found no passing load with a score far below.
A failed trial (OOM, a refused flag, a readiness timeout) is followed by its back-off: the same
flags with one memory flag (space.RESOURCE_FLAGS) a step lower, the best predicted - what an
operator tries after an out-of-memory failure. It says nothing about speed: it is left
out of the correction and gives its near neighbours a failure risk instead: FAIL_ODDS for its
twin, fading over a narrower kernel (FAIL_LENGTH), so a promising neighbour is tried after the
safe ones of the same promise, not never; and MORE_MEMORY_RISK to a candidate that asks at least
the memory it asked (every flag of space.RESOURCE_FLAGS at least as large, the rest equal: an
out-of-memory failure is monotone in them).

Controller only, standard library only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ansible_collections.servelab.serving.plugins.plugin_utils.tune.space import (
    Space, asks_at_least, backoffs, key,
)

KAPPA = 1.0          # how optimistic: predictions plus this many uncertainties
LENGTH = 0.3         # the kernel's length, in the flags' unit positions
PRIOR_WEIGHT = 0.5   # the correction's shrinkage towards the model
NOISE = 0.03         # log-units of a measured score's own noise (a level's window)
MIN_TRIALS = 3
NO_SCORE_PENALTY = -2.0  # log ratio a trial that found no passing load counts with
FAIL_LENGTH = 0.1        # the failure risk's kernel: narrower, a failure says little far away
FAIL_ODDS = 0.25         # the chance a failed trial's twin fails too: evidence, not a rule
MORE_MEMORY_RISK = 0.9   # ... and one that asks at least its memory (space.RESOURCE_FLAGS)


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
    risk: float = 0.0              # the chance it fails as its failed neighbours did


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
    if obs.status == "no_score" or obs.score is None or obs.score <= 0:
        return NO_SCORE_PENALTY
    return math.log(obs.score / predicted) if predicted > 0 else 0.0


def _kernel(a: Sequence[float], b: Sequence[float], length: float) -> float:
    return math.exp(-(_distance(a, b) ** 2) / (2 * length ** 2))


def rank(space: Space, candidates: Sequence[Mapping[str, Any]], model,
         observations: Sequence[Observation], tried: set) -> List[Ranked]:
    """Every untried candidate with its prediction, best (risk-weighted) optimistic first."""
    spread = getattr(model, "spread", 0.7)
    measured, failed, seen, failed_flags = [], [], [], []
    for obs in observations:
        seen.append(space.position(obs.flags))
        if obs.status == "failed":
            failed.append(space.position(obs.flags))
            failed_flags.append(obs.flags)
            continue
        pred = model.predict(obs.flags)
        base = pred.score if pred.score and pred.score > 0 else 1.0
        measured.append((space.position(obs.flags), _log_ratio(obs, base), obs.weight))
    out = []
    for flags in candidates:
        k = key(flags)
        if k in tried:
            continue
        pred = model.predict(flags)
        base = pred.score if pred.score and pred.score > 0 else 1e-9
        pos = space.position(flags)
        weights = [(_kernel(pos, p, LENGTH) * w, r) for p, r, w in measured]
        total = PRIOR_WEIGHT + sum(w for w, _r in weights)
        correction = sum(w * r for w, r in weights) / total
        sd = math.sqrt(NOISE ** 2 + spread ** 2 * PRIOR_WEIGHT / total)
        predicted = base * math.exp(correction)
        near_failed = sum(_kernel(pos, p, FAIL_LENGTH) for p in failed)
        risk = FAIL_ODDS * near_failed / (1.0 + sum(_kernel(pos, p, FAIL_LENGTH) for p in seen))
        if any(asks_at_least(flags, f) for f in failed_flags):
            risk = MORE_MEMORY_RISK     # asks at least what a failed trial asked (space.py)
        out.append(Ranked(dict(flags), k, predicted, sd, predicted * math.exp(KAPPA * sd), pred,
                          correction, risk))
    # Ties (no model, nothing measured): the middle of the space first, then by name.
    centre = (0.5,) * len(space.dims)
    out.sort(key=lambda r: (-round(r.optimistic * (1 - r.risk), 9),
                            _distance(space.position(r.flags), centre), r.key))
    return out


def initial_size(space: Space, budget: Optional[int] = None) -> int:
    """Trials of the initial design: one per searched flag, plus the model's best; at most a
    quarter of a budget in trials (and at least 2)."""
    size = len(space.dims) + 1
    return min(size, max(2, budget // 4)) if budget else size


def spread_pick(space: Space, ranked: Sequence[Ranked], observations: Sequence[Observation]
                ) -> Optional[Ranked]:
    """The untried candidate farthest from every trial so far (maximin; among equals the
    better predicted): the initial design, so that the model is fitted on trials that differ in
    every flag, not only around its own prior's best."""
    if not observations or not ranked:
        return None
    seen = [space.position(o.flags) for o in observations]
    order = {id(r): i for i, r in enumerate(ranked)}
    return max(ranked, key=lambda r: (round(min(_distance(space.position(r.flags), p)
                                                for p in seen), 9), -order[id(r)]))


def propose(space: Space, candidates: Sequence[Mapping[str, Any]], model,
            observations: Sequence[Observation], tried: set, best: Optional[float],
            tolerance: float, budget: Optional[int] = None) -> Proposal:
    """The next candidate, or done with the reason. budget: the tune's budget in trials."""
    ranked = rank(space, candidates, model, observations, tried)
    if not ranked:
        return Proposal(True, "every candidate of the space was tried")
    last = observations[-1] if observations else None
    if last is not None and last.status == "failed":
        # An operator's move after an out-of-memory failure: the same flags with one memory
        # flag a step lower (space.backoffs), the best predicted of them.
        wanted = {key(f) for f in backoffs(space, last.flags)}
        options = [r for r in ranked if r.key in wanted]
        if options:
            pick = options[0]
            return Proposal(False, "back off from the failed %s: one memory flag a step lower "
                                   "(the best predicted of %d)" % (key(last.flags), len(options)),
                            pick.flags, pick.key, _prediction(pick), ranked)
    size = initial_size(space, budget)
    if 0 < len(observations) < size:
        pick = spread_pick(space, ranked, observations)
        return Proposal(False, "the initial design (%d of %d): the candidate farthest from "
                               "every trial so far" % (len(observations) + 1, size),
                        pick.flags, pick.key, _prediction(pick), ranked)
    top = ranked[0]
    finished = sum(1 for o in observations if o.status != "failed")
    hope = top
    if best is not None and finished >= MIN_TRIALS and \
            hope.optimistic * (1 - hope.risk) <= best * (1 + tolerance):
        return Proposal(True, "no untried candidate is expected to beat the best (%.4g) by more "
                              "than %g%%: the most optimistic one, %s, is predicted %.4g (at "
                              "most %.4g%s)" % (
                                  best, 100 * tolerance, hope.key, hope.predicted,
                                  hope.optimistic, ", failure risk %.0f%%" % (100 * hope.risk)
                                  if hope.risk else ""), ranked=ranked)
    if not observations:
        why = ("the model's best candidate (%s)" % top.model.source
               if top.model.source != "none" else "the first trial: the middle of the space")
    elif top.risk >= 0.2:
        why = ("the best predicted candidate (%.4g), despite a failed neighbour (risk %.0f%%)"
               % (top.predicted, 100 * top.risk))
    elif top.optimistic > top.predicted * 1.2 and top.sd > 0.2:
        why = "exploration: far from every measured trial (uncertainty %.0f%%)" % (100 * top.sd)
    else:
        why = "the best predicted candidate (%.4g, +-%.0f%%)" % (top.predicted, 100 * top.sd)
    return Proposal(False, why, top.flags, top.key, _prediction(top), ranked)


def _prediction(r: Ranked) -> Dict[str, Any]:
    return {"score": r.predicted, "sd": r.sd, "optimistic": r.optimistic,
            "model_score": r.model.score, "x": r.model.x, "source": r.model.source,
            "correction": r.correction, "risk": r.risk}


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
