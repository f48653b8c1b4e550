"""The CUDA stack in the lab's containers, for the lab tests of upgrade-cuda.yml (test_cuda_upgrade.py,
test_cuda_rolling.py): the repositories they build and serve (aptrepo/, pypirepo/), the field host's
12.8 state, and what a test reads back (snapshot, selected toolkit, installed packages).
Every helper works on container 129 unless given another `vmid` (Lab.add_container).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from aptrepo import PUBLIC_KEY_NAME, SigningKey, ToolkitSpec, build_cuda_repo
from pypirepo import StackVersions, build_stack_indexes

UPGRADE = "upgrade-cuda.yml"
STACK = "playbooks/gpu_stack.yml"
CT = "ct129"
VENV = "/opt/sglang/venv"
# The role's default pins: SGLang 0.5.23 and its own pins (torch 2.14.1, sglang-kernel 0.4.10, FlashInfer
# 0.7.2), the stand-ins built from the released metadata (roles/sglang/vars/releases.yml).
VERSIONS = StackVersions()
OLD_FLASHINFER = "0.6.16"       # the role's old SM12x fusion minimum: its fusion module still says [9, 10]
OLD_KERNEL = "0.4.7"            # the role's old kernel default: pins torch 2.13.0, SGLang 0.5.23 wants 0.4.10
# The lab's GPUs are the field host's, RTX PRO 6000 Blackwell (SM 12.0), on which SGLang 0.5.14 and later
# refuse FlashInfer's allreduce fusion: the upgrade runs as an operator of that fleet must run it.
NO_FUSION = {"sglang_require_allreduce_fusion": False}
SYSTEMD_ENV = "/etc/systemd/system.conf.d/servelab-cuda.conf"
FIELD_CUDA = "12.8"
# The task of playbooks/gpu_stack.yml that fails a host at the end of its batch (the rollout's stop).
ROLLOUT_STOP = "Stop the rollout after this batch when the upgrade failed here"

# What "the host as it was" means here: packages, alternatives, and the files the roles touch.
SNAPSHOT = r"""
dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\n' | grep -E ' (cuda|python3-(debian|venv|packaging))' || true
for name in cuda cuda-12 cuda-13; do echo "alt $name: $(update-alternatives --query $name 2>/dev/null | grep -E '^(Status|Value):' | tr '\n' ' ')"; done
find /etc/apt/sources.list.d /etc/apt/keyrings /etc/profile.d /etc/systemd/system.conf.d /etc/ansible /opt /usr/local -maxdepth 3 \
  -printf '%p %y %l %s\n' 2>/dev/null | sort
# the package lists themselves (a refresh changes them); apt's lock file and partial/ are not state
echo "/var/lib/apt/lists $(find /var/lib/apt/lists -maxdepth 1 -type f ! -name lock -printf '%f %s %T@\n' 2>/dev/null | sort | md5sum)"
"""

RESET = r"""
dpkg --configure -a >/dev/null 2>&1 || true
dpkg --purge cuda-toolkit-13-0 cuda-toolkit-12-8 cuda-keyring >/dev/null 2>&1 || true
for name in cuda cuda-12 cuda-13; do update-alternatives --remove-all $name >/dev/null 2>&1 || true; done
rm -rf /usr/local/cuda-12.8 /usr/local/cuda-13.0 /opt/sglang /etc/apt/keyrings/servelab-cuda.* \
  /etc/apt/sources.list.d/servelab-cuda.sources /etc/apt/sources.list.d/cuda-*.list \
  /etc/profile.d/servelab-cuda.sh /etc/ansible/facts.d/servelab_cuda.fact /etc/ansible/facts.d/servelab_sglang.fact \
  /etc/systemd/system.conf.d/servelab-cuda.conf /var/lib/servelab/cuda_toolkit-rollback.json \
  /var/lib/servelab/sglang-rollback.json
"""


@dataclasses.dataclass
class Repos:
    """The served repositories: URLs as the container reaches them."""

    cuda: str            # cuda-keyring, 12.8.1, 13.0.0, 13.0.1
    broken: str          # cuda-keyring, 12.8.1, 13.0.0, 13.0.1 whose nvcc cannot start
    pypi: str            # root of torch/cuXY/, kernel/cuXY/, kernel-wrong/cuXY/, pypi/simple/, flashinfer/cuXY/
    key_name: str = PUBLIC_KEY_NAME
    pypi_dir: Path | None = None     # the directory served at `pypi` (a test may serve it again its own way)

    def role_vars(self, lab, repo: str | None = None, **extra) -> dict:
        repo = repo or self.cuda
        return dict({
            "cuda_toolkit_repo_url": repo,
            "cuda_toolkit_repo_key_url": repo + self.key_name,
            "sglang_version": VERSIONS.sglang,
            "sglang_torch_version": VERSIONS.torch,
            "sglang_flashinfer_version": VERSIONS.flashinfer,
            "sglang_kernel_version": VERSIONS.kernel,
            "sglang_kernel_index_url": self.pypi + "kernel/cu130/",
            "sglang_torch_index_url": self.pypi + "torch/cu130/",
            "sglang_pypi_index_url": self.pypi + "pypi/simple/",
            "sglang_flashinfer_index_url": self.pypi + "flashinfer/cu130/",
            "sglang_pip_trusted_hosts": [lab.controller_address],
        }, **dict(NO_FUSION, **extra))


def ct(lab, script: str, *args: str, check: bool = True, timeout: float = 300, vmid: int | None = None):
    """Run a shell script in container 129 (or vmid)."""
    return lab.pct_exec(vmid or lab.config.vmid, "sh", "-c", script, "sh", *args, check=check, timeout=timeout)


def snapshot(lab, vmid: int | None = None) -> str:
    return ct(lab, SNAPSHOT, vmid=vmid).stdout


def reset_container(lab, *, purge_helpers: bool = False, vmid: int | None = None) -> None:
    """Container 129 (or vmid) without any CUDA toolkit, NVIDIA source, venv or servelab fact."""
    ct(lab, RESET + ("apt-get purge -y -q python3-debian >/dev/null\n" if purge_helpers else ""), vmid=vmid)


def field_state(lab, repo: str, *, toolkits=(("cuda-toolkit-12-8", None),), venv_cuda: str | None = FIELD_CUDA,
                pypi: str | None = None, vmid: int | None = None) -> None:
    """The field host before the upgrade: NVIDIA's cuda-keyring from `repo`, toolkits installed by
    apt (auto-selected by their alternatives), and an SGLang venv built for `venv_cuda`."""
    reset_container(lab, vmid=vmid)
    packages = " ".join(name + ("=" + version if version else "") for name, version in toolkits)
    ct(lab, "set -e\n"
            "python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "
            "\"$1cuda-keyring_1.1-1_all.deb\" /tmp/cuda-keyring.deb\n"
            "dpkg -i /tmp/cuda-keyring.deb >/dev/null && rm /tmp/cuda-keyring.deb\n"
            "apt-get update -q >/dev/null\n"
            "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends %s >/dev/null\n" % packages,
       repo, vmid=vmid)
    if venv_cuda:
        tag = "cu" + venv_cuda.replace(".", "")
        ct(lab, "set -e\n"
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv >/dev/null\n"
                "python3 -m venv %(venv)s\n"
                "pip() { index=$1; host=$2; shift 2; %(venv)s/bin/pip install -q --disable-pip-version-check "
                "--trusted-host \"$host\" --index-url \"$index\" \"$@\"; }\n"
                "pip \"$1torch/%(tag)s/\" \"$2\" torch==%(torch)s+%(tag)s\n"
                "pip \"$1kernel/%(tag)s/\" \"$2\" sglang-kernel==%(kernel)s+%(tag)s\n"
                "pip \"$1pypi/simple/\" \"$2\" sglang==%(sglang)s flashinfer-python==%(fi)s\n"
                "pip \"$1flashinfer/%(tag)s/\" \"$2\" flashinfer-cubin==%(fi)s flashinfer-jit-cache==%(fi)s+%(tag)s\n"
                % dict(venv=VENV, tag=tag, torch=VERSIONS.torch, sglang=VERSIONS.sglang, fi=VERSIONS.flashinfer,
                       kernel=VERSIONS.kernel),
           pypi, lab.controller_address, vmid=vmid)


def selected(lab, vmid: int | None = None) -> str:
    return ct(lab, "readlink -f /usr/local/cuda || true", vmid=vmid).stdout.strip()


def installed(lab, vmid: int | None = None) -> dict:
    out = ct(lab, "dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Version}\\n' 'cuda-*' 2>/dev/null || true",
             vmid=vmid).stdout
    return {pkg: version for status, pkg, version in (line.split("|") for line in out.splitlines() if "|" in line)
            if status.startswith("ii")}


def start_gpu_job(lab) -> int:
    """A process titled like an SGLang scheduler (what gpu_reap looks for), in its own session."""
    out = ct(lab, "setsid bash -c 'exec -a sglang::scheduler_TP0 sleep 600' </dev/null >/dev/null 2>&1 & echo $!").stdout
    return int(out.strip())


def job_alive(lab, pid: int) -> bool:
    return ct(lab, "kill -0 %d 2>/dev/null && echo yes || echo no" % pid).stdout.strip() == "yes"


def failure_messages(run) -> str:
    return "\n".join(f.msg for f in run.failures)


def build_repos(lab, tmp) -> Repos:
    """Build and serve the repositories under `tmp`: a good one, one whose 13.0.1 nvcc cannot start,
    and the PyPI indexes of the stand-in wheels."""
    cuda_dir, broken_dir, pypi_dir = tmp / "cuda", tmp / "cuda-broken", tmp / "pypi"
    for directory in (cuda_dir, broken_dir, pypi_dir):
        directory.mkdir()
    urls = {d: lab.serve_directory(d, name="http-%s-%s" % (tmp.name, d.name)) for d in (cuda_dir, broken_dir, pypi_dir)}
    with SigningKey(tmp / "gnupg") as key:
        build_cuda_repo(cuda_dir, key, urls[cuda_dir],
                        [ToolkitSpec("12.8.1"), ToolkitSpec("13.0.0"), ToolkitSpec("13.0.1")])
        build_cuda_repo(broken_dir, key, urls[broken_dir],
                        [ToolkitSpec("12.8.1"), ToolkitSpec("13.0.0"), ToolkitSpec("13.0.1", broken=True)])
    build_stack_indexes(pypi_dir, VERSIONS, cuda_releases=("12.8", "13.0"))
    return Repos(cuda=urls[cuda_dir], broken=urls[broken_dir], pypi=urls[pypi_dir], pypi_dir=pypi_dir)
