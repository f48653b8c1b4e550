"""Fixtures the reaper's unit tests share."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_reap_helpers import Spawner  # noqa: E402


@pytest.fixture
def sp(tmp_path):
    """A Spawner of stand-in GPU processes in tmp_path; every process it started is ended by
    PID when the test ends, passed or not."""
    spawner = Spawner(tmp_path)
    try:
        yield spawner
    finally:
        spawner.cleanup()
