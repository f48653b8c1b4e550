"""llm_bench's result files: parts, levels.csv and requests.jsonl (results/parts.py)."""
from __future__ import annotations

import csv
import json
import multiprocessing
import os

from ansible_collections.servelab.serving.plugins.module_utils.results.levels import EXTRA_COLUMNS
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    part_stem, read_levels_csv, read_parts, rebuild_run_files, write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.manifest import run_lock
from ansible_collections.servelab.serving.plugins.module_utils.results.contract import (
    LEVEL_COLUMNS, LEVELS, PARTS_DIR, REQUESTS,
)


def row(host, profile, c, **extra):
    r = {col: None for col in LEVEL_COLUMNS}
    r.update(host=host, profile=profile, concurrency=c, requests=c * 10, errors=0,
             output_tok_s=100.0 * c, client_limited=False, load_mode="concurrency",
             server_metrics={})
    r.update(extra)
    return r


def requests_for(r, n):
    return [{"host": r["host"], "profile": r["profile"], "concurrency": r["concurrency"],
             "request_id": i} for i in range(n)]


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_rebuild_orders_levels_and_concatenates_requests(tmp_path):
    parts = tmp_path / PARTS_DIR
    rows = [row("h2", "baseline", 1), row("h1", "eagle3", 10), row("h1", "eagle3", 2,
            server_metrics={"server_spec_accept_length_mean": 3.2}), row("h1", "baseline", 5)]
    for i, r in enumerate(rows):
        write_level_files(str(parts), r, requests_for(r, i + 1), ["note %d" % i])
    rebuilt = rebuild_run_files(str(tmp_path))
    assert [(r["host"], r["profile"], r["concurrency"]) for r in rebuilt] == [
        ("h1", "baseline", 5), ("h1", "eagle3", 2), ("h1", "eagle3", 10), ("h2", "baseline", 1)]
    with open(tmp_path / LEVELS) as fh:
        header = fh.readline().strip().split(",")
    assert header[:len(LEVEL_COLUMNS)] == list(LEVEL_COLUMNS)
    assert header[len(LEVEL_COLUMNS):len(LEVEL_COLUMNS) + len(EXTRA_COLUMNS)] == list(
        EXTRA_COLUMNS)
    assert "server_spec_accept_length_mean" in header
    table = read_csv(tmp_path / LEVELS)
    assert [t["concurrency"] for t in table] == ["5", "2", "10", "1"]
    assert table[1]["server_spec_accept_length_mean"] == "3.2"
    assert table[0]["client_limited"] == "false" and table[0]["output_tok_s_ci95"] == ""
    # Read back typed: flags are flags, blanks are None, server figures back in their dict.
    typed = read_levels_csv(str(tmp_path / LEVELS))
    assert typed[0]["client_limited"] is False and typed[0]["output_tok_s_ci95"] is None
    assert typed[0]["concurrency"] == 5 and typed[1]["server_metrics"] == {
        "server_spec_accept_length_mean": 3.2}
    lines = (tmp_path / REQUESTS).read_text().splitlines()
    assert len(lines) == 1 + 2 + 3 + 4
    assert json.loads(lines[0])["concurrency"] == 5      # in level order


def test_part_names_are_unique_per_level_and_safe():
    assert part_stem(row("gpu/1", "eagle 3", 7)) == "gpu_1__eagle_3__c7"
    rate = row("h", "p", 64, load_mode="rate", request_rate=2.5)
    assert part_stem(rate) == "h__p__c64__r2p5"


def test_a_part_without_its_json_is_not_a_level(tmp_path):
    parts = tmp_path / PARTS_DIR
    write_level_files(str(parts), row("h", "p", 1), [])
    (parts / "h__p__c2.jsonl").write_text('{"x": 1}\n')   # a level cut before its .json
    assert [r["concurrency"] for r, _path in read_parts(str(parts))] == [1]


def _writer(run_dir, c):
    r = row("host%d" % (c % 3), "p", c)
    write_level_files(os.path.join(run_dir, PARTS_DIR), r, requests_for(r, 2))
    with run_lock(run_dir):
        rebuild_run_files(run_dir)


def test_parallel_writers_lose_no_level(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), c)) for c in range(1, 13)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    table = read_csv(tmp_path / LEVELS)
    assert sorted(int(t["concurrency"]) for t in table) == list(range(1, 13))
    assert len((tmp_path / REQUESTS).read_text().splitlines()) == 24
