"""What a tune maximises, and whether one measured level meets the SLO.

An objective is a score column of the level row and the SLO it is scored under:

- `goodput`: requests per second that met every SLO (the level row's `goodput_request_s`,
  module_utils/loadgen/metrics.py), under `slo` (TTFT, TPOT, E2E in ms);
- `output_tok_s`: output tokens per second, under `slo` (typically a p99 TTFT alone).

A level *meets the SLO* when, for every limit given, the level's percentile `percentile` (50, 90
or 99: the row's `<metric>_p<q>_ms` columns) is at or under it: "p99 TTFT <= 2000 ms and p99
TPOT <= 60 ms". A level that is not usable (results/level_verdict.py: excluded for its errors,
client-limited) does not meet it, whatever its percentiles say: its figures are not the
server's. A *failed* level (the server did not serve) ends the trial as failed.

Pure Python; the rows are dicts (a part file's `level`, a module result).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    CLIENT_LIMITED, FAILED, level_verdict,
)

METRICS = {"goodput": "goodput_request_s", "output_tok_s": "output_tok_s"}
# The throughput a level's score can never exceed, in the score's unit: goodput counts finished
# requests that met the SLO, tok/s counts output tokens.
THROUGHPUT = {"goodput": "request_s", "output_tok_s": "output_tok_s"}
UNITS = {"goodput": "req/s", "output_tok_s": "tok/s"}
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")
PERCENTILES = (50, 90, 99)


class ObjectiveError(ValueError):
    """A bad objective; the message names the key and the fix."""


def _finite(value) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class Judgement:
    """One level held to the objective."""
    passed: bool
    score: Optional[float]          # the objective's column (also when the SLO was missed)
    throughput: Optional[float]     # the bound on any score at this load (THROUGHPUT)
    reason: str = ""                # why it missed, in words ("p99 TTFT 812 ms > 500 ms")
    failed: bool = False            # the server did not serve: the trial ends as failed
    client_limited: bool = False
    per_request: Optional[float] = None   # score units per finished request (1 for goodput)
    score_ci95: Optional[float] = None    # the score's 95% half-width (see judge)
    excess: Optional[float] = None        # the worst limited percentile over its limit


@dataclass(frozen=True)
class Objective:
    metric: str = "goodput"
    slo: Mapping[str, float] = field(default_factory=dict)
    percentile: int = 99

    @classmethod
    def parse(cls, value, where: str = "tune_objective") -> Objective:
        """{metric: goodput|output_tok_s, slo: {ttft_ms: .., tpot_ms: .., e2e_ms: ..},
        percentile: 50|90|99}; ObjectiveError naming the key otherwise."""
        if not isinstance(value, Mapping):
            raise ObjectiveError("%s must be a mapping such as {metric: goodput, slo: {ttft_ms: "
                                 "2000, tpot_ms: 60}, percentile: 99}, got %r" % (where, value))
        unknown = sorted(str(k) for k in value if k not in ("metric", "slo", "percentile"))
        if unknown:
            raise ObjectiveError("%s: unknown key(s) %s; known: metric, slo, percentile"
                                 % (where, ", ".join(unknown)))
        metric = value.get("metric", "goodput")
        if metric not in METRICS:
            raise ObjectiveError("%s.metric: %r is not one of %s"
                                 % (where, metric, ", ".join(METRICS)))
        slo_in = value.get("slo") or {}
        if not isinstance(slo_in, Mapping):
            raise ObjectiveError("%s.slo must be a mapping of %s in ms"
                                 % (where, ", ".join(SLO_KEYS)))
        slo: Dict[str, float] = {}
        for key, limit in slo_in.items():
            if key not in SLO_KEYS:
                raise ObjectiveError("%s.slo.%s: unknown SLO; known: %s"
                                     % (where, key, ", ".join(SLO_KEYS)))
            number = _finite(limit)
            if number is None or number <= 0:
                raise ObjectiveError("%s.slo.%s must be a number of ms > 0, got %r"
                                     % (where, key, limit))
            slo[key] = number
        if not slo:
            raise ObjectiveError("%s.slo: give at least one limit (ttft_ms, tpot_ms, e2e_ms): "
                                 "without one every load meets it and the tune has nothing to "
                                 "find" % where)
        percentile = value.get("percentile", 99)
        if isinstance(percentile, bool) or percentile not in PERCENTILES:
            raise ObjectiveError("%s.percentile: %r is not one of %s (the level rows' "
                                 "percentile columns)" % (where, percentile,
                                                          ", ".join(map(str, PERCENTILES))))
        return cls(metric=metric, slo=dict(sorted(slo.items())), percentile=int(percentile))

    def as_dict(self) -> dict:
        return {"metric": self.metric, "slo": dict(self.slo), "percentile": self.percentile}

    @property
    def column(self) -> str:
        return METRICS[self.metric]

    @property
    def unit(self) -> str:
        return UNITS[self.metric]

    def slo_column(self, key: str) -> str:
        """'ttft_ms' -> 'ttft_p99_ms' at this objective's percentile."""
        return "%s_p%d_ms" % (key[:-3], self.percentile)

    def describe(self) -> str:
        """'goodput (req/s) with p99 TTFT <= 2000 ms, p99 TPOT <= 60 ms'."""
        limits = ", ".join("p%d %s <= %g ms" % (self.percentile, key[:-3].upper(), limit)
                           for key, limit in self.slo.items())
        return "%s (%s) with %s" % (self.metric, self.unit, limits)

    def judge(self, row: Mapping) -> Judgement:
        """Whether `row` (one level) meets the SLO, and its score. The score's 95% half-width
        is the level's own interval of output tok/s (the window's batch means,
        loadgen/metrics.py), relative, applied to the score: the one interval a level has."""
        score = _finite(row.get(self.column))
        throughput = _finite(row.get(THROUGHPUT[self.metric]))
        tok_s, ci = _finite(row.get("output_tok_s")), _finite(row.get("output_tok_s_ci95"))
        requests = _finite(row.get("request_s"))
        extra = dict(
            per_request=1.0 if self.metric == "goodput" else (
                tok_s / requests if tok_s is not None and requests else None),
            score_ci95=score * ci / tok_s if score is not None and ci is not None and tok_s
            else None)
        verdict = level_verdict(row)
        if verdict.status == FAILED:
            return Judgement(False, score, throughput, verdict.reason, failed=True, **extra)
        if verdict.status == CLIENT_LIMITED:
            return Judgement(False, score, throughput,
                             "client-limited (%s): the client, not the server, set the pace"
                             % verdict.reason, client_limited=True, **extra)
        if not verdict.usable:
            return Judgement(False, score, throughput, verdict.reason or verdict.status, **extra)
        missed = []
        ratios = []
        for key, limit in self.slo.items():
            value = row.get(self.slo_column(key))
            value = float("inf") if value == float("inf") else _finite(value)
            label = "p%d %s" % (self.percentile, key[:-3].upper())
            if value is None:
                missed.append("%s not measured" % label)
            else:
                ratios.append(value / limit)
                if value > limit:
                    missed.append("%s %.4g ms > %g ms" % (label, value, limit))
        if score is None:
            missed.append("%s not measured" % self.column)
        return Judgement(not missed, score, throughput, "; ".join(missed),
                         excess=max(ratios) if ratios else None, **extra)


def limits_text(slo: Mapping[str, float]) -> Tuple[str, ...]:
    return tuple("%s <= %g ms" % (k[:-3].upper(), v) for k, v in slo.items())
