"""llm_bench's one options path (loadgen/options.py): one argument spec for the module and its
action plugin, with LevelConfig's defaults, and no silent replacement of a given value."""
from __future__ import annotations

import json
from dataclasses import MISSING, fields

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import (
    BenchOptionsError, level_configs,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.options import (
    ACTION_ARGUMENT_SPEC, ACTION_ONLY_OPTIONS, ARGUMENT_SPEC, with_defaults,
)
from ansible_collections.servelab.serving.plugins.modules import llm_bench as module

BASE = {"base_url": "http://127.0.0.1:1", "model": "m", "concurrency": [1, 4]}


def validated(params: dict, spec=None) -> dict:
    """What Ansible hands the module (or the action, through validate_argument_spec)."""
    result = ArgumentSpecValidator(ARGUMENT_SPEC if spec is None else spec).validate(params)
    if result.error_messages:
        raise ValueError("; ".join(result.error_messages))
    return result.validated_parameters


def test_the_module_validates_with_the_one_spec():
    assert module.ARGUMENT_SPEC is ARGUMENT_SPEC
    assert set(ACTION_ARGUMENT_SPEC) == set(ARGUMENT_SPEC) | set(ACTION_ONLY_OPTIONS)


def test_spec_defaults_are_level_config_defaults():
    level_defaults = {f.name: f.default for f in fields(LevelConfig) if f.default is not MISSING}
    per_level = ("concurrency", "request_rate")       # lists in the spec, one value per level
    # ignore_eos is unset by default (the prompts decide); level_configs makes that the level's
    # own default, False (tests/unit/test_loadgen_strict_server.py).
    tri_state = ("ignore_eos",)
    shared = [n for n in ARGUMENT_SPEC
              if n in level_defaults and n not in per_level + tri_state]
    assert len(shared) > 15
    for name in shared:
        assert ARGUMENT_SPEC[name].get("default") == level_defaults[name], name
    assert "default" not in ARGUMENT_SPEC["ignore_eos"] and level_defaults["ignore_eos"] is False


@pytest.mark.parametrize("option, value", [
    ("level_seconds", 0), ("max_tokens", 0), ("ci_batches", 1), ("level_timeout", 0.1)])
def test_a_given_value_is_never_replaced_by_a_default(option, value):
    # The old path read `params.get("level_seconds") or 30.0`: 0 became 30 silently.
    with pytest.raises(BenchOptionsError, match=option):
        level_configs(validated(dict(BASE, **{option: value})))


def test_unset_and_null_options_take_the_spec_default():
    configs, _workload = level_configs(dict(BASE, level_seconds=None))
    assert configs[0].level_seconds == ARGUMENT_SPEC["level_seconds"]["default"]
    assert with_defaults({})["workload"] == {"kind": "builtin"}


def test_templated_strings_convert_as_ansible_converts_them():
    params = validated(dict(BASE, concurrency="1,2,5", level_seconds="2.5", ignore_eos="yes"))
    configs, _workload = level_configs(params)
    assert [c.concurrency for c in configs] == [1, 2, 5]
    assert configs[0].level_seconds == 2.5 and configs[0].ignore_eos is True


def test_an_unknown_option_is_rejected_by_the_action_spec():
    with pytest.raises(ValueError, match="concurency"):
        validated(dict(BASE, concurency=[1], run_id="r"), ACTION_ARGUMENT_SPEC)


def test_the_controller_checks_a_workload_file_option_without_reading_the_file(tmp_path):
    missing = str(tmp_path / "on-the-bench-client.jsonl")
    spec = {"kind": "jsonl", "path": missing}
    configs, workload = level_configs(dict(BASE, workload=spec), read_workload=False)
    assert workload is None and len(configs) == 2
    with pytest.raises(BenchOptionsError, match="workload.path"):
        level_configs(dict(BASE, workload=spec))          # the bench client reads it
    with pytest.raises(BenchOptionsError, match="workload.path"):
        level_configs(dict(BASE, workload={"kind": "jsonl"}), read_workload=False)
    with pytest.raises(BenchOptionsError, match="workload: unknown key"):
        level_configs(dict(BASE, workload={"kind": "builtin", "prompts": 3}), read_workload=False)
    good = tmp_path / "p.jsonl"
    good.write_text(json.dumps({"prompt": "a"}) + "\n")
    _configs, workload = level_configs(dict(BASE, workload={"kind": "jsonl", "path": str(good)}))
    assert [p.text for p in workload.prompts] == ["a"]
