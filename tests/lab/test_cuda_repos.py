"""The lab's test repositories on their own (no lab needed): the signed APT repository with NVIDIA-like
packages is accepted by apt and its packages look like the real ones; the PyPI-style indexes install
with pip and the stand-in wheels answer like torch, sglang and flashinfer."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aptrepo import PUBLIC_KEY_NAME, SigningKey, ToolkitSpec, build_cuda_repo
from pypirepo import StackVersions, build_stack_indexes

# Like the lab: skipped without the tools, except under CI (env CI set), where that fails instead.
needs_gpg = pytest.mark.skipif((shutil.which("gpg") is None or shutil.which("apt-get") is None)
                               and not os.environ.get("CI"),
                               reason="needs gpg and apt-get (Debian packages gpg, apt)")


@pytest.fixture(scope="module")
def apt_repo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("aptrepo")
    url = "file://%s/repo/" % tmp
    with SigningKey(tmp / "gnupg") as key:
        build_cuda_repo(tmp / "repo", key, url, [ToolkitSpec("12.8.1"), ToolkitSpec("13.0.0"),
                                                 ToolkitSpec("13.0.1", broken=True)])
    return tmp, url


def private_apt(tmp: Path, sources: str) -> list[str]:
    """apt-get options for an apt that only knows `sources` and keeps its state under tmp/apt."""
    root = tmp / "apt"
    for sub in ("etc/sources.list.d", "etc/preferences.d", "state/lists/partial", "cache/archives/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "etc/sources.list").write_text(sources)
    (root / "state/status").touch()
    return ["-o", "Dir::Etc=%s/etc" % root, "-o", "Dir::State=%s/state" % root, "-o", "Dir::Cache=%s/cache" % root,
            "-o", "Dir::State::status=%s/state/status" % root, "-o", "Debug::NoLocking=1",
            "-o", "APT::Sandbox::User=%s" % ("root" if os.geteuid() == 0 else os.environ.get("USER", "nobody"))]


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, **kwargs)


@needs_gpg
def test_apt_accepts_the_signed_repository_and_sees_every_version(apt_repo):
    tmp, url = apt_repo
    opts = private_apt(tmp, "deb [signed-by=%s/repo/%s] %s /\n" % (tmp, PUBLIC_KEY_NAME, url))
    update = run(["apt-get", *opts, "update"])
    assert update.returncode == 0 and "NO_PUBKEY" not in update.stderr, update.stdout + update.stderr
    policy = run(["apt-cache", *opts, "policy", "cuda-toolkit-13-0", "cuda-toolkit-12-8"]).stdout
    assert "13.0.1-1 500" in policy and "13.0.0-1 500" in policy and "12.8.1-1 500" in policy
    plan = run(["apt-get", *opts, "install", "--simulate", "cuda-toolkit-13-0=13.0.0-1"]).stdout
    assert "Inst cuda-toolkit-13-0 (13.0.0-1" in plan


@needs_gpg
def test_apt_refuses_the_repository_with_another_key(apt_repo, tmp_path):
    tmp, url = apt_repo
    with SigningKey(tmp_path / "other") as other:
        (tmp_path / "other.asc").write_text(other.public_key_armored())
    opts = private_apt(tmp_path, "deb [signed-by=%s/other.asc] %s /\n" % (tmp_path, url))
    update = run(["apt-get", *opts, "update"])
    assert "NO_PUBKEY" in update.stdout + update.stderr or "not signed" in update.stdout + update.stderr


@needs_gpg
def test_toolkit_packages_install_like_nvidias(apt_repo, tmp_path):
    tmp, _url = apt_repo
    deb = tmp / "repo" / "cuda-toolkit-13-0_13.0.0-1_amd64.deb"
    contents = run(["dpkg-deb", "--contents", str(deb)]).stdout
    for path in ("./usr/local/cuda-13.0/bin/nvcc", "./usr/local/cuda-13.0/lib64/libcudart.so.13.0.48",
                 "./usr/local/cuda-13.0/lib64/libcudart.so -> libcudart.so.13", "./usr/local/cuda-13.0/version.json"):
        assert path in contents, contents
    run(["dpkg-deb", "--extract", str(deb), str(tmp_path / "x")])
    run(["dpkg-deb", "--control", str(deb), str(tmp_path / "x" / "DEBIAN")])
    nvcc = run([str(tmp_path / "x/usr/local/cuda-13.0/bin/nvcc"), "--version"])
    assert nvcc.returncode == 0 and "Cuda compilation tools, release 13.0, V13.0.48" in nvcc.stdout
    postinst = (tmp_path / "x/DEBIAN/postinst").read_text()
    assert "update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-13.0 130" in postinst
    assert "update-alternatives --remove cuda /usr/local/cuda-13.0" in (tmp_path / "x/DEBIAN/prerm").read_text()

    broken = tmp / "repo" / "cuda-toolkit-13-0_13.0.1-1_amd64.deb"
    run(["dpkg-deb", "--extract", str(broken), str(tmp_path / "b")])
    result = run([str(tmp_path / "b/usr/local/cuda-13.0/bin/nvcc"), "--version"])
    assert result.returncode == 127 and "error while loading shared libraries" in result.stderr


@needs_gpg
def test_keyring_package_points_at_the_repository(apt_repo, tmp_path):
    tmp, url = apt_repo
    run(["dpkg-deb", "--extract", str(tmp / "repo" / "cuda-keyring_1.1-1_all.deb"), str(tmp_path)])
    listing = (tmp_path / "etc/apt/sources.list.d/cuda-debian12-x86_64.list").read_text()
    assert listing == "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] %s /\n" % url
    assert (tmp_path / "usr/share/keyrings/cuda-archive-keyring.gpg").stat().st_size > 0


def test_pypi_indexes_install_a_stack_that_answers_like_the_real_one(tmp_path):
    versions = StackVersions()          # role sglang's defaults: SGLang 0.5.23 and its own pins
    build_stack_indexes(tmp_path / "idx", versions, cuda_releases=("12.8", "13.0"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's pip config (find-links, constraints) stays out
    target = tmp_path / "site"
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target", str(target)]
    fi = versions.flashinfer
    for index, pins in (("torch/cu130/", ["torch==%s+cu130" % versions.torch]),
                        ("pypi/simple/", ["sglang==%s" % versions.sglang, "flashinfer-python==" + fi, "--no-deps"]),
                        ("flashinfer/cu130/", ["flashinfer-cubin==" + fi, "flashinfer-jit-cache==%s+cu130" % fi])):
        result = run(base + ["--index-url", (tmp_path / "idx" / index).as_uri() + "/"] + pins, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
    env["PYTHONPATH"] = str(target)
    probe = run([sys.executable, "-c", "import torch, sglang; print(torch.__version__, torch.version.cuda, "
                 "sglang.__version__, torch.cuda.is_available())"], env=env)
    assert probe.stdout.split() == ["%s+cu130" % versions.torch, "13.0", versions.sglang, "False"], probe.stderr
    show = run([sys.executable, "-m", "flashinfer", "show-config"], env=env)
    assert show.returncode == 0, show.stderr
    assert "flashinfer-jit-cache version: %s+cu130" % fi in show.stdout and "Torch CUDA version: 13.0" in show.stdout
    # Without torch, show-config fails like the real one.
    (target / "torch").rename(tmp_path / "torch-away")
    assert run([sys.executable, "-m", "flashinfer", "show-config"], env=env).returncode != 0
