"""tune.yml's preflight of the tune_* variables (plugins/plugin_utils/tune/settings.py), before
anything starts: unknown names with the nearest known one, types, the base profile, the
objective, flags the engine does not model, combinations the engine's rules refuse (left out and
listed; a space with none left is a problem), the bench settings a tune sets itself."""
from __future__ import annotations

from ansible_collections.servelab.serving.plugins.plugin_utils.tune.settings import check_tune


def values(**over):
    base = {
        "tune_space": {"max_running_requests": [8, 32]},
        "bench_profiles": [{"name": "baseline",
                            "simulator": {"profile": "baseline", "time_scale": 20}}],
        "bench_engine": "simulator", "bench_slo": {"ttft_ms": 500}, "bench_level_seconds": 8,
        "bench_workload": {"kind": "synthetic", "input_tokens": 256, "output_tokens": 32},
        "bench_max_tokens": 32, "bench_repeats": 1,
        "tune_objective": {"metric": "goodput", "percentile": 99}, "tune_axis": "rate",
        "tune_budget": {"trials": 4}, "tune_tolerance": 0.05, "tune_min_trials": 3,
        "tune_max_levels": 10, "tune_concurrency_cap": 1024, "tune_strategy": "model",
        "tune_base_profile": "",
    }
    base.update(over)
    return base


def messages(check):
    return [p.message for p in check.problems]


def test_good_settings_give_candidates_probes_and_no_problem():
    check = check_tune(values(), ["tune_space"], {}, "h")
    assert check.ok, messages(check)
    assert len(check.candidates) == 2 and check.refused == []
    assert check.settings["engine"] == "simulator"
    assert check.settings["objective"]["slo"] == {"ttft_ms": 500.0}   # from bench_slo
    assert check.settings["short_level_seconds"] == 2.0
    assert [p["simulator"]["max_running"] for p in check.probes] == [8, 32]


def test_unknown_tune_variable_names_the_nearest_one():
    check = check_tune(values(), ["tune_space", "tune_budgte"], {"tune_budgte": "gv.yml:3"}, "h")
    assert any("tune_budgte: unknown variable; did you mean tune_budget?" in m
               for m in messages(check))
    assert check.problems[0].where == "gv.yml:3"


def test_types_and_required_space():
    check = check_tune(values(tune_space=None, tune_axis="qps"), [], {}, "h")
    text = " | ".join(messages(check))
    assert "tune_space: required" in text and "tune_axis" in text


def test_base_profile_must_exist():
    check = check_tune(values(tune_base_profile="eagle"), ["tune_base_profile"], {}, "h")
    assert "tune_base_profile: 'eagle' is not a profile of bench_profiles (baseline)" in \
        " ".join(messages(check))


def test_objective_needs_an_slo():
    check = check_tune(values(bench_slo={}), [], {}, "h")
    assert "slo" in " ".join(messages(check))


def test_a_flag_the_simulator_does_not_model_is_named():
    check = check_tune(values(tune_space={"max_runing_requests": [8]}), [], {}, "h")
    assert any(m.startswith("tune_space.max-runing-requests: the simulator models no such flag; "
                            "did you mean max-running-requests?") for m in messages(check))


def test_impossible_combinations_are_refused_up_front_and_listed():
    space = {"speculative_num_steps": [1, 3], "speculative_eagle_topk": [1, 4],
             "speculative_num_draft_tokens": [4, 32]}
    check = check_tune(values(tune_space=space, bench_profiles=[
        {"name": "eagle3", "simulator": {"profile": "eagle3"}}]), [], {}, "h")
    assert check.ok, messages(check)
    refused = {r["key"]: r["reason"] for r in check.refused if r["kind"] == "refused"}
    # topk 4 over 1 step scores 4 candidates: 31 draft tokens cannot be filled
    assert "speculative-eagle-topk=4 speculative-num-draft-tokens=32 speculative-num-steps=1" \
        in refused
    assert all("spec_num_draft_tokens" in r for r in refused.values())
    assert len(check.candidates) + len(check.refused) == 8
    assert set(check.settings["refused"]) == {r["key"] for r in check.refused}


def test_a_space_with_nothing_left_fails():
    check = check_tune(values(tune_space={"mem_fraction_static": [0.3, 0.4]}), [], {}, "h")
    assert any("every one of its 2 combinations is refused" in m for m in messages(check))


def test_settings_a_tune_makes_itself_are_refused():
    check = check_tune(values(bench_capacity_search={"axis": "rate"}, bench_repeats=3), [], {},
                       "h")
    text = " ".join(messages(check))
    assert "bench_capacity_search: tune.yml sets each trial's capacity search itself" in text
    assert "bench_repeats: a tune measures each load once" in text


def test_command_engine_flags_are_checked_by_the_commands_help():
    check = check_tune(values(
        bench_engine="command", tune_space={"cb_max_batch_tokens": [256, 1024]},
        bench_profiles=[{"name": "tf", "command": ["transformers", "serve", "{model}",
                                                   "--port", "{port}"]}]), [], {}, "gpu1")
    assert check.ok, messages(check)
    assert check.help_checks == [{"variable": "tune_space",
                                  "argv": ["transformers", "serve", "{model}", "--port", "{port}"],
                                  "flags": ["--cb-max-batch-tokens"], "hosts": ["gpu1"],
                                  "where": ""}]
    assert check.probes[0]["command"][-2:] == ["--cb-max-batch-tokens", "256"]


def test_candidates_the_engine_runs_as_one_server_are_tried_once():
    """topk 1 runs steps + 1 draft tokens whatever was given (SGLang rewrites it; the simulator
    resolves it alike): of topk 1 x draft 4, 8 only the first is a candidate; and 4 draft tokens
    over 3 steps leave 3 tree nodes over 3 depths, a chain whatever the topk: the simulator runs
    topk 4 x draft 4 as topk 1."""
    space = {"speculative_num_steps": [3], "speculative_eagle_topk": [1, 4],
             "speculative_num_draft_tokens": [4, 8]}
    check = check_tune(values(tune_space=space, bench_profiles=[
        {"name": "eagle3", "simulator": {"profile": "eagle3"}}]), [], {}, "h")
    assert check.ok, messages(check)
    same = [r for r in check.refused if r["kind"] == "same server"]
    assert [r["key"] for r in same] == [
        "speculative-eagle-topk=1 speculative-num-draft-tokens=8 speculative-num-steps=3",
        "speculative-eagle-topk=4 speculative-num-draft-tokens=4 speculative-num-steps=3"]
    assert {r["reason"] for r in same} == {"the engine runs it as the same server as "
                                           "speculative-eagle-topk=1 "
                                           "speculative-num-draft-tokens=4 "
                                           "speculative-num-steps=3"}
    assert len(check.candidates) == 2


def test_sglang_rules_refuse_a_draft_tree_too_large_for_its_steps_and_topk():
    base = {"name": "eagle3", "engine": "sglang", "model": "/m", "base": "eagle3",
            "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/d", "num_steps": 1,
                            "eagle_topk": 2, "num_draft_tokens": 3}}
    space = {"speculative_num_draft_tokens": [3, 16], "max_running_requests": [32]}
    check = check_tune(values(tune_space=space, bench_engine="sglang", bench_profiles=[base]),
                       [], {}, "h")
    assert check.ok, messages(check)
    [refused] = check.refused
    assert refused["key"] == "max-running-requests=32 speculative-num-draft-tokens=16"
    assert "needs 15 draft tokens but topk 2 over 1 steps gives 2 candidates" in refused["reason"]
    assert "sglang/srt/speculative/eagle_utils.py:" in refused["reason"]
    assert check.probes[0]["speculative"]["num_draft_tokens"] == 3
