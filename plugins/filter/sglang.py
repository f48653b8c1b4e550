# -*- coding: utf-8 -*-
"""Filters of role sglang: the pinned requirement sets, pip's index arguments, the compatibility
rules (GPU architecture x FlashInfer x CUDA, rules as data in roles/sglang/vars/main.yml), the
parsed `python -m sglang.check_env` output, and the verify checks.

Pure functions (unit-tested in tests/unit/test_cuda_sglang_filters.py).
"""
from __future__ import annotations

import json
import re
import shlex

from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.filter.sglang_releases import fusion_gate, gate_problem

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

    versions: {sglang, torch, flashinfer, kernel}; torch, the SGLang kernel and flashinfer-jit-cache
    get the +cuXY local label unless the given version carries one already. The kernel's package
    name follows its version (kernel_package: sgl-kernel up to 0.3.x, sglang-kernel from 0.4.0).
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
    kernel_spec = []
    kernel = kernel_name = None
    if versions.get("kernel") not in (None, ""):
        kernel = _check_version("sglang_kernel_version", versions.get("kernel"))
        if "+" not in kernel:
            kernel = "%s+%s" % (kernel, tag)
        elif not kernel.endswith("+" + tag):
            raise AnsibleFilterError("sglang_kernel_version: %r is not a %s build (sglang_cuda_version %s)"
                                     % (kernel, tag, cuda_version))
        kernel_name = kernel_package(kernel)
        kernel_spec = ["%s==%s" % (kernel_name, kernel)]
    return {
        "torch": ["torch==%s" % torch],
        "kernel": kernel_spec,
        "pypi": ["sglang==%s" % sglang, "flashinfer-python==%s" % flashinfer],
        # From FlashInfer's own index: PyPI's flashinfer-cubin stops at 0.6.13 and it has no
        # flashinfer-jit-cache at all (vars/releases.yml, on_pypi).
        "flashinfer": ["flashinfer-cubin==%s" % flashinfer, "flashinfer-jit-cache==%s+%s" % (flashinfer, tag)],
        "versions": {"sglang": sglang, "torch": torch, "flashinfer": flashinfer,
                     "flashinfer_jit_cache": "%s+%s" % (flashinfer, tag),
                     "kernel": kernel, "kernel_package": kernel_name, "cuda_tag": tag},
    }


# The SGLang kernel's distribution was published as `sgl-kernel` up to 0.3.21.post1 and as
# `sglang-kernel` from 0.4.0 (sgl-project/sglang#20440 "Release sglang kernel 0.4.0", 2026-03-12;
# #32648 keeps the name sglang-kernel and the import name sgl_kernel).
KERNEL_RENAMED_AT = (0, 4, 0)


def kernel_package(kernel_version) -> str:
    """The distribution name of the SGLang kernel at `kernel_version`: sgl-kernel (< 0.4.0) or sglang-kernel."""
    return "sglang-kernel" if _release(kernel_version) >= KERNEL_RENAMED_AT else "sgl-kernel"


def _release(version) -> tuple:
    """The release numbers of a version (0.6.7.post2+cu130 -> (0, 6, 7)); pre/post/local parts ignored."""
    match = re.match(r"^\s*(\d+(?:\.\d+)*)", str(version or ""))
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def _version_key(version) -> tuple:
    """Sortable key of a PEP 440 version: release, then pre-release (a < b < rc < final), then post."""
    text = str(version or "").split("+", 1)[0]
    release = _release(text)
    pre = re.search(r"(a|b|rc)(\d+)", text)
    post = re.search(r"\.post(\d+)", text)
    pre_key = ({"a": 0, "b": 1, "rc": 2}[pre.group(1)], int(pre.group(2))) if pre else (3, 0)
    return release + (0,) * (6 - len(release)), pre_key, int(post.group(1)) if post else -1


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


# ---------------------------------------------------------------------------------------------
# Compatibility rules (data: roles/sglang/vars/main.yml, _sglang_compat_rules)
# ---------------------------------------------------------------------------------------------

def _rule_for(arch, rules):
    """The rule of compute capability `arch` (X.Y): the exact one, else the X.x one, else None."""
    arch = str(arch or "").strip()
    major = arch.split(".", 1)[0]
    exact = [r for r in rules or [] if str(r.get("arch")) == arch]
    wild = [r for r in rules or [] if str(r.get("arch")) == major + ".x"]
    return (exact or wild or [None])[0]


def _gpu_groups(gpus):
    """[(indexes, name, arch)] for the GPUs, identical ones together (GPU 0,1,2 NVIDIA ... SM 12.0)."""
    groups = {}
    for gpu in gpus or []:
        key = (str(gpu.get("name") or "unknown GPU"), str(gpu.get("compute_capability") or ""))
        groups.setdefault(key, []).append(str(gpu.get("index", "?")))
    return [(",".join(idx), name, arch) for (name, arch), idx in groups.items()]


def _source(rule, what):
    text = rule.get(what + "_source") or "no source recorded"
    if not rule.get(what + "_verified", False):
        text += "; this number is not verified from a source"
    return text


def compat(gpus, pins, cuda_version, rules, require_fusion=True, host="the host", releases=None) -> dict:
    """The GPUs' compute capability against the rules: {checked, gpus: [...], problems: [...]}.

    A GPU whose rule says FlashInfer's allreduce fusion runs there from FlashInfer `flashinfer_min`
    and FlashInfer's JIT needs CUDA `cuda_min` is a problem when the pinned FlashInfer or the CUDA
    release is older; a GPU without fusion (or without a rule) is one when require_fusion is true.
    Fusion also needs SGLang's own gate (releases: vars/releases.yml, filter sglang_fusion_gate):
    SGLang 0.5.14+ raises at start on any GPU outside it, older releases skip the fusion there.
    Each problem names the GPU, the versions and the fix. No GPU seen: nothing to check.
    """
    gate = fusion_gate(pins["sglang"], releases)
    flashinfer = pins["flashinfer"]
    cuda = str(cuda_version)
    report = {"checked": bool(gpus), "require_fusion": bool(require_fusion), "gpus": [], "problems": []}
    for indexes, name, arch in _gpu_groups(gpus):
        label = "GPU %s %s (SM %s) on %s" % (indexes, name, arch or "unknown", host)
        rule = _rule_for(arch, rules)
        entry = {"gpus": indexes, "name": name, "arch": arch, "rule": rule and rule.get("arch"),
                 "fusion": False, "flashinfer_min": None, "cuda_min": None, "sglang_allows": None}
        report["gpus"].append(entry)
        if rule is None:
            if require_fusion:
                report["problems"].append(
                    "%s: no compatibility rule for SM %s (_sglang_compat_rules), so FlashInfer's allreduce fusion "
                    "cannot be promised there with FlashInfer %s and CUDA %s. Fix: add a rule for it with its source, "
                    "or set sglang_require_allreduce_fusion: false." % (label, arch or "unknown", flashinfer, cuda))
            continue
        entry.update(flashinfer_min=rule.get("flashinfer_min"), cuda_min=rule.get("cuda_min"))
        cuda_min = rule.get("cuda_min")
        if cuda_min and _release(cuda) < _release(cuda_min):
            report["problems"].append(
                "%s: FlashInfer's JIT needs CUDA >= %s on SM %s (%s), the stack is built for CUDA %s. Fix: set "
                "cuda_toolkit_version / sglang_cuda_version to %s or newer." % (label, cuda_min, rule["arch"],
                                                                                _source(rule, "cuda"), cuda, cuda_min))
        if not rule.get("fusion"):
            if require_fusion:
                report["problems"].append(
                    "%s: FlashInfer's allreduce fusion does not run on SM %s (%s); FlashInfer %s, CUDA %s. Fix: set "
                    "sglang_require_allreduce_fusion: false to run without it." % (
                        label, rule["arch"], _source(rule, "flashinfer"), flashinfer, cuda))
            continue
        minimum = rule.get("flashinfer_min")
        if minimum and _version_key(flashinfer) < _version_key(minimum):
            if require_fusion:
                report["problems"].append(
                    "%s cannot run FlashInfer's allreduce fusion with FlashInfer %s: SM %s needs FlashInfer >= %s "
                    "(%s). Fix: set sglang_flashinfer_version to %s or newer (with an SGLang release that pins it), "
                    "or sglang_require_allreduce_fusion: false to run without fusion." % (
                        label, flashinfer, rule["arch"], minimum, _source(rule, "flashinfer"), minimum))
            continue
        if gate:
            major = _release(arch)[:1]
            entry["sglang_allows"] = bool(major) and major[0] in gate["majors"]
            if not entry["sglang_allows"]:
                if require_fusion:
                    report["problems"].append(gate_problem(label, arch, pins["sglang"], gate, releases))
                continue
        entry["fusion"] = True
    return report


# ---------------------------------------------------------------------------------------------
# python -m sglang.check_env
# ---------------------------------------------------------------------------------------------

# check_env prints `key: value` lines (sglang/check_env.py: check_env()); the topology value is
# `nvidia-smi topo -m`'s table on the lines after its key, up to the next key check_env prints.
_AFTER_TOPOLOGY = ("Hypervisor vendor", "ulimit soft")
# SGLang's own key carries a colon, so it prints "Hypervisor vendor:: KVM" (sglang 0.5.23
# sglang/check_env.py:118 returns {"Hypervisor vendor:": ...}, :141 prints f"{k}: {v}"): a key is
# read without its trailing colons.
_GPU_KEY = re.compile(r"^GPU ([\d,]+)$")
_GPU_CC_KEY = re.compile(r"^GPU ([\d,]+) Compute Capability$")


def check_env(stdout) -> dict:
    """`python -m sglang.check_env` text -> {python, cuda_available, gpus, compute_capability, cuda_home,
    nvcc, nvcc_release, driver, torch, topology, hypervisor, ulimit_soft, packages: {name: version}}."""
    fields, topology, current = {}, None, None
    for line in str(stdout or "").splitlines():
        key, sep, value = line.partition(": ")
        key = key.rstrip(":") if sep else key
        if current is not None:
            if not (sep and key in _AFTER_TOPOLOGY):
                topology.append(line)
                continue
            current = None
        if not sep:
            key, sep, value = line.partition(":")
            if not sep or not key or line[:1].isspace():
                continue
        key, value = key.strip(), value.strip()
        if key in ("NVIDIA Topology", "AMD Topology"):
            topology, current = ([value] if value else []), key
            continue
        fields[key] = value
    info = {"python": fields.pop("Python", None), "cuda_available": None, "gpus": {}, "compute_capability": {},
            "cuda_home": fields.pop("CUDA_HOME", None), "nvcc": fields.pop("NVCC", None), "nvcc_release": None,
            "driver": fields.pop("CUDA Driver Version", None) or fields.pop("CUDA Driver Versions", None),
            "torch": fields.pop("PyTorch", None),
            "topology": "\n".join(topology).strip("\n") if topology is not None else None,
            "hypervisor": fields.pop("Hypervisor vendor", None), "ulimit_soft": fields.pop("ulimit soft", None),
            "packages": {}}
    available = fields.pop("CUDA available", None)
    if available is not None:
        info["cuda_available"] = available == "True"
    match = re.search(r"release (\d+\.\d+)", info["nvcc"] or "")
    info["nvcc_release"] = match.group(1) if match else None
    for key, value in fields.items():
        cc, gpu = _GPU_CC_KEY.match(key), _GPU_KEY.match(key)
        if cc:
            info["compute_capability"][cc.group(1)] = value
        elif gpu:
            info["gpus"][gpu.group(1)] = value
        else:
            info["packages"][key] = None if value == "Module Not Found" else value
    return info


# ---------------------------------------------------------------------------------------------
# Verify: the kernel, check_env, allreduce fusion and the CUDA smoke test (files/smoke.py)
# ---------------------------------------------------------------------------------------------

def smoke_result(probe) -> dict:
    """The JSON smoke.py printed (its last line); {'error': ...} when it printed none."""
    lines = [ln for ln in str((probe or {}).get("stdout") or "").splitlines() if ln.strip().startswith("{")]
    if not lines:
        return {"error": "smoke.py printed no JSON (rc %s): %s" % ((probe or {}).get("rc"), _tail(probe or {}))}
    try:
        return json.loads(lines[-1])
    except ValueError as err:
        return {"error": "smoke.py printed bad JSON: %s" % err}


def smoke_fact(smoke) -> dict:
    """The smoke result as the local fact keeps it: without its timings and numeric noise (ms, seconds,
    max_abs_diff), so that a rerun on a converged host writes the same fact (changed=0); the times are
    in verify's message. The kernel and fusion parts are recorded under their own keys."""
    smoke = dict(smoke or {})
    for key in ("seconds", "kernel", "fusion"):
        smoke.pop(key, None)
    smoke["devices"] = [{k: v for k, v in d.items() if k not in ("ms", "max_abs_diff")}
                        for d in smoke.get("devices") or []]
    if isinstance(smoke.get("jit"), dict):
        smoke["jit"] = {k: v for k, v in smoke["jit"].items() if k != "seconds"}
    return smoke


def stack_problems(pins, smoke, check_env_probe, compat_report, cuda_version) -> list:
    """What is wrong beyond the pins, one sentence each: the SGLang kernel's version and CUDA build,
    `python -m sglang.check_env`, allreduce fusion in the venv for the GPUs' architectures (when
    required), and the smoke test (a matmul on every GPU, FlashInfer's JIT)."""
    problems = []
    smoke = smoke or {}
    major = str(cuda_version).split(".", 1)[0]
    if smoke.get("error"):
        return [smoke["error"]]
    kernel = smoke.get("kernel") or {}
    if pins.get("kernel"):
        name = pins["kernel_package"]
        found = kernel.get("version")
        if kernel.get("package") != name or found != pins["kernel"]:
            problems.append("%s is %s, expected %s" % (name, ("%s %s" % (kernel.get("package"), found))
                                                       if found else "missing", pins["kernel"]))
        cudart = sorted(set(kernel.get("cudart") or []))
        if cudart and cudart != [major]:
            problems.append("%s %s links %s (CUDA %s), expected CUDA %s: a wheel of another CUDA build. Install the "
                            "%s build from sglang_kernel_index_url" % (
                                name, found, ", ".join("libcudart.so.%s" % v for v in cudart), "/".join(cudart), major,
                                pins["cuda_tag"]))
        if kernel.get("error"):
            problems.append("%s does not import: %s" % (name, kernel["error"]))
    if (check_env_probe or {}).get("rc") != 0:
        problems.append("python -m sglang.check_env failed (rc %s): %s"
                        % ((check_env_probe or {}).get("rc"), _tail(check_env_probe or {})))
    report = compat_report or {}
    fusion = smoke.get("fusion") or {}
    if report.get("require_fusion") and report.get("checked"):
        archs = fusion.get("archs") or {}
        missing = [name for name, ok in (fusion.get("entry_points") or {}).items() if not ok]
        if fusion.get("error") or missing:
            problems.append("FlashInfer's allreduce fusion is not available in the venv: %s"
                            % (fusion.get("error") or "missing " + ", ".join(missing)))
        else:
            unsupported = sorted(a for a, ok in archs.items() if not ok)
            if unsupported:
                problems.append("FlashInfer %s in the venv does not build its allreduce fusion for SM %s (its "
                                "supported majors: %s)" % (pins["flashinfer"], ", ".join(unsupported),
                                                           fusion.get("supported_majors")))
    for device in smoke.get("devices") or []:
        if not device.get("ok"):
            problems.append("the CUDA smoke test failed on GPU %s (%s): %s" % (device.get("index"), device.get("name"),
                                                                               device.get("error")))
    jit = smoke.get("jit") or {}
    if jit.get("ran") and not jit.get("ok"):
        problems.append("FlashInfer's JIT build of a small kernel failed: %s" % jit.get("error"))
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
            "sglang_kernel_package": kernel_package,
            "sglang_compat": compat,
            "sglang_check_env": check_env,
            "sglang_smoke_result": smoke_result,
            "sglang_smoke_fact": smoke_fact,
            "sglang_stack_problems": stack_problems,
        }
