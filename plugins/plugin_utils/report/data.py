"""Load one run's results for the report: the level rows, manifest.json, the request records.

The level rows come from the typed part files (parts/*.json, written as each level finished);
levels.csv, an export, is read only for a run that has no parts (an older run, or a hand-made
file). Either way the frame is built from typed rows, and every level's verdict (usable or not,
and why) is results.level_verdict's, the rule llm_bench's sweep stops on, so the tables, plots,
crossover and sweep agree.
"""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from dataclasses import dataclass, field

# Controller requirements (requirements.txt). Guarded so that the plugin loads without them and
# bench_report fails naming what is missing (plugins/action/bench_report.py), not an import error.
try:
    import pandas as pd
except ImportError:  # pragma: no cover - checked by the action plugin
    pd = None

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import CANCELLED_PREFIX
from ansible_collections.servelab.serving.plugins.module_utils.redact import redact_text
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVEL_COLUMNS,
    LEVELS,
    MANIFEST,
    PARTS_DIR,
    REQUESTS,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    DEFAULT_MAX_ERROR_RATE,
    level_flags,
    level_verdict,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    KIND_FLOAT,
    KIND_INT,
    LOAD_MODE_RATE,
    field_of,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.level_csv import as_bool
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    PartError,
    read_levels_csv,
    read_parts,
    row_repeat,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.context import profile_records

__all__ = ["DEFAULT_MAX_ERROR_RATE", "ReportError", "RunData", "load_levels", "load_run"]

# Without these a row means nothing; the other LEVEL_COLUMNS may be missing (an older or partial
# run) and are then shown as "-".
REQUIRED_COLUMNS = ("host", "profile", "concurrency", "output_tok_s")


class ReportError(Exception):
    """The results cannot be reported; the message names the file or field and the fix."""


@dataclass
class RunData:
    results_dir: str
    run_id: str
    # closed-loop rows: LEVEL_COLUMNS + usable, verdict, note, flags; sorted; one per repeat
    # (report/repeats.py summarises them into one per level)
    levels: pd.DataFrame
    manifest: dict
    planned_levels: list  # concurrency levels the run meant to measure, when known
    request_errors: dict = field(default_factory=dict)  # (host, profile, C) -> [(error, count)]
    warnings: list = field(default_factory=list)
    rate_levels: pd.DataFrame | None = None  # open-loop (request-rate) rows, reported apart
    records: LevelRecords | None = None  # the typed rows as read, and the request files


@dataclass
class LevelRecords:
    """A run's level rows as typed dicts, where they were read from, and its request files."""

    rows: list
    source: str  # the parts directory or levels.csv: named in messages about the rows
    request_files: list


def _from_parts(results_dir: str) -> LevelRecords | None:
    parts_dir = os.path.join(results_dir, PARTS_DIR)
    try:
        parts = read_parts(parts_dir)
    except PartError as exc:
        raise ReportError(str(exc)) from None
    if not parts:
        return None
    return LevelRecords(
        rows=[row for row, _jsonl in parts],
        source=parts_dir,
        request_files=[jsonl for _key, jsonl in parts if os.path.isfile(jsonl)],
    )


def _from_csv(results_dir: str) -> LevelRecords:
    path = os.path.join(results_dir, LEVELS)
    if not os.path.isfile(path):
        raise ReportError(
            f"no {LEVELS} in {results_dir} (and no {PARTS_DIR}/): no level finished in this "
            "run, or this is not a run directory; pass results/<run_id> of a run that measured "
            "at least one level"
        )
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), None)
        rows = read_levels_csv(path)
    except (OSError, csv.Error, UnicodeDecodeError) as exc:
        raise ReportError(f"{path} is not a readable CSV ({exc}); rebuild it from parts/") from exc
    if not header:
        raise ReportError(f"{path} is empty: no level finished in this run")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ReportError(
            f"{path} lacks the column(s) {', '.join(missing)}; servelab's levels.csv "
            f"has {', '.join(LEVEL_COLUMNS)}"
        )
    if not rows:
        raise ReportError(f"{path} has a header but no rows: no level finished in this run")
    requests = os.path.join(results_dir, REQUESTS)
    return LevelRecords(rows, path, [requests] if os.path.isfile(requests) else [])


def level_records(results_dir: str) -> LevelRecords:
    """The run's level rows: from its parts, else from its levels.csv."""
    if not os.path.isdir(results_dir):
        raise ReportError(
            f"results_dir {results_dir} is not a directory; pass results/<run_id> "
            "(or results/latest)"
        )
    return _from_parts(results_dir) or _from_csv(results_dir)


def level_frame(
    records: LevelRecords, max_error_rate: float = DEFAULT_MAX_ERROR_RATE
) -> tuple[pd.DataFrame, list]:
    """The typed rows as the report's frame, each with its verdict (usable, note) and flags."""
    rows = []
    for row in records.rows:
        verdict = level_verdict(row, max_error_rate)
        rows.append(dict(row, usable=verdict.usable, verdict=verdict.status,
                         note=redact_text(verdict.note),
                         flags="; ".join(level_flags(row))))
    # Column by column as objects, so text and flags keep their values (None stays None, not
    # NaN); figures become numbers below.
    columns = list(dict.fromkeys(name for row in rows for name in row))
    frame = pd.DataFrame(
        {name: pd.Series([row.get(name) for row in rows], dtype=object) for name in columns}
    )
    for column in LEVEL_COLUMNS:
        if column not in frame.columns:
            frame[column] = False if column == "client_limited" else float("nan")
    frame["host"] = frame["host"].astype(str)
    frame["profile"] = frame["profile"].astype(str)
    concurrency = pd.to_numeric(frame["concurrency"], errors="coerce")
    if concurrency.isna().any() or (concurrency <= 0).any():
        raise ReportError(
            f"{records.source}: column concurrency must hold positive integers; rows "
            f"{list(frame.index[concurrency.isna() | (concurrency <= 0)])} do not"
        )
    frame["concurrency"] = concurrency.astype(int)
    for column in frame.columns:
        # Figures are numbers (NaN = not measured) whatever file they came from.
        f = field_of(column)
        kind = f.kind if f is not None else None
        if kind in (KIND_INT, KIND_FLOAT) and column != "concurrency":
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame["client_limited"] = frame["client_limited"].map(as_bool).astype(bool)
    frame["usable"] = frame["usable"].astype(bool)
    if "load_mode" in frame.columns and "request_rate" not in frame.columns:
        frame["request_rate"] = float("nan")
    # A row without a repeat (levels.csv of a run from before repeats) is its level's only one.
    frame["repeat"] = [row_repeat({"repeat": r}) for r in frame.get("repeat", [None] * len(frame))]
    key = ["host", "profile", "concurrency", "repeat"] + (
        ["load_mode", "request_rate"] if "load_mode" in frame.columns else []
    )
    warnings = []
    duplicated = frame.duplicated(key, keep="last")
    if duplicated.any():
        keys = frame.loc[duplicated, ["host", "profile", "concurrency", "repeat"]].values.tolist()
        warnings.append(
            f"{os.path.basename(records.source)} has (host, profile, concurrency, repeat) "
            f"{keys} more than once; the last row of each is used"
        )
        frame = frame.loc[~duplicated]
    frame = frame.sort_values(["host", "profile", "concurrency", "repeat"],
                              kind="stable").reset_index(drop=True)
    return frame, warnings


def load_levels(
    results_dir: str, max_error_rate: float = DEFAULT_MAX_ERROR_RATE
) -> tuple[pd.DataFrame, list]:
    """The run's level frame (parts, else levels.csv); a ReportError naming the fix when there
    is nothing to report."""
    return level_frame(level_records(results_dir), max_error_rate)


def split_load_modes(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(closed-loop rows, open-loop request-rate rows). The crossover is a closed-loop notion:
    rate levels are reported apart, never mixed into the concurrency curves."""
    if "load_mode" not in frame.columns:
        return frame, frame.iloc[0:0]
    is_rate = frame["load_mode"].map(lambda mode: str(mode).strip().lower()) == LOAD_MODE_RATE
    return frame[~is_rate].reset_index(drop=True), frame[is_rate].reset_index(drop=True)


def load_manifest(results_dir: str) -> tuple[dict, list]:
    path = os.path.join(results_dir, MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}, []
    except ValueError as exc:
        return {}, [f"{path} is not valid JSON ({exc}); reported without it"]
    if not isinstance(data, dict):
        return {}, [f"{path} does not hold a JSON object; reported without it"]
    return data, []


def load_request_errors(request_files: list, limit: int = 3) -> tuple[dict, list]:
    """The commonest error texts per (host, profile, concurrency) in the request records (the
    parts' .jsonl files, or requests.jsonl for a run without parts).

    Streamed line by line: a run can hold hundreds of thousands of records and only the failing
    ones matter here.
    """
    counters: dict = {}
    warnings = []
    for path in request_files:
        bad_lines = 0
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    if '"error"' not in line:
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError:
                        bad_lines += 1
                        continue
                    error = record.get("error")
                    # Tail requests cancelled when a level ends are not errors (llm_bench's rule).
                    if not error or str(error).startswith(CANCELLED_PREFIX):
                        continue
                    key = (
                        str(record.get("host")),
                        str(record.get("profile")),
                        record.get("concurrency"),
                    )
                    # An error body may quote a request header or the server's arguments.
                    counters.setdefault(key, Counter())[redact_text(str(error))[:160]] += 1
        except FileNotFoundError:
            continue
        if bad_lines:
            warnings.append(f"{path}: {bad_lines} unreadable line(s) skipped")
    return {k: c.most_common(limit) for k, c in counters.items()}, warnings


def planned_levels(manifest: dict) -> list:
    """Concurrency levels the run was asked for, when the manifest records them."""
    bench = manifest.get("bench") if isinstance(manifest.get("bench"), dict) else {}
    for value in (bench.get("concurrency"), bench.get("levels"), manifest.get("concurrency")):
        if isinstance(value, list):
            try:
                return sorted({int(v) for v in value})
            except (TypeError, ValueError):
                return []
    return []


def _recorded_failures(results_dir: str) -> str:
    """What manifest.json says went wrong, to append to a 'nothing to report' error."""
    if not os.path.isdir(results_dir):
        return ""
    manifest, _unused = load_manifest(results_dir)
    failed = [r for r in profile_records(manifest) if (r.status or "").lower() == "failed"]
    if not failed:
        return ""
    return ". manifest.json records the failure(s): " + "; ".join(
        f"{r.profile} on {r.host}: {(r.error or 'no message')[:200]}" for r in failed
    )


def load_run(results_dir: str, max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> RunData:
    if not isinstance(max_error_rate, (int, float)) or not 0 <= max_error_rate <= 1:
        raise ReportError(
            f"max_error_rate must be a fraction between 0 and 1, got {max_error_rate!r}"
        )
    try:
        records = level_records(results_dir)
    except ReportError as exc:
        raise ReportError(str(exc) + _recorded_failures(results_dir)) from None
    levels, warnings = level_frame(records, max_error_rate)
    # A run of open-loop levels only is reported too: its rate table and plot, and no
    # speedup, crossover or recommendation (those compare closed-loop concurrency levels).
    levels, rate_levels = split_load_modes(levels)
    manifest, more = load_manifest(results_dir)
    warnings += more
    errors, more = load_request_errors(records.request_files)
    warnings += more
    run_id = str(manifest.get("run_id") or os.path.basename(os.path.realpath(results_dir)))
    return RunData(
        results_dir=results_dir,
        run_id=run_id,
        levels=levels,
        manifest=manifest,
        planned_levels=planned_levels(manifest),
        request_errors=errors,
        warnings=warnings,
        rate_levels=rate_levels,
        records=records,
    )
