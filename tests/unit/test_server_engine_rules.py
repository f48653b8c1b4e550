"""server/engine_rules.py: what each pinned SGLang release does with the searched flags, proven
from the released wheels (downloaded once into .cache/sglang-wheels/, as
test_server_sglang_argdefs.py does; sglang is never imported, its source is read).

For every rule and release: the recorded file:line is where the rule's witness is (or, recorded
as absent, the release has no such line); the checks fire on the combination and stay quiet on
its repaired neighbour; and what the releases do not refuse is checked as absent from their
argument checks. SGLang flag names the simulator's knob table uses are real flags of each release.
"""
import ast
import dataclasses
import functools
import re
import zipfile

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.server import engine_rules
from ansible_collections.servelab.serving.plugins.module_utils.server.argdefs import (
    SGLANG_ARG_SOURCES,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.engine_rules import (
    SGLANG_RULE_RELEASES, SGLANG_RULES, EngineRulesError, check_sglang_flags, locate, refused,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.render_sglang import (
    SGLANG_FLAG_HISTORY, SGLANG_PINNED_VERSIONS,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.versions import parse_version
from ansible_collections.servelab.serving.plugins.module_utils.simulator.knobs import SGLANG_KNOBS

from test_server_sglang_argdefs import defs, sglang_wheel

RELEASES = SGLANG_RULE_RELEASES


@functools.cache
def files(version):
    with zipfile.ZipFile(sglang_wheel(version)) as archive:
        return {n: archive.read(n).decode("utf-8") for n in archive.namelist()
                if n.startswith("sglang/srt/") and n.endswith(".py")}


def test_the_rules_cover_the_pinned_releases():
    assert set(SGLANG_PINNED_VERSIONS) <= set(RELEASES)
    for rule in SGLANG_RULES:
        assert set(rule.sources) == set(RELEASES), rule.id
        assert rule.severity in engine_rules.SEVERITIES


def check_source(rule, version):
    found = locate(rule.witness, files(version).get)
    assert found == rule.sources[version], (
        f"{rule.id} in sglang {version}: recorded {rule.sources[version]}, the wheel has it at "
        f"{found}")


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("rule", SGLANG_RULES, ids=lambda r: r.id)
def test_each_recorded_line_holds_its_rule_in_the_released_source(rule, version):
    check_source(rule, version)


@pytest.mark.parametrize("stale", ["sglang/srt/arg_groups/speculative_hook.py:1259", None])
def test_a_wrong_recorded_line_fails_the_source_check(stale):
    """Put a stale line (or 'not in this release') back into a rule: the check must fail."""
    rule = engine_rules._RULES["topk1_draft_rewritten"]
    wrong = dataclasses.replace(rule, sources=dict(rule.sources, **{"0.5.23": stale}))
    with pytest.raises(AssertionError, match="recorded"):
        check_source(wrong, "0.5.23")


# (flags, rule that fires, the repaired flags on which it does not)
EAGLE = {"speculative_algorithm": "EAGLE3", "max_running_requests": 64}
CASES = [
    (dict(EAGLE, max_running_requests=0), "max_running_positive",
     dict(EAGLE, max_running_requests=1)),
    (dict(EAGLE, speculative_eagle_topk=4, speculative_num_draft_tokens=16),
     "spec_shape_all_or_none",
     dict(EAGLE, speculative_num_steps=5, speculative_eagle_topk=4,
          speculative_num_draft_tokens=16)),
    (dict(EAGLE, speculative_num_steps=3, speculative_eagle_topk=1,
          speculative_num_draft_tokens=8), "topk1_draft_rewritten",
     dict(EAGLE, speculative_num_steps=3, speculative_eagle_topk=1,
          speculative_num_draft_tokens=4)),
    (dict(EAGLE, speculative_num_steps=2, speculative_eagle_topk=2,
          speculative_num_draft_tokens=8), "draft_tokens_within_tree",   # 2 + 1 * 4 = 6 < 7
     dict(EAGLE, speculative_num_steps=2, speculative_eagle_topk=2,
          speculative_num_draft_tokens=7)),
    (dict(EAGLE, max_running_requests=None), "spec_max_running_default", EAGLE),
    (dict(EAGLE, cuda_graph_max_bs=32), "cuda_graph_eager_above",
     dict(EAGLE, cuda_graph_max_bs=64)),
    ({"chunked_prefill_size": 1000, "page_size": 64}, "chunked_prefill_page_size",
     {"chunked_prefill_size": 1024, "page_size": 64}),
    ({"chunked_prefill_size": 0}, "chunked_prefill_off", {"chunked_prefill_size": -1}),
    ({"mem_fraction_static": 0.0}, "mem_fraction_no_pool", {"mem_fraction_static": 0.85}),
    ({"mem_fraction_static": 1.0}, "mem_fraction_whole_gpu", {"mem_fraction_static": 0.95}),
    (dict(EAGLE, enable_mixed_chunk=True), "mixed_chunk_off_with_eagle",
     dict(EAGLE, enable_mixed_chunk=False)),
]


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("flags, rule, repaired", CASES, ids=[c[1] for c in CASES])
def test_each_rule_fires_on_its_combination_and_not_on_the_repaired_one(flags, rule, repaired,
                                                                        version):
    hits = [p for p in check_sglang_flags(version, flags) if p.rule == rule]
    source = engine_rules._RULES[rule].sources[version]
    if source is None:                       # not a rule of this release
        assert hits == []
        return
    [problem] = hits
    assert problem.source == source and problem.release == version
    assert problem.message and problem.severity == engine_rules._RULES[rule].severity
    assert not [p for p in check_sglang_flags(version, repaired) if p.rule == rule]


def test_0_5_23_keeps_mixed_chunks_with_eagle():
    spec_info = files("0.5.23")["sglang/srt/speculative/spec_info.py"]
    start = spec_info.index("def supports_mixed_chunk")
    assert "SpeculativeAlgorithm.EAGLE3" in spec_info[start:start + 600]
    assert check_sglang_flags("0.5.23", dict(EAGLE, enable_mixed_chunk=True)) == []


def test_refused_keeps_what_cannot_run():
    problems = check_sglang_flags("0.5.23", {
        "speculative_algorithm": "EAGLE3", "speculative_num_steps": 2, "speculative_eagle_topk": 2,
        "speculative_num_draft_tokens": 8, "max_running_requests": 64, "cuda_graph_max_bs": 8,
        "mem_fraction_static": 0.9})
    assert {p.rule for p in problems} == {"draft_tokens_within_tree", "cuda_graph_eager_above"}
    assert [p.rule for p in refused(problems)] == ["draft_tokens_within_tree"]


def test_another_release_uses_the_nearest_checked_one():
    problems = check_sglang_flags("0.5.20", {"max_running_requests": 0})
    assert {p.rule for p in problems} == {"max_running_positive", "nearest_release"}
    assert all(p.release == "0.5.14" for p in problems)
    assert check_sglang_flags("0.6.1", {})[0].release == "0.5.23"


@pytest.mark.parametrize("flags, says", [
    ({"tp": 8}, "tp: not a flag these rules read"),
    ({"max_running_requests": "64"}, "max_running_requests must be an integer"),
    ({"enable_mixed_chunk": "yes"}, "enable_mixed_chunk must be true or false"),
    ({"mem_fraction_static": "most"}, "mem_fraction_static must be a number"),
])
def test_bad_input_is_named(flags, says):
    with pytest.raises(EngineRulesError, match=says):
        check_sglang_flags("0.5.23", flags)
    with pytest.raises(EngineRulesError, match="release"):
        check_sglang_flags("latest", {})


# ---- what the releases do not refuse ------------------------------------------------------------
def _checks(version):
    """(test source, path:line) of every assert and every `if` that raises, in the release's
    argument-processing sources."""
    out = []
    for name, text in files(version).items():
        if not any(name == p or (p.endswith("/") and name.startswith(p)) for p in SGLANG_ARG_SOURCES):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Assert):
                out.append((ast.unparse(node.test), f"{name}:{node.lineno}"))
            elif isinstance(node, ast.If) and any(isinstance(n, ast.Raise) for n in node.body):
                out.append((ast.unparse(node.test), f"{name}:{node.lineno}"))
    return out


@pytest.mark.parametrize("version", RELEASES)
def test_no_release_refuses_a_cuda_graph_size_below_the_running_cap(version):
    both = [(test, where) for test, where in _checks(version)
            if "cuda_graph" in test and "max_running_requests" in test]
    assert both == [], both


@pytest.mark.parametrize("version", RELEASES)
def test_no_release_range_checks_mem_fraction_static_among_its_arguments(version):
    # a comparison of the flag itself with a bound (0.5.23's KV-sharding hook asks only whether
    # it is set, kv_shard_hook.py:302, and bounds a value derived from it)
    ranged = re.compile(r"mem_fraction_static\)?\s*(<|>|<=|>=)|(<|>|<=|>=)\s*\S*mem_fraction_static\b")
    found = [(test, where) for test, where in _checks(version) if ranged.search(test)]
    assert found == [], found


@pytest.mark.parametrize("version", RELEASES)
def test_the_knob_tables_flags_are_flags_of_each_release(version):
    flags, _env = defs(version)
    for knob in SGLANG_KNOBS:
        spelled = "--" + knob.flag.replace("_", "-")
        if knob.flag in SGLANG_FLAG_HISTORY:
            spelled = [s for since, s in SGLANG_FLAG_HISTORY[knob.flag]
                       if parse_version(version).at_least(since)][-1]
        assert spelled in flags, (knob.flag, spelled, version)
