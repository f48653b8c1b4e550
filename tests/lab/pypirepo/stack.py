"""Stand-in wheels of the SGLang serving stack, laid out like the real package indexes.

Generated from what the released wheels say (roles/sglang/vars/releases.yml, written by
tools/sglang_release_facts.py from PyPI's wheels), not by hand: each stand-in carries its release's
real exact pins, FlashInfer's stand-in `jit/comm.py` the majors the real one builds its allreduce
fusion for, and each package sits on the index that really serves it. A version the file does not
record cannot be built (ReleaseNotRecorded): a stand-in may not invent metadata.

- `torch/<cuXY>/`: torch `<version>+cuXY` whose `torch.version.cuda` is `X.Y` (PyTorch's index,
  https://download.pytorch.org/whl/cuXY).
- `pypi/`: sglang (its real pins: torch, the kernel, flashinfer-python, flashinfer-cubin where it
  has one; `python -m sglang.check_env` printing SGLang's format), flashinfer-python (the
  `flashinfer` command and `python -m flashinfer`, `show-config` included, the allreduce fusion entry
  points `flashinfer.comm.trtllm_allreduce_fusion`, `flashinfer/jit/comm.py` naming the real majors),
  and flashinfer-cubin only where PyPI really has that version (it stops at 0.6.13).
- `kernel/<cuXY>/`: the SGLang kernel `<version>+cuXY` (sglang-kernel from 0.4.0, sgl-kernel
  before; import sgl_kernel; its real torch pin) whose stand-in library names libcudart.so.<X>
  (SGLang's wheel index, https://docs.sglang.ai/whl/cuXY); `kernel-wrong/<cuXY>/`: the same version
  and label, built against the other CUDA (its library names libcudart.so.12 for cu130).
- `flashinfer/<cuXY>/`: flashinfer-cubin `<version>` and flashinfer-jit-cache `<version>+cuXY`
  (FlashInfer's index, https://flashinfer.ai/whl/cuXY; PyPI has no jit-cache).

Pure Python, no tensors: enough for pip to resolve and install and for the roles to verify.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import yaml

from .index import write_simple_index
from .wheel import build_wheel

RELEASES_FILE = Path(__file__).resolve().parents[3] / "roles" / "sglang" / "vars" / "releases.yml"


class ReleaseNotRecorded(KeyError):
    """A stand-in was asked for a release whose real metadata releases.yml does not hold."""


@functools.lru_cache(maxsize=1)
def releases() -> dict:
    return yaml.safe_load(RELEASES_FILE.read_text())["_sglang_releases"]


def recorded(kind: str, version: str) -> dict:
    try:
        return releases()[kind][version]
    except KeyError:
        raise ReleaseNotRecorded(
            "%s %s is not recorded in %s: add it to tools/sglang_release_facts.py and rerun the tool, so that its "
            "stand-in carries the real metadata" % (kind, version, RELEASES_FILE)) from None


TORCH_VERSION_PY = '''"""servelab lab stand-in for torch/version.py (same fields as PyTorch's)."""
from typing import Optional

__all__ = ["__version__", "debug", "cuda", "git_version", "hip", "xpu"]
__version__ = "{version}"
debug = False
cuda: Optional[str] = "{cuda}"
git_version = "0000000000000000000000000000000000000000"
hip: Optional[str] = None
xpu: Optional[str] = None
'''

TORCH_INIT = '''"""servelab lab stand-in for PyTorch: version information only, no tensors."""
from torch import cuda, version
from torch.version import __version__
'''

TORCH_CUDA = '''"""No GPU reaches the lab: CUDA is never available (as PyTorch says without a driver)."""


def is_available():
    return False


def device_count():
    return 0
'''

FLASHINFER_MAIN = '''"""servelab lab stand-in for FlashInfer's command line (`flashinfer show-config`)."""
import sys
from importlib import metadata

import flashinfer

PACKAGES = ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")


def _version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def show_config():
    import torch  # FlashInfer needs torch: without it show-config fails, as the real one does

    print("=== Version Info ===")
    print("FlashInfer version: %s" % flashinfer.__version__)
    for name in PACKAGES[1:]:
        print("%s version: %s" % (name, _version(name) or "Not installed"))
    print("=== Torch Version Info ===")
    print("Torch version: %s" % torch.__version__)
    print("CUDA runtime available: %s" % torch.cuda.is_available())
    print("Torch CUDA version: %s" % torch.version.cuda)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["show-config"]:
        return show_config()
    sys.stderr.write("Usage: flashinfer [show-config]\\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
'''


# sglang/check_env.py of SGLang (python -m sglang.check_env): the same keys, order and format
# (`key: value` lines; CUDA details only when torch sees a GPU; the `nvidia-smi topo -m` table on the
# lines after "NVIDIA Topology:"; package versions from each module's __version__).
SGLANG_CHECK_ENV = '''"""servelab lab stand-in for sglang/check_env.py: SGLang's output format."""
import importlib
import os
import resource
import subprocess
import sys
from collections import OrderedDict, defaultdict

import torch

PACKAGE_LIST = ["sglang", "sgl_kernel", "flashinfer", "triton", "transformers", "torchao", "numpy", "aiohttp",
                "fastapi", "hf_transfer", "huggingface_hub", "interegular", "modelscope", "orjson", "outlines",
                "packaging", "psutil", "pydantic", "multipart", "zmq", "uvicorn", "uvloop", "vllm", "xgrammar",
                "openai", "tiktoken", "anthropic", "litellm", "decord"]


def get_package_versions(packages):
    versions = {}
    for package in packages:
        try:
            module = importlib.import_module(package)
            if hasattr(module, "__version__"):
                versions[package] = module.__version__
        except ModuleNotFoundError:
            versions[package] = "Module Not Found"
    return versions


def _get_gpu_info():
    devices, capabilities = defaultdict(list), defaultdict(list)
    for k in range(torch.cuda.device_count()):
        devices[torch.cuda.get_device_name(k)].append(str(k))
        capability = torch.cuda.get_device_capability(k)
        capabilities["%d.%d" % capability].append(str(k))
    info = {}
    for name, ids in devices.items():
        info["GPU %s" % ",".join(ids)] = name
    for cap, ids in capabilities.items():
        info["GPU %s Compute Capability" % ",".join(ids)] = cap
    return info


def _get_cuda_version_info():
    cuda_home = os.environ.get("CUDA_HOME")
    info = {"CUDA_HOME": cuda_home}
    if cuda_home and os.path.isdir(cuda_home):
        try:
            out = subprocess.check_output('"%s" -V' % os.path.join(cuda_home, "bin/nvcc"), shell=True).decode().strip()
            info["NVCC"] = out[out.rfind("Cuda compilation tools"):out.rfind("Build")].strip()
        except subprocess.SubprocessError:
            info["NVCC"] = "Not Available"
        try:
            out = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader,nounits"])
            versions = set(out.decode().strip().split("\\n"))
            info["CUDA Driver Version" if len(versions) == 1 else "CUDA Driver Versions"] = ", ".join(sorted(versions))
        except (OSError, subprocess.SubprocessError):
            info["CUDA Driver Version"] = "Not Available"
    return info


def get_gpu_topology():
    try:
        result = subprocess.run(["nvidia-smi", "topo", "-m"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, check=True)
        return "\\n" + result.stdout if result.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def get_hypervisor_vendor():
    # SGLang's key carries its own colon: it prints "Hypervisor vendor:: KVM" (check_env.py:118).
    try:
        out = subprocess.check_output(["lscpu"], text=True)
    except (OSError, subprocess.SubprocessError):
        return {}
    for line in out.splitlines():
        if "Hypervisor vendor:" in line:
            return {"Hypervisor vendor:": line.split(":")[1].strip()}
    return {}


def check_env():
    env_info = OrderedDict()
    env_info["Python"] = sys.version.replace("\\n", "")
    env_info["CUDA available"] = torch.cuda.is_available()
    if env_info["CUDA available"]:
        env_info.update(_get_gpu_info())
        env_info.update(_get_cuda_version_info())
    env_info["PyTorch"] = torch.__version__
    env_info.update(get_package_versions(PACKAGE_LIST))
    topo = get_gpu_topology()
    if topo:
        env_info["NVIDIA Topology"] = topo
    env_info.update(get_hypervisor_vendor())
    env_info["ulimit soft"] = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for k, v in env_info.items():
        print("%s: %s" % (k, v))


if __name__ == "__main__":
    check_env()
'''

FLASHINFER_COMM = '''"""servelab lab stand-in for flashinfer.comm: the allreduce fusion entry points SGLang calls."""


def trtllm_create_ipc_workspace_for_all_reduce_fusion(*args, **kwargs):
    raise RuntimeError("servelab lab stand-in: no GPU, no IPC workspace")


def trtllm_allreduce_fusion(*args, **kwargs):
    raise RuntimeError("servelab lab stand-in: no GPU, no allreduce")
'''

FLASHINFER_JIT_COMM = '''"""servelab lab stand-in for flashinfer/jit/comm.py (the line verify reads)."""


def gen_trtllm_comm_module():
    nvcc_flags = dict(supported_major_versions=[{majors}])
    return nvcc_flags
'''


@dataclasses.dataclass(frozen=True)
class StackVersions:
    """One stack; the default is role sglang's (SGLang 0.5.23 and its own pins). of_sglang() gives
    any recorded SGLang release with its real pins."""

    torch: str = "2.14.1"
    sglang: str = "0.5.23"
    flashinfer: str = "0.7.2"
    kernel: str = "0.4.10"

    @classmethod
    def of_sglang(cls, version: str) -> StackVersions:
        requires = recorded("sglang", version)["requires"]
        return cls(torch=requires["torch"], sglang=version, flashinfer=requires["flashinfer-python"],
                   kernel=requires.get("sglang-kernel") or requires["sgl-kernel"])


def _release(version: str) -> tuple[int, ...]:
    import re
    return tuple(int(p) for p in re.match(r"\d+(?:\.\d+)*", version).group(0).split("."))


def kernel_package(version: str) -> str:
    """sglang-kernel from 0.4.0 (sgl-project/sglang#20440), sgl-kernel before."""
    return "sglang-kernel" if _release(version) >= (0, 4, 0) else "sgl-kernel"


def fusion_majors(flashinfer_version: str) -> str:
    """The CUDA majors the real FlashInfer's allreduce fusion builds for (its jit/comm.py)."""
    return ", ".join(str(m) for m in recorded("flashinfer", flashinfer_version)["fusion_majors"])


def on_pypi(name: str, version: str) -> bool:
    """Whether PyPI really serves name==version (releases.yml on_pypi; a version not listed: no)."""
    return bool(releases()["on_pypi"].get(name, {}).get(version, False))


def cuda_tag(cuda_release: str) -> str:
    return "cu" + cuda_release.replace(".", "")


def torch_wheel(version: str, cuda_release: str, outdir: Path) -> Path:
    full = "%s+%s" % (version, cuda_tag(cuda_release))
    return build_wheel("torch", full, {
        "torch/__init__.py": TORCH_INIT,
        "torch/version.py": TORCH_VERSION_PY.format(version=full, cuda=cuda_release),
        "torch/cuda/__init__.py": TORCH_CUDA,
    }, outdir, summary="servelab lab stand-in for PyTorch (CUDA %s build)" % cuda_release)


def sglang_wheel(versions: StackVersions, outdir: Path) -> Path:
    """SGLang with its release's real exact pins (whatever `versions` asks for the other packages)."""
    requires = recorded("sglang", versions.sglang)["requires"]
    return build_wheel("sglang", versions.sglang, {
        "sglang/__init__.py": '"""servelab lab stand-in for SGLang."""\nfrom sglang.version import __version__\n',
        "sglang/version.py": '__version__ = "%s"\n' % versions.sglang,
        "sglang/check_env.py": SGLANG_CHECK_ENV,
    }, outdir, requires=["%s==%s" % item for item in sorted(requires.items())],
        summary="servelab lab stand-in for SGLang")


def kernel_wheel(version: str, cuda_release: str, outdir: Path, *, linked_cuda: str | None = None) -> Path:
    """The SGLang kernel <version>+cuXY; its stand-in library names libcudart.so.<major of linked_cuda>."""
    full = "%s+%s" % (version, cuda_tag(cuda_release))
    cudart = (linked_cuda or cuda_release).split(".")[0]
    return build_wheel(kernel_package(version), full, {
        "sgl_kernel/__init__.py": '"""servelab lab stand-in for sgl_kernel."""\n__version__ = "%s"\n' % version,
        # Not a real ELF: the bytes verify looks for (the NEEDED entry of the CUDA runtime).
        "sgl_kernel/common_ops.abi3.so": "\x7fELF servelab stand-in\x00libcudart.so.%s\x00libtorch.so\x00" % cudart,
    }, outdir, requires=["%s==%s" % item for item in sorted(recorded("sglang_kernel", version)["requires"].items())],
        summary="servelab lab stand-in for the SGLang kernel (CUDA %s build)" % cudart)


def flashinfer_wheels(version: str, cuda_releases: tuple[str, ...], outdir: Path) -> dict[str, list[Path]]:
    """{"pypi": [flashinfer-python (+ flashinfer-cubin where PyPI has it)], "cuXY": [flashinfer-cubin,
    flashinfer-jit-cache +cuXY], ...}: each on the index that really serves it."""
    cubin = build_wheel("flashinfer-cubin", version, {"flashinfer_cubin/__init__.py": '__version__ = "%s"\n' % version},
                        outdir)
    wheels = {"pypi": [
        build_wheel("flashinfer-python", version, {
            "flashinfer/__init__.py": '"""servelab lab stand-in for FlashInfer."""\n__version__ = "%s"\n' % version,
            "flashinfer/__main__.py": FLASHINFER_MAIN,
            "flashinfer/comm/__init__.py": FLASHINFER_COMM,
            "flashinfer/jit/__init__.py": '"""servelab lab stand-in: no JIT (no GPU, no nvcc)."""\n',
            "flashinfer/jit/comm.py": FLASHINFER_JIT_COMM.format(majors=fusion_majors(version)),
        }, outdir, requires=["torch"], console_scripts={"flashinfer": "flashinfer.__main__:main"}),
    ] + ([cubin] if on_pypi("flashinfer-cubin", version) else [])}
    for release in cuda_releases:
        full = "%s+%s" % (version, cuda_tag(release))
        wheels[cuda_tag(release)] = [cubin, build_wheel("flashinfer-jit-cache", full, {
            "flashinfer_jit_cache/__init__.py": '__version__ = "%s"\n' % full}, outdir / cuda_tag(release))]
    return wheels


@dataclasses.dataclass(frozen=True)
class StackIndexes:
    """Index directories (relative to the served root, each ending in /)."""

    root: Path
    cuda_releases: tuple[str, ...]
    pypi: str = "pypi/simple/"

    def torch(self, cuda_release: str) -> str:
        return "torch/%s/" % cuda_tag(cuda_release)

    def flashinfer(self, cuda_release: str) -> str:
        return "flashinfer/%s/" % cuda_tag(cuda_release)

    def kernel(self, cuda_release: str, *, wrong_build: bool = False) -> str:
        return "%s/%s/" % ("kernel-wrong" if wrong_build else "kernel", cuda_tag(cuda_release))


def build_stack_indexes(root: Path, versions: StackVersions = StackVersions(),
                        cuda_releases: tuple[str, ...] = ("12.8", "13.0")) -> StackIndexes:
    """Write the three kinds of index under root (served as one directory)."""
    build = root.parent / (root.name + ".wheels")
    flashinfer = flashinfer_wheels(versions.flashinfer, cuda_releases, build)
    indexes = StackIndexes(root=root, cuda_releases=cuda_releases)
    for release in cuda_releases:
        write_simple_index(root / indexes.torch(release),
                           [torch_wheel(versions.torch, release, build / cuda_tag(release))])
        write_simple_index(root / indexes.flashinfer(release), flashinfer[cuda_tag(release)])
        write_simple_index(root / indexes.kernel(release),
                           [kernel_wheel(versions.kernel, release, build / cuda_tag(release))])
        other = "12.8" if release.split(".", maxsplit=1)[0] != "12" else "13.0"
        write_simple_index(root / indexes.kernel(release, wrong_build=True),
                           [kernel_wheel(versions.kernel, release, build / "wrong" / cuda_tag(release),
                                         linked_cuda=other)])
    write_simple_index(root / indexes.pypi, [sglang_wheel(versions, build)] + flashinfer["pypi"])
    return indexes
