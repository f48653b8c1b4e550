"""plugins/module_utils/ is what AnsiballZ ships to targets (bare containers with python3): it
imports the standard library, its own subpackages and ansible.module_utils only. pandas and
matplotlib belong to the controller (plugins/plugin_utils/, the report); an optional accelerator
(pynvml) is imported under `try: ... except ImportError`.

The sources are parsed, not imported, so an import hidden in a function counts too.
"""
from __future__ import annotations

import os
import sys

import pytest
from importscan import heavy_imports, imports  # tests/: the shared import scanner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE_UTILS = os.path.join(REPO, "plugins", "module_utils")
OWN = "ansible_collections.servelab.serving.plugins.module_utils"


def module_utils_sources():
    out = []
    for root, dirs, files in os.walk(MODULE_UTILS):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
    return out


def test_the_scan_sees_hidden_and_dynamic_imports():
    source = ("import json\n"
              "def plot():\n    import matplotlib.pyplot as plt\n"
              "from pandas import DataFrame\n"
              "import importlib\nimportlib.import_module('numpy')\n"
              "try:\n    import pynvml\nexcept ImportError:\n    pynvml = None\n")
    assert sorted(heavy_imports(source)) == [("matplotlib.pyplot", 3), ("numpy", 6),
                                             ("pandas", 4)]
    assert ("pynvml", 8, True) in imports(source)
    assert ("pandas", 4, False) in imports(source)


def test_module_utils_has_sources():
    names = {os.path.relpath(p, MODULE_UTILS) for p in module_utils_sources()}
    assert os.path.join("simulator", "server.py") in names and "netstamp.py" in names and os.path.join("results", "contract.py") in names


@pytest.mark.parametrize("path", module_utils_sources(),
                         ids=lambda p: os.path.relpath(p, MODULE_UTILS))
def test_nothing_under_module_utils_imports_pandas_or_matplotlib(path):
    with open(path, encoding="utf-8") as fh:
        assert heavy_imports(fh.read()) == [], (
            "%s is shipped to targets: pandas/matplotlib/numpy belong in plugins/plugin_utils/"
            % os.path.relpath(path, REPO))


@pytest.mark.parametrize("path", module_utils_sources(),
                         ids=lambda p: os.path.relpath(p, MODULE_UTILS))
def test_module_utils_imports_only_what_a_bare_target_has(path):
    """stdlib, module_utils itself, ansible.module_utils; anything else only as an optional,
    guarded import. Never plugin_utils or controller-side ansible (errors, plugins, ...)."""
    with open(path, encoding="utf-8") as fh:
        found = imports(fh.read())
    bad = []
    for name, line, guarded in found:
        top = name.split(".")[0]
        if name == OWN or name.startswith(OWN + "."):
            continue
        if name.startswith("ansible_collections.servelab.serving.plugins.plugin_utils"):
            bad.append("%s:%d controller-only %s" % (path, line, name))
        elif top == "ansible" and not (name == "ansible.module_utils"
                                       or name.startswith("ansible.module_utils.")):
            bad.append("%s:%d controller-side %s" % (path, line, name))
        elif top not in sys.stdlib_module_names and top not in ("__future__", "ansible") \
                and not guarded:
            bad.append("%s:%d unguarded third-party import %s" % (path, line, name))
    assert not bad, bad
