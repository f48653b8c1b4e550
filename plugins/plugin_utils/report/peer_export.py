"""A run's levels as vLLM's `vllm bench sweep` results, for `vllm bench sweep plot` and
`vllm bench sweep plot_pareto` (checked against vLLM 0.33.0; the reader is unchanged since 0.25.0).

Those plotters read every `**/summary.json` under the directory they are given: each a JSON list
of flat run records, the keys `vllm bench serve --save-result` writes (milliseconds for latencies,
tok/s and request/s for throughputs) merged with the sweep's parameters. They group figures, rows,
columns and curves by any key of the record. So each level (host, profile, concurrency; and the
request rate in open loop) becomes one summary.json in the directory `vllm bench sweep serve`
would name for it: the serve setting is the host and profile, the bench setting the concurrency
(vLLM's max_concurrency) and, in open loop, the request rate. A level measured more than once
(repeats) lists every repeat in its summary.json, `run_number` repeat - 1, as `sweep serve
--num-runs` lists its runs.

Only servelab's own figures are written, under vLLM's names and in its units (both are ms and tok/s,
so nothing is rescaled): the names are the field table's (results/levels.py, each field's `vllm`),
the latencies' std included (population std, numpy.std's default, as vLLM's), the percentiles chosen
with bench_percentiles as vLLM names those of its --metric-percentiles (`p95_ttft_ms`,
`p99.9_e2el_ms`), and `date` (the level's window start, in vLLM's format, UTC). What servelab does
not measure is left out, never made up (vLLM's one-second peak output rate). Levels with no output
rate are left out, as `sweep serve` leaves out a combination without a successful run.

Controller only: bench_report writes these beside report.html (export.export_files).
"""
from __future__ import annotations

import json
import math
import os

from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    FIELD, KIND_STR, VLLM_KEYS, level_date, percentile_field,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.percentiles import (
    percentile_columns,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import row_repeat
from ansible_collections.servelab.serving.plugins.plugin_utils.report.analysis import (
    finite_number as _number,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.report.describing import describe

PEER_DIR = "vllm_sweep"
SUMMARY_JSON = "summary.json"

# vLLM's key -> servelab's level field (same unit): the field table's `vllm` names (levels.py),
# the figures, plus `date` (text: when the level was measured, vLLM's format).
_FIGURES = tuple((key, name) for key, name in VLLM_KEYS.items() if FIELD[name].kind != KIND_STR)
_TEXTS = tuple((key, name) for key, name in VLLM_KEYS.items() if FIELD[name].kind == KIND_STR)

# servelab fields carried under their own names, to filter or group by (--filter-by, --curve-by).
_CARRIED = ("host", "profile", "load_mode", "client_limited", "window_complete", "itl_basis",
            "tokens_source", "output_tok_s_ci95")

# What the level does not say; each record says which run it came from and on what.
_DESCRIBING = ("run_id", "engine", "engine_version", "gpu_name", "gpu_count", "time_scale")


def _count(value):
    number = _number(value)
    return None if number is None else int(round(number))


def _bench_setting(row: dict) -> dict:
    """The sweep's bench parameters for a level, as `vllm bench serve` spells them."""
    setting = {"max_concurrency": _count(row.get("concurrency"))}
    if row.get("load_mode") == "rate" and _number(row.get("request_rate")) is not None:
        setting["request_rate"] = _number(row.get("request_rate"))
    return setting


def _as_text(setting: dict) -> str:
    return "-".join("%s=%s" % (k, v) for k, v in setting.items())


def _directory(serve: dict, bench: dict) -> str:
    # `sweep serve` names a combination "SERVE-" + "-" + serve text + "-BENCH-" + "-" + bench
    # text, with '/' and '..' made harmless (its sanitize_filename).
    name = "-".join(("SERVE-", _as_text(serve), "BENCH-", _as_text(bench)))
    return name.replace("/", "_").replace("..", "__").strip("'").strip('"')


def vllm_record(row: dict, described: dict) -> dict:
    """One level as a `vllm bench sweep` run record (the keys its plotters read)."""
    record = {}
    for name in _DESCRIBING:
        record[name] = described.get(name)
    for name in _CARRIED:
        value = row.get(name)
        record[name] = None if isinstance(value, float) and math.isnan(value) else value
    for key, name in _FIGURES:
        record[key] = _number(row.get(name))
    # The percentiles the run asked for beyond p50/p90/p99 (bench_percentiles), under vLLM's
    # names for its --metric-percentiles: p95_ttft_ms, p99.9_e2el_ms.
    for name in percentile_columns(row):
        record[percentile_field(name).vllm[0]] = _number(row.get(name))
    for key, name in _TEXTS:
        value = row.get(name)
        record[key] = value if isinstance(value, str) and value else None
    if record.get("date") is None:      # a level measured before rows had their date
        record["date"] = level_date(row.get("window_start_unix_ns"))
    window = _number(row.get("window_s"))
    output = _number(row.get("output_tok_s"))
    total = _number(row.get("total_tok_s"))
    requests = _count(row.get("requests"))
    errors = _count(row.get("errors")) or 0
    record["completed"] = None if requests is None else requests - errors
    record["failed"] = errors
    record["num_prompts"] = requests
    # Token totals as servelab counts them for its rates: arrived inside the window.
    record["total_output_tokens"] = (
        None if window is None or output is None else int(round(output * window)))
    prompt = (None if window is None or output is None or total is None
              else int(round((total - output) * window)))
    record["total_input_tokens"] = None if prompt is None or prompt < 0 else prompt
    record["model_id"] = described.get("model")
    record["tokenizer_id"] = described.get("model")
    record["backend"] = "servelab"
    record["endpoint_type"] = "servelab"
    record["label"] = row.get("profile")
    bench = _bench_setting(row)
    record["request_rate"] = bench.get("request_rate", "inf")   # closed loop: no arrival rate
    record["burstiness"] = 1.0                                   # Poisson arrivals in open loop
    record.update(bench)
    # vLLM's sweep numbers the runs of one combination (its --num-runs) from 0: a repeat is one.
    record["run_number"] = row_repeat(row) - 1
    return record


def peer_files(rows: list, request_files: list, manifest: dict, run_id: str) -> dict:
    """relative path -> bytes: one vllm_sweep/<combination>/summary.json per measured level
    (deterministic bytes: a rebuild of the same run writes nothing new). `request_files` is not
    read: vLLM's plotters read the level figures only."""
    del request_files
    known = describe(manifest if isinstance(manifest, dict) else {}, run_id)
    records: dict = {}
    for row in sorted(rows, key=row_repeat):
        if _number(row.get("output_tok_s")) is None:
            continue
        described = dict(known.get((str(row.get("host")), str(row.get("profile"))), {}),
                         run_id=run_id)
        serve = {"host": row.get("host"), "profile": row.get("profile")}
        path = os.path.join(PEER_DIR, _directory(serve, _bench_setting(row)), SUMMARY_JSON)
        # The repeats of a level are the runs of one combination: one summary.json lists them.
        records.setdefault(path, []).append(vllm_record(row, described))
    return {path: (json.dumps(runs, indent=4, sort_keys=True, allow_nan=False) + "\n")
            .encode("utf-8") for path, runs in records.items()}
