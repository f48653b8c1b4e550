"""Request records go to disk as they finish (loadgen/spool.py, issue 26 item 4): what comes back
from the spool, the rows files and their merge is exactly what the records held in memory gave:
the same LevelPart, the same level row, the same part file bytes."""
from __future__ import annotations

import dataclasses
import os
import random

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.client import finish_records
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    CANCELLED_PREFIX, RequestTiming, level_row, reduce_requests, request_row, LevelPart,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spool import (
    RecordSpool, RequestRows, spool_directory,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    _jsonl, write_level_files,
)

WS, WE = 1_000_000_000, 3_000_000_000
WALL = 1_700_000_000_000_000_000


def records(seed, n, per_chunk=True):
    """Finished requests in completion order: warmup, window, tail, cancelled, failed."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t_send = rng.randrange(0, 4_000_000_000)
        if rng.random() < 0.1:
            out.append(RequestTiming(worker=i % 7, request_id=i, t_send=t_send,
                                     error="connect failed: refused"))
            continue
        times = sorted(t_send + rng.randrange(1, 500_000_000) for _chunk in range(rng.randrange(1, 40)))
        toks = [rng.choice((1, 1, 2, 3)) for _time in times] if per_chunk else None
        r = RequestTiming(worker=i % 7, request_id=i, t_send=t_send, t_first=times[0],
                          t_last=times[-1], prompt_tokens=rng.randrange(1, 99),
                          completion_tokens=sum(toks) if toks else len(times),
                          tokens_source="server", chunks=len(times), chunk_times=times,
                          chunk_tokens=toks, server_id="id-%d" % i,
                          t_sched=t_send - 5 if i % 3 == 0 else None)
        if rng.random() < 0.05:
            r.error = CANCELLED_PREFIX + " level over (tail request)"
        out.append(r)
    out.sort(key=lambda r: r.t_last or r.t_send)
    return out


def settle(reqs, ws, we):
    for r in reqs:
        r.in_window = bool(ws) and r.t_send >= ws and (not we or r.t_send < we)


def in_memory(cfg, per_process, ws, we):
    """What run_level did before the spool: reduce each list, merge, sort the rows by t_send."""
    merged, rows = LevelPart(), []
    for reqs in per_process:
        settle(reqs, ws, we)
        merged.merge(reduce_requests(reqs, ws, we, cfg.ci_batches, cfg.slo))
        for r in reqs:
            row = request_row(r, ws, we, WALL)
            row.update(host=cfg.host_label, profile=cfg.profile, concurrency=cfg.concurrency,
                       repeat=cfg.repeat)
            rows.append(row)
    rows.sort(key=lambda r: r["t_send"])
    return merged, rows


def spooled(cfg, per_process, ws, we, tmp_path):
    directory = spool_directory()
    merged, indexes = LevelPart(), []
    for i, reqs in enumerate(per_process):
        spool = RecordSpool(os.path.join(directory, "client-%d.spool" % i))
        for r in reqs:
            r.in_window = not r.in_window        # stale live guesses: the spool settles them
            spool.add(r)
            if len(spool.pending) > 3:
                spool.flush()
        ok = [r for r in reqs if r.ok]
        per_token = bool(ok) and all(r.chunk_tokens is not None for r in ok)
        part, index = finish_records(spool, cfg, ws, we, per_token, WALL)
        assert not os.path.exists(spool.path)
        merged.merge(part)
        indexes.append(index)
    return merged, RequestRows(indexes, directory), directory


def test_the_spool_gives_what_the_records_in_memory_gave(tmp_path):
    cfg = LevelConfig(base_url="http://127.0.0.1:9", model="m", concurrency=5,
                      slo={"ttft_ms": 200.0}, host_label="h", profile="p", repeat=2)
    per_process = [records(1, 300), records(2, 250)]
    old_part, old_rows = in_memory(cfg, [[dataclasses.replace(r) for r in reqs]
                                         for reqs in per_process], WS, WE)
    new_part, rows, directory = spooled(cfg, per_process, WS, WE, tmp_path)
    assert dataclasses.asdict(new_part) == dataclasses.asdict(old_part)
    old_part.ws = new_part.ws = WS
    old_part.we = new_part.we = WE
    assert level_row("h", "p", 5, new_part, cfg.slo) == level_row("h", "p", 5, old_part, cfg.slo)
    assert len(rows) == len(old_rows) == 550
    assert "".join(rows.lines()) == "".join(_jsonl(old_rows))
    assert list(rows) == old_rows
    assert rows[3] == old_rows[3]
    row = {"host": "h", "profile": "p", "concurrency": 5, "repeat": 1}
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    _old_csv, old_jsonl = write_level_files(str(tmp_path / "old"), row, old_rows)
    _new_csv, new_jsonl = write_level_files(str(tmp_path / "new"), row, rows)
    with open(old_jsonl, "rb") as old, open(new_jsonl, "rb") as new:
        assert new.read() == old.read()
    rows.close()
    assert not os.path.exists(directory)


def test_without_per_chunk_counts_or_a_window_the_spool_agrees_too(tmp_path):
    cfg = LevelConfig(base_url="http://127.0.0.1:9", model="m", keep_chunks=True)
    for ws, we in ((0, 0), (WS, 0)):
        per_process = [records(3, 120, per_chunk=False)]
        old_part, old_rows = in_memory(cfg, [[dataclasses.replace(r) for r in per_process[0]]],
                                       ws, we)
        new_part, rows, _directory = spooled(cfg, per_process, ws, we, tmp_path)
        assert dataclasses.asdict(new_part) == dataclasses.asdict(old_part)
        assert [r["phase"] for r in rows] == [r["phase"] for r in old_rows]
        assert all("chunk_times" in r for r in rows)
        rows.close()


def test_a_record_comes_back_from_the_spool_field_for_field(tmp_path):
    spool = RecordSpool(str(tmp_path / "s"))
    original = records(4, 40)
    for r in original:
        spool.add(r)
    spool.flush()
    back = list(spool.records(WS, WE))
    settle(original, WS, WE)
    assert [dataclasses.asdict(r) for r in back] == [dataclasses.asdict(r) for r in original]
