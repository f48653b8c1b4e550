"""The test tiers: which marker a test gets from its folder, and which tests pytest-xdist must
keep in one worker. The root conftest.py applies it; tests/unit/test_tiers.py runs it under a
real `pytest -n 2 --dist loadgroup`.

Tiers (pyproject.toml's markers; the Makefile's test targets select by marker, never by folder):
tests/integration -> integration, tests/lab -> lab, tests/gpu -> gpu; tests/unit has none (the
fast tier). A test marks itself only with what its folder does not say (core, root, pypi,
haproxy, thirdparty, slow). `thirdparty` (a real server from PyPI on the CPU, e.g. `transformers
serve`: tests/integration/thirdparty) is integration by its folder, so `make test-integration` and
`make test-all` run it; the fast tier leaves it out by name too (the Makefile's FAST_TIER), so a
`core` mark cannot pull a CPU-bound server into it.

Under `--dist loadgroup` the tests of one xdist_group run in one worker, one after the other:
- the lab: one set of containers and links per test session (its session fixture would otherwise
  come up once per worker, on the same names);
- the root tests: their network namespaces, sshd and subnets are picked from what is free on the
  machine at their start;
- the third-party servers: each is CPU-bound on the machine's few cores; one at a time, beside the
  other workers' tests, keeps each one's start and levels in their timeouts;
- a module whose tests share a module- or class-scoped fixture (one bench run read by several
  tests): otherwise that fixture runs once per worker that gets one of them.
"""
from __future__ import annotations

import os
from typing import Iterable, Optional

import pytest

TIER_BY_FOLDER = {"integration": "integration", "lab": "lab", "gpu": "gpu"}
SERIAL_GROUP = {"lab": "lab", "root": "netns", "thirdparty": "thirdparty"}


def shares_a_module_fixture(item) -> bool:
    """The test uses a module- or class-scoped fixture."""
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        if any(d.scope in ("module", "class") for d in defs):
            return True
    return False


def xdist_group(item) -> Optional[str]:
    for marker, group in SERIAL_GROUP.items():
        if item.get_closest_marker(marker):
            return group
    if shares_a_module_fixture(item):
        return item.nodeid.split("::", 1)[0]
    return None


def mark(items: Iterable, tests_root: str) -> None:
    """Add each item's tier marker (from its folder under tests_root) and its xdist_group."""
    for item in items:
        rel = os.path.relpath(str(item.fspath), tests_root).split(os.sep)
        tier = TIER_BY_FOLDER.get(rel[0]) if len(rel) > 1 else None
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
