"""The rolling upgrade's settings (plugins/filter/rollout.py): what playbooks/gpu_stack.yml hands
to Ansible's `serial` / `max_fail_percentage`, and the errors a typo gets before any host is touched."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.filter.rollout import (
    rollout_max_fail_percentage,
    rollout_serial,
)


@pytest.mark.parametrize("value, expected", [
    (1, 1), ("3", 3), ("25%", "25%"), (" 50 % ", "50%"), ([1, "5", "50%"], [1, 5, "50%"]),
])
def test_batch_sizes_ansible_understands(value, expected):
    assert rollout_serial(value) == expected


@pytest.mark.parametrize("value", [0, -1, "abc", "0%", "150%", True, [], [1, "x"], "1.5"])
def test_a_bad_batch_size_names_the_variable_and_the_fix(value):
    with pytest.raises(AnsibleFilterError) as err:
        rollout_serial(value, "gpu_stack_serial")
    assert str(err.value).startswith("gpu_stack_serial: ")
    assert "e.g. -e gpu_stack_serial=2" in str(err.value)


@pytest.mark.parametrize("value, expected", [(0, 0), ("0", 0), ("25", 25), ("12.5%", 12.5), (100, 100)])
def test_failure_budgets(value, expected):
    assert rollout_max_fail_percentage(value) == expected


@pytest.mark.parametrize("value", [-1, 101, "many", True])
def test_a_bad_failure_budget_names_the_variable_and_the_fix(value):
    with pytest.raises(AnsibleFilterError) as err:
        rollout_max_fail_percentage(value, "gpu_stack_max_fail_percentage")
    assert str(err.value).startswith("gpu_stack_max_fail_percentage: ")
    assert "from 0 (stop at the first failed host) to 100" in str(err.value)
