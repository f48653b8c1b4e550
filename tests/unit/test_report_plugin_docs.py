"""The stub modules' DOCUMENTATION describes exactly the options the action plugins accept."""

from __future__ import annotations

import importlib.util
import os

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(kind, name):
    # By path: plugins/action and plugins/modules both hold a bench_report.py.
    spec = importlib.util.spec_from_file_location(
        f"{kind}_{name}", os.path.join(REPO, "plugins", kind, f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["bench_report", "bench_manifest"])
def test_documentation_matches_argument_spec(name):
    doc_module = load("modules", name)
    spec = load("action", name).ARGUMENT_SPEC
    doc = yaml.safe_load(doc_module.DOCUMENTATION)
    yaml.safe_load(doc_module.EXAMPLES)
    yaml.safe_load(doc_module.RETURN)
    assert doc["module"] == name
    assert set(doc["options"]) == set(spec)
    for option, rules in spec.items():
        documented = doc["options"][option]
        assert documented["type"] == rules["type"], option
        assert bool(documented.get("required", False)) == bool(rules.get("required", False)), option
        assert documented.get("default") == rules.get("default"), option
