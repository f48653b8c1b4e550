"""Trace replay: requests sent at the times a trace gives (Mooncake's or Azure's LLM inference
traces as JSONL), with its input and output lengths. Standard library only.

A trace is one JSON object per line with a timestamp and the two lengths; the names Mooncake
(`timestamp` in ms, `input_length`, `output_length`) and Azure (`TIMESTAMP`, `ContextTokens`,
`GeneratedTokens`) use are read, as are `input_tokens`/`output_tokens`. Timestamps are relative:
the first request is sent at the level's start, each later one its offset after, divided by
`speedup` (2: twice as fast). Prompts are built to the input lengths (exactly, with a tokenizer)
before the level starts.

TraceSchedule replays those offsets through the interface the open loop's ArrivalSchedule has
(`next_ns`, `advance()`), one client process's share of them.
"""
from __future__ import annotations

import random
from typing import List, Optional, Sequence

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.datasets import read_rows
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.prompts import (
    Prompt, Workload, WorkloadError,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.tokens import (
    Counter, filler_text,
)

TIME_KEYS = ("timestamp", "TIMESTAMP", "time", "arrival_time")
INPUT_KEYS = ("input_length", "input_tokens", "ContextTokens", "prompt_tokens")
OUTPUT_KEYS = ("output_length", "output_tokens", "GeneratedTokens", "completion_tokens")
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
NS_PER_S = 1_000_000_000
NEVER_NS = 2 ** 62      # past the trace's end: no more arrivals


def _number(row: dict, keys: Sequence[str], where: str, what: str) -> float:
    for key in keys:
        if key in row:
            try:
                value = float(row[key])
            except (TypeError, ValueError):
                break
            if value >= 0:
                return value
            break
    raise WorkloadError("workload.path %s: no %s (a number >= 0 under one of %s)"
                        % (where, what, ", ".join(keys)))


def from_trace(spec: dict, counter: Counter, words) -> Workload:
    unit = UNITS[spec["timestamp_unit"]]
    speedup = spec["speedup"]
    rows = []
    for where, row in read_rows(str(spec["path"]), "workload"):
        if not isinstance(row, dict):
            raise WorkloadError("workload.path %s: expected an object" % where)
        rows.append((_number(row, TIME_KEYS, where, "timestamp"),
                     int(_number(row, INPUT_KEYS, where, "input length")),
                     int(_number(row, OUTPUT_KEYS, where, "output length")), where))
        if spec.get("limit") and len(rows) >= spec["limit"]:
            break
    if not rows:
        raise WorkloadError("workload.path %s: no requests in the trace" % spec["path"])
    rows.sort(key=lambda r: r[0])       # stable: equal timestamps keep the file's order
    t0 = rows[0][0]
    rng = random.Random(spec["seed"])
    prompts, arrivals = [], []
    for t, n_in, n_out, where in rows:
        text, got = filler_text(counter, max(1, n_in), rng, words,
                                head="%06d" % rng.randrange(10 ** 6))
        prompts.append(Prompt(messages=[{"role": "user", "content": text}],
                              max_tokens=max(1, n_out), ignore_eos=spec["ignore_eos"],
                              label=where, input_tokens=got))
        # offsets in the trace's unit first: (1200 - 1000) * 1e-3 is 0.2 exactly, not 0.19999...
        arrivals.append((t - t0) * unit / speedup)
    span = arrivals[-1]
    return Workload("trace", prompts, "%d requests from the trace %s over %.1f s%s"
                    % (len(prompts), spec["path"], span,
                       " (speedup %g)" % speedup if speedup != 1 else ""),
                    token_source=counter.source, arrivals_s=arrivals)


class TraceSchedule:
    """The trace's send times for client process `index` of `nproc` (every nproc-th arrival,
    so the processes interleave), from `first_ns` (the level's start). `index_of_next` is the
    prompt the next arrival sends (the trace's own, not a shuffled one)."""

    def __init__(self, arrivals_s: List[float], first_ns: int, index: int = 0, nproc: int = 1):
        self.mine = list(range(index, len(arrivals_s), max(1, nproc)))
        self.times = [first_ns + int(arrivals_s[i] * NS_PER_S) for i in self.mine]
        self.pos = 0
        self.next_ns = self.times[0] if self.times else NEVER_NS

    @property
    def index_of_next(self) -> Optional[int]:
        return self.mine[self.pos] if self.pos < len(self.mine) else None

    @property
    def done(self) -> bool:
        return self.pos >= len(self.times)

    def advance(self) -> int:
        """The arrival due now; the schedule moves on to the next one (NEVER_NS after the last)."""
        due = self.next_ns
        self.pos += 1
        self.next_ns = self.times[self.pos] if self.pos < len(self.times) else NEVER_NS
        return due


def mean_rate(arrivals_s: List[float]) -> Optional[float]:
    """The trace's offered rate (requests/s over its span); None for a single instant."""
    span = arrivals_s[-1] - arrivals_s[0] if arrivals_s else 0.0
    return (len(arrivals_s) - 1) / span if span > 0 else None
