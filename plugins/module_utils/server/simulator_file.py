"""Put the simulator's source on the target as one file the server process can run.

The simulator is one self-contained stdlib file, plugins/module_utils/simulator.py.
Importing it here makes Ansible's AnsiballZ ship it with llm_server (module_utils are found by
their imports); its source is then read back through the module's loader, which works from the
AnsiballZ zip as well as from a checkout, and written to <state_dir>/<name>/servelab_simulator.py,
where a detached server process can outlive the task that wrote it.
"""
from __future__ import annotations

import hashlib
import inspect
import os
from typing import Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import atomic_write_text

try:  # optional import for AnsiballZ: shipped when present, a clear error at use when absent
    from ansible_collections.servelab.serving.plugins.module_utils import simulator as _simulator_module
    _IMPORT_ERROR: Optional[BaseException] = None
except ImportError as _exc:  # pragma: no cover - depends on the checkout
    _simulator_module = None
    _IMPORT_ERROR = _exc

SCRIPT_NAME = "servelab_simulator.py"


class SimulatorUnavailable(RuntimeError):
    pass


def simulator_source() -> str:
    module = _simulator_module
    if module is None:
        raise SimulatorUnavailable(
            f"engine simulator needs plugins/module_utils/simulator.py, which could not "
            f"be imported ({_IMPORT_ERROR}); use engine command or restore the file")
    loader = getattr(module, "__loader__", None)
    source = None
    if loader is not None and hasattr(loader, "get_source"):
        source = loader.get_source(module.__name__)
    return source or inspect.getsource(module)


def digest(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()[:16]


def materialise(server_dir: str, source: str) -> Tuple[str, bool]:
    """Write the script if its content differs; return (path, written)."""
    path = os.path.join(server_dir, SCRIPT_NAME)
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read() == source:
                return path, False
    except OSError:
        pass
    atomic_write_text(path, source)
    return path, True
