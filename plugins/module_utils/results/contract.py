"""The results contract (docs/architecture.md): file names, column names and atomic writes.

Every producer (llm_bench) and consumer (bench_report, tests, testinfra) reads the names from
here, so a renamed column breaks loudly in one place instead of silently in three.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Iterable, Union

MANIFEST = "manifest.json"
REQUESTS = "requests.jsonl"
LEVELS = "levels.csv"
SUMMARY = "summary.md"
REPORT_HTML = "report.html"
PLOTS_DIR = "plots"
PARTS_DIR = "parts"          # per (host, profile, level) files written as each level finishes
CAPACITY_DIR = "capacity"    # per (host, profile): a capacity search's outcome (llm_bench)
TUNE_DIR = "tune"            # a tune's trials, best profile and Pareto table (tune.yml)
LATEST_LINK = "latest"       # results/latest -> results/<run_id>

# One record per request in requests.jsonl. Times are client CLOCK_MONOTONIC in ns.
REQUEST_FIELDS = (
    "host", "profile", "concurrency", "worker", "request_id",
    "t_send", "t_first", "t_last",
    "prompt_tokens", "completion_tokens", "tokens_source",
    "ttft_ms", "e2e_ms", "tpot_ms", "chunks", "error", "in_window",
)

# One row per (host, profile, concurrency) in levels.csv; the contract's required columns first,
# then extra columns. Consumers must tolerate extra columns. Every column (these, the extras and
# the server_* ones) is defined, with its unit, header and format, in results/levels.py.
LEVEL_COLUMNS = (
    "host", "profile", "concurrency", "requests", "errors", "window_s",
    "output_tok_s", "output_tok_s_ci95", "total_tok_s", "request_s",
    "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
    "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms",
    "itl_p50_ms", "itl_p99_ms",
    "e2e_p50_ms", "e2e_p99_ms",
    "goodput_request_s", "client_limited",
)


def atomic_write_text(path: str, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so that readers see the old file or the new one, never a torn one.

    Results are 0644 (meant to be read by the team, like any other file); private state files
    (a server's state, which names its secrets' places) pass 0o600."""
    atomic_write_chunks(path, (text,), mode)


def atomic_write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    """atomic_write_text for bytes (the simulator's zipapp)."""
    atomic_write_chunks(path, (data,), mode)


def atomic_write_chunks(path: str, chunks: Iterable[Union[str, bytes]], mode: int = 0o644) -> None:
    """atomic_write_text of the concatenated `chunks` (text or bytes), written as they come (a
    level's request records are streamed, never held whole)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_if_changed(path: str, data: bytes, check_mode: bool = False) -> bool:
    """atomic_write_bytes unless `path` already holds exactly `data` (a rerun of the report or
    the exports rewrites nothing it would not change); whether the file differs. `check_mode`:
    only say so."""
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except FileNotFoundError:
        pass
    if not check_mode:
        atomic_write_bytes(path, data)
    return True


def atomic_write_json(path: str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
