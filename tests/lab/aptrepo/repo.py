"""Index and sign a flat APT repository (`deb <url> /`, the layout of NVIDIA's CUDA repositories).

Writes Packages, Packages.gz, Release (with the hashes apt checks), InRelease (clearsigned) and
Release.gpg (detached), signed with a SigningKey.
"""
from __future__ import annotations

import email.utils
import gzip
import hashlib
import shutil
import subprocess
from pathlib import Path

from .signing import SigningKey


def _hashes(data: bytes) -> dict[str, str]:
    return {
        "MD5Sum": hashlib.md5(data).hexdigest(),
        "SHA1": hashlib.sha1(data).hexdigest(),
        "SHA256": hashlib.sha256(data).hexdigest(),
    }


def package_stanza(deb: Path, filename: str) -> str:
    """The Packages stanza of one .deb: its control file plus where it is and its checksums."""
    control = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True, text=True,
                             check=True, timeout=60).stdout.rstrip("\n")
    data = deb.read_bytes()
    sums = _hashes(data)
    return (control + "\nFilename: %s\nSize: %d\nMD5sum: %s\nSHA1: %s\nSHA256: %s\n"
            % (filename, len(data), sums["MD5Sum"], sums["SHA1"], sums["SHA256"]))


def write_flat_repo(directory: Path, debs: list[Path], key: SigningKey, *, origin: str = "servelab-lab",
                    label: str = "servelab lab CUDA") -> Path:
    """Copy `debs` into `directory` and write a signed flat repository index there."""
    directory.mkdir(parents=True, exist_ok=True)
    stanzas = []
    for deb in debs:
        if deb.parent.resolve() != directory.resolve():
            shutil.copy2(deb, directory / deb.name)
        stanzas.append(package_stanza(directory / deb.name, "./" + deb.name))
    packages = "\n".join(stanzas).encode()
    (directory / "Packages").write_bytes(packages)
    packages_gz = gzip.compress(packages, mtime=0)
    (directory / "Packages.gz").write_bytes(packages_gz)

    lines = ["Origin: %s" % origin, "Label: %s" % label, "Architectures: amd64 all",
             "Date: %s" % email.utils.formatdate(usegmt=True), "Acquire-By-Hash: no"]
    indexes = {"Packages": packages, "Packages.gz": packages_gz}
    for field in ("MD5Sum", "SHA1", "SHA256"):
        lines.append("%s:" % field)
        for name, data in indexes.items():
            lines.append(" %s %d %s" % (_hashes(data)[field], len(data), name))
    release = directory / "Release"
    release.write_text("\n".join(lines) + "\n")
    key.clearsign(release, directory / "InRelease")
    key.detach_sign(release, directory / "Release.gpg")
    return directory
