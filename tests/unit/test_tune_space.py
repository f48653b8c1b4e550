"""The tune's search space (plugins/plugin_utils/tune/space.py): lists and ranges parsed into
candidates, bad spaces refused naming tune_space.<flag>, and each candidate made into the trial
profile per engine - SGLang's own profile keys, extra_args, the speculative block, the command
line, the simulator's fields."""
from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.tune.simulator import (
    simulator_fields,
)
from ansible_collections.servelab.serving.plugins.plugin_utils.tune.space import (
    Space, SpaceError, apply, canonical_flag, key,
)


def test_lists_and_ranges_give_the_product():
    space = Space.parse({"max_running_requests": [64, 32],
                         "--chunked-prefill-size": {"min": 2048, "max": 16384, "points": 4,
                                                    "scale": "log"},
                         "mem-fraction-static": {"min": 0.8, "max": 0.9, "step": 0.05}})
    assert space.flags == ("--max-running-requests", "--chunked-prefill-size",
                           "--mem-fraction-static")
    assert space.dims[0].values == (32, 64)
    assert space.dims[1].values == (2048, 4096, 8192, 16384)
    assert space.dims[2].values == (0.8, 0.85, 0.9)
    assert space.size == 2 * 4 * 3 == len(list(space.candidates()))
    # positions: log for a wide numeric axis
    assert space.dims[1].position(4096) == pytest.approx(1 / 3)


@pytest.mark.parametrize("raw, words", [
    ({}, "non-empty mapping"),
    ({"max_running_requests": "32,64"}, "tune_space.max_running_requests must be a list"),
    ({"max_running_requests": [32, 32]}, "listed twice"),
    ({"max_running_requests": [32, "x"]}, "mixed value types"),
    ({"x": {"min": 4, "max": 2}}, "max 2 is below min 4"),
    ({"x": {"min": 0, "max": 2, "points": 3, "scale": "log"}}, "log range needs min > 0"),
    ({"x": {"min": 1, "max": 2, "step": 1, "points": 3}}, "step or points, not both"),
    ({"max_running_requests": [1], "--max-running-requests": [2]}, "same flag"),
    ({"bad flag!": [1]}, "not a flag name"),
])
def test_bad_spaces_name_the_flag(raw, words):
    with pytest.raises(SpaceError, match=words):
        Space.parse(raw)


def test_a_too_large_space_is_refused():
    with pytest.raises(SpaceError, match="combinations"):
        Space.parse({"a": list(range(40)), "b": list(range(40)), "c": list(range(40))})


def test_sglang_flags_go_to_profile_keys_or_extra_args():
    base = {"name": "b", "base": "eagle3", "model": "/m", "extra_args": ["--chunked-prefill-size",
                                                                         "8192", "--x"],
            "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 3,
                            "eagle_topk": 4, "num_draft_tokens": 16}}
    flags = {"--max-running-requests": 64, "--chunked-prefill-size": 4096,
             "--speculative-eagle-topk": 1, "--enable-mixed-chunk": True}
    out = apply(base, "sglang", flags, "t01")
    assert out["name"] == "t01" and out["max_running_requests"] == 64
    assert out["speculative"]["eagle_topk"] == 1 and out["speculative"]["num_steps"] == 3
    assert out["extra_args"] == ["--x", "--chunked-prefill-size", "4096", "--enable-mixed-chunk"]
    assert base["extra_args"][1] == "8192", "the base profile is not changed"


def test_speculative_flags_need_a_speculative_base():
    with pytest.raises(SpaceError, match="no speculative block"):
        apply({"name": "b"}, "sglang", {"--speculative-num-steps": 2}, "t01")


def test_command_flags_replace_or_append_on_the_command_line():
    base = {"name": "b", "command": ["serve", "{model}", "--cb-max-batch-tokens=256",
                                     "--cb-use-cuda-graph", "--port", "{port}"]}
    out = apply(base, "command", {"--cb-max-batch-tokens": 1024, "--cb-use-cuda-graph": False},
                "t02")
    assert out["command"] == ["serve", "{model}", "--port", "{port}", "--cb-max-batch-tokens",
                              "1024"]


def test_simulator_takes_sglang_names_as_its_fields():
    fields = simulator_fields()
    out = apply({"name": "b", "simulator": {"profile": "baseline", "time_scale": 20}},
                "simulator", {"--max-running-requests": 16, "--chunked-prefill-size": 2048},
                "t03", fields)
    assert out["simulator"] == {"profile": "baseline", "time_scale": 20, "max_running": 16,
                                "chunked_prefill_size": 2048}
    assert fields["--cuda-graph-max-bs-decode"] == "cuda_graph_max_bs"


def test_key_is_sorted_and_stable():
    assert key({"--b": 2, "--a": 0.5}) == "a=0.5 b=2" == key({"--a": 0.5, "--b": 2})
    assert canonical_flag("Max_Running_Requests") == "--max-running-requests"


def test_a_candidate_asks_at_least_a_failed_ones_memory_only_when_every_memory_flag_is_larger():
    from ansible_collections.servelab.serving.plugins.plugin_utils.tune.space import asks_at_least
    failed = {"--mem-fraction-static": 0.9, "--cuda-graph-max-bs": 64, "--schedule-policy": "lpm"}
    assert asks_at_least(dict(failed, **{"--cuda-graph-max-bs": 128}), failed)
    assert not asks_at_least(dict(failed, **{"--mem-fraction-static": 0.85}), failed)
    assert not asks_at_least(dict(failed, **{"--schedule-policy": "fcfs"}), failed)
    assert not asks_at_least(failed, failed)
