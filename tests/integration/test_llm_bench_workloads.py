"""The workloads users bring (issue 28, item 2), sent by llm_bench to the simulator: every prompt
arrives whole (the simulator's prompt_tokens are its own count of what it received) and the level
row says how the workload counted its input lengths (`prompt_token_source`)."""
from __future__ import annotations

import json
import os

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    level_configs, run_levels,
)
from simproc import SIMULATOR, ServerProcess

pytestmark = pytest.mark.skipif(not os.path.exists(SIMULATOR), reason="simulator not present")


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
