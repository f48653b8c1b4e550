"""Load one run's results for the report: levels.csv (required), manifest.json, requests.jsonl.

Everything the report decides about a level (usable for speedup and crossover or not, and why) is
decided here, once, in the `usable` and `note` columns, so the tables, plots and crossover agree.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import CANCELLED_PREFIX
from ansible_collections.servelab.serving.plugins.plugin_utils.report.context import profile_records
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import LEVEL_COLUMNS, LEVELS, MANIFEST, REQUESTS

# Without these a row means nothing; the other LEVEL_COLUMNS may be missing (an older or partial
# run) and are then shown as "-".
REQUIRED_COLUMNS = ("host", "profile", "concurrency", "output_tok_s")
DEFAULT_MAX_ERROR_RATE = 0.1
_TRUE = {"true", "1", "yes", "y", "t"}
_OK_STATUS = {"", "ok", "nan", "none", "finished", "success", "succeeded"}
SERVER_FAILING = "server failing"  # llm_bench's stop_reason when errors kept coming


class ReportError(Exception):
    """The results cannot be reported; the message names the file or field and the fix."""


@dataclass
class RunData:
    results_dir: str
    run_id: str
    levels: pd.DataFrame  # closed-loop rows: LEVEL_COLUMNS + usable, note, flags; sorted
    manifest: dict
    planned_levels: list  # concurrency levels the run meant to measure, when known
    request_errors: dict = field(default_factory=dict)  # (host, profile, C) -> [(error, count)]
    warnings: list = field(default_factory=list)
    rate_levels: pd.DataFrame | None = None  # open-loop (request-rate) rows, reported apart


def _as_bool(value) -> bool:
    if isinstance(value, bool):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return str(value).strip().lower() in _TRUE


def _text(value) -> str:
    return (
        ""
        if value is None or (isinstance(value, float) and math.isnan(value))
        else str(value).strip()
    )


def _level_verdict(row, max_error_rate: float) -> tuple[bool, str]:
    """(usable for speedup/crossover, note saying why not) for one level row."""
    requests, errors, tok_s = row["requests"], row["errors"], row["output_tok_s"]
    status = _text(row.get("status")).lower()  # optional extra columns from here on
    first_error = _text(row.get("first_error"))
    if status not in _OK_STATUS:
        return False, f"failed: status {status}"
    if _text(row.get("stop_reason")) == SERVER_FAILING:
        return False, "failed: the server kept failing" + (
            f" ({first_error[:80]})" if first_error else ""
        )
    if pd.isna(tok_s) or tok_s <= 0:
        return False, "failed: no output measured" + (
            f" ({first_error[:80]})" if first_error else ""
        )
    if not pd.isna(requests) and requests <= 0:
        return False, "failed: no request completed"
    if not pd.isna(requests) and not pd.isna(errors) and errors >= requests:
        return False, f"failed: all {int(requests)} requests errored"
    if row["client_limited"]:
        return False, "client-limited"
    if not pd.isna(requests) and not pd.isna(errors) and requests > 0:
        rate = errors / requests
        if rate > max_error_rate:
            return False, f"errors {rate:.0%} > {max_error_rate:.0%}"
    return True, ""


def _level_flags(row) -> str:
    """Facts about a usable level that a reader must know (they do not exclude it)."""
    flags = []
    if (
        "window_complete" in row
        and _text(row["window_complete"])
        and not _as_bool(row["window_complete"])
    ):
        flags.append(
            "window incomplete"
            + (f" ({_text(row.get('stop_reason'))})" if _text(row.get("stop_reason")) else "")
        )
    if _text(row.get("itl_basis")) == "chunk":
        flags.append("ITL per chunk (tokens per chunk unknown)")
    source = _text(row.get("tokens_source"))
    if source and source != "server":
        flags.append(f"tokens counted by the client ({source})")
    return "; ".join(flags)


def load_levels(
    results_dir: str, max_error_rate: float = DEFAULT_MAX_ERROR_RATE
) -> tuple[pd.DataFrame, list]:
    """levels.csv as a normalised frame; a ReportError naming the fix when it is unusable."""
    path = os.path.join(results_dir, LEVELS)
    if not os.path.isdir(results_dir):
        raise ReportError(
            f"results_dir {results_dir} is not a directory; pass results/<run_id> "
            "(or results/latest)"
        )
    if not os.path.isfile(path):
        raise ReportError(
            f"no {LEVELS} in {results_dir}: no level finished in this run, or this is "
            "not a run directory; pass results/<run_id> of a run that measured at "
            "least one level"
        )
    try:
        frame = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ReportError(f"{path} is empty: no level finished in this run") from None
    except (ValueError, pd.errors.ParserError) as exc:
        raise ReportError(f"{path} is not a readable CSV ({exc}); rebuild it from parts/") from exc
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ReportError(
            f"{path} lacks the column(s) {', '.join(missing)}; servelab's levels.csv "
            f"has {', '.join(LEVEL_COLUMNS)}"
        )
    if frame.empty:
        raise ReportError(f"{path} has a header but no rows: no level finished in this run")
    warnings = []
    for column in LEVEL_COLUMNS:
        if column not in frame.columns:
            frame[column] = False if column == "client_limited" else float("nan")
    frame["host"] = frame["host"].astype(str)
    frame["profile"] = frame["profile"].astype(str)
    concurrency = pd.to_numeric(frame["concurrency"], errors="coerce")
    if concurrency.isna().any() or (concurrency <= 0).any():
        raise ReportError(
            f"{path}: column concurrency must hold positive integers; rows "
            f"{list(frame.index[concurrency.isna() | (concurrency <= 0)])} do not"
        )
    frame["concurrency"] = concurrency.astype(int)
    for column in LEVEL_COLUMNS:
        if column not in ("host", "profile", "concurrency", "client_limited"):
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    frame["client_limited"] = frame["client_limited"].map(_as_bool).astype(bool)
    key = ["host", "profile", "concurrency"] + (
        ["load_mode", "request_rate"] if "load_mode" in frame.columns else []
    )
    if "request_rate" not in frame.columns and "load_mode" in frame.columns:
        frame["request_rate"] = float("nan")
    duplicated = frame.duplicated(key, keep="last")
    if duplicated.any():
        keys = frame.loc[duplicated, ["host", "profile", "concurrency"]].values.tolist()
        warnings.append(
            f"{LEVELS} repeats (host, profile, concurrency) {keys}; the last row of each is used"
        )
        frame = frame.loc[~duplicated]
    verdicts = [_level_verdict(row, max_error_rate) for _, row in frame.iterrows()]
    frame["usable"] = [v[0] for v in verdicts]
    frame["note"] = [v[1] for v in verdicts]
    frame["flags"] = [_level_flags(row) for _, row in frame.iterrows()]
    frame = frame.sort_values(["host", "profile", "concurrency"], kind="stable").reset_index(
        drop=True
    )
    return frame, warnings


def split_load_modes(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(closed-loop rows, open-loop request-rate rows). The crossover is a closed-loop notion:
    rate levels are reported apart, never mixed into the concurrency curves."""
    if "load_mode" not in frame.columns:
        return frame, frame.iloc[0:0]
    is_rate = frame["load_mode"].map(_text).str.lower() == "rate"
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


def load_request_errors(results_dir: str, limit: int = 3) -> tuple[dict, list]:
    """The commonest error texts per (host, profile, concurrency) from requests.jsonl.

    Streamed line by line: the file can hold hundreds of thousands of records and only the
    failing ones matter here.
    """
    path = os.path.join(results_dir, REQUESTS)
    counters: dict = {}
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
                # Tail requests cancelled when a level ends are not errors (llm_bench's rule too).
                if not error or str(error).startswith(CANCELLED_PREFIX):
                    continue
                key = (
                    str(record.get("host")),
                    str(record.get("profile")),
                    record.get("concurrency"),
                )
                counters.setdefault(key, Counter())[str(error)[:160]] += 1
    except FileNotFoundError:
        return {}, []
    warnings = [f"{path}: {bad_lines} unreadable line(s) skipped"] if bad_lines else []
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
    manifest, _ = load_manifest(results_dir)
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
        levels, warnings = load_levels(results_dir, max_error_rate)
    except ReportError as exc:
        raise ReportError(str(exc) + _recorded_failures(results_dir)) from None
    levels, rate_levels = split_load_modes(levels)
    if levels.empty:
        raise ReportError(
            f"{os.path.join(results_dir, LEVELS)} holds only open-loop (request-rate) "
            "levels; the report compares profiles over closed-loop concurrency levels"
        )
    manifest, more = load_manifest(results_dir)
    warnings += more
    errors, more = load_request_errors(results_dir)
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
    )
