"""Per-request TTFT and ITL samples of chosen levels, for the report's CDF plots.

Read from the run's request records (the parts' .jsonl files, or requests.jsonl for a run
without parts), streamed line by line: a run can hold hundreds of thousands of records, and only
the window requests of the few levels drawn are kept - as sample series written to files in a
directory the caller gives (module_utils/loadgen/samples.py), so the report's memory does not
grow with the levels' length, though their ITL samples are per token. A part file of a level
that is not drawn is not opened at all (its name says which level it holds, results/parts.py).

ITL: per token from each record's inter-token gaps (`itl` and `itl_basis`,
module_utils/results/request_itl.py: a chunk of k tokens gives k samples of gap/k, as the level's
ITL figures count them), else per chunk when the server gave no per-chunk counts; records written
before they carried their gaps give them from `chunk_times` (llm_bench's test-only keep_chunks)
or, without either, each request's TPOT as the inter-token proxy. Each series says which
(`itl_basis`), and the axis label says it. A level measured more than once (repeats) pools the
window requests of all its repeats.

The curves (samples_ecdf) are exact at the points drawn: the fraction of the samples at or below
each of about 8 x max_points points spaced evenly on a log scale between the level's smallest
and largest sample (those two included), counted in one pass; points where the curve does not
step are dropped, and the rest thinned to max_points for drawing.
"""

from __future__ import annotations

import json
import os
import re
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.samples import Samples
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    REPEAT_SUFFIX_RE,
    part_stem,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.request_itl import (
    ITL_BASIS_TOKEN,
    itl_samples_ms,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    exclusion_reason, finite_number as _number,
)

ITL_TOKEN, ITL_CHUNK, ITL_TPOT = "token", "chunk", "tpot"
NS_PER_MS = 1_000_000
# A part file's name: <host>__<profile>__c<C>[__r<rate>][__rep<repeat>].jsonl
_PART_FILE = re.compile(r"__c\d+(__r[0-9p.]+)?(__rep\d+)?\.jsonl$")


@dataclass
class LevelSamples:
    """A drawn level's samples (ms): series in memory, or in files under the directory
    read_samples was given."""
    ttft_ms: Samples = field(default_factory=lambda: Samples("d"))
    tpot_ms: Samples = field(default_factory=lambda: Samples("d"))
    itl_ms: Samples = field(default_factory=lambda: Samples("d", weighted=True))  # per token
    with_chunks: int = 0  # window requests that carried their gaps (or chunk times)
    with_tokens: int = 0  # ... with per-chunk token counts
    ok: int = 0  # window requests that succeeded

    @classmethod
    def in_files(cls, prefix: str) -> LevelSamples:
        return cls(Samples("d", path=prefix + ".ttft"), Samples("d", path=prefix + ".tpot"),
                   Samples("d", weighted=True, path=prefix + ".itl"))


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


def _add_gaps(samples: LevelSamples, record: dict) -> None:
    """The record's ITL samples: from its gaps (`itl`), else from chunk times (older records
    written with keep_chunks); neither, none (the level falls back to the TPOT proxy)."""
    itl, basis = record.get("itl"), record.get("itl_basis")
    if isinstance(itl, str) and basis is not None:
        try:
            pairs = itl_samples_ms(itl, basis)
        except ValueError:
            return
        samples.with_chunks += 1
        samples.with_tokens += int(basis == ITL_BASIS_TOKEN)
        if pairs:
            samples.itl_ms.extend([v for v, _w in pairs], [w for _v, w in pairs])
        return
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
            samples.itl_ms.append(gap / k, float(k))
        else:
            samples.itl_ms.append(gap)


def _wanted_file(path: str, stems: set) -> bool:
    """A part file of a level not drawn is skipped unopened; any other file is read."""
    name = os.path.basename(path)
    if not _PART_FILE.search(name):
        return True
    # Every repeat of a drawn level is read: its distribution pools the repeats' requests.
    return REPEAT_SUFFIX_RE.sub("", name[: -len(".jsonl")]) in stems


def read_samples(request_files: list, wanted: set, directory: str | None = None
                 ) -> tuple[dict, list]:
    """({(host, profile, C): LevelSamples}, warnings) for the window requests that succeeded.

    wanted: {(host, profile, C)} of closed-loop levels. Records outside the window, with an
    error, or cancelled are left out. `directory`: where the samples are written (the caller
    removes it); None keeps them in memory."""
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
                    samples = out.get(key)
                    if samples is None:
                        samples = out[key] = (
                            LevelSamples() if directory is None else
                            LevelSamples.in_files(os.path.join(directory, str(len(out)))))
                    samples.ok += 1
                    ttft, tpot = _number(record.get("ttft_ms")), _number(record.get("tpot_ms"))
                    if ttft is not None:
                        samples.ttft_ms.append(ttft)
                    if tpot is not None:
                        samples.tpot_ms.append(tpot)
                    _add_gaps(samples, record)
        except FileNotFoundError:
            continue
        if bad:
            warnings.append(f"{path}: {bad} unreadable line(s) skipped")
    return out, warnings


def itl_basis(samples: LevelSamples) -> str:
    """ITL_TOKEN / ITL_CHUNK when every successful window request carried its gaps (with
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
        x, y = samples_ecdf(level.ttft_ms, max_points=max_points)
        if x:
            out.append(CdfSeries(metric="ttft", x=x, y=y, samples=len(level.ttft_ms), **common))
        basis = itl_basis(level)
        values = level.tpot_ms if basis == ITL_TPOT else level.itl_ms
        x, y = samples_ecdf(values, max_points=max_points)
        if x:
            out.append(CdfSeries(metric="itl", x=x, y=y, samples=len(values), itl_basis=basis,
                                 **common))
    return out


def _grid(low: float, high: float, n: int) -> list:
    """About n points from low to high (both exact, ascending), evenly spaced on a log scale
    above 0 (down to high x 1e-6: a latency's decades), evenly spaced below."""
    if high <= 0:
        points = [low + (high - low) * i / (n - 1) for i in range(n)]
    else:
        start = max(low, high * 1e-6)
        ratio = high / start
        points = [start * ratio ** (i / (n - 1)) for i in range(n)]
        if low < start:
            points = [low] + ([0.0] if low < 0.0 < start else []) + points
    points[0], points[-1] = low, high
    return sorted(set(points))


def samples_ecdf(samples: Samples, max_points: int = 2000) -> tuple:
    """(x, y) of the empirical CDF of a series (weighted samples count their weight): x
    ascending, y the exact fraction at or below x, ending at 1; in one pass over the samples and
    bounded memory (the module docstring says how the points are chosen)."""
    if not samples:
        return [], []
    samples.seal()
    low, high = float(samples.vmin), float(samples.vmax)
    if low == high:
        return [low], [1.0]
    edges = _grid(low, high, 8 * max_points)
    # v <= edges[j] exactly when bisect_left(edges, v) <= j: the weight at or below each point.
    counts: Counter = Counter()
    for values, weights in samples.blocks():
        if weights is None:
            counts.update(map(bisect_left, repeat(edges), values))
        else:
            for value, weight in zip(values, weights):
                counts[bisect_left(edges, value)] += weight
    total = sum(counts.values())
    xs, ys, acc = [], [], 0.0
    for j in sorted(counts):
        acc += counts[j]
        xs.append(edges[j])
        ys.append(acc / total)
    if len(xs) > max_points:
        step = (len(xs) - 1) / (max_points - 1)
        keep = sorted({round(i * step) for i in range(max_points)})
        xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
    return xs, ys


def wanted_levels(levels, chosen: dict) -> set:
    """{(host, profile, C)} of the measured levels at the chosen concurrencies."""
    return {(str(r["host"]), str(r["profile"]), int(r["concurrency"]))
            for _key, r in levels.iterrows()
            if int(r["concurrency"]) in chosen.get(str(r["host"]), ())}
