"""simulator/knobs.py: SGLang's searched flags in the simulator's terms. That each flag is a real
flag of the pinned releases is checked against their wheels in test_server_engine_rules.py."""
import dataclasses

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.simulator import knobs
from ansible_collections.servelab.serving.plugins.module_utils.simulator.predictor import (
    predict_level,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import (
    PROFILES, SimError, SimProfile, resolve_profile,
)

# issue 27's searched flags
SEARCHED = ("max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs",
            "mem_fraction_static", "speculative_num_steps", "speculative_eagle_topk",
            "speculative_num_draft_tokens")
PROFILE_FIELDS = {f.name for f in dataclasses.fields(SimProfile)}


def test_every_searched_flag_drives_a_field_and_says_how():
    table = {k.flag: k for k in knobs.SGLANG_KNOBS}
    assert set(SEARCHED) <= set(table)
    for knob in knobs.SGLANG_KNOBS:
        assert knob.field in PROFILE_FIELDS, knob
        assert knob.effect and knob.engine_default, knob
    assert set(knobs.FREE_PARAMETERS) <= PROFILE_FIELDS
    assert not set(knobs.FREE_PARAMETERS) & {k.field for k in knobs.SGLANG_KNOBS}
    assert set(knobs.SIMULATOR_KEYS) == PROFILE_FIELDS - {"name", "description"}


def test_flags_become_the_simulator_mapping_and_back():
    flags = {"max_running_requests": 64, "--chunked-prefill-size": 4096,
             "cuda_graph_max_bs_decode": 32, "mem_fraction_static": 0.8,
             "speculative_num_steps": 3, "speculative_eagle_topk": 1,
             "speculative_num_draft_tokens": 4, "enable_mixed_chunk": None}
    params = knobs.simulator_params(flags, base={"profile": "eagle3", "time_scale": 20})
    assert params == {"profile": "eagle3", "time_scale": 20, "max_running": 64,
                      "chunked_prefill_size": 4096, "cuda_graph_max_bs": 32,
                      "mem_fraction_static": 0.8, "spec_num_steps": 3, "spec_eagle_topk": 1,
                      "spec_num_draft_tokens": 4}
    back = knobs.sglang_flags(params)
    assert back["max_running_requests"] == 64 and back["cuda_graph_max_bs"] == 32
    assert back["enable_mixed_chunk"] is True                  # the base profile's (None: kept)
    assert (back["speculative_eagle_topk"], back["speculative_num_draft_tokens"]) == (1, 4)
    assert knobs.sglang_flags("baseline")["speculative_num_steps"] is None
    assert knobs.sglang_flags("baseline")["chunked_prefill_size"] == -1
    p, ts = resolve_profile(params)
    assert ts == 20 and predict_level(params, 8).output_tok_s == predict_level(p, 8, time_scale=20).output_tok_s


def test_topk_one_reads_back_as_the_chain_sglang_runs():
    params = knobs.simulator_params({"speculative_num_steps": 3, "speculative_eagle_topk": 1,
                                     "speculative_num_draft_tokens": 16}, base="eagle3")
    assert knobs.sglang_flags(params)["speculative_num_draft_tokens"] == 4


@pytest.mark.parametrize("flags, says", [
    ({"tp_size": 8}, "tp_size: not a flag the simulator models"),
    ({"mem_fraction_static": 0.2}, "mem_fraction_static 0.2 leaves no KV cache"),
    ({"chunked_prefill_size": "big"}, "chunked_prefill_size must be a int"),
    ({"speculative_num_draft_tokens": 99}, "spec_num_draft_tokens 99"),
])
def test_bad_flags_are_named(flags, says):
    with pytest.raises(SimError) as err:
        knobs.simulator_params(flags, base="eagle3")
    assert says in str(err.value), str(err.value)


def test_a_tuner_candidate_predicts_differently_from_the_base():
    base = predict_level("baseline", 64).output_tok_s
    capped = predict_level(knobs.simulator_params({"max_running_requests": 8}), 64).output_tok_s
    assert capped < 0.5 * base
    assert PROFILES["baseline"].max_running == 256
