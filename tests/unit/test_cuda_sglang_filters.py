"""Unit tests of role sglang's filters: the exact pins per index (one FlashInfer version, the cuXY
builds), pip's index arguments and the verify checks. The lab tests run the role itself."""
from __future__ import annotations


import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.filter import sglang as filters

VERSIONS = {"sglang": "0.5.10", "torch": "2.9.1", "flashinfer": "0.6.7.post2"}
PINS = filters.requirements(VERSIONS, "13.0")["versions"]
FLASHINFER_OK = {"flashinfer-python": "0.6.7.post2", "flashinfer-cubin": "0.6.7.post2",
                 "flashinfer-jit-cache": "0.6.7.post2+cu130"}


def test_requirements_pin_every_package_for_one_cuda():
    req = filters.requirements(VERSIONS, "13.0")
    assert req["torch"] == ["torch==2.9.1+cu130"]
    assert req["pypi"] == ["sglang==0.5.10", "flashinfer-python==0.6.7.post2", "flashinfer-cubin==0.6.7.post2"]
    assert req["flashinfer"] == ["flashinfer-jit-cache==0.6.7.post2+cu130"]
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
