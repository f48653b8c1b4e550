"""Profiles: built-in bases, merging, and validation that names the key and the fix."""
import pytest

from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import (
    BUILTIN_PROFILES,
    ProfileError,
    resolve_profile,
)


def test_base_eagle3_merges_user_keys_over_builtin():
    profile = resolve_profile({"base": "eagle3", "model": "/m",
                               "speculative": {"draft_model_path": "/d"}, "tp": 8})
    assert profile.name == "eagle3"
    spec = profile.speculative
    builtin = BUILTIN_PROFILES["eagle3"]["speculative"]
    assert (spec.algorithm, spec.num_steps, spec.eagle_topk, spec.num_draft_tokens) == (
        builtin["algorithm"], builtin["num_steps"], builtin["eagle_topk"],
        builtin["num_draft_tokens"])
    assert spec.draft_model_path == "/d"
    assert profile.tp == 8 and profile.enable_metrics is True


def test_eagle3_v2_builtin_is_spec_v2_with_a_chain_draft():
    profile = resolve_profile({"base": "eagle3_v2", "speculative": {"draft_model_path": "/d"}})
    assert profile.spec_v2 is True
    assert profile.speculative.eagle_topk == 1
    assert profile.speculative.num_draft_tokens == profile.speculative.num_steps + 1


def test_user_keys_win_and_name_defaults_to_base():
    profile = resolve_profile({"base": "eagle3", "name": "eagle3-8",
                               "speculative": {"eagle_topk": 8, "draft_model_path": "/d"}})
    assert profile.name == "eagle3-8" and profile.speculative.eagle_topk == 8


def test_module_model_is_default_and_profile_model_wins():
    assert resolve_profile({"name": "a"}, default_model="/x").model == "/x"
    assert resolve_profile({"name": "a", "model": "/y"}, default_model="/x").model == "/y"


@pytest.mark.parametrize("raw, needles", [
    ({"name": "a", "tpp": 8}, ["unknown key", "tpp", "allowed keys"]),
    ({"name": "a", "speculative": {"algorithm": "EAGLE3", "topk": 4}},
     ["speculative", "unknown key", "topk"]),
    ({"name": "a", "speculative": {"algorithm": "EAGLE3", "num_steps": 3}},
     ["num_steps set without eagle_topk, num_draft_tokens", "together, or none"]),
    ({"name": "a", "speculative": {"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}},
     ["speculative.algorithm is required"]),
    ({"name": "a", "speculative": {"algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                                   "num_draft_tokens": 16}},
     ["num_draft_tokens must be", "num_steps + 1 = 4", "got 16"]),
    ({"base": "eagle3", "spec_v2": True, "speculative": {"draft_model_path": "/d"}},
     ["spec_v2 needs speculative.eagle_topk 1", "got 4"]),
    ({"name": "a", "spec_v2": True}, ["spec_v2 is set but speculative is not"]),
    ({"name": "a", "spec_v2": True, "speculative": {"algorithm": "NGRAM"}},
     ["spec_v2 applies to", "not NGRAM"]),
    ({"name": "a", "spec_v2": True, "speculative": {"algorithm": "EAGLE3"}},
     ["eagle_topk 1", "unset"]),
    ({"base": "eagle3_v2", "env": {"SGLANG_ENABLE_SPEC_V2": "1"}},
     ["env.SGLANG_ENABLE_SPEC_V2 and spec_v2 both set"]),
    ({"name": "a", "tp": "eight"}, ["tp must be an integer"]),
    ({"name": "a", "tp": 0}, ["tp must be an integer >= 1"]),
    ({"name": "a", "mem_fraction_static": 1.5}, ["mem_fraction_static must be a number in (0, 1]"]),
    ({"name": "a", "flashinfer_allreduce_fusion": "fast"},
     ["flashinfer_allreduce_fusion must be true, false or a backend name"]),
    ({"name": "a", "enable_metrics": "sometimes"}, ["enable_metrics must be true or false"]),
    ({"name": "a", "env": {"1BAD": "x"}}, ["not a valid environment variable name"]),
    ({"name": "a", "ready": {"path": "health"}}, ["ready.path must be an absolute URL path"]),
    ({"name": "a", "ready": {"path": "/h", "method": "PUT"}}, ["method must be GET or POST"]),
    ({"base": "eagle4"}, ["profile.base 'eagle4' is not a built-in profile", "baseline"]),
    ({}, ["profile.name is required"]),
])
def test_bad_profiles_fail_with_a_message_naming_the_key(raw, needles):
    with pytest.raises(ProfileError) as err:
        resolve_profile(raw)
    for needle in needles:
        assert needle in str(err.value)


def test_strings_from_templating_are_coerced():
    profile = resolve_profile({"name": "a", "tp": "8", "mem_fraction_static": "0.85",
                               "enable_metrics": "true", "spec_v2": None,
                               "flashinfer_allreduce_fusion": "trtllm",
                               "extra_args": "--foo 1 --bar 'a b'"})
    assert profile.tp == 8 and profile.mem_fraction_static == 0.85
    assert profile.enable_metrics is True and profile.spec_v2 is None
    assert profile.flashinfer_allreduce_fusion == "trtllm"
    assert profile.extra_args == ("--foo", "1", "--bar", "a b")


def test_ready_defaults_to_post_when_a_body_is_given():
    profile = resolve_profile({"name": "a", "ready": {"path": "/v1/chat/completions",
                                                      "body": {"max_tokens": 1}}})
    assert profile.ready.method == "POST" and profile.ready.status == 200
