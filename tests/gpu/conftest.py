"""GPU tests: marked `gpu`, skipped where there is no NVIDIA GPU with a working driver."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_env  # noqa: E402

gpu_env.use_module_utils()


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    mine = [i for i in items if str(i.fspath).startswith(here)]
    if not mine:
        return
    ok, why = gpu_env.gpu_present()
    for item in mine:
        item.add_marker(pytest.mark.gpu)
        if not ok:
            item.add_marker(pytest.mark.skip(reason="no NVIDIA GPU/driver: %s" % why))
