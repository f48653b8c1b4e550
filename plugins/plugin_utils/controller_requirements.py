"""The collection's Python requirements on the controller (requirements.txt at the collection
root), checked where they are needed: the report step names what is missing and the command
that installs it into the Python that runs Ansible, before anything is read or written.

ansible-core has no place for Python packages in meta/runtime.yml; community collections ship a
requirements.txt at the collection root (meta/execution-environment.yml points ansible-builder
at it) and document it in their README. Standard library only.
"""
from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from typing import Callable, List, Optional, Tuple

# import name -> the distribution requirements.txt names (what pip installs)
REPORT_PACKAGES: Tuple[Tuple[str, str], ...] = (
    ("pandas", "pandas"), ("numpy", "numpy"), ("matplotlib", "matplotlib"), ("pyarrow", "pyarrow"),
)
# plugins/plugin_utils/ -> the collection root
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIREMENTS_FILE = os.path.join(COLLECTION_ROOT, "requirements.txt")


def missing(packages=REPORT_PACKAGES,
            find_spec: Callable[[str], object] = importlib.util.find_spec) -> List[str]:
    """The distributions of `packages` whose module this Python cannot import."""
    out = []
    for module, dist in packages:
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(dist)
    return out


def install_command(python: str = sys.executable, requirements: str = REQUIREMENTS_FILE) -> str:
    """`<python> -m pip install -r <collection>/requirements.txt` (the file the collection
    ships), or of the packages by name when the file is not there."""
    if os.path.isfile(requirements):
        return "%s -m pip install -r %s" % (shlex.quote(python), shlex.quote(requirements))
    return "%s -m pip install %s" % (shlex.quote(python),
                                     " ".join(d for _m, d in REPORT_PACKAGES))


def requirements_error(step: str, missing_now: List[str], python: str = sys.executable,
                       requirements: str = REQUIREMENTS_FILE) -> Optional[str]:
    """The failure message of `step` for the packages in `missing_now`; None when none is."""
    if not missing_now:
        return None
    return ("%s needs %s on the controller (the collection's requirements.txt), missing from the "
            "Python that runs Ansible (%s): install them with: %s"
            % (step, ", ".join(missing_now), python, install_command(python, requirements)))
