"""gpu_facts's logic: GPUs, driver, CUDA toolkits and the serving stack's versions, in one result.

Where there is no driver (a CI machine, a container without passthrough) the result is clean:
`gpus: []`, `source: none` and `reason` saying why (each backend's error), never an exception.
Standard library only; NVML via nvidia-ml-py when importable, `nvidia-smi` as fallback.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.gpu.query import BACKENDS, GpuInfo, open_backend
from ansible_collections.servelab.serving.plugins.module_utils.gpu.toolkit import (
    Toolkit, find_toolkits, nvcc_version, selected_toolkit,
)
from ansible_collections.servelab.serving.plugins.module_utils.gpu.venv import VenvFacts, probe_venv

DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build  (...)"
NVRM_VERSION = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")


@dataclass
class GpuFactsOptions:
    venv: Optional[str] = None
    nvidia_smi: str = "nvidia-smi"
    cuda_root: str = "/usr/local"
    driver_version_file: str = DRIVER_VERSION_FILE
    backend: str = "auto"


@dataclass
class GpuFacts:
    gpus: List[GpuInfo]
    driver_version: Optional[str]
    cuda_driver_version: Optional[str]
    source: str                              # nvml | nvidia-smi | none
    reason: Optional[str]                    # why gpus is empty (or why a fallback was used)
    kernel_module_version: Optional[str]     # from /proc/driver/nvidia/version
    toolkits: List[Toolkit] = field(default_factory=list)
    cuda_selected: Optional[str] = None
    cuda_selected_path: Optional[str] = None
    nvcc_release: Optional[str] = None       # of the selected toolkit's nvcc
    nvcc_version: Optional[str] = None
    venv: Optional[VenvFacts] = None


def kernel_module_version(path: str) -> Optional[str]:
    try:
        with open(path) as fh:
            m = NVRM_VERSION.search(fh.read())
    except OSError:
        return None
    return m.group(1) if m else None


def collect_gpu_facts(opts: GpuFactsOptions) -> GpuFacts:
    if opts.backend not in BACKENDS:
        raise ValueError("backend: %r is not one of %s" % (opts.backend, ", ".join(BACKENDS)))
    # the venv first: a bad path is an input error, reported before any other work
    venv = probe_venv(opts.venv) if opts.venv else None

    kmod = kernel_module_version(opts.driver_version_file)
    backend, reasons = open_backend(opts.backend, opts.nvidia_smi)
    if backend is None:
        gpus: List[GpuInfo] = []
        driver = kmod
        cuda = None
        source = "none"
        reason = "no NVIDIA driver reachable: " + "; ".join(reasons)
    else:
        try:
            gpus = backend.gpus()
            info = backend.driver()
        finally:
            backend.close()
        driver = info.driver_version or kmod
        cuda = info.cuda_driver_version
        source = backend.source
        reason = None
        if reasons:                               # NVML failed, nvidia-smi answered
            reason = "fell back to nvidia-smi: " + "; ".join(reasons)
        if not gpus:
            reason = ((reason + "; ") if reason else "") + "the driver reports no GPU"

    kits = find_toolkits(opts.cuda_root)
    sel_version, sel_path = selected_toolkit(opts.cuda_root, kits)
    nvcc_rel, nvcc_ver = (nvcc_version(os.path.join(sel_path, "bin", "nvcc"))
                          if sel_path else (None, None))
    return GpuFacts(gpus=gpus, driver_version=driver, cuda_driver_version=cuda, source=source,
                    reason=reason, kernel_module_version=kmod, toolkits=kits,
                    cuda_selected=sel_version, cuda_selected_path=sel_path,
                    nvcc_release=nvcc_rel, nvcc_version=nvcc_ver, venv=venv)
