"""tune.yml's failure when no trial has a score says what the levels showed: never 'no load met
the SLO' where loads met it (the device run of 2026-12-06 said so of two trials that met it up to
16 and 32 req/s). The task's own template, rendered by Ansible's Templar from playbooks/tune.yml."""
from __future__ import annotations

import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TASK = "Fail the tune when no trial has a score"


def fail_message(trials, **more):
    with open(os.path.join(REPO, "playbooks", "tune.yml")) as fh:
        plays = yaml.safe_load(fh)
    task = [t for p in plays for t in p.get("tasks", []) if t.get("name") == TASK][0]
    variables = dict(__tune_trials=trials, bench_results_root="/r", bench_run_id="run1", **more)
    for name, template in task.get("vars", {}).items():   # in order: __at uses __met
        variables[name] = Templar(loader=DataLoader(), variables=variables).template(
            trust_as_template(template))
    return Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template(task["ansible.builtin.fail"]["msg"]))


DEVICE = [{"trial": "t01", "status": "no_score", "reason": "max_levels (5) measured",
           "highest_load_met": 16.0},
          {"trial": "t02", "status": "no_score", "reason": "max_levels (5) measured",
           "highest_load_met": 32.0}]


def test_loads_that_met_the_slo_are_named_never_denied():
    text = fail_message(DEVICE)
    assert text.startswith("No trial of the tune has a score: loads up to rate 32/s met the SLO, "
                           "but no trial ended with a score (2 trial(s): t01 no_score max_levels "
                           "(5) measured; t02 no_score"), text
    assert "no load" not in text.lower() and "/r/run1/tune/trials.csv" in text
    # a failed trial that met the SLO before its server died counts too
    text = fail_message([dict(DEVICE[0], status="failed", reason="the server died")])
    assert "loads up to rate 16/s met the SLO" in text and "every trial failed" not in text
    assert "concurrency 16 met" in fail_message(DEVICE[:1], tune_axis="concurrency")


@pytest.mark.parametrize("trials, words", [
    ([{"trial": "t01", "status": "no_score", "reason": "r", "highest_load_met": None}],
     "no load any trial measured met the SLO"),
    ([{"trial": "t01", "status": "failed", "reason": "boom"}], "every trial failed"),
    ([{"trial": "t01", "status": "failed", "reason": "boom"},
      {"trial": "t02", "status": "no_score", "reason": "r"}], "no load any trial measured met"),
])
def test_without_a_load_that_met_it_the_message_says_which(trials, words):
    text = fail_message(trials)
    assert text.startswith("No trial of the tune has a score: " + words), text
