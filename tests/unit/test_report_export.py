"""The exports bench_report writes beside report.html: levels.json (valid against the
levels.schema.json written with it), levels.parquet and requests.parquet with typed columns, and
the columns that make them self-describing (engine, version, model, time scale, GPUs)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict

import jsonschema
import pandas as pd

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    CANCELLED_PREFIX, RequestTiming, level_row, reduce_requests, request_row,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    MANIFEST, PARTS_DIR, atomic_write_json,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import write_level_files
from ansible_collections.servelab.serving.plugins.plugin_utils.report import export
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report, write_report

MS = 1_000_000


def timing(i, t_send_ms, in_window, error=None):
    times = [int((t_send_ms + 20 + 5 * k) * MS) for k in range(4)]
    return RequestTiming(worker=i % 2, request_id=i, t_send=int(t_send_ms * MS),
                         t_first=times[0], t_last=times[-1], prompt_tokens=12,
                         completion_tokens=4, tokens_source="server", chunks=4, error=error,
                         in_window=in_window, chunk_times=times, chunk_tokens=[1, 1, 1, 1],
                         server_id="req-%d" % i)


def make_run(tmp_path, profiles=("baseline", "eagle3")):
    run = tmp_path / "run-x"
    parts = run / PARTS_DIR
    os.makedirs(parts)
    ws, we = 100 * MS, 1100 * MS
    for p, profile in enumerate(profiles):
        for c in (1, 2, 4):
            reqs = [timing(i, 10 + 40 * i, 100 <= 10 + 40 * i < 1100) for i in range(30)]
            reqs.append(timing(99, 1150, False, error=CANCELLED_PREFIX + " level over"))
            part = reduce_requests(reqs, ws, we, 5, {})
            row = asdict(level_row("gpu1", profile, c, part, {}))
            row["output_tok_s"] = (100.0 + 50 * p) * c
            row["server_metrics"] = {"server_running_reqs_mean": float(c)}
            rows = []
            for r in reqs:
                rec = request_row(r, ws, we, 1_700_000_000 * 10**9)
                rec.update(host="gpu1", profile=profile, concurrency=c)
                rows.append(rec)
            write_level_files(str(parts), row, rows)
    atomic_write_json(str(run / MANIFEST), {
        "run_id": "run-x",
        "hosts": {"gpu1": {"gpu_facts": {"gpus": [{"name": "NVIDIA H200"}] * 8},
                           "bench": {"engine": "simulator", "model": "servelab-sim"}}},
        "profiles": {name: {"gpu1": {"engine": "simulator", "status": "finished",
                                     "simulator": {"profile": name, "time_scale": 20}}}
                     for name in profiles},
    })
    return run


def test_exports_are_typed_self_describing_and_valid(tmp_path):
    run = make_run(tmp_path)
    changed = write_report(build_report(str(run)))
    assert set(export.EXPORT_FILES) <= set(changed)
    levels = pd.read_parquet(run / export.LEVELS_PARQUET)
    assert len(levels) == 6
    assert str(levels["concurrency"].dtype) == "Int64"
    assert str(levels["output_tok_s"].dtype) == "float64"
    assert str(levels["client_limited"].dtype) == "boolean"
    assert str(levels["profile"].dtype).startswith("string")
    assert set(levels["engine"]) == {"simulator"} and set(levels["model"]) == {"servelab-sim"}
    assert set(levels["time_scale"]) == {20.0} and set(levels["gpu_name"]) == {"NVIDIA H200"}
    assert set(levels["gpu_count"]) == {8} and set(levels["run_id"]) == {"run-x"}
    assert list(levels["server_running_reqs_mean"]) == [1.0, 2.0, 4.0] * 2
    requests = pd.read_parquet(run / export.REQUESTS_PARQUET)
    assert len(requests) == 6 * 31
    assert str(requests["t_send"].dtype) == "Int64"
    assert str(requests["in_window"].dtype) == "boolean"
    assert set(requests["phase"]) == {"warmup", "window", "tail", "cancelled"}
    assert set(requests["error_kind"].dropna()) == {"cancelled"}
    assert requests["t_send_unix_ns"].min() > 1_700_000_000 * 10**9
    document = json.loads((run / export.LEVELS_JSON).read_text())
    schema = json.loads((run / export.LEVELS_SCHEMA).read_text())
    jsonschema.validate(document, schema)
    assert document["schema_version"] == export.SCHEMA_VERSION
    units = {c["name"]: c.get("unit") for c in document["columns"]}
    assert units["ttft_p50_ms"] == "ms" and units["output_tok_s"] == "tok/s"


def test_the_schema_refuses_a_document_that_breaks_it(tmp_path):
    run = make_run(tmp_path, profiles=("baseline",))
    write_report(build_report(str(run)))
    document = json.loads((run / export.LEVELS_JSON).read_text())
    schema = json.loads((run / export.LEVELS_SCHEMA).read_text())
    document["levels"][0]["concurrency"] = "four"
    try:
        jsonschema.validate(document, schema)
    except jsonschema.ValidationError as exc:
        assert "four" in str(exc)
    else:
        raise AssertionError("a text concurrency passed the schema")


def test_a_rebuild_of_the_same_run_writes_nothing_new(tmp_path):
    run = make_run(tmp_path, profiles=("baseline",))
    write_report(build_report(str(run)))
    again = write_report(build_report(str(run)))
    assert not set(export.EXPORT_FILES) & set(again)
