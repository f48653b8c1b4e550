"""Versions of the serving stack inside a virtualenv: run that venv's python with a tiny script.

The script asks the package metadata (importlib.metadata) and reads torch's version.py as text:
nothing heavy is imported (importing torch or sglang takes seconds and may touch the GPU).
FlashInfer ships as three packages that must carry one version: flashinfer-python,
flashinfer-cubin and flashinfer-jit-cache; each is reported, with whether they agree.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Dict, Optional

PROBE_TIMEOUT = 60.0
FLASHINFER_PACKAGES = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")
OTHER_PACKAGES = ("torch", "sglang", "sgl-kernel", "sglang-kernel", "vllm", "triton",
                  "nvidia-ml-py")

# Runs under the venv's interpreter (any Python 3.8+); prints one JSON object.
PROBE = r"""
import json, os, re, sys
out = {"python": sys.version.split()[0], "executable": sys.executable, "packages": {}}
try:
    from importlib import metadata
except ImportError:
    metadata = None
for name in sys.argv[1:]:
    v = None
    if metadata is not None:
        try:
            v = metadata.version(name)
        except Exception:
            v = None
    out["packages"][name] = v
out["torch_cuda"] = None
try:
    import importlib.util
    spec = importlib.util.find_spec("torch")   # locates, does not import
    if spec is not None and spec.origin:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as fh:
            m = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", fh.read(), re.M)
        out["torch_cuda"] = m.group(1) if m else None
except Exception as exc:
    out["torch_cuda_error"] = str(exc)
print(json.dumps(out))
"""


class VenvError(ValueError):
    pass


@dataclass
class VenvFacts:
    path: str
    python: Optional[str]               # version of the venv's interpreter
    torch: Optional[str]
    torch_cuda: Optional[str]           # CUDA the torch wheel was built for (torch.version.cuda)
    sglang: Optional[str]
    flashinfer: Dict[str, Optional[str]] = field(default_factory=dict)
    flashinfer_consistent: Optional[bool] = None    # all installed ones share a version
    packages: Dict[str, Optional[str]] = field(default_factory=dict)


def venv_python(venv: str) -> str:
    """The interpreter for `venv`: a venv directory (its bin/python) or a python executable."""
    if os.path.isfile(venv) and os.access(venv, os.X_OK):
        return venv
    for name in ("python", "python3"):
        cand = os.path.join(venv, "bin", name)
        if os.access(cand, os.X_OK):
            return cand
    raise VenvError("venv: %s has no bin/python; give the virtualenv directory (the one holding "
                    "bin/python) or a python executable" % venv)


def probe_venv(venv: str) -> VenvFacts:
    python = venv_python(venv)
    try:
        proc = subprocess.run([python, "-I", "-c", PROBE] + list(FLASHINFER_PACKAGES)
                              + list(OTHER_PACKAGES),
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VenvError("venv: could not run %s: %s" % (python, exc)) from exc
    if proc.returncode != 0:
        raise VenvError("venv: %s failed (exit %d): %s"
                        % (python, proc.returncode, proc.stderr.strip()[-500:]))
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise VenvError("venv: %s printed no JSON: %r" % (python, proc.stdout[-500:])) from None
    pkgs = data.get("packages", {})
    fi = {name: pkgs.get(name) for name in FLASHINFER_PACKAGES}
    installed = {v for v in fi.values() if v}
    return VenvFacts(
        path=venv, python=data.get("python"), torch=pkgs.get("torch"),
        torch_cuda=data.get("torch_cuda"), sglang=pkgs.get("sglang"), flashinfer=fi,
        flashinfer_consistent=(len(_base_versions(installed)) == 1) if installed else None,
        packages=pkgs)


def _base_versions(versions):
    """flashinfer-jit-cache carries a local tag (0.6.18+cu130): compare the public part."""
    return {v.split("+", 1)[0] for v in versions}
