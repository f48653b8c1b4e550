"""Build a binary .deb from a description, with dpkg-deb (no network, no root needed)."""
from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

DPKG_DEB_TIMEOUT = 120


@dataclasses.dataclass
class DebPackage:
    """A package as dpkg sees it: control fields, files, symlinks and maintainer scripts."""

    name: str
    version: str
    architecture: str = "amd64"
    description: str = "servelab lab package"
    depends: list[str] = dataclasses.field(default_factory=list)
    files: dict[str, tuple[str | bytes, int]] = dataclasses.field(default_factory=dict)  # path -> (content, mode)
    symlinks: dict[str, str] = dataclasses.field(default_factory=dict)                  # path -> target
    scripts: dict[str, str] = dataclasses.field(default_factory=dict)                   # postinst, prerm, ...
    conffiles: list[str] = dataclasses.field(default_factory=list)
    extra_control: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def filename(self) -> str:
        version = self.version.split(":", 1)[-1]
        return "%s_%s_%s.deb" % (self.name, version, self.architecture)

    def control(self) -> str:
        fields = {
            "Package": self.name,
            "Version": self.version,
            "Architecture": self.architecture,
            "Maintainer": "servelab lab <lab@servelab.invalid>",
            "Section": "devel",
            "Priority": "optional",
        }
        if self.depends:
            fields["Depends"] = ", ".join(self.depends)
        fields.update(self.extra_control)
        lines = ["%s: %s" % item for item in fields.items()]
        summary, _sep, body = self.description.partition("\n")
        lines.append("Description: %s" % summary)
        lines += [" " + (line or ".") for line in body.splitlines()]
        return "\n".join(lines) + "\n"


def build_deb(package: DebPackage, staging: Path, outdir: Path) -> Path:
    """Lay the package out under `staging/<name>_<version>` and build it into `outdir`."""
    root = staging / ("%s_%s" % (package.name, package.version.replace(":", "_")))
    if root.exists():
        raise FileExistsError("staging directory %s already used" % root)
    debian = root / "DEBIAN"
    debian.mkdir(parents=True)
    (debian / "control").write_text(package.control())
    for name, text in package.scripts.items():
        script = debian / name
        script.write_text(text)
        script.chmod(0o755)
    if package.conffiles:
        (debian / "conffiles").write_text("".join(path + "\n" for path in package.conffiles))
    for path, (content, mode) in package.files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
        target.chmod(mode)
    for path, link_target in package.symlinks.items():
        link = root / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(link_target)
    for directory in [p for p in root.rglob("*") if p.is_dir()]:
        directory.chmod(0o755)
    outdir.mkdir(parents=True, exist_ok=True)
    deb = outdir / package.filename
    result = subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
                            capture_output=True, text=True, timeout=DPKG_DEB_TIMEOUT, check=False)
    if result.returncode != 0:
        raise RuntimeError("dpkg-deb --build %s failed: %s%s" % (root, result.stdout, result.stderr))
    return deb
