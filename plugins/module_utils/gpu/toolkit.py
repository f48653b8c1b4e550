"""The CUDA toolkits installed side by side under a root (/usr/local/cuda-X.Y), the one the
`cuda` link selects (directly or through /etc/alternatives), and what their nvcc says.

Standard library only. The root is an option so tests and the lab can point at stand-ins.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import List, Optional, Tuple

TOOLKIT_DIR = re.compile(r"^cuda-(\d+\.\d+)$")
NVCC_RELEASE = re.compile(r"release\s+(\d+\.\d+)(?:,\s*V([\d.]+))?")
NVCC_TIMEOUT = 30.0


@dataclass
class Toolkit:
    version: str                   # X.Y, from the directory name
    path: str
    full_version: Optional[str]    # X.Y.Z from version.json / version.txt where present
    nvcc_release: Optional[str]    # what bin/nvcc --version says (X.Y); None without nvcc


def full_version(path: str) -> Optional[str]:
    """version.json (CUDA 11.1+) or version.txt (older)."""
    try:
        with open(os.path.join(path, "version.json")) as fh:
            data = json.load(fh)
        v = (data.get("cuda") or {}).get("version")
        if v:
            return str(v)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        with open(os.path.join(path, "version.txt")) as fh:
            m = re.search(r"CUDA Version\s+([\d.]+)", fh.read())
            if m:
                return m.group(1)
    except OSError:
        pass
    return None


def nvcc_version(nvcc: str) -> Tuple[Optional[str], Optional[str]]:
    """(release X.Y, build version) from `nvcc --version`; (None, None) if it cannot run."""
    if not os.access(nvcc, os.X_OK):
        return None, None
    try:
        out = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True,
                             timeout=NVCC_TIMEOUT, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    m = NVCC_RELEASE.search(out)
    return (m.group(1), m.group(2)) if m else (None, None)


def find_toolkits(cuda_root: str) -> List[Toolkit]:
    try:
        names = os.listdir(cuda_root)
    except OSError:
        return []
    kits = []
    for name in names:
        m = TOOLKIT_DIR.match(name)
        path = os.path.join(cuda_root, name)
        if not m or not os.path.isdir(path) or os.path.islink(path):
            continue
        kits.append(Toolkit(version=m.group(1), path=path, full_version=full_version(path),
                            nvcc_release=nvcc_version(os.path.join(path, "bin", "nvcc"))[0]))
    kits.sort(key=lambda k: tuple(int(x) for x in k.version.split(".")))
    return kits


def selected_toolkit(cuda_root: str,
                     toolkits: List[Toolkit]) -> Tuple[Optional[str], Optional[str]]:
    """(version, resolved path) of what <root>/cuda points at; (None, None) without the link."""
    link = os.path.join(cuda_root, "cuda")
    if not os.path.exists(link):
        return None, None
    real = os.path.realpath(link)
    for kit in toolkits:
        if os.path.realpath(kit.path) == real:
            return kit.version, real
    m = TOOLKIT_DIR.match(os.path.basename(real))
    if m:
        return m.group(1), real
    v = full_version(real)       # a plain directory installed as /usr/local/cuda
    return (".".join(v.split(".")[:2]) if v else None), real
