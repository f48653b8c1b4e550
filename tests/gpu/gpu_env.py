"""What the GPU checks need from their machine, without Ansible or pytest installed there.

- `use_module_utils()` makes `ansible_collections.servelab.serving.*` importable from this
  checkout (the collection link under collections/), with or without Ansible installed.
- `gpu_present()` says whether an NVIDIA GPU with a working driver is here, and if not why.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every GPU process the checks start keeps NVLink multicast off (NCCL, PyTorch symmetric memory,
# NVSHMEM): on shared multi-GPU hosts a program using it can take the GPUs out of service.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}


def gpu_child_env() -> dict:
    """The environment for a GPU child process: ours, with multicast off whatever we inherited."""
    return dict(os.environ, **NO_MULTICAST_ENV)


def use_module_utils() -> None:
    """Make `ansible_collections.servelab.serving.*` importable from this checkout, with or
    without Ansible installed: a namespace-package path through the collection link."""
    tools = os.path.join(REPO, "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import collection_link
    collection_link.importable()


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
                              text=True, timeout=60, check=False)
        if proc.returncode == 0 and "GPU " in proc.stdout:
            return True, "nvidia-smi -L: %s" % proc.stdout.strip().splitlines()[0]
        return False, "%s; nvidia-smi -L failed: %s" % (nvml_reason, proc.stdout.strip()[-200:])
    return False, "%s; no nvidia-smi on PATH" % nvml_reason


def smi_query(fields: List[str], smi: Optional[str] = None) -> List[dict]:
    """nvidia-smi --query-gpu, as a list of dicts (values stripped, units off)."""
    smi = smi or shutil.which("nvidia-smi") or "nvidia-smi"
    out = subprocess.run([smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=60, check=True).stdout
    rows = []
    for line in out.strip().splitlines():
        vals = [v.strip() for v in line.split(",")]
        rows.append(dict(zip(fields, vals)))
    return rows


def smi_cuda_version(smi: Optional[str] = None) -> Optional[str]:
    import re
    smi = smi or shutil.which("nvidia-smi") or "nvidia-smi"
    out = subprocess.run([smi], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=60, check=False).stdout
    m = re.search(r"CUDA (?:Driver )?Version\s*:\s*([0-9]+\.[0-9]+)", out)
    return m.group(1) if m else None
