"""Repository-wide pytest setup.

This checkout is the collection servelab.serving. Its plugins import each other as
`ansible_collections.servelab.serving.plugins...`, the names Ansible itself uses (AnsiballZ ships
module_utils to targets under them). Tests import the same names through the link
`collections/ansible_collections/servelab/serving -> .` (tools/collection_link.py, made by
`make setup`), so they exercise the very files Ansible runs.
"""
import os
import sys

REPO = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402

collection_link.importable()
# tests/ for the helpers tests share (simproc: the simulator as a child process).
_TESTS = os.path.join(REPO, "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
os.environ.setdefault("ANSIBLE_CONFIG", os.path.join(REPO, "ansible.cfg"))

# The tiers by folder (pyproject.toml's markers; the Makefile's test targets select by marker).
_TIER_BY_FOLDER = {"integration": "integration", "lab": "lab", "gpu": "gpu"}
# Under pytest-xdist (`-n`, `--dist loadgroup`) the tests of one group run in one worker, one after
# the other: the lab is one set of containers and links per test session (its session fixture
# would otherwise come up once per worker), and the root tests' network namespaces, sshd and
# subnets are picked from what is free on the machine at their start.
_SERIAL_GROUP = {"lab": "lab", "root": "netns"}


def pytest_collection_modifyitems(config, items):
    import pytest
    for item in items:
        rel = os.path.relpath(str(item.fspath), _TESTS).split(os.sep)
        marker = _TIER_BY_FOLDER.get(rel[0]) if len(rel) > 1 else None
        if marker:
            item.add_marker(getattr(pytest.mark, marker))
        for name, group in _SERIAL_GROUP.items():
            if item.get_closest_marker(name):
                item.add_marker(pytest.mark.xdist_group(group))
                break


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
