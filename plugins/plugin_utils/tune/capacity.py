"""The highest load that meets the SLO, for one server: bisection with short levels first.

vLLM's auto_tune walks the request rate down step by step from an infinite rate until p99 E2E
meets its limit: one level per step, each as long as the last. Here the next level depends on the
last result (llm_bench's action measures one level per module call and asks `next_step` which
load comes next):

1. The first level is `start`: the rate where the best trial so far found its score (`beat`), so a
   trial that cannot beat it usually shows so in one level, or the model's prediction.
2. Bracketing: while every level met the SLO, the load grows by `expand`, and by `expand`^2
   once two loads met it (galloping, capped: up to `maximum`); while none did, it shrinks by
   `expand` (down to `minimum`). Started 30x under its capacity, a search with `expand` 2
   brackets it in 4 levels ([8, 32) x the start) where doubling takes 6 ([16, 32)); the wider
   bracket costs one short level more to bisect (benchmarks/capacity_bench.py measures both).
3. Bisection: the next load is the middle of the bracket [lo, hi) - lo the highest load that met
   the SLO below hi, the lowest that missed it (geometric middle for a rate, the integer middle
   for a concurrency). The bracket never holds a measured load, so no load is measured twice.
4. Short levels first: while the bracket is wider than `short_tolerance`, levels run
   `short_seconds` (screening); then `full_seconds`, and the bracket's bottom is the highest
   full-length level that met the SLO (none yet: the middle of the bracket while it is wide, a
   step of half the tolerance under its short bottom when not), until it is narrower than
   `tolerance`. The score is the best
   full-length passing level's: a short level decides where to look, never the result.
   A short level that misses the SLO by less than `margin` is borderline (a short window's p99
   is a handful of requests): the next level confirms it at full length, just under its load.
5. Pruning (successive halving's rule, per trial): any score at a load below hi is at most the
   throughput measured at hi (throughput grows with load; plus `margin` for a short level's
   noise), and in open loop at most hi itself (no more requests finish than arrive). Once that
   bound is within `tolerance` of `beat`, the trial cannot beat the best by more than the search
   can resolve: it stops, `pruned`. Started at the best trial's load, a trial that misses the
   SLO there is pruned after one short level.
6. A score whenever a load met the SLO: the last level of `max_levels` is kept for a full-length
   level under the highest load that met it (a step of half the tolerance under), when no
   full-length level has yet; a maximum load that met the SLO at a short level is confirmed at
   full length just under it. A search that ends so (`max_levels`, `at_maximum`) scores a lower
   bound: the capacity is at least its load (`Outcome.lower_bound`).

`next_step` is a pure function of the levels measured so far, so a resumed sweep that keeps its
finished levels (run_record.py) replays the same decisions and measures only what is missing.
Controller only, standard library only.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import List, Mapping, Optional, Sequence, Union

from ansible_collections.servelab.serving.plugins.plugin_utils.tune.objective import (
    Judgement, Objective, ObjectiveError,
)

AXES = ("rate", "concurrency")
SHORT, FULL = "short", "full"
# Outcomes
FOUND = "found"             # the bracket is narrow and a full-length level met the SLO
PRUNED = "pruned"           # it cannot beat `beat`
NONE_PASSED = "none_passed"  # not even the minimum load met the SLO
AT_MAXIMUM = "at_maximum"   # the maximum load met it: the capacity is at least that
MAX_LEVELS = "max_levels"   # the level budget ran out first (a score is then a lower bound)
FAILED = "failed"           # the server did not serve a level
OUTCOMES = (FOUND, PRUNED, NONE_PASSED, AT_MAXIMUM, MAX_LEVELS, FAILED)


class SearchError(ValueError):
    """A bad search specification; the message names the key and the fix."""


def _number(spec: Mapping, key: str, default=None, minimum: float = 0.0,
            exclusive: bool = True, integer: bool = False) -> Optional[float]:
    value = spec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool):
        raise SearchError("capacity_search.%s must be a number, got %r" % (key, value))
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SearchError("capacity_search.%s must be a number, got %r" % (key, value)) from None
    if not math.isfinite(number) or number < minimum or (exclusive and number == minimum):
        raise SearchError("capacity_search.%s must be a number %s %g, got %r"
                          % (key, ">" if exclusive else ">=", minimum, value))
    if integer and not number.is_integer():
        raise SearchError("capacity_search.%s must be a whole number, got %r" % (key, value))
    return number


@dataclass(frozen=True)
class SearchSpec:
    """One trial's capacity search (llm_bench's `capacity_search` option, a dict of these)."""
    axis: str
    objective: Objective
    start: float
    full_seconds: float
    minimum: float
    maximum: float
    beat: Optional[float] = None
    tolerance: float = 0.05
    short_seconds: Optional[float] = None
    short_tolerance: float = 0.25
    expand: float = 2.0
    max_levels: int = 12
    margin: float = 0.1

    KEYS = ("axis", "objective", "start", "full_seconds", "minimum", "maximum", "beat",
            "tolerance", "short_seconds", "short_tolerance", "expand", "max_levels", "margin")

    @classmethod
    def parse(cls, spec: Mapping) -> SearchSpec:
        if not isinstance(spec, Mapping):
            raise SearchError("capacity_search must be a mapping, got %r" % (spec,))
        unknown = sorted(str(k) for k in spec if k not in cls.KEYS)
        if unknown:
            raise SearchError("capacity_search: unknown key(s) %s; known: %s"
                              % (", ".join(unknown), ", ".join(cls.KEYS)))
        axis = spec.get("axis", "rate")
        if axis not in AXES:
            raise SearchError("capacity_search.axis: %r is not one of %s"
                              % (axis, ", ".join(AXES)))
        try:
            objective = Objective.parse(spec.get("objective"), "capacity_search.objective")
        except ObjectiveError as exc:
            raise SearchError(str(exc)) from None
        integer = axis == "concurrency"
        low = 1.0 if integer else 0.0
        minimum = _number(spec, "minimum", 1.0 if integer else 0.01, low, not integer, integer)
        maximum = _number(spec, "maximum", 4096.0 if integer else 10000.0, low, not integer,
                          integer)
        start = _number(spec, "start", None, low, not integer)
        full = _number(spec, "full_seconds", None)
        if start is None or full is None:
            raise SearchError("capacity_search needs start (the first load) and full_seconds "
                              "(the window of the final levels)")
        if maximum < minimum:
            raise SearchError("capacity_search: maximum %g is below minimum %g"
                              % (maximum, minimum))
        short = _number(spec, "short_seconds", None)
        if short is not None and short >= full:
            raise SearchError("capacity_search.short_seconds %g must be below full_seconds %g "
                              "(short levels screen, full ones decide)" % (short, full))
        tolerance = _number(spec, "tolerance", 0.05)
        short_tol = _number(spec, "short_tolerance", 0.25)
        if short_tol < tolerance:
            raise SearchError("capacity_search.short_tolerance %g must be at least tolerance %g"
                              % (short_tol, tolerance))
        expand = _number(spec, "expand", 2.0, 1.0)
        levels = _number(spec, "max_levels", 12, 1.0, False, True)
        margin = _number(spec, "margin", 0.1, 0.0, False)
        beat = _number(spec, "beat", None, 0.0, False)
        start = min(max(start, minimum), maximum)
        if integer:
            start = float(round(start))
        return cls(axis=axis, objective=objective, start=start, full_seconds=full,
                   minimum=minimum, maximum=maximum, beat=beat, tolerance=tolerance,
                   short_seconds=short, short_tolerance=short_tol, expand=expand,
                   max_levels=int(levels), margin=margin)

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.KEYS}
        out["objective"] = self.objective.as_dict()
        return out

    @property
    def integer(self) -> bool:
        return self.axis == "concurrency"


@dataclass(frozen=True)
class Measured:
    """One level of the search: its load, phase and judgement."""
    x: float
    phase: str
    judgement: Judgement


@dataclass(frozen=True)
class Step:
    """The next level to measure."""
    x: float
    phase: str
    seconds: float
    why: str

    def level(self, axis: str) -> dict:
        """llm_bench's per-level options for it."""
        if axis == "concurrency":
            return {"concurrency": [int(self.x)]}
        return {"request_rate": [self.x]}


@dataclass(frozen=True)
class Outcome:
    """How the search ended, and what it found."""
    status: str
    reason: str
    score: Optional[float] = None       # the best full-length passing level's score
    best_x: Optional[float] = None      # its load
    lo: Optional[float] = None          # the highest load that met the SLO (below hi)
    hi: Optional[float] = None          # the lowest load that missed it
    bound: Optional[float] = None       # the most any load below hi could score
    levels: int = 0
    short_levels: int = 0
    full_levels: int = 0
    score_ci95: Optional[float] = None  # see Search.finish
    passed_levels: List[float] = field(default_factory=list)
    # The search ended before a load above the score's missed the SLO closely enough: the
    # capacity is at least best_x, maybe more (at_maximum, max_levels with a score).
    lower_bound: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _round(x: float, integer: bool) -> float:
    if integer:
        return float(int(round(x)))
    if x <= 0:
        return x
    digits = 4 - int(math.floor(math.log10(abs(x)))) - 1
    return round(x, max(digits, 0)) if digits >= 0 else float(round(x, digits))


class Search:
    """The levels of one trial's search so far and what comes next (module docstring)."""

    def __init__(self, spec: SearchSpec, levels: Sequence[Measured] = ()) -> None:
        self.spec = spec
        self.levels: List[Measured] = list(levels)

    def add(self, x: float, phase: str, row_or_judgement: Union[Mapping, Judgement]) -> Measured:
        judgement = (row_or_judgement if isinstance(row_or_judgement, Judgement)
                     else self.spec.objective.judge(row_or_judgement))
        measured = Measured(float(x), phase, judgement)
        self.levels.append(measured)
        return measured

    # -- the bracket --------------------------------------------------------------------------
    def _ok(self):
        return [m for m in self.levels if m.judgement.passed]

    def borderline(self, m: Measured) -> bool:
        """A short level that missed the SLO by less than `margin` (its worst percentile within
        1 + margin of its limit): a short window's p99 is a handful of requests, so that is no
        evidence of a miss until a full-length level confirms it."""
        j = m.judgement
        return (m.phase == SHORT and not j.passed and not j.failed and j.excess is not None
                and j.excess < 1.0 + self.spec.margin)

    def bracket(self):
        """(lo, hi): hi the lowest load that missed the SLO (a borderline short miss does not
        count), lo the highest that met it below hi (None where there is none)."""
        missed = [m.x for m in self.levels if not m.judgement.passed and not self.borderline(m)]
        hi = min(missed) if missed else None
        below = [m.x for m in self._ok() if hi is None or m.x < hi]
        return (max(below) if below else None), hi

    def bound(self, hi: Optional[float]) -> Optional[float]:
        """The most any load below hi can score (module docstring, rule 5): the throughput
        measured at hi (throughput grows with load), plus `margin` for a short level's noise
        (half of it for a full one); in open loop also hi itself in the score's unit (a server
        finishes no more requests than arrive). The smaller of the two."""
        if hi is None:
            return None
        at = [m for m in self.levels if m.x == hi]
        if not at:
            return None
        level = at[-1].judgement
        bounds = []
        if level.throughput is not None:
            margin = self.spec.margin if at[-1].phase == SHORT else self.spec.margin / 2
            bounds.append(level.throughput * (1.0 + margin))
        if not self.spec.integer and level.per_request is not None:
            bounds.append(hi * level.per_request)
        return min(bounds) if bounds else None

    def _phase(self, lo, hi) -> str:
        if self.spec.short_seconds is None:
            return FULL
        if any(m.phase == FULL for m in self.levels):
            return FULL          # once full, always full: the bracket is already narrow
        if lo is not None and hi is not None and self._width(lo, hi) <= self.spec.short_tolerance:
            return FULL
        return SHORT

    def _width(self, lo: float, hi: float) -> float:
        if self.spec.integer and hi - lo <= 1:
            return 0.0
        return hi / lo - 1.0

    def _seconds(self, phase: str) -> float:
        return self.spec.short_seconds if phase == SHORT else self.spec.full_seconds

    def _fresh(self, x: float, downwards: bool) -> float:
        """x rounded, moved off any load already measured (the part files are keyed by load)."""
        spec = self.spec
        x = _round(min(max(x, spec.minimum), spec.maximum), spec.integer)
        seen = {m.x for m in self.levels}
        step = 1.0 if spec.integer else max(x * 0.005, 10 ** -4)
        tries = 0
        while x in seen and tries < 50:
            x = _round(x - step if downwards else x + step, spec.integer)
            tries += 1
        return x

    # -- the decision --------------------------------------------------------------------------
    def next_step(self) -> Union[Step, Outcome]:
        nxt = self._decide()
        if isinstance(nxt, Step) and len(self.levels) >= self.spec.max_levels:
            return self._out_of_levels(*self.bracket())
        return nxt

    def _decide(self) -> Union[Step, Outcome]:
        spec = self.spec
        failed = [m for m in self.levels if m.judgement.failed]
        if failed:
            return self.finish(FAILED, "the server did not serve the level at %s: %s"
                               % (self.label(failed[0].x), failed[0].judgement.reason))
        if not self.levels:
            phase = SHORT if spec.short_seconds is not None else FULL
            return Step(spec.start, phase, self._seconds(phase),
                        "the first level: %s" % ("the best trial's load" if spec.beat is not None
                                                 else "the predicted capacity"))
        last = self.levels[-1]
        left = spec.max_levels - len(self.levels)
        lo, hi = self.bracket()
        bound = self.bound(hi)
        beat = spec.beat
        if beat is not None and bound is not None and bound <= beat * (1 + spec.tolerance):
            return self.finish(PRUNED, "cannot beat the best so far by more than the tolerance: "
                               "a load below %s (where the SLO was missed) scores at most %s "
                               "%s, the best so far is %s"
                               % (self.label(hi), "%.4g" % float(bound), spec.objective.unit,
                                  "%.4g" % float(beat)))
        full_ok = [m for m in self._ok() if m.phase == FULL]
        if left == 1 and not full_ok and lo is not None:
            # The last level is kept for a score: without a full-length level that met the SLO
            # the trial would end with none although loads met it (rule 6).
            return Step(self._fresh(self._under(lo), True), FULL, spec.full_seconds,
                        "the last level of max_levels (%d): a full-length level under the "
                        "highest load that met the SLO (%s), so the trial has a score"
                        % (spec.max_levels, self.label(lo)))
        if self.borderline(last):
            return Step(self._fresh(last.x, True), FULL, spec.full_seconds,
                        "a borderline miss at a short level (%s): confirmed at full length"
                        % last.judgement.reason)
        phase = self._phase(lo, hi)
        if hi is None:                                  # everything met the SLO so far
            if lo >= spec.maximum:
                top = max((m.x for m in full_ok), default=None)
                if top is None or top * (1.0 + spec.tolerance) < spec.maximum:
                    return Step(self._fresh(spec.maximum, True), FULL, spec.full_seconds,
                                "the maximum load %s met the SLO at a short level: confirmed at "
                                "full length" % self.label(spec.maximum))
                return self.finish(AT_MAXIMUM, "the maximum load %s met the SLO: the capacity is "
                                   "at least %s (a lower bound)"
                                   % (self.label(spec.maximum), self.label(top)))
            factor = self._gallop(len({m.x for m in self._ok()}))
            return Step(self._fresh(lo * factor, False), phase, self._seconds(phase),
                        "every level met the SLO: up by %.3gx%s" % (
                            factor, " (galloping: two or more met it)" if factor > spec.expand
                            else ""))
        if lo is None:                                  # nothing met it yet
            if hi <= spec.minimum:
                return self.finish(NONE_PASSED, "not even the minimum load %s met the SLO (%s)"
                                   % (self.label(spec.minimum),
                                      self._level_at(hi).judgement.reason))
            return Step(self._fresh(hi / spec.expand, True), phase, self._seconds(phase),
                        "no level met the SLO: down by %gx" % spec.expand)
        if phase == FULL:
            # A short level decides where to look, never the result: the bracket's bottom is
            # now the highest full-length level that met the SLO below hi.
            full_lo = max((m.x for m in full_ok if m.x < hi), default=None)
            if full_lo is None:
                # None yet: the middle of the bracket at full length while it is wide, else a
                # step of half the tolerance under its (short) bottom.
                if self._width(lo, hi) > spec.tolerance:
                    return Step(self._fresh(self._middle(lo, hi), True), FULL,
                                spec.full_seconds, "a full-length level must meet the SLO: "
                                "bisect [%s, %s)" % (self.label(lo), self.label(hi)))
                x = self._under(lo)
                if x < spec.minimum:
                    return self.finish(NONE_PASSED, "no full-length level met the SLO down to "
                                       "the minimum load %s" % self.label(spec.minimum))
                return Step(self._fresh(x, True), FULL, spec.full_seconds,
                            "a full-length level must meet the SLO: under %s" % self.label(lo))
            if self._width(full_lo, hi) <= spec.tolerance:
                return self.finish(FOUND, "the capacity lies in [%s, %s)"
                                   % (self.label(full_lo), self.label(hi)))
            return Step(self._fresh(self._middle(full_lo, hi), True), FULL, spec.full_seconds,
                        "bisect [%s, %s)" % (self.label(full_lo), self.label(hi)))
        return Step(self._fresh(self._middle(lo, hi), True), phase, self._seconds(phase),
                    "bisect [%s, %s)" % (self.label(lo), self.label(hi)))

    def _gallop(self, passed: int) -> float:
        """The step up after `passed` loads that all met the SLO: `expand`, then `expand`^2 from
        the second on (galloping, capped). Two passes in a row say the capacity is far: the
        search then covers the distance in half the levels, and the bracket it leaves is at
        most `expand`^2 wide (one bisection more than doubling's). Uncapped growth, or growth
        downwards too, left wider brackets whose bisection cost more than the bracketing saved
        (benchmarks/capacity_bench.py measured the variants)."""
        return self.spec.expand ** (2 if passed >= 2 else 1)

    def _under(self, x: float) -> float:
        """A load a step of half the tolerance under x (one under, for a concurrency)."""
        return (x - 1) if self.spec.integer else x * (1.0 - self.spec.tolerance / 2)

    def _out_of_levels(self, lo, hi) -> Outcome:
        """MAX_LEVELS, with what the levels showed: a lower bound when a full-length level met
        the SLO, else whether any load met it at all."""
        n = self.spec.max_levels
        ok = self._ok()
        full_ok = [m for m in ok if m.phase == FULL]
        if full_ok:
            # The highest full-length pass under hi; a non-monotone server can pass at full
            # length only above the lowest miss: then the score's own load (finish's best).
            top = max((m.x for m in full_ok if hi is None or m.x < hi),
                      default=max(full_ok, key=lambda m: m.judgement.score or 0.0).x)
            if hi is None:
                return self.finish(MAX_LEVELS, "max_levels (%d) measured before a load missed the "
                                   "SLO: every load measured met it, up to %s; the capacity is at "
                                   "least %s (a lower bound)"
                                   % (n, self.label(max(m.x for m in ok)), self.label(top)))
            return self.finish(MAX_LEVELS, "max_levels (%d) measured before the bracket [%s, %s) "
                               "narrowed to the tolerance: the capacity is at least %s (a lower "
                               "bound)" % (n, self.label(top), self.label(hi), self.label(top)))
        if ok:
            missed = [m for m in self.levels if m.phase == FULL and not m.judgement.passed]
            return self.finish(MAX_LEVELS, "max_levels (%d) measured: loads up to %s met the SLO "
                               "at short levels, but no full-length level did%s"
                               % (n, self.label(max(m.x for m in ok)),
                                  " (%s: %s)" % (self.label(missed[-1].x),
                                                 missed[-1].judgement.reason) if missed else ""))
        lowest = min(self.levels, key=lambda m: m.x)
        return self.finish(MAX_LEVELS, "max_levels (%d) measured and no load met the SLO (the "
                           "lowest, %s: %s)" % (n, self.label(lowest.x), lowest.judgement.reason))

    def _middle(self, lo: float, hi: float) -> float:
        if self.spec.integer:
            return float((int(lo) + int(hi)) // 2)
        return math.sqrt(lo * hi)

    def _level_at(self, x: float) -> Measured:
        return [m for m in self.levels if m.x == x][-1]

    def label(self, x: Optional[float]) -> str:
        if x is None:
            return "-"
        if self.spec.integer:
            return "C=%d" % int(x)
        return "rate=%g/s" % x

    def finish(self, status: str, reason: str) -> Outcome:
        """The outcome: the score is the best full-length passing level's (any passing level's
        when the search has no full phase). Its uncertainty (`score_ci95`) is that level's own
        95% half-width of output tok/s, relative, applied to the score: the window's batch-means
        interval (loadgen/metrics.py), the only interval one level has."""
        lo, hi = self.bracket()
        full_ok = [m for m in self._ok() if m.phase == FULL]
        if full_ok and self.spec.short_seconds is not None:
            lo = max((m.x for m in full_ok if hi is None or m.x < hi), default=lo)
        best = max(full_ok, key=lambda m: m.judgement.score or 0.0) if full_ok else None
        return Outcome(
            status=status, reason=reason,
            score=best.judgement.score if best else None,
            best_x=best.x if best else None, lo=lo, hi=hi, bound=self.bound(hi),
            levels=len(self.levels),
            short_levels=sum(1 for m in self.levels if m.phase == SHORT),
            full_levels=sum(1 for m in self.levels if m.phase == FULL),
            score_ci95=best.judgement.score_ci95 if best else None,
            passed_levels=sorted(m.x for m in self._ok()),
            lower_bound=best is not None and status in (AT_MAXIMUM, MAX_LEVELS))


def run_search(spec: SearchSpec, measure) -> Outcome:
    """Drive a search to its end with `measure(step) -> row` (tests and the benchmark's
    oracle; llm_bench's action drives it level by level instead)."""
    search = Search(spec)
    while True:
        nxt = search.next_step()
        if isinstance(nxt, Outcome):
            return nxt
        search.add(nxt.x, nxt.phase, measure(nxt))
