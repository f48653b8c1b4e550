"""What the GPU checks need from their machine, without Ansible or pytest installed there.

- `use_module_utils()` makes `ansible.module_utils.servelab.*` importable from this checkout:
  through the real ansible package when it is installed, else through a stand-in package
  object whose path is plugins/module_utils (the code under test imports itself that way).
- `gpu_present()` says whether an NVIDIA GPU with a working driver is here, and if not why.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types
from typing import List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE_UTILS = os.path.join(REPO, "plugins", "module_utils")

# Every GPU process the checks start keeps NVLink multicast off (NCCL, PyTorch symmetric memory,
# NVSHMEM): on shared multi-GPU hosts a program using it can take the GPUs out of service.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_child_env() -> dict:
    """The environment for a GPU child process: ours, with multicast off whatever we inherited."""
    return dict(os.environ, **NO_MULTICAST_ENV)


def use_module_utils() -> None:
    try:
        import ansible.module_utils as mu
    except ImportError:
        ansible = sys.modules.get("ansible") or types.ModuleType("ansible")
        ansible.__path__ = []
        mu = types.ModuleType("ansible.module_utils")
        mu.__path__ = []
        ansible.module_utils = mu
        sys.modules["ansible"] = ansible
        sys.modules["ansible.module_utils"] = mu
    if MODULE_UTILS not in mu.__path__:
        mu.__path__.append(MODULE_UTILS)


def gpu_present() -> Tuple[bool, str]:
    smi = shutil.which("nvidia-smi")
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
        if n > 0:
            return True, "%d GPU(s) via NVML" % n
        return False, "NVML reports no GPU"
    except Exception as exc:   # ImportError, NVMLError_*
        nvml_reason = "NVML: %s" % exc
    if smi:
        proc = subprocess.run([smi, "-L"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=60)
        if proc.returncode == 0 and "GPU " in proc.stdout:
            return True, "nvidia-smi -L: %s" % proc.stdout.strip().splitlines()[0]
        return False, "%s; nvidia-smi -L failed: %s" % (nvml_reason, proc.stdout.strip()[-200:])
    return False, "%s; no nvidia-smi on PATH" % nvml_reason


def smi_query(fields: List[str], smi: Optional[str] = None) -> List[dict]:
    """nvidia-smi --query-gpu, as a list of dicts (values stripped, units off)."""
    smi = smi or shutil.which("nvidia-smi") or "nvidia-smi"
    out = subprocess.run([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=60, check=True).stdout
    rows = []
    for line in out.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        rows.append(dict(zip(fields, vals)))
    return rows


def smi_cuda_version(smi: Optional[str] = None) -> Optional[str]:
    import re
    smi = smi or shutil.which("nvidia-smi") or "nvidia-smi"
    out = subprocess.run([smi], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True, timeout=60).stdout
    m = re.search(r"CUDA (?:Driver )?Version\s*:\s*([0-9]+\.[0-9]+)", out)
    return m.group(1) if m else None
