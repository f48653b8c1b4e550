#!/usr/bin/python
# -*- coding: utf-8 -*-
"""gpu_facts: GPUs, driver, CUDA toolkits and serving-stack versions of a host."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Report GPUs, NVIDIA driver, CUDA toolkits and the torch/SGLang/FlashInfer versions of a venv
description:
  - GPUs (index, name, UUID, compute capability, memory total/used, compute processes), driver
    version and CUDA driver version, through NVML (nvidia-ml-py) when importable, else C(nvidia-smi).
  - Where there is no driver the result is clean, V(gpus=[]) with RV(gpu_facts.reason) saying why;
    the task does not fail.
  - The CUDA toolkits installed side by side (C(<cuda_root>/cuda-X.Y)), the one the
    C(<cuda_root>/cuda) link selects, and the release its C(nvcc) reports.
  - With O(venv), the versions of torch (and the CUDA it was built for), SGLang and the three
    FlashInfer packages (flashinfer-python, flashinfer-cubin, flashinfer-jit-cache) in that venv,
    read by running the venv's python with a tiny script that imports none of them.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  venv:
    description: A virtualenv directory (holding C(bin/python)) or a python executable.
    type: path
  nvidia_smi:
    description: The nvidia-smi executable (name looked up on PATH, or a path).
    type: str
    default: nvidia-smi
  cuda_root:
    description: Where the toolkits are installed (C(cuda-X.Y) directories and the C(cuda) link).
    type: path
    default: /usr/local
  driver_version_file:
    description: >-
      The kernel module's version file, read for the driver version when neither NVML nor
      nvidia-smi answers.
    type: path
    default: /proc/driver/nvidia/version
  backend:
    description: V(auto) tries NVML then nvidia-smi.
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
attributes:
  check_mode:
    support: full
    description: Reads only; runs the same in check mode.
  diff_mode:
    support: none
    description: Reports facts; there is nothing to diff.
"""

EXAMPLES = r"""
- name: GPU and CUDA facts, with the SGLang venv's versions
  servelab.serving.gpu_facts:
    venv: /opt/sglang/venv
  register: facts_before

- name: Show the selected toolkit
  ansible.builtin.debug:
    msg: >-
      CUDA {{ facts_before.gpu_facts.cuda_selected }} (nvcc {{ facts_before.gpu_facts.nvcc_release }}),
      {{ facts_before.gpu_facts.gpus | length }} GPU(s)
"""

RETURN = r"""
gpu_facts:
  description: Everything found.
  returned: always
  type: dict
  contains:
    gpus:
      description: One entry per GPU; empty without a driver.
      type: list
      elements: dict
      sample:
        - index: 0
          name: NVIDIA H200
          uuid: GPU-...
          compute_capability: "9.0"
          memory_total_mib: 143771
          memory_used_mib: 0
          processes: [{pid: 1234, used_mib: 20480}]
    driver_version:
      description: NVIDIA driver version.
      type: str
      sample: "580.82.07"
    cuda_driver_version:
      description: Highest CUDA version the driver supports.
      type: str
      sample: "13.0"
    source:
      description: Where the GPU list came from.
      type: str
      choices: [nvml, nvidia-smi, none]
    reason:
      description: Why RV(gpu_facts.gpus) is empty, or why the fallback was used; null otherwise.
      type: str
    kernel_module_version:
      description: From C(/proc/driver/nvidia/version).
      type: str
    toolkits:
      description: Installed toolkits, oldest first.
      type: list
      elements: dict
      sample: [{version: "12.8", path: /usr/local/cuda-12.8, full_version: "12.8.1", nvcc_release: "12.8"}]
    cuda_selected:
      description: Version the C(cuda) link selects.
      type: str
      sample: "13.0"
    cuda_selected_path:
      description: Where the C(cuda) link resolves.
      type: str
    nvcc_release:
      description: Release reported by the selected toolkit's C(nvcc).
      type: str
      sample: "13.0"
    nvcc_version:
      description: Full C(nvcc) build version.
      type: str
      sample: "13.0.88"
    venv:
      description: With O(venv); null otherwise.
      type: dict
      sample:
        path: /opt/sglang/venv
        python: "3.12.3"
        torch: "2.11.0+cu130"
        torch_cuda: "13.0"
        sglang: "0.5.23"
        flashinfer: {flashinfer-python: "0.6.18", flashinfer-cubin: "0.6.18", flashinfer-jit-cache: "0.6.18+cu130"}
        flashinfer_consistent: true
"""

import dataclasses

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.servelab.serving.plugins.module_utils.gpu.facts import (
    GpuFactsOptions,
    collect_gpu_facts,
)
from ansible_collections.servelab.serving.plugins.module_utils.gpu.venv import VenvError


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path"),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            cuda_root=dict(type="path", default="/usr/local"),
            driver_version_file=dict(type="path", default="/proc/driver/nvidia/version"),
            backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        facts = collect_gpu_facts(GpuFactsOptions(
            venv=p["venv"], nvidia_smi=p["nvidia_smi"], cuda_root=p["cuda_root"],
            driver_version_file=p["driver_version_file"], backend=p["backend"]))
    except VenvError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, gpu_facts=dataclasses.asdict(facts))


if __name__ == "__main__":
    main()
