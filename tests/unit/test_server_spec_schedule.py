"""vLLM's switch by load as a profile setting: vLLM's own schedule rules, the derivation from a
crossover, and where the setting is refused. The rendered command line is a golden file
(tests/data/sglang/golden/vllm-0.33.0/eagle3_schedule.txt, checked by test_server_render.py)."""
import json

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.server import spec_schedule as ss
from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import ProfileError, resolve_profile
from ansible_collections.servelab.serving.plugins.module_utils.server.render import render_server

EAGLE = {"name": "e", "base": "eagle3_v2", "spec_v2": None, "model": "/m",
         "speculative": {"draft_model_path": "/d"}}


def with_schedule(schedule):
    raw = json.loads(json.dumps(EAGLE))
    raw["speculative"]["tokens_per_batch_size"] = schedule
    return raw


@pytest.mark.parametrize("schedule, rule", [
    ([], "non-empty list"),
    ([[2, 4, 3], [5, 256, 0]], "must start at 1"),
    ([[1, 4, 3], [4, 256, 0]], "must not overlap"),
    ([[1, 0, 3]], "start <= end"),
    ([[1, 4, -1]], "tokens must be >= 0"),
    ([[1, 4, 9], [5, 256, 0]], "exceeds the profile's 3 speculative tokens"),
    ([[1, 4]], "each entry is"),
])
def test_schedules_vllm_refuses_are_refused_with_the_rule(schedule, rule):
    with pytest.raises(ProfileError, match=rule):
        resolve_profile(with_schedule(schedule))


def test_a_gap_between_ranges_is_vllms_business_not_an_error():
    # vLLM fills a gap with the previous range's k; its validator accepts it, so do we.
    assert resolve_profile(with_schedule([[1, 3, 3], [6, 256, 0]])).speculative


def test_the_schedule_is_rendered_into_vllms_speculative_config():
    spec = render_server(resolve_profile(with_schedule([[1, 3, 3], [4, 256, 0]])), "vllm",
                         host="127.0.0.1", port=8000, python="/v/bin/python")
    config = json.loads(spec.cmd[spec.cmd.index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 3, 3], [4, 256, 0]]


def test_sglang_has_no_switch_and_says_what_to_do_instead():
    with pytest.raises(ProfileError, match="router"):
        render_server(resolve_profile(with_schedule([[1, 3, 3], [4, 256, 0]])), "sglang",
                      host="127.0.0.1", port=30000, python="/v/bin/python",
                      engine_version="0.5.13.post1")


@pytest.mark.parametrize("bracket_low, concurrency, estimate, keep", [
    (2, 5, 3.6, 3),      # the interpolation lies above the bracket's low end: floor of it
    (2, 5, 2.0, 2),      # exactly at the low end
    (None, 2, None, 1),  # lost from the second level on: at least 1
    (4, 10, None, 4),
])
def test_the_largest_speculating_batch_from_a_crossover(bracket_low, concurrency, estimate, keep):
    assert ss.speculation_max_batch(bracket_low, concurrency, estimate) == keep


def test_built_schedules_pass_vllms_rules():
    for keep in (1, 3, 255, 400):
        built = ss.build_schedule(keep, 3, 256)
        assert ss.validate_schedule(ss.as_lists(built), 3, "s") == built
        assert built[0] == (1, keep, 3) and built[1][2] == 0
