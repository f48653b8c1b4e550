"""Local APT repositories for the lab tests: NVIDIA-like CUDA packages, indexed and signed.

    from aptrepo import SigningKey, ToolkitSpec, build_cuda_repo, PUBLIC_KEY_NAME
    with SigningKey(tmp / "gnupg") as key:
        build_cuda_repo(tmp / "repo", key, url, [ToolkitSpec("12.8.1"), ToolkitSpec("13.0.1")])
"""
from .cuda import NVCC_BUILDS, PUBLIC_KEY_NAME, ToolkitSpec, build_cuda_repo, keyring_package, toolkit_package
from .deb import DebPackage, build_deb
from .repo import write_flat_repo
from .signing import SigningError, SigningKey

__all__ = ["NVCC_BUILDS", "PUBLIC_KEY_NAME", "ToolkitSpec", "build_cuda_repo", "keyring_package", "toolkit_package",
           "DebPackage", "build_deb", "write_flat_repo", "SigningError", "SigningKey"]
