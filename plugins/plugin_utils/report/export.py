"""A run's results in the formats the ecosystem reads: levels.json (with its JSON Schema),
levels.parquet and requests.parquet, typed, for pandas, polars, DuckDB and the peers' tools.

Every column's type, unit and meaning come from the field table (module_utils/results/levels.py)
and the request record (module_utils/loadgen/metrics.py request_row), never restated here. Each
level row carries the columns that make a file self-describing without the manifest beside it:
the run, the engine and its version, the model, the simulator's time scale, and the GPUs of the
host it ran on.

Error texts are redacted as the report's are (a server's error body may quote a header or its
own arguments): the secrets the manifest holds and every value a text marks as secret.

Controller only (pandas, pyarrow): bench_report writes these beside report.html; llm_bench writes
the two Parquet files after each level too (parquet_files, plugin_utils/run_exports.py).
"""
from __future__ import annotations

import io
import json
import math

# Controller requirements (requirements.txt), guarded like data.py's: bench_report names what is
# missing instead of failing to load.
try:
    import pandas as pd
except ImportError:  # pragma: no cover - checked by the action plugin
    pd = None

from ansible_collections.servelab.serving.plugins.module_utils.redact import collect_secrets, redact_text
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    KIND_BOOL,
    KIND_FLOAT,
    KIND_INT,
    KIND_STR,
    ROW_COLUMNS,
    csv_columns,
    field_of,
    level_date,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.describing import describe
from ansible_collections.servelab.serving.plugins.plugin_utils.report.peer_export import peer_files

LEVELS_JSON = "levels.json"
LEVELS_SCHEMA = "levels.schema.json"
LEVELS_PARQUET = "levels.parquet"
REQUESTS_PARQUET = "requests.parquet"
EXPORT_FILES = (LEVELS_JSON, LEVELS_SCHEMA, LEVELS_PARQUET, REQUESTS_PARQUET)
# Bumped when a column changes meaning or type; new columns alone do not bump it.
SCHEMA_VERSION = 1

# The self-describing columns, in order: (name, kind, meaning).
DESCRIBING = (
    ("run_id", KIND_STR, "the run the level belongs to"),
    ("engine", KIND_STR, "the serving engine (sglang, vllm, simulator, transformers, external)"),
    ("engine_version", KIND_STR, "the engine's version, where the run recorded it"),
    ("model", KIND_STR, "the model served"),
    ("time_scale", KIND_FLOAT,
     "simulator speed factor against real time; empty for real engines (not rescaled)"),
    ("gpu_name", KIND_STR, "the host's GPU model (the commonest, where it has several)"),
    ("gpu_count", KIND_INT, "GPUs the host has"),
)

# requests.parquet: the request record's columns and their kinds (metrics.request_row, plus the
# host/profile/concurrency/repeat the sweep adds).
REQUEST_COLUMNS = (
    ("host", KIND_STR), ("profile", KIND_STR), ("concurrency", KIND_INT), ("repeat", KIND_INT),
    ("worker", KIND_INT), ("request_id", KIND_INT),
    ("t_send", KIND_INT), ("t_first", KIND_INT), ("t_last", KIND_INT),
    ("t_send_unix_ns", KIND_INT),
    ("prompt_tokens", KIND_INT), ("completion_tokens", KIND_INT), ("tokens_source", KIND_STR),
    ("ttft_ms", KIND_FLOAT), ("e2e_ms", KIND_FLOAT), ("tpot_ms", KIND_FLOAT),
    ("chunks", KIND_INT), ("error", KIND_STR), ("error_kind", KIND_STR),
    ("in_window", KIND_BOOL), ("phase", KIND_STR), ("server_id", KIND_STR),
    ("queue_ms", KIND_FLOAT),
    # The inter-token gaps as the record writes them (module_utils/results/request_itl.py).
    ("itl", KIND_STR), ("itl_basis", KIND_STR),
)
# requests.parquet is written in row groups of this many records: the report holds one group's
# records at a time, not the run's (each record carries its gaps, ~6 bytes a token).
REQUEST_BATCH = 4096

_PANDAS = {KIND_INT: "Int64", KIND_FLOAT: "float64", KIND_BOOL: "boolean", KIND_STR: "string"}
_JSON = {KIND_INT: "integer", KIND_FLOAT: "number", KIND_BOOL: "boolean", KIND_STR: "string"}


# Free-text columns that may quote what a server echoed.
LEVEL_TEXTS = ("first_error",)
REQUEST_TEXTS = ("error",)


def _redacted(record: dict, names, secrets) -> dict:
    for name in names:
        if isinstance(record.get(name), str):
            record[name] = redact_text(record[name], secrets)
    return record


def _described(rows: list, manifest: dict, run_id: str, secrets=frozenset()) -> list:
    known = describe(manifest, run_id)
    blank = {name: None for name, _kind, _meaning in DESCRIBING}
    out = []
    for row in rows:
        flat = {k: v for k, v in row.items() if k != "server_metrics"}
        flat.update(row.get("server_metrics") or {})
        if flat.get("date") is None:    # a level measured before rows had their date
            flat["date"] = level_date(flat.get("window_start_unix_ns"))
        key = (str(row.get("host")), str(row.get("profile")))
        extra = dict(blank, run_id=run_id)
        extra.update({k: v for k, v in known.get(key, {}).items() if v is not None})
        out.append(_redacted(dict(extra, **flat), LEVEL_TEXTS, secrets))
    return out


def level_columns(rows: list) -> list:
    """Describing columns, then levels.csv's (csv_columns: the same columns for every run, in
    the same order, whatever it measured; then the chosen percentiles' columns), then any the
    rows hold that neither defines, sorted (an older or hand-made levels.csv's own columns,
    e.g. `status`)."""
    names = [name for name, _kind, _meaning in DESCRIBING] + csv_columns(
        (k for row in rows for k in row if k.startswith("server_")), (k for row in rows for k in row))
    present = {k for row in rows for k in row}
    return names + sorted(present - set(names))


def _kind(name: str) -> str:
    for described, kind, _meaning in DESCRIBING:
        if described == name:
            return kind
    f = field_of(name)
    if f is not None:
        return f.kind
    return KIND_FLOAT if name.startswith("server_") else KIND_STR


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _typed_frame(records: list, columns: list, kinds: dict) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(records, columns=columns)
    for name in columns:
        kind = kinds[name]
        column = frame[name]
        if kind == KIND_BOOL:
            column = column.map(lambda v: None if _missing(v) else bool(v))
        elif kind == KIND_STR:
            column = column.map(lambda v: None if _missing(v) else str(v))
        elif kind == KIND_INT:
            column = pd.to_numeric(column, errors="coerce").round()
        frame[name] = column.astype(_PANDAS[kind])
    return frame


def _parquet(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, engine="pyarrow", index=False)
    return buf.getvalue()


def levels_schema(columns: list) -> dict:
    """The JSON Schema levels.json follows (draft 2020-12), from the field table."""
    props = {}
    for name in columns:
        kind = _kind(name)
        f = field_of(name)
        meaning = next((m for n, _k, m in DESCRIBING if n == name), None) or (
            f.meaning if f else "the server's /metrics figure %s" % name)
        prop = {"type": [_JSON[kind], "null"], "description": meaning}
        if f is not None and f.unit:
            prop["x-unit"] = f.unit
        props[name] = prop
    required = ["run_id"] + list(ROW_COLUMNS[:3])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://servelab.invalid/schemas/levels-%d.json" % SCHEMA_VERSION,
        "title": "servelab levels.json",
        "type": "object",
        "required": ["schema_version", "run_id", "columns", "levels"],
        "properties": {
            "schema_version": {"const": SCHEMA_VERSION},
            "run_id": {"type": "string"},
            "columns": {"type": "array", "items": {
                "type": "object", "required": ["name", "type"],
                "properties": {"name": {"type": "string"}, "type": {"type": "string"},
                               "unit": {"type": "string"}, "meaning": {"type": "string"}}}},
            "levels": {"type": "array", "items": {
                "type": "object", "required": required, "properties": props,
                "additionalProperties": {"type": ["number", "string", "boolean", "null"]}}},
        },
    }


def _json_value(value):
    if isinstance(value, float) and math.isnan(value):      # NaN: not measured
        return None
    return value


def _request_records(request_files: list, secrets):
    """The request records of `request_files`, one at a time, in order."""
    for path in request_files:
        try:
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    if line.strip():
                        try:
                            record = json.loads(line)
                        except ValueError:
                            continue
                        if isinstance(record, dict):
                            # Written before repeats existed: its level's only measurement.
                            record.setdefault("repeat", 1)
                            yield _redacted(record, REQUEST_TEXTS, secrets)
        except FileNotFoundError:
            continue


def _batches(records, size: int):
    batch = []
    for record in records:
        batch.append(record)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _requests_parquet(request_files: list, secrets) -> bytes:
    """requests.parquet, written REQUEST_BATCH records (one row group) at a time."""
    import pyarrow.parquet as pq    # pandas' Parquet engine (export needs it anyway)
    import pyarrow as pa
    columns, kinds = [n for n, _k in REQUEST_COLUMNS], dict(REQUEST_COLUMNS)
    buf = io.BytesIO()
    writer = None
    try:
        for batch in _batches(_request_records(request_files, secrets), REQUEST_BATCH):
            table = pa.Table.from_pandas(_typed_frame(batch, columns, kinds), preserve_index=False)
            if writer is None:
                writer = pq.ParquetWriter(buf, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:      # no records: the typed, empty table
        return _parquet(_typed_frame([], columns, kinds))
    return buf.getvalue()


def parquet_files(rows: list, request_files: list, manifest: dict, run_id: str) -> dict:
    """levels.parquet and requests.parquet alone, as export_files writes them: what llm_bench
    writes after each level (plugin_utils/run_exports.py), so a run measured without the report
    step has them too."""
    secrets = collect_secrets(manifest)
    described = _described(rows, manifest, run_id, secrets)
    columns = level_columns(described)
    kinds = {name: _kind(name) for name in columns}
    return {LEVELS_PARQUET: _parquet(_typed_frame(described, columns, kinds)),
            REQUESTS_PARQUET: _requests_parquet(request_files, secrets)}


def export_files(rows: list, request_files: list, manifest: dict, run_id: str) -> dict:
    """relative path -> bytes of every export (deterministic bytes: a rebuild of the same run
    writes nothing new)."""
    secrets = collect_secrets(manifest)
    described = _described(rows, manifest, run_id, secrets)
    columns = level_columns(described)
    kinds = {name: _kind(name) for name in columns}
    schema = levels_schema(columns)
    document = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "columns": [dict({"name": n, "type": _JSON[kinds[n]]},
                         **({"unit": field_of(n).unit} if field_of(n) and field_of(n).unit else {}))
                    for n in columns],
        "levels": [{n: _json_value(row.get(n)) for n in columns} for row in described],
    }
    files = {
        LEVELS_JSON: (json.dumps(document, indent=1, sort_keys=False) + "\n").encode("utf-8"),
        LEVELS_SCHEMA: (json.dumps(schema, indent=1) + "\n").encode("utf-8"),
        LEVELS_PARQUET: _parquet(_typed_frame(described, columns, kinds)),
        REQUESTS_PARQUET: _requests_parquet(request_files, secrets),
    }
    files.update(peer_files(rows, request_files, manifest, run_id))
    return files
