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


def pytest_collection_modifyitems(config, items):
    import pytest
    for item in items:
        rel = os.path.relpath(str(item.fspath), _TESTS).split(os.sep)
        marker = _TIER_BY_FOLDER.get(rel[0]) if len(rel) > 1 else None
        if marker:
            item.add_marker(getattr(pytest.mark, marker))
