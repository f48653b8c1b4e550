"""llm_bench figures held against the simulator's truth (module_utils/simulator/).

The simulator logs, per request, when it received it and when it emitted every chunk and how many
tokens each carried (CLOCK_MONOTONIC, the client's clock too). These tests recompute the figures
from that truth over the window llm_bench chose and compare: window output tok/s, TPOT, TTFT,
per-token ITL with multi-token chunks (where chunk-gap ITL would be off by the chunk size), and the
server-side /metrics window figures. They fail when the window, token or ITL logic is broken.

Tolerances are wide enough for a shared, noisy 2-core machine; the precise figures are the
benchmark's job (benchmarks/client_bench.py).
"""
from __future__ import annotations

import contextlib
import os
import time

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import percentile, weighted_percentile
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import synthetic
from simproc import ServerProcess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIMULATOR = os.path.join(REPO, "plugins", "module_utils", "simulator")

pytestmark = pytest.mark.skipif(not os.path.exists(SIMULATOR), reason="simulator not present")


@contextlib.contextmanager
def simulator(tmp_path, profile, *extra):
    truth = tmp_path / ("truth-%s-%d.jsonl" % (profile, time.monotonic_ns()))
    with ServerProcess("--profile", profile, *extra, truth_log=truth) as srv:
        box = {}

        def records():
            # The truth log is flushed at shutdown: stop the simulator first.
            srv.stop()
            if "records" not in box:
                box["records"] = srv.truth_records()
            return box["records"]

        yield srv.url, records


def truth_over(records, ws, we):
    ok = [r for r in records if not r.get("error") and r.get("t_first_ns")]
    tokens = sum(k for r in ok for t, k in zip(r["chunk_ns"], r["chunk_tokens"]) if ws <= t < we)
    inside = [r for r in ok if ws <= r["t_recv_ns"] < we]
    ttft = sorted(r["t_first_ns"] - r["t_recv_ns"] for r in inside)
    tpot = sorted((r["t_last_ns"] - r["t_first_ns"]) / (r["completion_tokens"] - 1)
                  for r in inside if r["completion_tokens"] > 1)
    itl = []
    for r in inside:
        t, k = r["chunk_ns"], r["chunk_tokens"]
        itl.extend(((t[i] - t[i - 1]) / k[i], k[i]) for i in range(1, len(t)))
    return {"tok_s": tokens / ((we - ws) / 1e9), "ttft_ms": percentile(ttft, 50) / 1e6,
            "tpot_ms": percentile(tpot, 50) / 1e6,
            "itl_ms": weighted_percentile(itl, 50) / 1e6, "requests": len(inside)}


def level(url, c, **kw):
    base = dict(base_url=url, model="servelab-sim", concurrency=c, max_tokens=24,
                ignore_eos=True, level_seconds=1.5, level_timeout=90, server_metrics=False,
                ramp_seconds=0.2)
    base.update(kw)
    workload = synthetic(32, base["max_tokens"], count=16)
    return run_level(LevelConfig(**base), workload)


def test_fixed_setting_figures_match_the_truth_at_several_levels(tmp_path):
    """50 ms to the first chunk, then 12 ms per chunk: at C = 1, 4, 24 the window's figures are
    those of the server's own log."""
    with simulator(tmp_path, "fixed") as (url, records):
        rows = [level(url, c).row for c in (1, 4, 24)]
        truth = records()
    for row in rows:
        t = truth_over(truth, row.window_start_ns, row.window_end_ns)
        assert row.window_complete and row.errors == 0 and row.requests >= 1
        assert row.output_tok_s == pytest.approx(t["tok_s"], rel=0.02), row.concurrency
        assert row.tpot_p50_ms == pytest.approx(t["tpot_ms"], rel=0.03), row.concurrency
        assert row.ttft_p50_ms == pytest.approx(t["ttft_ms"], abs=5.0), row.concurrency
        # and the truth itself is the setting: 12 ms per token, ~50 ms to the first
        assert t["tpot_ms"] == pytest.approx(12.0, rel=0.05)
        assert row.tokens_source == "server"


def test_multi_token_chunks_per_token_itl_against_truth(tmp_path):
    """3 tokens per chunk, a chunk every 12 ms: per token that is 4 ms. SGLang's native API
    reports per-chunk counts, and so does the OpenAI API with continuous_usage_stats, so
    llm_bench's ITL must match the truth's per-token ITL on both; without per-chunk usage the
    figure is inter-chunk (12 ms) and labelled `chunk`."""
    with simulator(tmp_path, "fixed", "--tokens-per-chunk", "3") as (url, records):
        native = level(url, 4, api="sglang_generate").row
        chat_usage = level(url, 4).row
        chat = level(url, 4, per_chunk_usage=False).row
        truth = records()
    t = truth_over(truth, native.window_start_ns, native.window_end_ns)
    assert native.itl_basis == "token"
    assert t["itl_ms"] == pytest.approx(4.0, rel=0.1)
    assert native.itl_p50_ms == pytest.approx(t["itl_ms"], rel=0.1)
    assert native.output_tok_s == pytest.approx(t["tok_s"], rel=0.02)
    # TPOT counts tokens, not chunks: (t_last - t_first) / (24 - 1) ~ 7 chunks x 12 ms / 23
    assert native.tpot_p50_ms == pytest.approx(t["tpot_ms"], rel=0.03)
    assert chat_usage.itl_basis == "token"
    tu = truth_over(truth, chat_usage.window_start_ns, chat_usage.window_end_ns)
    assert chat_usage.itl_p50_ms == pytest.approx(tu["itl_ms"], rel=0.1)
    assert chat.itl_basis == "chunk"
    assert chat.itl_p50_ms == pytest.approx(12.0, rel=0.1)
    tc = truth_over(truth, chat.window_start_ns, chat.window_end_ns)
    assert chat.output_tok_s == pytest.approx(tc["tok_s"], rel=0.02)  # server usage, not chunks


def test_batched_model_with_speculation_and_server_metrics(tmp_path):
    """The eagle3 profile (continuous batching, multi-token chunks from accepted drafts), run
    20x faster than real time: throughput and per-token ITL against the truth, and the server's
    /metrics differenced over the window."""
    with simulator(tmp_path, "eagle3", "--time-scale", "20") as (url, records):
        res = level(url, 8, api="sglang_generate", max_tokens=64, server_metrics=True,
                    level_seconds=2.0)
        truth = records()
    row = res.row
    t = truth_over(truth, row.window_start_ns, row.window_end_ns)
    assert row.itl_basis == "token"
    assert row.output_tok_s == pytest.approx(t["tok_s"], rel=0.03)
    assert row.itl_p50_ms == pytest.approx(t["itl_ms"], rel=0.15, abs=0.3)
    srv = row.server_metrics
    assert srv, res.warnings
    # Requests spend part of their time outside the batch (the model's per-request overhead), so
    # the server sees between 1 and C of them running, never more.
    assert 1.0 <= srv["server_running_reqs_mean"] <= 8.0
    assert srv["server_generation_tokens_s"] == pytest.approx(row.output_tok_s, rel=0.25)
    assert srv.get("server_spec_accept_length_mean", 0) > 1.0


def test_server_faults_are_recorded_not_fatal(tmp_path):
    """HTTP 500s, error events mid-stream and malformed chunks fail those requests, with the
    reason; the level still measures the rest."""
    with simulator(tmp_path, "fixed", "--error-rate", "0.3", "--malformed-every", "7") as (
            url, records):
        res = level(url, 4, level_seconds=1.5)
        truth = records()
    row = res.row
    failed = [r for r in res.requests if r["error"] and not r["error"].startswith("cancelled:")]
    assert failed and row.run_errors == len(failed)
    reasons = " | ".join(r["error"] for r in failed)
    assert "HTTP 500" in reasons or "server error in stream" in reasons
    assert "malformed chunk" in reasons
    assert row.run_requests > row.run_errors and row.output_tok_s > 0
    # Every request the server says it failed is a failure on the client too.
    server_failed = {r["id"] for r in truth if r.get("error")}
    client_by_id = {r["server_id"]: r for r in res.requests if r.get("server_id")}
    for rid in server_failed & set(client_by_id):
        assert client_by_id[rid]["error"], rid
