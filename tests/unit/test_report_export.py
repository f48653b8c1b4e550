"""The exports bench_report writes beside report.html: levels.json (valid against the
levels.schema.json written with it), levels.parquet and requests.parquet with typed columns, and
the columns that make them self-describing (engine, version, model, time scale, GPUs)."""
from __future__ import annotations

import json

import jsonschema
import pandas as pd

import reportrun  # tests/ (the root conftest puts it on sys.path)
from ansible_collections.servelab.serving.plugins.plugin_utils.report import export
from ansible_collections.servelab.serving.plugins.plugin_utils.report.build import build_report, write_report


def make_run(tmp_path, profiles=("baseline", "eagle3")):
    """Levels C = 1, 2, 4 with output tok/s (100 + 50 p) x C, a server gauge, and requests in
    every phase (warmup, window, tail, cancelled)."""
    return reportrun.make_run(
        tmp_path, name="run-x", profiles=profiles, levels=(1, 2, 4),
        tok_s={name: (lambda c, p=p: (100.0 + 50 * p) * c) for p, name in enumerate(profiles)},
        failed_request=False,
        server_metrics=lambda c: {"server_running_reqs_mean": float(c)})


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
