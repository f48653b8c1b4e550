"""run_level end to end against the stdlib fake server (test_loadgen_fakeserver.py), whose truth
log says when every chunk was really emitted: the window logic, the closed and open loop, the
per-token ITL, errors, and the figures held against the truth.

Tolerances are loose enough for a shared 2-core machine yet far tighter than the errors the tests
guard against (a 4-token chunk read as one token is 4x off; a window that includes the ramp or the
drain skews the figures by whole requests).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from collections import defaultdict

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import level_verdict
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import level_date
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import CANCELLED_PREFIX, percentile
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load
from simproc import ServerProcess

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_loadgen_fakeserver.py")


@contextlib.contextmanager
def fake_server(tmp_path, *args):
    truth = tmp_path / ("truth-%d.jsonl" % time.monotonic_ns())
    with ServerProcess(*args, script=FAKE, truth_log=truth) as srv:
        yield srv.url, truth


def read_truth(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def truth_figures(truth, ws, we):
    """The server's own figures over [ws, we): tokens emitted in it, TTFT/TPOT of requests it
    received in it."""
    tokens = sum(k for rec in truth for t, k in rec["chunks"] if ws <= t < we)
    in_win = [rec for rec in truth if ws <= rec["t_recv_ns"] < we]
    ttft = sorted(rec["t_first_ns"] - rec["t_recv_ns"] for rec in in_win)
    tpot = sorted((rec["t_last_ns"] - rec["t_first_ns"]) / (rec["completion_tokens"] - 1)
                  for rec in in_win if rec["completion_tokens"] > 1)
    return {"output_tok_s": tokens / ((we - ws) / 1e9),
            "ttft_p50_ms": percentile(ttft, 50) / 1e6, "tpot_p50_ms": percentile(tpot, 50) / 1e6}


def cfg(url, **kw):
    base = dict(base_url=url, model="m", concurrency=4, max_tokens=12, level_seconds=1.0,
                level_timeout=60, server_metrics=False)
    base.update(kw)
    return LevelConfig(**base)


WORKLOAD = load({"kind": "builtin"})


def test_closed_loop_window_and_figures_against_truth(tmp_path):
    with fake_server(tmp_path, "--ttft-ms", "25", "--step-ms", "4") as (url, truth_path):
        res = run_level(cfg(url, concurrency=6, warmup_requests=2, slo={"ttft_ms": 1000}),
                        WORKLOAD)
    row, reqs = res.row, res.requests
    ws, we = row.window_start_ns, row.window_end_ns
    assert row.window_complete and we - ws >= 1e9
    by_worker = defaultdict(list)
    for r in reqs:
        by_worker[r["worker"]].append(r)
    assert sorted(by_worker) == list(range(6))
    for rs in by_worker.values():
        rs.sort(key=lambda r: r["t_send"])
        # Closed loop: a worker sends its next request only after its last one finished.
        for a, b in zip(rs, rs[1:]):
            assert b["t_send"] >= a["t_last"]
        # Warmup: each worker finished 2 requests before the window opened.
        assert sum(1 for r in rs if r["t_last"] is not None and r["t_last"] < ws) >= 2
    window = [r for r in reqs if r["in_window"]]
    assert window and all(ws <= r["t_send"] < we for r in window)
    assert all(r["error"] is None for r in window)       # every window request ran to the end
    outside = [r for r in reqs if not r["in_window"]]
    assert all(r["t_send"] < ws or r["t_send"] >= we for r in outside)
    # Each record names its phase by the same rule.
    assert all(r["phase"] == "window" for r in window)
    for r in outside:
        expected = ("cancelled" if (r["error"] or "").startswith(CANCELLED_PREFIX)
                    else "warmup" if r["t_send"] < ws else "tail")
        assert r["phase"] == expected, r
    # The tail that kept the load on was cut, not counted as errors.
    assert row.errors == 0 and row.run_errors == 0
    assert all(r["error"] is None or r["error"].startswith(CANCELLED_PREFIX) for r in reqs)
    assert row.requests == len(window)
    assert row.goodput_request_s == pytest.approx(row.request_s)
    assert row.itl_basis == "token" and row.tokens_source == "server"
    # Dated by its window start on the wall clock (vLLM's `date` format, UTC).
    assert row.date == level_date(row.window_start_unix_ns) and len(row.date) == 15

    truth = truth_figures(read_truth(truth_path), ws, we)
    assert row.output_tok_s == pytest.approx(truth["output_tok_s"], rel=0.03)
    assert row.tpot_p50_ms == pytest.approx(truth["tpot_p50_ms"], rel=0.05)
    assert abs(row.ttft_p50_ms - truth["ttft_p50_ms"]) < 3.0


def test_multi_token_chunks_give_per_token_itl(tmp_path):
    """4 tokens per chunk every 4 x 6 ms: per-token ITL is ~6 ms. Reading a chunk as one token
    (chunk-gap ITL) would report ~24 ms."""
    with fake_server(tmp_path, "--ttft-ms", "20", "--step-ms", "6",
                     "--tokens-per-chunk", "4") as (url, truth_path):
        native = run_level(cfg(url, api="sglang_generate", max_tokens=16), WORKLOAD).row
        chat = run_level(cfg(url, max_tokens=16), WORKLOAD).row
        opaque = run_level(cfg(url, max_tokens=16, per_chunk_usage=False), WORKLOAD).row
    for row in (native, chat):
        assert row.itl_basis == "token"
        assert 4.0 < row.itl_p50_ms < 9.0, row.itl_p50_ms
    # Without per-chunk counts the figure is inter-chunk latency, and labelled so.
    assert opaque.itl_basis == "chunk"
    assert 18.0 < opaque.itl_p50_ms < 32.0, opaque.itl_p50_ms
    # Token counts come from the server either way (16 per request, 4 chunks).
    truth = read_truth(truth_path)
    assert {rec["completion_tokens"] for rec in truth} == {16}
    assert native.tokens_source == chat.tokens_source == opaque.tokens_source == "server"


@pytest.mark.parametrize("server_args", [
    ("--sep", "crlf", "--json-style", "spaced"),
    ("--framing", "close", "--split"),
])
def test_server_variants_parse_the_same(tmp_path, server_args):
    with fake_server(tmp_path, "--ttft-ms", "10", "--step-ms", "3", *server_args) as (url, _truth):
        res = run_level(cfg(url, concurrency=3, level_seconds=0.6), WORKLOAD)
    row = res.row
    assert row.errors == 0 and row.requests > 0
    done = [r for r in res.requests if r["error"] is None]
    assert done and all(r["completion_tokens"] == 12 and r["chunks"] == 12 for r in done)


def test_errors_are_counted_and_the_level_goes_on(tmp_path):
    with fake_server(tmp_path, "--ttft-ms", "5", "--step-ms", "2", "--fail-every", "4") as (
            url, _truth):
        res = run_level(cfg(url, concurrency=2, level_seconds=0.8), WORKLOAD)
    row = res.row
    assert row.run_errors > 0 and row.first_error.startswith("HTTP 500")
    assert row.run_requests > row.run_errors
    assert not level_verdict(res.row_dict()).failed


def test_no_server_stops_the_level_as_failing(tmp_path):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                  # nothing listens there now
    res = run_level(cfg("http://127.0.0.1:%d" % port, concurrency=2), WORKLOAD)
    assert res.row.stop_reason == "server failing"
    assert res.row.run_errors > 0 and "connect failed" in res.row.first_error
    verdict = level_verdict(res.row_dict())
    assert verdict.failed and "failed" in verdict.reason


def test_two_client_processes_share_the_workers(tmp_path):
    with fake_server(tmp_path, "--ttft-ms", "15", "--step-ms", "4") as (url, truth_path):
        res = run_level(cfg(url, concurrency=6, processes=2), WORKLOAD)
    row = res.row
    assert row.client_processes == 2
    assert sorted({r["worker"] for r in res.requests}) == list(range(6))
    assert len({r["request_id"] for r in res.requests}) == len(res.requests)
    truth = truth_figures(read_truth(truth_path), row.window_start_ns, row.window_end_ns)
    assert row.output_tok_s == pytest.approx(truth["output_tok_s"], rel=0.03)


def test_open_loop_constant_rate(tmp_path):
    with fake_server(tmp_path, "--ttft-ms", "10", "--step-ms", "2") as (url, _truth):
        res = run_level(cfg(url, concurrency=16, load_mode="rate", request_rate=25.0,
                            arrival="constant", level_seconds=1.2, warmup_requests=3),
                        WORKLOAD)
    row = res.row
    assert row.load_mode == "rate" and row.request_rate == 25.0
    assert row.request_s == pytest.approx(25.0, rel=0.2)
    sched = sorted(r["t_send"] for r in res.requests if r["error"] is None)
    gaps = sorted(b - a for a, b in zip(sched, sched[1:]))
    assert percentile(gaps, 50) / 1e6 == pytest.approx(40.0, rel=0.2)   # 1/25 s apart
    queued = [r["queue_ms"] for r in res.requests if r["queue_ms"] is not None]
    assert queued and percentile(sorted(queued), 50) < 5.0   # capacity to spare: no queueing


def test_adaptive_precision_runs_until_the_interval_is_narrow(tmp_path):
    with fake_server(tmp_path, "--ttft-ms", "10", "--step-ms", "3") as (url, _truth):
        row = run_level(cfg(url, concurrency=4, level_seconds=0.5, target_ci_pct=3.0,
                            level_timeout=30), WORKLOAD).row
    assert row.window_complete
    assert row.output_tok_s_ci95 / row.output_tok_s * 100 <= 3.0 * 1.5


def test_a_trace_needs_rate_and_multi_turn_needs_concurrency_before_anything_is_sent():
    """The workload hooks (level.WORKLOAD_HOOKS) keep an order only in their own load mode: a
    trace's arrivals are its schedule (rate), turns wait for the previous answer (concurrency)."""
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.prompts import (
        Prompt, Workload,
    )
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LoadgenError
    prompts = [Prompt(messages=[{"role": "user", "content": "hi"}]) for _n in range(2)]
    base = "http://127.0.0.1:1"     # nothing listens: the refusal comes first
    trace = Workload("trace", prompts, arrivals_s=[0.0, 0.1])
    with pytest.raises(LoadgenError, match="workload.kind trace: .*needs load_mode: rate"):
        run_level(LevelConfig(base_url=base, model="m", load_mode="concurrency"), trace)
    turns = Workload("multi_turn", prompts, conversations=[[0, 1]])
    with pytest.raises(LoadgenError, match="workload.kind multi_turn: .*needs load_mode: "
                                           "concurrency"):
        run_level(LevelConfig(base_url=base, model="m", load_mode="rate", request_rate=1.0),
                  turns)
