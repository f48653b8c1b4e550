"""llm_bench's result files (docs/architecture.md, results contract).

Each finished level is written as two part files, atomically:
  results/<run_id>/parts/<host>__<profile>__c<C>.json    {"level": row, "warnings": [...]}
  results/<run_id>/parts/<host>__<profile>__c<C>.jsonl   one request record per line
(`__r<rate>` is appended for open-loop levels, `__rep<r>` for the repeats of a level measured
more than once, from repeat 2 on: repeat 1 keeps the name a level measured once has, so a run
measured once can be resumed with more repeats and keeps what it has). Then, under the run's lock (fcntl.flock on
results/<run_id>/.lock, the lock every servelab writer of a run takes), levels.csv and
requests.jsonl are rebuilt from all parts, so parallel forks (several hosts) never lose a level
and a run cut short keeps every finished one.

The parts are the typed record (bench_report reads them); levels.csv is an export, its columns
and cells defined by results/levels.py, and read back typed only for runs that have no parts.
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVELS, PARTS_DIR, REQUESTS, atomic_write_chunks, atomic_write_text,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_csv import csv_cell, row_from_csv
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import LOAD_MODE_RATE, csv_columns

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


REPEAT_SUFFIX = "__rep"
# The part stem's repeat suffix, to tell a repeat's files from its level's (report/distributions).
REPEAT_SUFFIX_RE = re.compile(r"__rep\d+$")


def row_repeat(row: dict) -> int:
    """The row's repeat (1 for a row written before repeats existed, or measured once)."""
    try:
        return max(1, int(row.get("repeat") or 1))
    except (TypeError, ValueError):
        return 1


def part_stem(row: dict) -> str:
    """File stem of one level's part files, unique per (host, profile, level, repeat)."""
    stem = "%s__%s__c%d" % (_UNSAFE.sub("_", str(row["host"])),
                            _UNSAFE.sub("_", str(row["profile"])), int(row["concurrency"]))
    if row.get("load_mode") == LOAD_MODE_RATE and row.get("request_rate") is not None:
        stem += "__r%s" % ("%g" % float(row["request_rate"])).replace(".", "p")
    if row_repeat(row) > 1:
        stem += "%s%d" % (REPEAT_SUFFIX, row_repeat(row))
    return stem


def _jsonl(records: Iterable[dict]) -> Iterator[str]:
    """The .jsonl's lines. A level's rows as the load generator returns them (loadgen/spool.py
    RequestRows) are already these lines, streamed from its files."""
    lines = getattr(records, "lines", None)
    if lines is not None:
        return lines()
    return (json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)


def write_level_files(directory: str, row: dict, requests: Iterable[dict],
                      warnings: Optional[List[str]] = None) -> Tuple[str, str]:
    """Write one level's part files atomically (requests first: a .json means a complete level)."""
    stem = os.path.join(directory, part_stem(row))
    atomic_write_chunks(stem + ".jsonl", _jsonl(requests))
    atomic_write_text(stem + ".json", json.dumps({"level": row, "warnings": warnings or []},
                                                 indent=1, sort_keys=True, default=str) + "\n")
    return stem + ".json", stem + ".jsonl"


def _sort_key(row: dict):
    return (str(row.get("host")), str(row.get("profile")), str(row.get("load_mode")),
            float(row.get("request_rate") or 0), int(row.get("concurrency") or 0),
            row_repeat(row))


class PartError(ValueError):
    """A part file that is not one: the message names the file."""


def read_parts(parts_dir: str) -> List[Tuple[dict, str]]:
    """(level row, path of its requests .jsonl) for every complete part, in report order."""
    out = []
    if not os.path.isdir(parts_dir):
        return out
    for name in sorted(os.listdir(parts_dir)):
        if not name.endswith(".json") or name.startswith("."):
            continue
        path = os.path.join(parts_dir, name)
        try:
            with open(path, encoding="utf-8") as fh:
                row = json.load(fh)["level"]
            if not isinstance(row, dict):
                raise TypeError("its level is a %s, not an object" % type(row).__name__)
        except (ValueError, KeyError, TypeError) as exc:
            raise PartError("%s is not a level part file (%s: %s); delete it or rerun the "
                            "level" % (path, type(exc).__name__, exc)) from None
        # A part written before repeats existed is its level's only measurement: repeat 1.
        row.setdefault("repeat", 1)
        out.append((row, path[:-len(".json")] + ".jsonl"))
    out.sort(key=lambda item: _sort_key(item[0]))
    return out


def levels_csv(rows: List[dict]) -> str:
    """levels.csv text: LEVEL_COLUMNS first, then the extra columns, then server_* columns."""
    columns = csv_columns((k for r in rows for k in (r.get("server_metrics") or {})),
                          (k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    for r in rows:
        flat: Dict[str, object] = dict(r)
        flat.update(r.get("server_metrics") or {})
        writer.writerow([csv_cell(flat.get(c)) for c in columns])
    return buf.getvalue()


def read_levels_csv(path: str) -> List[dict]:
    """levels.csv's records as typed row dicts (level_csv.row_from_csv): the reader for runs
    without parts. Raises OSError, csv.Error or UnicodeDecodeError as the file gives them."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [row_from_csv(record) for record in csv.DictReader(fh)]


def rebuild_run_files(run_dir: str) -> List[dict]:
    """Rebuild levels.csv and requests.jsonl of a run from its parts (call under the run lock).
    Returns the level rows."""
    parts = read_parts(os.path.join(run_dir, PARTS_DIR))
    rows = [row for row, _jsonl in parts]
    atomic_write_text(os.path.join(run_dir, LEVELS), levels_csv(rows))
    atomic_write_chunks(os.path.join(run_dir, REQUESTS),
                        _file_chunks([jsonl for _key, jsonl in parts]))
    return rows


def _file_chunks(paths: List[str], size: int = 1 << 20) -> Iterator[bytes]:
    """The files' bytes in order, a MiB at a time (a run's records are never held whole)."""
    for path in paths:
        try:
            fh = open(path, "rb")
        except FileNotFoundError:
            continue
        with fh:
            while True:
                chunk = fh.read(size)
                if not chunk:
                    break
                yield chunk
