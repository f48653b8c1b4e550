"""A benchmark run on disk for report tests: part files with typed level rows and request
records (as llm_bench writes them), and a manifest with the host's GPUs and the simulator's time
scale. One builder for the report's unit tests and its browser test.

    run = make_run(tmp_path)                     # baseline + eagle3 at C = 1, 2, 4, 8
    run = make_run(tmp_path, profiles=("baseline",), levels=(1, 2, 4), time_scale=None)
"""
from __future__ import annotations

import os

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    CANCELLED_PREFIX, RequestTiming, level_row, reduce_requests, request_row,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    MANIFEST, PARTS_DIR, atomic_write_json,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import row_dict
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import write_level_files

MS = 1_000_000
WINDOW = (100 * MS, 1100 * MS)
WALL_OFFSET_NS = 1_700_000_000 * 10**9
LEVELS = (1, 2, 4, 8)
# baseline scales with C, eagle3 wins at low C and falls below between C=2 and C=4.
TOK_S = {"baseline": lambda c: 100.0 * c, "eagle3": lambda c: 180.0 + 40 * c}


def timing(i, t_send_ms, in_window, ttft_ms=20, gap_ms=5, error=None):
    """One request with 4 one-token chunks, `gap_ms` apart, the first `ttft_ms` after the send."""
    first = t_send_ms + ttft_ms
    times = [int((first + gap_ms * k) * MS) for k in range(4)]
    return RequestTiming(worker=i % 2, request_id=i, t_send=int(t_send_ms * MS),
                         t_first=times[0], t_last=times[-1], prompt_tokens=12,
                         completion_tokens=4, tokens_source="server", chunks=4, error=error,
                         in_window=in_window, chunk_times=times, chunk_tokens=[1, 1, 1, 1],
                         server_id="req-%d" % i)


def level_requests(p: int, c: int, failed: bool = True):
    """30 requests sent 40 ms apart (warmup, window, tail), TTFT growing with C and not sorted as
    written, an HTTP 500 inside the window (when `failed`) and a cancelled tail request."""
    ws, we = WINDOW
    reqs = [timing(i, 10 + 40 * i, ws <= (10 + 40 * i) * MS < we,
                   ttft_ms=10 * c + (7 * i) % 11 + p, gap_ms=2 + c + p)
            for i in range(30)]
    if failed:
        reqs.append(timing(98, 500, True, error="HTTP 500"))
    reqs.append(timing(99, 1150, False, error=CANCELLED_PREFIX + " level over"))
    return reqs


def make_run(tmp_path, name="run-p", profiles=("baseline", "eagle3"), levels=LEVELS,
             tok_s=None, time_scale=20, gpus=8, client_limited=(), keep_chunks=False,
             failed_request=True, server_metrics=None, without_gaps=False):
    """The run directory. tok_s: {profile: f(C)} (default TOK_S, else 100 x C); client_limited:
    {(profile, C)} marked client-limited; server_metrics: f(C) -> the row's server_* dict;
    without_gaps: records as written before they carried their inter-token gaps (no `itl`)."""
    tok_s = tok_s or TOK_S
    run = tmp_path / name
    parts = run / PARTS_DIR
    os.makedirs(parts)
    ws, we = WINDOW
    for p, profile in enumerate(profiles):
        for c in levels:
            reqs = level_requests(p, c, failed_request)
            row = row_dict(level_row("gpu1", profile, c, reduce_requests(reqs, ws, we, 5, {}), {}))
            rate = tok_s.get(profile, lambda c: 100.0 * c)(c)
            row["output_tok_s"] = rate
            row["output_tok_s_ci95"] = rate / 20
            row["client_limited"] = (profile, c) in client_limited
            if server_metrics is not None:
                row["server_metrics"] = server_metrics(c)
            records = []
            for r in reqs:
                rec = request_row(r, ws, we, WALL_OFFSET_NS)
                rec.update(host="gpu1", profile=profile, concurrency=c)
                if keep_chunks:
                    rec["chunk_times"] = list(r.chunk_times)
                    rec["chunk_tokens"] = list(r.chunk_tokens)
                if without_gaps:
                    del rec["itl"], rec["itl_basis"]
                records.append(rec)
            write_level_files(str(parts), row, records)
    simulator = {"profile": "x"} if time_scale is None else {"profile": "x",
                                                             "time_scale": time_scale}
    atomic_write_json(str(run / MANIFEST), {
        "run_id": name,
        "hosts": {"gpu1": {"gpu_facts": {"gpus": [{"name": "NVIDIA H200"}] * gpus},
                           "bench": {"engine": "simulator", "model": "servelab-sim"}}},
        "profiles": {profile: {"gpu1": {"engine": "simulator", "status": "finished",
                                        "simulator": simulator}}
                     for profile in profiles},
    })
    return run
