"""bench_derived_profiles' preflight (plugin_utils/preflight/derived.py): each mistake named."""
import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.derived import check_derived

PROFILES = [{"name": "baseline", "tp": 8}, {"name": "eagle3", "tp": 8}]


def problems(**values):
    base = {"bench_derived_profiles": ["schedule"], "bench_profiles": PROFILES,
            "bench_engine": "vllm", "bench_derived_source": "eagle3",
            "bench_derived_baseline": "baseline", "bench_server_port": 30000}
    base.update(values)
    found = []
    check_derived(base, lambda name, message: found.append((name, message)))
    return found


def test_a_valid_setting_passes():
    assert problems() == []
    assert problems(bench_derived_profiles=["router"], bench_engine="sglang") == []
    assert problems(bench_derived_profiles=[]) == []


@pytest.mark.parametrize("values, name, words", [
    ({"bench_engine": "sglang"}, "bench_derived_profiles", "SGLang has none: use router"),
    ({"bench_derived_source": "eagle9"}, "bench_derived_source", "is not a profile"),
    ({"bench_derived_source": "baseline"}, "bench_derived_source", "the same profile"),
    ({"bench_derived_profiles": ["router"], "bench_server_port": 65534}, "bench_server_port",
     "take 65535 and 65536"),
    ({"bench_derived_profiles": ["router"], "bench_engine": "sglang",
      "bench_profiles": [{"name": "baseline"}, {"name": "eagle3", "tp": 3}]},
     "bench_derived_profiles", "even tp"),
    ({"bench_derived_profiles": ["router", "router"]}, "bench_derived_profiles", "repeats"),
])
def test_mistakes_are_named(values, name, words):
    found = problems(**values)
    assert any(n == name and words in m for n, m in found), found
