"""Workloads (workloads.py) and option validation (loadgen_options.py)."""
from __future__ import annotations

import json

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    BenchOptionsError, level_configs,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import WorkloadError, builtin, load, synthetic


def test_builtin_set_is_varied_coding_and_agentic_prompts():
    w = builtin()
    assert len(w.prompts) >= 20
    lengths = sorted(len(p.messages[-1]["content"]) for p in w.prompts)
    assert lengths[-1] > 10 * lengths[0]          # short questions and long agent transcripts
    assert len({p.text for p in w.prompts}) == len(w.prompts)
    assert all(p.messages[0]["role"] == "system" for p in w.prompts)
    assert any("tool_call" in p.text for p in w.prompts)


def test_synthetic_prompts_have_the_lengths_asked_and_distinct_prefixes():
    w = synthetic(input_tokens=100, output_tokens=33, count=12, seed=4)
    assert len(w.prompts) == 12
    assert all(p.max_tokens == 33 and p.ignore_eos for p in w.prompts)
    assert all(len(p.text.split()) == 100 for p in w.prompts)
    assert len({p.text.split()[0] for p in w.prompts}) == 12      # no shared cached prefix
    assert synthetic(100, 33, 12, seed=4).prompts[3].text == w.prompts[3].text
    spread = synthetic(100, 40, 50, spread=0.5, seed=1)
    outs = {p.max_tokens for p in spread.prompts}
    assert min(outs) >= 20 and max(outs) <= 60 and len(outs) > 5


def test_jsonl_workload(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "a"}) + "\n\n" + json.dumps(
        {"messages": [{"role": "user", "content": "b"}], "max_tokens": 9}) + "\n")
    w = load({"kind": "jsonl", "path": str(path)})
    assert [p.text for p in w.prompts] == ["a", "b"]
    assert w.prompts[1].max_tokens == 9
    path.write_text('{"prompt": "a"}\n{"text": 1}\n')
    with pytest.raises(WorkloadError, match="line 2"):
        load({"kind": "jsonl", "path": str(path)})
    with pytest.raises(WorkloadError, match="workload.path"):
        load({"kind": "jsonl", "path": str(tmp_path / "missing.jsonl")})


@pytest.mark.parametrize("spec, field", [
    ({"kind": "nope"}, "workload.kind"),
    ({"kind": "synthetic", "output_tokens": 5}, "workload.input_tokens"),
    ({"kind": "synthetic", "input_tokens": 0, "output_tokens": 5}, "workload.input_tokens"),
    ({"kind": "synthetic", "input_tokens": 5, "output_tokens": 5, "spread": 1.5},
     "workload.spread"),
    ({"kind": "builtin", "prompts": 3}, "unknown key"),
    ({"kind": "jsonl"}, "workload.path"),
])
def test_bad_workloads_name_the_field(spec, field):
    with pytest.raises(WorkloadError, match=field):
        load(spec)
    assert load({"type": "builtin"}).kind == "builtin"      # `type` is accepted for `kind`


BASE = {"base_url": "http://127.0.0.1:1", "model": "m", "concurrency": [1, 4]}


@pytest.mark.parametrize("change, field", [
    ({"concurrency": []}, "concurrency"),
    ({"concurrency": [1, 0]}, "concurrency"),
    ({"base_url": "localhost:30000"}, "base_url"),
    ({"model": ""}, "model"),
    ({"slo": {"ttft": 5}}, "slo.ttft"),
    ({"slo": {"ttft_ms": -1}}, "slo.ttft_ms"),
    ({"level_seconds": 10, "level_timeout": 5}, "level_timeout"),
    ({"load_mode": "rate"}, "request_rate"),
    ({"load_mode": "rate", "request_rate": [1], "concurrency": [1, 2]}, "concurrency"),
    ({"request_rate": [2]}, "request_rate"),
    ({"target_ci_pct": 0}, "target_ci_pct"),
    ({"workload": {"kind": "synthetic"}}, "workload"),
])
def test_bad_options_fail_before_any_load_naming_the_field(change, field):
    with pytest.raises(BenchOptionsError, match=field):
        level_configs(dict(BASE, **change))


def test_level_configs_one_per_level():
    configs, workload = level_configs(dict(BASE, slo={"ttft_ms": "200"}, processes=0))
    assert [c.concurrency for c in configs] == [1, 4]
    assert configs[0].slo == {"ttft_ms": 200.0}
    assert all(c.processes == 0 for c in configs)     # automatic: resolved per level by run_level
    rate, _workload = level_configs(dict(BASE, concurrency=[64], load_mode="rate",
                                         request_rate=[0.5, 2]))
    assert [(c.concurrency, c.request_rate) for c in rate] == [(64, 0.5), (64, 2.0)]
    assert workload.kind == "builtin"


def test_synthetic_input_tokens_mean_the_same_to_the_simulator():
    """`input_tokens` is honoured by the simulator's token rule (one 4-byte word per token), so
    the embedded default sends the prompt length the field fit assumes."""
    from ansible_collections.servelab.serving.plugins.module_utils.simulator.tokens import (
        prompt_tokens_for_text,
    )
    for n in (16, 2048):
        for prompt in synthetic(input_tokens=n, output_tokens=8, count=5, seed=3).prompts:
            counted = prompt_tokens_for_text(prompt.messages[0]["content"])
            assert abs(counted - n) <= 2, (n, counted)
