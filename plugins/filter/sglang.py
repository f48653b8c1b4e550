# -*- coding: utf-8 -*-
"""Filters of role sglang: the pinned requirement sets, pip's index arguments, and the verify checks.

Pure functions (unit-tested in tests/unit/test_cuda_sglang_filters.py).
"""
from __future__ import annotations

import re
import shlex

from ansible.errors import AnsibleFilterError

# PEP 440 public version with an optional local label (2.9.1, 0.6.7.post2, 2.9.1+cu130).
VERSION_RE = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[A-Za-z0-9.]+)?$")
CUDA_RE = re.compile(r"^(\d+)\.(\d+)$")


def cuda_tag(cuda_version) -> str:
    """13.0 -> cu130 (the tag of PyTorch's and FlashInfer's indexes and wheels)."""
    match = CUDA_RE.match(str(cuda_version).strip())
    if not match:
        raise AnsibleFilterError("sglang_cuda_version: %r is not X.Y (e.g. 13.0): it picks the cuXY indexes and "
                                 "the torch/flashinfer-jit-cache builds" % (cuda_version,))
    return "cu%s%s" % match.groups()


def _check_version(name, value) -> str:
    value = str(value).strip()
    if not VERSION_RE.match(value):
        raise AnsibleFilterError("%s: %r is not an exact version (e.g. 0.5.23, 2.9.1, 0.6.7.post2): the stack is "
                                 "installed with exact pins so that reruns change nothing" % (name, value))
    return value


def requirements(versions, cuda_version) -> dict:
    """Exact pins per index: {torch: [...], pypi: [...], flashinfer: [...]}; one FlashInfer version for all three.

    versions: {sglang, torch, flashinfer}; torch and flashinfer-jit-cache get the +cuXY local label
    unless the given version carries one already.
    """
    tag = cuda_tag(cuda_version)
    sglang = _check_version("sglang_version", versions.get("sglang"))
    torch = _check_version("sglang_torch_version", versions.get("torch"))
    flashinfer = _check_version("sglang_flashinfer_version", versions.get("flashinfer"))
    if "+" in flashinfer:
        raise AnsibleFilterError("sglang_flashinfer_version: %r carries a local label; give the public version "
                                 "(e.g. 0.7.2): flashinfer-jit-cache gets +%s, the other two none" % (flashinfer, tag))
    if "+" not in torch:
        torch = "%s+%s" % (torch, tag)
    elif not torch.endswith("+" + tag):
        raise AnsibleFilterError("sglang_torch_version: %r is not a %s build (sglang_cuda_version %s)"
                                 % (torch, tag, cuda_version))
    return {
        "torch": ["torch==%s" % torch],
        "pypi": ["sglang==%s" % sglang, "flashinfer-python==%s" % flashinfer, "flashinfer-cubin==%s" % flashinfer],
        "flashinfer": ["flashinfer-jit-cache==%s+%s" % (flashinfer, tag)],
        "versions": {"sglang": sglang, "torch": torch, "flashinfer": flashinfer,
                     "flashinfer_jit_cache": "%s+%s" % (flashinfer, tag)},
    }


def pip_index_args(index_url, trusted_hosts=None, extra="") -> str:
    """pip arguments that make `index_url` the only index (plus --trusted-host for plain-http mirrors)."""
    url = str(index_url or "").strip()
    if not re.match(r"^(https?|file)://", url):
        raise AnsibleFilterError("package index %r is not an http(s):// or file:// URL (sglang_*_index_url)" % url)
    args = ["--index-url", url]
    for host in trusted_hosts or []:
        args += ["--trusted-host", str(host)]
    return " ".join(shlex.quote(a) for a in args) + ((" " + str(extra)) if extra else "")


def verify_problems(pins, facts, torch_probe, sglang_probe, flashinfer_probe, cuda_version) -> list:
    """What is wrong with the venv, one sentence each; [] when the stack is what was asked.

    pins: requirements()['versions']; facts: gpu_facts' venv dict; *_probe: registered command
    results (torch prints __version__ and version.cuda on two lines, sglang its __version__).
    """
    problems = []
    facts = facts or {}
    major = str(cuda_version).split(".", 1)[0]
    if torch_probe.get("rc") != 0:
        problems.append("import torch failed (rc %s): %s" % (torch_probe.get("rc"), _tail(torch_probe)))
    else:
        lines = str(torch_probe.get("stdout") or "").split()
        version, cuda = (lines + ["", ""])[:2]
        if version != pins["torch"]:
            problems.append("torch is %s, expected %s" % (version or "unknown", pins["torch"]))
        if cuda.split(".")[0] != major:
            problems.append("torch.version.cuda is %s, expected CUDA %s.x" % (cuda or "None", major))
    if sglang_probe.get("rc") != 0:
        problems.append("import sglang failed (rc %s): %s" % (sglang_probe.get("rc"), _tail(sglang_probe)))
    elif str(sglang_probe.get("stdout") or "").strip() != pins["sglang"]:
        found = str(sglang_probe.get("stdout") or "").strip() or "unknown"
        problems.append("sglang is %s, expected %s" % (found, pins["sglang"]))
    if flashinfer_probe.get("rc") != 0:
        problems.append("flashinfer show-config failed (rc %s): %s"
                        % (flashinfer_probe.get("rc"), _tail(flashinfer_probe)))
    flashinfer = facts.get("flashinfer") or {}
    expected = {"flashinfer-python": pins["flashinfer"], "flashinfer-cubin": pins["flashinfer"],
                "flashinfer-jit-cache": pins["flashinfer_jit_cache"]}
    wrong = ["%s %s" % (name, flashinfer.get(name) or "missing") for name, version in expected.items()
             if flashinfer.get(name) != version]
    if wrong:
        problems.append("FlashInfer packages are not all %s: %s" % (pins["flashinfer"], ", ".join(wrong)))
    return problems


def _tail(probe, limit=400) -> str:
    """The end of what a command printed (its stderr first); Ansible's msg only when it printed nothing."""
    text = " ".join(str(probe.get(k) or "").strip() for k in ("stderr", "stdout")).strip()
    return (text or str(probe.get("msg") or "").strip() or "no output")[-limit:]


class FilterModule:
    def filters(self):
        return {
            "sglang_cuda_tag": cuda_tag,
            "sglang_requirements": requirements,
            "sglang_pip_index_args": pip_index_args,
            "sglang_verify_problems": verify_problems,
        }
