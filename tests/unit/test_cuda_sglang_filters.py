"""Unit tests of role sglang's filters: the exact pins per index (one FlashInfer version, the cuXY
builds), pip's index arguments and the verify checks. The lab tests run the role itself."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.filter import sglang as filters

VERSIONS = {"sglang": "0.5.10", "torch": "2.9.1", "flashinfer": "0.6.7.post2"}
PINS = filters.requirements(VERSIONS, "13.0")["versions"]
FLASHINFER_OK = {"flashinfer-python": "0.6.7.post2", "flashinfer-cubin": "0.6.7.post2",
                 "flashinfer-jit-cache": "0.6.7.post2+cu130"}


def test_requirements_pin_every_package_for_one_cuda():
    req = filters.requirements(VERSIONS, "13.0")
    assert req["torch"] == ["torch==2.9.1+cu130"]
    assert req["pypi"] == ["sglang==0.5.10", "flashinfer-python==0.6.7.post2"]
    # cubin and jit-cache from FlashInfer's index (PyPI's cubin stops at 0.6.13, it has no jit-cache).
    assert req["flashinfer"] == ["flashinfer-cubin==0.6.7.post2", "flashinfer-jit-cache==0.6.7.post2+cu130"]
    assert filters.requirements(VERSIONS, "12.8")["torch"] == ["torch==2.9.1+cu128"]
    # A torch version that already names its build is taken as is, if it is the right one.
    assert filters.requirements(dict(VERSIONS, torch="2.9.1+cu130"), "13.0")["torch"] == ["torch==2.9.1+cu130"]


def test_requirements_refuse_a_torch_build_for_another_cuda():
    with pytest.raises(AnsibleFilterError, match=r"sglang_torch_version: '2\.9\.1\+cu128' is not a cu130 build"):
        filters.requirements(dict(VERSIONS, torch="2.9.1+cu128"), "13.0")


@pytest.mark.parametrize("key, value, variable", [
    ("sglang", ">=0.5", "sglang_version"), ("sglang", "latest", "sglang_version"),
    ("torch", "2.9.*", "sglang_torch_version"), ("flashinfer", "", "sglang_flashinfer_version")])
def test_requirements_refuse_anything_but_exact_versions(key, value, variable):
    with pytest.raises(AnsibleFilterError, match="%s: .* is not an exact version" % variable):
        filters.requirements(dict(VERSIONS, **{key: value}), "13.0")


def test_one_public_flashinfer_version():
    with pytest.raises(AnsibleFilterError, match="sglang_flashinfer_version: .* carries a local label"):
        filters.requirements(dict(VERSIONS, flashinfer="0.6.7.post2+cu130"), "13.0")


@pytest.mark.parametrize("cuda", ["13", "13.0.1", "cu130", ""])
def test_cuda_version_is_x_y(cuda):
    with pytest.raises(AnsibleFilterError, match="sglang_cuda_version"):
        filters.cuda_tag(cuda)


def test_pip_index_args():
    assert filters.pip_index_args("https://download.pytorch.org/whl/cu130") == \
        "--index-url https://download.pytorch.org/whl/cu130"
    assert filters.pip_index_args("http://10.0.0.1:8000/simple/", ["10.0.0.1"], "--no-cache-dir") == \
        "--index-url http://10.0.0.1:8000/simple/ --trusted-host 10.0.0.1 --no-cache-dir"
    with pytest.raises(AnsibleFilterError, match="is not an http"):
        filters.pip_index_args("download.pytorch.org/whl/cu130")


def _probe(stdout="", rc=0, stderr=""):
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def test_verify_passes_on_the_pinned_stack():
    assert filters.verify_problems(PINS, {"flashinfer": FLASHINFER_OK}, _probe("2.9.1+cu130\n13.0\n"),
                                   _probe("0.5.10\n"), _probe("=== Version Info ==="), "13.0") == []


def test_verify_names_each_problem():
    problems = filters.verify_problems(
        PINS, {"flashinfer": dict(FLASHINFER_OK, **{"flashinfer-jit-cache": "0.6.7.post2+cu128"})},
        _probe("2.9.1+cu128\n12.8\n"), _probe(rc=1, stderr="ModuleNotFoundError: No module named 'sglang'"),
        _probe(rc=1, stderr="ModuleNotFoundError: No module named 'torch'"), "13.0")
    assert problems == [
        "torch is 2.9.1+cu128, expected 2.9.1+cu130",
        "torch.version.cuda is 12.8, expected CUDA 13.x",
        "import sglang failed (rc 1): ModuleNotFoundError: No module named 'sglang'",
        "flashinfer show-config failed (rc 1): ModuleNotFoundError: No module named 'torch'",
        "FlashInfer packages are not all 0.6.7.post2: flashinfer-jit-cache 0.6.7.post2+cu128",
    ]


def test_verify_reports_missing_flashinfer_packages_and_a_cpu_torch():
    problems = filters.verify_problems(PINS, {"flashinfer": {"flashinfer-python": "0.6.7.post2"}},
                                       _probe("2.9.1+cu130\nNone\n"), _probe("0.5.10"), _probe(), "13.0")
    assert problems == ["torch.version.cuda is None, expected CUDA 13.x",
                        "FlashInfer packages are not all 0.6.7.post2: flashinfer-cubin missing, "
                        "flashinfer-jit-cache missing"]


# --- the SGLang kernel -------------------------------------------------------------------------

def test_kernel_is_pinned_for_the_cuda_build_under_its_release_name():
    req = filters.requirements(dict(VERSIONS, kernel="0.4.7"), "13.0")
    assert req["kernel"] == ["sglang-kernel==0.4.7+cu130"]
    assert (req["versions"]["kernel"], req["versions"]["kernel_package"]) == ("0.4.7+cu130", "sglang-kernel")
    # Before 0.4.0 the distribution was sgl-kernel (sgl-project/sglang#20440).
    assert filters.requirements(dict(VERSIONS, kernel="0.3.21.post1"), "12.8")["kernel"] == \
        ["sgl-kernel==0.3.21.post1+cu128"]
    assert filters.requirements(VERSIONS, "13.0")["kernel"] == []     # no pin: sglang's own requirement
    with pytest.raises(AnsibleFilterError, match=r"sglang_kernel_version: '0\.4\.7\+cu128' is not a cu130 build"):
        filters.requirements(dict(VERSIONS, kernel="0.4.7+cu128"), "13.0")
    with pytest.raises(AnsibleFilterError, match="sglang_kernel_version: .* is not an exact version"):
        filters.requirements(dict(VERSIONS, kernel="0.4.*"), "13.0")


@pytest.mark.parametrize("version, name", [("0.3.21.post1", "sgl-kernel"), ("0.3.7", "sgl-kernel"),
                                           ("0.4.0", "sglang-kernel"), ("0.4.6.post1+cu130", "sglang-kernel")])
def test_kernel_package_name_changed_at_0_4_0(version, name):
    assert filters.kernel_package(version) == name


# --- the compatibility rules (the role's own table) --------------------------------------------

ROLE = Path(__file__).resolve().parents[2] / "roles" / "sglang"
RULES = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_sglang_compat_rules"]
RTX = {"index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "compute_capability": "12.0"}
H200 = {"index": 0, "name": "NVIDIA H200", "compute_capability": "9.0"}
KPINS = filters.requirements(dict(VERSIONS, kernel="0.4.7"), "13.0")["versions"]


def _pins(flashinfer):
    return filters.requirements(dict(VERSIONS, flashinfer=flashinfer, kernel="0.4.7"), "13.0")["versions"]


def test_every_rule_names_its_source_and_says_whether_it_is_verified():
    assert {r["arch"] for r in RULES} >= {"12.0", "9.0", "10.x", "8.x"}
    for rule in RULES:
        assert rule.get("flashinfer_source"), rule
        assert isinstance(rule.get("flashinfer_verified"), bool), rule
        if rule["fusion"]:
            assert rule.get("flashinfer_min") and rule.get("cuda_min") and rule.get("cuda_source"), rule
            assert isinstance(rule.get("cuda_verified"), bool), rule


def test_sm120_with_a_flashinfer_below_the_fusion_minimum_is_refused_naming_gpu_versions_and_fix():
    gpus = [dict(RTX, index=i) for i in range(8)]
    report = filters.compat(gpus, _pins("0.6.7.post2"), "13.0", RULES, True, "ct129")
    assert report["checked"] and len(report["problems"]) == 1
    problem = report["problems"][0]
    assert problem.startswith("GPU 0,1,2,3,4,5,6,7 NVIDIA RTX PRO 6000 Blackwell Server Edition (SM 12.0) on ct129 "
                              "cannot run FlashInfer's allreduce fusion with FlashInfer 0.6.7.post2: SM 12.0 needs "
                              "FlashInfer >= 0.6.17"), problem
    assert "flashinfer/jit/comm.py:192" in problem and "not verified" not in problem
    assert "Fix: set sglang_flashinfer_version to 0.6.17 or newer" in problem
    assert "sglang_require_allreduce_fusion: false" in problem
    assert report["gpus"] == [{"gpus": "0,1,2,3,4,5,6,7", "name": RTX["name"], "arch": "12.0", "rule": "12.0",
                               "fusion": False, "flashinfer_min": "0.6.17", "cuda_min": "12.8", "sglang_allows": None}]
    # Only reported when fusion is not required.
    assert filters.compat(gpus, _pins("0.6.7.post2"), "13.0", RULES, False, "ct129")["problems"] == []


@pytest.mark.parametrize("flashinfer", ["0.6.17", "0.6.18", "0.7.2"])
def test_sm120_passes_flashinfers_rule_from_the_minimum(flashinfer):
    # FlashInfer's rule alone (no SGLang gate data): see test_sglang_release_filters.py for the gate.
    report = filters.compat([RTX], _pins(flashinfer), "13.0", RULES, True, "ct129")
    assert report["problems"] == [] and report["gpus"][0]["fusion"] is True


@pytest.mark.parametrize("flashinfer", ["0.6.17rc1", "0.6.16", "0.6.16.post4"])
def test_below_the_minimum_pre_releases_and_0_6_16_posts_included(flashinfer):
    assert filters.compat([RTX], _pins(flashinfer), "13.0", RULES, True)["problems"]


def test_sm12x_needs_the_cuda_its_jit_builds_with():
    problems = filters.compat([RTX], _pins("0.7.2"), "12.6", RULES, True, "ct129")["problems"]
    assert problems == ["GPU 0 NVIDIA RTX PRO 6000 Blackwell Server Edition (SM 12.0) on ct129: FlashInfer's JIT needs "
                        "CUDA >= 12.8 on SM 12.0 (CUDA 12.8 release notes (first nvcc with sm_120 / compute_120)), the "
                        "stack is built for CUDA 12.6. Fix: set cuda_toolkit_version / sglang_cuda_version to 12.8 or newer."]
    spark = dict(RTX, name="NVIDIA GB10", compute_capability="12.1")
    assert "CUDA >= 12.9" in filters.compat([spark], _pins("0.7.2"), "12.8", RULES, True)["problems"][0]


def test_hopper_and_gpus_without_fusion():
    assert filters.compat([H200], _pins("0.6.7.post2"), "13.0", RULES, True)["problems"] == []
    l40s = {"index": 0, "name": "NVIDIA L40S", "compute_capability": "8.9"}
    problems = filters.compat([l40s], _pins("0.7.2"), "13.0", RULES, True, "ct1")["problems"]
    assert len(problems) == 1 and "does not run on SM 8.x" in problems[0] and "sglang_require_allreduce_fusion" in problems[0]
    unknown = {"index": 3, "name": "Future GPU", "compute_capability": "15.0"}
    assert "no compatibility rule for SM 15.0" in filters.compat([unknown], _pins("0.7.2"), "13.0", RULES, True)["problems"][0]


def test_no_gpu_seen_checks_nothing():
    assert filters.compat([], _pins("0.6.7.post2"), "13.0", RULES, True) == \
        {"checked": False, "require_fusion": True, "gpus": [], "problems": []}


# --- python -m sglang.check_env ----------------------------------------------------------------

# The format of sglang/check_env.py (check_env(): `key: value`, the topology table after its key;
# "Hypervisor vendor:: KVM" with two colons, as sglang 0.5.23's check_env.py:118/:141 print it).
CHECK_ENV = """Python: 3.12.3 (main, Nov  6 2025, 13:44:16) [GCC 13.3.0]
CUDA available: True
GPU 0,1: NVIDIA RTX PRO 6000 Blackwell Server Edition
GPU 0,1 Compute Capability: 12.0
CUDA_HOME: /usr/local/cuda
NVCC: Cuda compilation tools, release 13.0, V13.0.88
CUDA Driver Version: 580.95.05
PyTorch: 2.14.1+cu130
sglang: 0.5.23
sgl_kernel: 0.4.7
flashinfer: 0.7.2
triton: 3.7.1
vllm: Module Not Found
NVIDIA Topology:\x20
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tPHB\t0-15\t0\t\tN/A
GPU1\tPHB\t X \t0-15\t0\t\tN/A

Legend:

  X    = Self
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)

Hypervisor vendor:: KVM
ulimit soft: 1048576
"""


def test_check_env_is_parsed_into_the_fact():
    info = filters.check_env(CHECK_ENV)
    assert info["python"].startswith("3.12.3") and info["cuda_available"] is True
    assert info["gpus"] == {"0,1": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}
    assert info["compute_capability"] == {"0,1": "12.0"}
    assert (info["cuda_home"], info["nvcc"], info["nvcc_release"], info["driver"], info["torch"]) == \
        ("/usr/local/cuda", "Cuda compilation tools, release 13.0, V13.0.88", "13.0", "580.95.05", "2.14.1+cu130")
    assert info["packages"] == {"sglang": "0.5.23", "sgl_kernel": "0.4.7", "flashinfer": "0.7.2", "triton": "3.7.1",
                                "vllm": None}
    assert info["topology"].splitlines()[1].startswith("GPU0\t X \tPHB")
    assert "PHB  = Connection traversing PCIe" in info["topology"]
    assert (info["hypervisor"], info["ulimit_soft"]) == ("KVM", "1048576")
    assert "Hypervisor" not in info["topology"]
    # One colon (older output, other tools) reads the same.
    assert filters.check_env(CHECK_ENV.replace("vendor:: KVM", "vendor: KVM"))["hypervisor"] == "KVM"


def test_check_env_without_a_gpu():
    info = filters.check_env("Python: 3.11.2\nCUDA available: False\nPyTorch: 2.14.1+cu130\nsglang: 0.5.23\n"
                             "ulimit soft: 1024\n")
    assert info["cuda_available"] is False and info["nvcc"] is None and info["topology"] is None
    assert info["packages"] == {"sglang": "0.5.23"} and info["gpus"] == {}


# --- verify: kernel, check_env, fusion, smoke test ---------------------------------------------

def _smoke(**parts):
    base = {"smoke": 1, "gpu": False, "reason": "no GPU", "devices": [],
            "kernel": {"package": "sglang-kernel", "version": "0.4.7+cu130", "cudart": ["13"]},
            "fusion": {"available": True, "entry_points": {"trtllm_allreduce_fusion": True}, "archs": {"12.0": True},
                       "supported_majors": [9, 10, 12]},
            "jit": {"ran": False, "reason": "no GPU"}}
    base.update(parts)
    return base


COMPAT_SM120 = filters.compat([RTX], KPINS | {"flashinfer": "0.7.2"}, "13.0", RULES, True)


def test_stack_passes_on_the_pinned_kernel_and_fusion():
    assert filters.stack_problems(KPINS, _smoke(), _probe("Python: 3"), COMPAT_SM120, "13.0") == []


def test_a_kernel_wheel_of_another_cuda_build_is_named():
    smoke = _smoke(kernel={"package": "sglang-kernel", "version": "0.4.7+cu130", "cudart": ["12"]})
    assert filters.stack_problems(KPINS, smoke, _probe(), COMPAT_SM120, "13.0") == [
        "sglang-kernel 0.4.7+cu130 links libcudart.so.12 (CUDA 12), expected CUDA 13: a wheel of another CUDA "
        "build. Install the cu130 build from sglang_kernel_index_url"]
    smoke = _smoke(kernel={"package": "sgl-kernel", "version": "0.3.21", "cudart": []})
    assert filters.stack_problems(KPINS, smoke, _probe(), COMPAT_SM120, "13.0") == \
        ["sglang-kernel is sgl-kernel 0.3.21, expected 0.4.7+cu130"]
    smoke = _smoke(kernel={"package": None, "version": None})
    assert filters.stack_problems(KPINS, smoke, _probe(), COMPAT_SM120, "13.0") == \
        ["sglang-kernel is missing, expected 0.4.7+cu130"]


def test_fusion_missing_in_the_venv_or_for_the_gpu_architecture():
    smoke = _smoke(fusion={"entry_points": {"trtllm_allreduce_fusion": False}, "archs": {"12.0": False}})
    assert filters.stack_problems(KPINS, smoke, _probe(), COMPAT_SM120, "13.0") == \
        ["FlashInfer's allreduce fusion is not available in the venv: missing trtllm_allreduce_fusion"]
    smoke = _smoke(fusion={"entry_points": {"trtllm_allreduce_fusion": True}, "archs": {"12.0": False},
                           "supported_majors": [9, 10]})
    assert filters.stack_problems(KPINS, smoke, _probe(), COMPAT_SM120, "13.0") == \
        ["FlashInfer 0.6.7.post2 in the venv does not build its allreduce fusion for SM 12.0 (its supported majors: [9, 10])"]
    # Not required (or no GPU seen): reported in the fact only.
    relaxed = dict(COMPAT_SM120, require_fusion=False)
    assert filters.stack_problems(KPINS, smoke, _probe(), relaxed, "13.0") == []


def test_check_env_and_smoke_failures():
    smoke = _smoke(gpu=True, devices=[{"index": 0, "name": "H200", "ok": True, "ms": 0.2},
                                      {"index": 1, "name": "H200", "ok": False, "error": "CUDA error: ECC"}],
                   jit={"ran": True, "ok": False, "error": "nvcc fatal"})
    problems = filters.stack_problems(KPINS, smoke, _probe(rc=1, stderr="No module named sglang.check_env"),
                                      COMPAT_SM120, "13.0")
    assert problems == ["python -m sglang.check_env failed (rc 1): No module named sglang.check_env",
                        "the CUDA smoke test failed on GPU 1 (H200): CUDA error: ECC",
                        "FlashInfer's JIT build of a small kernel failed: nvcc fatal"]
    assert filters.stack_problems(KPINS, filters.smoke_result(_probe("Traceback", rc=1)), _probe(), COMPAT_SM120,
                                  "13.0") == ["smoke.py printed no JSON (rc 1): Traceback"]


def test_the_fact_keeps_no_timings():
    smoke = _smoke(gpu=True, seconds=3.2, devices=[{"index": 0, "ok": True, "ms": 0.21, "max_abs_diff": 0.001}],
                   jit={"ran": True, "ok": True, "seconds": 41.0})
    fact = filters.smoke_fact(smoke)
    assert fact["devices"] == [{"index": 0, "ok": True}] and fact["jit"] == {"ran": True, "ok": True}
    assert "seconds" not in fact and "kernel" not in fact and "fusion" not in fact


def test_smoke_script_runs_outside_ansible_and_says_when_there_is_no_gpu():
    proc = subprocess.run([sys.executable, str(ROLE / "files" / "smoke.py"), "--arch", "12.0"],
                          capture_output=True, text=True, timeout=300, check=False)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["gpu"]:
        pytest.skip("this machine has a GPU: the lab and CI have none")
    assert proc.returncode == 0, proc.stderr
    assert out["reason"].startswith(("no GPU", "torch does not import")) and out["devices"] == []
    assert out["jit"] == {"ran": False, "ok": None, "nvcc": None, "nvcc_release": None, "reason": "no --nvcc given"}
    assert set(out["fusion"]["archs"]) == {"12.0"} and "kernel" in out and out["ok"] is True
