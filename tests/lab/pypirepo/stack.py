"""Stand-in wheels of the SGLang serving stack, laid out like the real package indexes.

- `torch/<cuXY>/`: torch `<version>+cuXY` whose `torch.version.cuda` is `X.Y` (PyTorch's index,
  https://download.pytorch.org/whl/cuXY).
- `pypi/`: sglang (pinning torch and flashinfer like the real release), flashinfer-python (with the
  `flashinfer` command and `python -m flashinfer`, `show-config` included), flashinfer-cubin.
- `flashinfer/<cuXY>/`: flashinfer-jit-cache `<version>+cuXY` (FlashInfer's index,
  https://flashinfer.ai/whl/cuXY).

Pure Python, no tensors: enough for pip to resolve and install and for the roles to verify.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from .index import write_simple_index
from .wheel import build_wheel

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


@dataclasses.dataclass(frozen=True)
class StackVersions:
    """One coherent stack (these are the pins of SGLang 0.5.10's own wheel)."""

    torch: str = "2.9.1"
    sglang: str = "0.5.10"
    flashinfer: str = "0.6.7.post2"


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
    return build_wheel("sglang", versions.sglang, {
        "sglang/__init__.py": '"""servelab lab stand-in for SGLang."""\nfrom sglang.version import __version__\n',
        "sglang/version.py": '__version__ = "%s"\n' % versions.sglang,
    }, outdir, requires=["torch==%s" % versions.torch, "flashinfer-python==%s" % versions.flashinfer,
                         "flashinfer-cubin==%s" % versions.flashinfer],
        summary="servelab lab stand-in for SGLang")


def flashinfer_wheels(version: str, cuda_releases: tuple[str, ...], outdir: Path) -> dict[str, list[Path]]:
    """{"pypi": [flashinfer-python, flashinfer-cubin], "cuXY": [flashinfer-jit-cache +cuXY], ...}."""
    wheels = {"pypi": [
        build_wheel("flashinfer-python", version, {
            "flashinfer/__init__.py": '"""servelab lab stand-in for FlashInfer."""\n__version__ = "%s"\n' % version,
            "flashinfer/__main__.py": FLASHINFER_MAIN,
        }, outdir, requires=["torch"], console_scripts={"flashinfer": "flashinfer.__main__:main"}),
        build_wheel("flashinfer-cubin", version, {
            "flashinfer_cubin/__init__.py": '__version__ = "%s"\n' % version}, outdir),
    ]}
    for release in cuda_releases:
        full = "%s+%s" % (version, cuda_tag(release))
        wheels[cuda_tag(release)] = [build_wheel("flashinfer-jit-cache", full, {
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
    write_simple_index(root / indexes.pypi, [sglang_wheel(versions, build)] + flashinfer["pypi"])
    return indexes
