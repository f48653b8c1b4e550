"""testinfra suites for provisioned hosts, against any inventory:

    pytest tests/host --hosts=ansible://proxmox_hosts --ansible-inventory=inventory/<yours>
    pytest tests/host --hosts=ansible://gpu_servers --ansible-inventory=inventory/<yours>

Each test module names the inventory group it checks (GROUP) and skips hosts outside it, so
`--hosts=ansible://all` works too. Without --hosts (a plain `pytest`) the suites skip: they
describe remote hosts, not this machine.
"""
from __future__ import annotations

import pytest
from testinfra.utils.ansible_runner import AnsibleRunner


@pytest.fixture(scope="module", autouse=True)
def _needs_remote_hosts(request):
    if not request.config.getoption("hosts"):
        pytest.skip("testinfra suite for provisioned hosts: run it with --hosts=ansible://<group> "
                    "--ansible-inventory=<inventory> (see tests/host/conftest.py)")


@pytest.fixture(scope="module")
def in_group(_needs_remote_hosts, host, request):
    """Skip hosts outside the module's GROUP; return the host's inventory variables."""
    group = request.module.GROUP
    variables = host.ansible.get_variables()
    if group not in variables.get("group_names", []):
        pytest.skip("%s is not in group %s" % (variables.get("inventory_hostname"), group))
    return variables


@pytest.fixture(scope="session")
def inventory_runner(request) -> AnsibleRunner:
    return AnsibleRunner.get_runner(request.config.getoption("ansible_inventory"))
