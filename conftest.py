"""Repository-wide pytest setup.

This checkout is the collection servelab.serving. Its plugins import each other as
`ansible_collections.servelab.serving.plugins...`, the names Ansible itself uses (AnsiballZ ships
module_utils to targets under them). Tests import the same names through the link
`collections/ansible_collections/servelab/serving -> .` (tools/collection_link.py, made by
`make setup`), so they exercise the very files Ansible runs.
"""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402

collection_link.importable()
# tests/ for the helpers tests share (simproc: the simulator as a child process).
_TESTS = os.path.join(REPO, "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
os.environ.setdefault("ANSIBLE_CONFIG", os.path.join(REPO, "ansible.cfg"))

import tiers  # noqa: E402  (tests/: the tier markers and pytest-xdist's groups)


# tryfirst: pytest-xdist reads xdist_group in its own collection hook (on its workers).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    tiers.mark(items, _TESTS)


# tests/host holds testinfra suites of provisioned hosts (the field's, the lab's): without
# --hosts they describe no machine, so they are not collected, and the summary says so once.
_HOST_SUITES = os.path.join(_TESTS, "host")


def _no_remote_hosts(config) -> bool:
    return not config.getoption("hosts", default=None)


def pytest_ignore_collect(collection_path, config):
    if str(collection_path) == _HOST_SUITES and _no_remote_hosts(config):
        return True
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _no_remote_hosts(config):
        terminalreporter.write_line(
            "tests/host (testinfra suites of provisioned hosts) not run: they need "
            "--hosts=ansible://<group> --ansible-inventory=<inventory> (tests/host/conftest.py; "
            "make test-lab runs them against the lab)")
