"""The lab's stand-in indexes follow the released metadata (roles/sglang/vars/releases.yml), so an old
default of issue 24 put back fails against them as it fails against the real indexes (no lab needed):
the kernel 0.4.7 pins torch 2.13.0, flashinfer-cubin 0.7.2 is not on the PyPI stand-in, FlashInfer
0.6.16's fusion module has no SM 12, and a release without recorded metadata gets no stand-in."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pypirepo import StackVersions, build_stack_indexes
from pypirepo.stack import ReleaseNotRecorded, flashinfer_wheels, recorded, sglang_wheel

SMOKE = Path(__file__).resolve().parents[2] / "roles" / "sglang" / "files" / "smoke.py"


def _env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


def pip_install(target, index, *pins):
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
                           str(target), "--index-url", index.as_uri() + "/"] + list(pins),
                          capture_output=True, text=True, timeout=300, check=False, env=_env())


@pytest.fixture(scope="module")
def old_defaults(tmp_path_factory):
    """The stand-in indexes of the stack issue 24 found: the role's old kernel default 0.4.7."""
    root = tmp_path_factory.mktemp("old") / "idx"
    build_stack_indexes(root, StackVersions(kernel="0.4.7"), cuda_releases=("13.0",))
    return root


def test_the_sglang_stand_in_carries_the_real_pins(tmp_path):
    wheel = sglang_wheel(StackVersions(), tmp_path)
    import zipfile
    with zipfile.ZipFile(wheel) as archive:
        meta = archive.read("sglang-0.5.23.dist-info/METADATA").decode()
    requires = sorted(line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist"))
    assert requires == ["flashinfer-python==0.7.2", "sglang-kernel==0.4.10", "torch==2.14.1"]
    assert StackVersions.of_sglang("0.5.23") == StackVersions()


def test_the_old_kernel_default_does_not_install_beside_torch_2_14_1(old_defaults, tmp_path):
    assert pip_install(tmp_path, old_defaults / "torch" / "cu130", "torch==2.14.1+cu130").returncode == 0
    # As on SGLang's index: 0.4.7 wants torch 2.13.0, which no index here (or anywhere for cu130) offers.
    result = pip_install(tmp_path, old_defaults / "kernel" / "cu130", "sglang-kernel==0.4.7+cu130")
    assert result.returncode != 0 and "torch==2.13.0" in result.stderr, result.stderr
    assert recorded("sglang_kernel", "0.4.7")["requires"] == {"torch": "2.13.0"}


def test_flashinfer_cubin_0_7_2_is_only_on_the_flashinfer_index(old_defaults, tmp_path):
    missing = pip_install(tmp_path, old_defaults / "pypi" / "simple", "--no-deps", "flashinfer-cubin==0.7.2")
    assert missing.returncode != 0 and "No matching distribution" in missing.stderr, missing.stderr
    found = pip_install(tmp_path, old_defaults / "flashinfer" / "cu130", "--no-deps", "flashinfer-cubin==0.7.2")
    assert found.returncode == 0, found.stderr


@pytest.mark.parametrize("version, sm120", [("0.6.16", False), ("0.6.16.post4", False), ("0.6.17", True)])
def test_flashinfers_fusion_module_names_the_real_majors(tmp_path, version, sm120):
    wheels = flashinfer_wheels(version, ("13.0",), tmp_path / "wheels")
    python = next(w for w in wheels["pypi"] if w.name.startswith("flashinfer_python"))
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp_path / "site"),
                             str(python)], capture_output=True, text=True, timeout=300, check=False, env=_env())
    assert result.returncode == 0, result.stderr
    smoke = subprocess.run([sys.executable, str(SMOKE), "--arch", "12.0"], capture_output=True, text=True, timeout=300,
                           check=False, env=dict(_env(), PYTHONPATH=str(tmp_path / "site")))
    fusion = json.loads(smoke.stdout.strip().splitlines()[-1])["fusion"]
    assert fusion["archs"] == {"12.0": sm120}, fusion


def test_no_stand_in_without_recorded_metadata(tmp_path):
    with pytest.raises(ReleaseNotRecorded, match="sglang 0.5.99 is not recorded"):
        sglang_wheel(StackVersions(sglang="0.5.99"), tmp_path)
    with pytest.raises(ReleaseNotRecorded, match="flashinfer 0.6.15 is not recorded"):
        flashinfer_wheels("0.6.15", ("13.0",), tmp_path)
