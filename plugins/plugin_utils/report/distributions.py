"""Per-request TTFT and ITL samples of chosen levels, for the report's CDF plots.

Read from the run's request records (the parts' .jsonl files, or requests.jsonl for a run
without parts), streamed line by line: a run can hold hundreds of thousands of records, and only
the window requests of the few levels drawn are kept. A part file of a level that is not drawn is
not opened at all (its name says which level it holds, results/parts.py).

ITL: per token from the chunk arrival times when the records carry them (`chunk_times`, which
llm_bench writes only with its test-only keep_chunks; with `chunk_tokens` a chunk of k tokens
gives k samples of gap/k, as the level's ITL figures do), else per chunk; records without chunk
times (the normal case) give each request's TPOT as the inter-token proxy. Each series says
which (`itl_basis`), and the axis label says it. A level measured more than once (repeats)
pools the window requests of all its repeats.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    REPEAT_SUFFIX_RE,
    part_stem,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    exclusion_reason, finite_number as _number,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.figures import ecdf

ITL_TOKEN, ITL_CHUNK, ITL_TPOT = "token", "chunk", "tpot"
NS_PER_MS = 1_000_000
# A part file's name: <host>__<profile>__c<C>[__r<rate>][__rep<repeat>].jsonl
_PART_FILE = re.compile(r"__c\d+(__r[0-9p.]+)?(__rep\d+)?\.jsonl$")


@dataclass
class LevelSamples:
    ttft_ms: list = field(default_factory=list)
    tpot_ms: list = field(default_factory=list)
    itl_ms: list = field(default_factory=list)  # from chunk times, with itl_weights
    itl_weights: list = field(default_factory=list)
    with_chunks: int = 0  # window requests that carried chunk times
    with_tokens: int = 0  # ... and per-chunk token counts
    ok: int = 0  # window requests that succeeded


@dataclass
class CdfSeries:
    host: str
    profile: str
    concurrency: int
    metric: str  # "ttft" | "itl"
    x: list  # ms, ascending
    y: list  # fraction at or below x, ending at 1
    samples: int
    usable: bool
    reason: str = ""  # exclusion_reason of the level
    itl_basis: str = ""  # ITL_* for metric itl


def _add_chunks(samples: LevelSamples, record: dict) -> None:
    times = record.get("chunk_times")
    if not isinstance(times, list) or len(times) < 2:
        return
    tokens = record.get("chunk_tokens")
    per_token = isinstance(tokens, list) and len(tokens) == len(times)
    samples.with_chunks += 1
    samples.with_tokens += int(per_token)
    for i in range(1, len(times)):
        gap = (times[i] - times[i - 1]) / NS_PER_MS
        if per_token:
            k = tokens[i]
            if not k or k <= 0:
                continue
            samples.itl_ms.append(gap / k)
            samples.itl_weights.append(float(k))
        else:
            samples.itl_ms.append(gap)
            samples.itl_weights.append(1.0)


def _wanted_file(path: str, stems: set) -> bool:
    """A part file of a level not drawn is skipped unopened; any other file is read."""
    name = os.path.basename(path)
    if not _PART_FILE.search(name):
        return True
    # Every repeat of a drawn level is read: its distribution pools the repeats' requests.
    return REPEAT_SUFFIX_RE.sub("", name[: -len(".jsonl")]) in stems


def read_samples(request_files: list, wanted: set) -> tuple[dict, list]:
    """({(host, profile, C): LevelSamples}, warnings) for the window requests that succeeded.

    wanted: {(host, profile, C)} of closed-loop levels. Records outside the window, with an
    error, or cancelled are left out."""
    stems = {part_stem({"host": h, "profile": p, "concurrency": c}) for h, p, c in wanted}
    out: dict = {}
    warnings = []
    for path in request_files:
        if not _wanted_file(path, stems):
            continue
        bad = 0
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        bad += 1
                        continue
                    if not isinstance(record, dict) or record.get("in_window") is not True:
                        continue
                    # Errors and cancelled tail requests (CANCELLED_PREFIX) have no latency.
                    if record.get("error"):
                        continue
                    try:
                        key = (str(record.get("host")), str(record.get("profile")),
                               int(record.get("concurrency")))
                    except (TypeError, ValueError):
                        continue
                    if key not in wanted:
                        continue
                    samples = out.setdefault(key, LevelSamples())
                    samples.ok += 1
                    ttft, tpot = _number(record.get("ttft_ms")), _number(record.get("tpot_ms"))
                    if ttft is not None:
                        samples.ttft_ms.append(ttft)
                    if tpot is not None:
                        samples.tpot_ms.append(tpot)
                    _add_chunks(samples, record)
        except FileNotFoundError:
            continue
        if bad:
            warnings.append(f"{path}: {bad} unreadable line(s) skipped")
    return out, warnings


def itl_basis(samples: LevelSamples) -> str:
    """ITL_TOKEN / ITL_CHUNK when every successful window request carried chunk times (with
    per-chunk token counts: per token), else ITL_TPOT (each request's TPOT as the proxy)."""
    if samples.ok and samples.with_chunks == samples.ok:
        return ITL_TOKEN if samples.with_tokens == samples.ok else ITL_CHUNK
    return ITL_TPOT


def cdf_series(levels, chosen: dict, samples: dict, max_points: int = 2000) -> list:
    """CdfSeries for TTFT and ITL of every measured (host, profile) at the chosen levels.

    levels: the level frame (its `usable` and verdict mark excluded levels, which are kept and
    marked, not dropped: the plot draws them dotted); chosen: figures.cdf_levels_for();
    samples: read_samples()."""
    out = []
    for _key, row in levels.sort_values(["host", "profile", "concurrency"]).iterrows():
        host, profile, c = str(row["host"]), str(row["profile"]), int(row["concurrency"])
        if c not in chosen.get(host, ()):
            continue
        level = samples.get((host, profile, c))
        if level is None or not level.ok:
            continue
        common = dict(host=host, profile=profile, concurrency=c, usable=bool(row["usable"]),
                      reason=exclusion_reason(row))
        x, y = ecdf(level.ttft_ms, max_points=max_points)
        if x:
            out.append(CdfSeries(metric="ttft", x=x, y=y, samples=len(level.ttft_ms), **common))
        basis = itl_basis(level)
        if basis == ITL_TPOT:
            values, weights = level.tpot_ms, None
        else:
            values, weights = level.itl_ms, level.itl_weights
        x, y = ecdf(values, weights, max_points=max_points)
        if x:
            out.append(CdfSeries(metric="itl", x=x, y=y, samples=len(values), itl_basis=basis,
                                 **common))
    return out


def wanted_levels(levels, chosen: dict) -> set:
    """{(host, profile, C)} of the measured levels at the chosen concurrencies."""
    return {(str(r["host"]), str(r["profile"]), int(r["concurrency"]))
            for _key, r in levels.iterrows()
            if int(r["concurrency"]) in chosen.get(str(r["host"]), ())}
