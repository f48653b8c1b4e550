"""Fixtures of the lab tests (tests/lab, marked `lab`): one lab per test session.

`lab` brings the lab up once (from nothing, or from the caches of an earlier run) and tears it
down at the end of the session, also when a test fails or the run gets SIGTERM/SIGHUP/Ctrl-C, then
checks that nothing is left. Not root: skipped with the reason. Under CI (env CI set) a missing
prerequisite fails instead: CI must not go green by skipping the lab.
"""
from __future__ import annotations

import os
import signal

import pytest

from labctl import Lab, LabError, LabUnavailable


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt("signal %d" % signum)


@pytest.fixture(scope="session")
def lab():
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("the lab needs root (LXC, veth links, debootstrap): run `make test-lab` as root")
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        try:
            instance = Lab.up()
        except LabUnavailable as err:
            if os.environ.get("CI"):
                pytest.fail("lab prerequisite missing under CI: %s" % err, pytrace=False)
            pytest.skip("lab unavailable: %s" % err)
        except LabError as err:
            pytest.fail("lab bring-up failed: %s" % err, pytrace=False)
        try:
            yield instance
        finally:
            instance.down()
            left = instance.leftovers()
            assert not left, "lab teardown left: %s" % "; ".join(left)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
