"""The workloads users bring (issue 28, item 2), sent by llm_bench to the simulator: every prompt
arrives whole (the simulator's prompt_tokens are its own count of what it received) and the level
row says how the workload counted its input lengths (`prompt_token_source`)."""
from __future__ import annotations

import json

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    level_configs, run_levels,
)
from simproc import ServerProcess


def sweep(url, workload):
    configs, loaded = level_configs({
        "base_url": url, "model": "servelab-sim", "concurrency": [2], "max_tokens": 8,
        "level_seconds": 1.0, "level_timeout": 60, "server_metrics": False,
        "warmup_requests": 1, "min_latency_samples": 4, "drain_timeout": 0,
        "workload": workload})
    outcome = run_levels(configs, loaded)
    assert outcome.failure is None
    return loaded, outcome.levels[0], outcome.requests


def test_shared_prefix_and_sharegpt_workloads_reach_the_server_whole(tmp_path):
    share = tmp_path / "sharegpt.json"
    share.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "question number %d about the things "
                                                      "we see" % i},
                           {"from": "gpt", "value": "an answer of six words here"}]}
        for i in range(6)]))
    with ServerProcess("--profile", "fixed") as srv:
        sp, sp_row, sp_requests = sweep(srv.url, {
            "kind": "shared_prefix", "groups": 2, "prompts_per_group": 3, "prefix_tokens": 48,
            "question_tokens": 16, "output_tokens": 6})
        sg, sg_row, sg_requests = sweep(srv.url, {"kind": "sharegpt", "path": str(share)})
    assert sp_row["prompt_token_source"] == "words" and sp_row["errors"] == 0
    assert sg_row["prompt_token_source"] == "words" and sg_row["errors"] == 0
    ok = [r for r in sp_requests if r["error"] is None]
    assert ok
    # The simulator counts ceil(bytes / 4) of all the messages' text: the 3-letter words (4 bytes
    # with their space) are one token each, so prefix + question come to about 64.
    assert all(60 <= r["prompt_tokens"] <= 68 for r in ok)
    assert all(r["completion_tokens"] == 6 for r in ok)       # ignore_eos, as synthetic
    sg_ok = [r for r in sg_requests if r["error"] is None]
    assert sg_ok and all(r["completion_tokens"] <= 6 for r in sg_ok)   # the answer's length


def test_a_tokenizer_is_named_in_the_level_row(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "the": 1, "and": 2}
    vocab.update({str(d): 3 + d for d in range(10)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    with ServerProcess("--profile", "fixed") as srv:
        _w, row, _requests = sweep(srv.url, {"kind": "synthetic", "input_tokens": 16,
                                             "output_tokens": 4, "count": 8,
                                             "tokenizer": str(path)})
    assert row["prompt_token_source"] == "tokenizer:%s" % path


# The order-keeping workloads need the load generator's hooks (level.WORKLOAD_HOOKS: each trace
# request at its own time, each worker's turns in order). These tests are ready for the level
# that has them and skip where it does not (the options refuse those kinds there:
# tests/unit/test_loadgen_workload_kinds.py).
def _hooks():
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import level
    return getattr(level, "WORKLOAD_HOOKS", ())


@pytest.mark.skipif("arrivals" not in _hooks(), reason="level has no `arrivals` hook yet")
@pytest.mark.parametrize("processes", [1, 2])
def test_a_trace_is_replayed_at_its_timestamps_with_its_lengths(tmp_path, processes):
    offsets_ms = [0, 100, 150, 400, 420, 700, 900, 1000, 1300, 1350, 1600, 1900]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 5000 + t, "input_length": 10 + 7 * i,
                                         "output_length": 4}) + "\n"
                             for i, t in enumerate(offsets_ms)))
    with ServerProcess("--profile", "fixed") as srv:
        configs, loaded = level_configs({
            "base_url": srv.url, "model": "servelab-sim", "concurrency": [4],
            "load_mode": "rate", "request_rate": [6.0], "processes": processes,
            "level_seconds": 2.2, "level_timeout": 60, "server_metrics": False,
            "warmup_requests": 0, "min_latency_samples": 0, "drain_timeout": 0,
            "workload": {"kind": "trace", "path": str(trace)}})
        outcome = run_levels(configs, loaded)
    sent = sorted((r for r in outcome.requests if r["t_send"]), key=lambda r: r["t_send"])
    assert len(sent) == len(offsets_ms) and all(r["error"] is None for r in sent)
    # Scheduled at the trace's offsets exactly (t_send - queue_ms is the scheduled time), sent on
    # time but for the lateness a busy 2-core machine adds.
    scheduled = sorted(r["t_send"] - r["queue_ms"] * 1e6 for r in sent)
    assert [round((t - scheduled[0]) / 1e6, 1) for t in scheduled] == offsets_ms
    lateness = sorted(r["queue_ms"] for r in sent)
    assert lateness[len(lateness) // 2] < 30
    by_schedule = sorted(sent, key=lambda r: r["t_send"] - r["queue_ms"] * 1e6)
    for i, r in enumerate(by_schedule):
        # the simulator's own count (ceil(bytes / 4)) of the prompt built to the trace's length
        assert abs(r["prompt_tokens"] - (10 + 7 * i)) <= 2


@pytest.mark.skipif("conversations" not in _hooks(), reason="level has no `conversations` hook yet")
def test_multi_turn_turns_go_in_order_each_after_the_previous_answer():
    with ServerProcess("--profile", "fixed") as srv:
        configs, loaded = level_configs({
            "base_url": srv.url, "model": "servelab-sim", "concurrency": [2], "max_tokens": 8,
            "level_seconds": 1.0, "level_timeout": 60, "server_metrics": False,
            "warmup_requests": 0, "min_latency_samples": 0, "drain_timeout": 0,
            "workload": {"kind": "multi_turn", "conversations": 4, "turns": 3,
                         "input_tokens": 10, "output_tokens": 5}})
        outcome = run_levels(configs, loaded)
    assert outcome.failure is None
    for worker in (0, 1):
        sent = sorted((r for r in outcome.requests if r["worker"] == worker and r["t_send"]),
                      key=lambda r: r["t_send"])
        tokens = [r["prompt_tokens"] for r in sent if r["error"] is None]
        assert len(tokens) >= 6
        # turn 1, then turn 1 + its answer + turn 2, then ... and the next conversation
        assert tokens[0] < tokens[1] < tokens[2] and tokens[3] == tokens[0]
        assert all(b["t_send"] >= a["t_last"] for a, b in zip(sent, sent[1:]) if a["t_last"])
