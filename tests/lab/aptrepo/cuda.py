"""Stand-ins for NVIDIA's CUDA apt packages that install like the real ones, without the 4 GB.

- `cuda-toolkit-X-Y` (version `X.Y.Z-1`): `/usr/local/cuda-X.Y/` with `bin/nvcc` answering
  `--version` with the real text of that release, `lib64/libcudart.so*`, `include/`,
  `version.json`; postinst registers the `cuda` and `cuda-X` alternatives
  (`update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-X.Y <XY>`), prerm removes
  them, as NVIDIA's packages do. A `broken` variant has an nvcc that fails like a toolkit with a
  missing library.
- `cuda-keyring` (1.1-1, all): the archive key in `/usr/share/keyrings/cuda-archive-keyring.gpg`
  and `/etc/apt/sources.list.d/cuda-<distro>-<arch>.list` pointing at the repository, which is how
  field hosts usually got their NVIDIA repository.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .deb import DebPackage, build_deb
from .repo import write_flat_repo
from .signing import SigningKey

# What `nvcc --version` says per toolkit release (build version, "Built on" date, build tag).
NVCC_BUILDS = {
    "12.8.0": ("12.8.61", "Fri_Jan_10_22:17:43_PST_2025", "cuda_12.8.r12.8/compiler.35404655_0"),
    "12.8.1": ("12.8.93", "Fri_Feb_21_20:23:50_PST_2025", "cuda_12.8.r12.8/compiler.35583870_0"),
    "13.0.0": ("13.0.48", "Fri_Jul_25_01:56:49_PM_PDT_2025", "cuda_13.0.r13.0/compiler.36260728_0"),
    "13.0.1": ("13.0.88", "Wed_Aug_20_01:58:59_PM_PDT_2025", "cuda_13.0.r13.0/compiler.36424714_0"),
}
PUBLIC_KEY_NAME = "servelab-lab-archive.pub"


@dataclasses.dataclass(frozen=True)
class ToolkitSpec:
    version: str            # X.Y.Z
    revision: str = "1"
    broken: bool = False    # nvcc fails (a toolkit whose install went wrong)

    @property
    def release(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def package(self) -> str:
        return "cuda-toolkit-" + self.release.replace(".", "-")

    @property
    def deb_version(self) -> str:
        return "%s-%s" % (self.version, self.revision)

    @property
    def prefix(self) -> str:
        return "/usr/local/cuda-" + self.release

    @property
    def nvcc_build(self) -> str:
        return NVCC_BUILDS[self.version][0]

    @property
    def priority(self) -> int:
        major, minor = self.release.split(".")
        return int(major) * 10 + int(minor)


def nvcc_script(spec: ToolkitSpec) -> str:
    build, built_on, tag = NVCC_BUILDS[spec.version]
    if spec.broken:
        return ("#!/bin/sh\n# servelab lab stand-in: a toolkit whose compiler cannot start.\n"
                "echo \"%s/bin/nvcc: error while loading shared libraries: libnvptxcompiler.so.%s: "
                "cannot open shared object file: No such file or directory\" >&2\nexit 127\n"
                % (spec.prefix, spec.release.split(".")[0]))
    return ("#!/bin/sh\n# servelab lab stand-in for NVIDIA's nvcc %s (answers --version like the real one).\n"
            "case \"$1\" in\n"
            "  --version|-V)\n"
            "    cat <<'EOF'\n"
            "nvcc: NVIDIA (R) Cuda compiler driver\n"
            "Copyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on %s\n"
            "Cuda compilation tools, release %s, V%s\n"
            "Build %s\n"
            "EOF\n"
            "    ;;\n"
            "  *) echo 'nvcc fatal   : No input files specified; use option --help for more information' >&2; exit 1 ;;\n"
            "esac\n" % (spec.version, built_on, spec.release, build, tag))


def toolkit_package(spec: ToolkitSpec) -> DebPackage:
    major = spec.release.split(".")[0]
    lib = "libcudart.so.%s" % spec.nvcc_build
    version_json = {"cuda": {"name": "CUDA SDK", "version": spec.version},
                    "cuda_nvcc": {"name": "CUDA NVCC", "version": spec.nvcc_build},
                    "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": spec.nvcc_build}}
    alternatives = [("/usr/local/cuda", "cuda"), ("/usr/local/cuda-%s" % major, "cuda-%s" % major)]
    postinst = "#!/bin/sh\nset -e\nif [ \"$1\" = configure ]; then\n" + "".join(
        "  update-alternatives --install %s %s %s %d\n" % (link, name, spec.prefix, spec.priority)
        for link, name in alternatives) + "fi\n"
    prerm = "#!/bin/sh\nset -e\nif [ \"$1\" = remove ] || [ \"$1\" = deconfigure ]; then\n" + "".join(
        "  update-alternatives --remove %s %s\n" % (name, spec.prefix) for _link, name in alternatives) + "fi\n"
    description = ("CUDA Toolkit %s meta-package (servelab lab stand-in%s)\n"
                   "Installs %s like NVIDIA's package, with an nvcc that only answers --version."
                   % (spec.release, ", broken nvcc" if spec.broken else "", spec.prefix))
    return DebPackage(
        name=spec.package, version=spec.deb_version,
        description=description,
        files={
            spec.prefix + "/bin/nvcc": (nvcc_script(spec), 0o755),
            spec.prefix + "/version.json": (json.dumps(version_json, indent=3) + "\n", 0o644),
            spec.prefix + "/lib64/" + lib: (b"\x7fELF servelab lab stand-in for " + lib.encode() + b"\n",
                                            0o644),
            spec.prefix + "/include/cuda_runtime_api.h": (
                "#define CUDART_VERSION %d%03d\n" % (int(major), int(spec.release.split(".")[1]) * 10),
                0o644),
        },
        symlinks={spec.prefix + "/lib64/libcudart.so.%s" % major: lib,
                  spec.prefix + "/lib64/libcudart.so": "libcudart.so.%s" % major},
        scripts={"postinst": postinst, "prerm": prerm},
    )


def keyring_package(key: SigningKey, repo_url: str, distribution: str, arch: str) -> DebPackage:
    list_file = "/etc/apt/sources.list.d/cuda-%s-%s.list" % (distribution, arch)
    return DebPackage(
        name="cuda-keyring", version="1.1-1", architecture="all",
        description="GPG keyring for the CUDA repository (servelab lab stand-in)",
        files={
            "/usr/share/keyrings/cuda-archive-keyring.gpg": (key.public_key_binary(), 0o644),
            list_file: ("deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] %s /\n" % repo_url, 0o644),
        },
        conffiles=[list_file],
    )


def build_cuda_repo(directory: Path, key: SigningKey, repo_url: str, toolkits: list[ToolkitSpec], *,
                    distribution: str = "debian12", arch: str = "x86_64") -> Path:
    """A signed flat repository in `directory` (served at `repo_url`) with cuda-keyring and `toolkits`.

    The armored public key is written beside the index as PUBLIC_KEY_NAME (the key URL to give
    the role is repo_url + PUBLIC_KEY_NAME).
    """
    staging = directory.parent / (directory.name + ".staging")
    packages = [keyring_package(key, repo_url, distribution, arch)] + [toolkit_package(spec) for spec in toolkits]
    debs = [build_deb(package, staging, staging / "debs") for package in packages]
    write_flat_repo(directory, debs, key)
    (directory / PUBLIC_KEY_NAME).write_text(key.public_key_armored())
    return directory
