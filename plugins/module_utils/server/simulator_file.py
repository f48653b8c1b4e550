"""Put the simulator on the target as one file the server process can run: a zipapp.

The simulator is the package plugins/module_utils/simulator/ (standard library only, plus
module_utils/netstamp.py). Importing every module of it here makes Ansible's AnsiballZ ship
them with llm_server (module_utils are found by their imports); their sources are then read back
through each module's loader, which works from the AnsiballZ zip as well as from a checkout, and
packed into a zipapp written to <state_dir>/<name>/servelab_simulator.pyz, where a detached server
process (`python servelab_simulator.pyz ...`) can outlive the task that wrote it.

The archive holds the modules under their collection paths (so their own absolute imports
resolve inside it), empty __init__.py files for the parent packages, and a __main__.py that runs
simulator.cli.main. It is built the same byte for byte from the same sources (sorted entries,
fixed timestamps, stored), so its digest names the content: the file is rewritten only when the
digest differs, and the server's identity (simulator_sha256) changes only with the code.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import io
import os
import zipfile
from typing import Dict, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.results.contract import atomic_write_bytes

try:  # optional import for AnsiballZ: shipped when present, a clear error at use when absent
    from ansible_collections.servelab.serving.plugins.module_utils import netstamp as _netstamp
    from ansible_collections.servelab.serving.plugins.module_utils import simulator as _simulator
    from ansible_collections.servelab.serving.plugins.module_utils.simulator import (
        admission as _admission, cli as _cli, des as _des, effects as _effects,
        emission as _emission, listener as _listener, predictor as _predictor,
        profiles as _profiles, protocol as _protocol, requests as _requests, server as _server,
        tokens as _tokens, truth as _truth,
    )
    # Every module the zipapp holds: the simulator package and what it imports of module_utils.
    # tests/unit/test_simulator_file.py runs the archive in an isolated interpreter, so a module
    # missing here fails there.
    _SHIPPED: tuple = (_simulator, _admission, _cli, _des, _effects, _emission, _listener,
                       _predictor, _profiles, _protocol, _requests, _server, _tokens, _truth,
                       _netstamp)
    _IMPORT_ERROR: Optional[BaseException] = None
except ImportError as _exc:  # pragma: no cover - depends on the checkout
    _SHIPPED = ()
    _IMPORT_ERROR = _exc

# Modules of the simulator package that the server never imports and the zipapp leaves out: they
# run on the controller, for the tuner (runs.py: predict_run, which imports the load generator;
# knobs.py: SGLang's flags in the simulator's terms).
CONTROLLER_ONLY = ("knobs", "runs")

SCRIPT_NAME = "servelab_simulator.pyz"
# The single-file script of earlier releases: a server started by one of them still runs it
# (the reaper's default pattern matches both names; see inventory/local/group_vars/all.yml).
LEGACY_SCRIPT_NAME = "servelab_simulator.py"
MAIN = ("from ansible_collections.servelab.serving.plugins.module_utils.simulator.cli import main\n"
        "\n"
        "raise SystemExit(main())\n")
_EPOCH = (1980, 1, 1, 0, 0, 0)          # the earliest time a zip entry can hold: fixed bytes


class SimulatorUnavailable(RuntimeError):
    pass


def _source(module) -> str:
    loader = getattr(module, "__loader__", None)
    source = None
    if loader is not None and hasattr(loader, "get_source"):
        source = loader.get_source(module.__name__)
    return source if source is not None else inspect.getsource(module)


def _entry(module) -> str:
    path = module.__name__.replace(".", "/")
    return path + "/__init__.py" if hasattr(module, "__path__") else path + ".py"


def simulator_sources() -> Dict[str, str]:
    """{path in the archive: source} of every shipped module (read through its loader)."""
    if _IMPORT_ERROR is not None:
        raise SimulatorUnavailable(
            f"engine simulator needs plugins/module_utils/simulator/ and netstamp.py, which could "
            f"not be imported ({_IMPORT_ERROR}); use engine command or restore the files")
    return {_entry(module): _source(module) for module in _SHIPPED}


def build_archive(sources: Dict[str, str]) -> bytes:
    """A zipapp of sources ({path: text}), with the parent packages' __init__.py files and
    __main__.py (MAIN) unless sources give them. The same sources give the same bytes."""
    files = dict(sources)
    files.setdefault("__main__.py", MAIN)
    for path in list(files):
        parts = path.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            files.setdefault("/".join(parts[:depth]) + "/__init__.py", "")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for path in sorted(files):
            info = zipfile.ZipInfo(path, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            zf.writestr(info, files[path].encode("utf-8"))
    return buf.getvalue()


@functools.lru_cache(maxsize=1)
def simulator_archive() -> bytes:
    """The zipapp of the simulator, built once per process."""
    return build_archive(simulator_sources())


def digest(archive: bytes) -> str:
    return hashlib.sha256(archive).hexdigest()[:16]


def _file_digest(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as fh:
            return digest(fh.read())
    except OSError:
        return None


def materialise(server_dir: str, archive: bytes) -> Tuple[str, bool]:
    """Write the zipapp if the file's content digest differs; return (path, written)."""
    path = os.path.join(server_dir, SCRIPT_NAME)
    if _file_digest(path) == digest(archive):
        return path, False
    atomic_write_bytes(path, archive)
    return path, True
