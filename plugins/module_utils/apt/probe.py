"""Ask an apt repository which versions of a package it has, without configuring it on the host.

apt itself reads the repository (so its proxy settings, auth.conf, TLS and signature checks all
apply, as they will for the real install), but every file it writes goes to a temporary
directory: its own sources list, lists, cache and key. /etc/apt, /var/lib/apt/lists and the dpkg
database are not touched, and no apt or dpkg lock of the host is taken. Used by role
cuda_toolkit's preflight: a version the repository lacks is refused before the host's sources
and key are rewritten.

Standard library only; the module plugins/modules/apt_repo_versions.py runs it.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from typing import Callable, List, Optional, Sequence, Tuple


@dataclasses.dataclass
class Probe:
    package: str
    versions: List[str]          # what the repository offers, apt's order (newest first)
    error: str = ""              # why the repository could not be read ('' when it was)


def apt_reason(*texts: str, warnings: bool = True) -> str:
    """The lines that say why apt failed (a full disk, E:, Err:, else W:), without debconf's warnings; '' if none."""
    lines = []
    for text in texts:
        for raw in (text or "").splitlines():
            if raw.startswith((" ", "\t")) and raw.strip() and lines and lines[-1].startswith("Err:"):
                # apt prints a failed fetch's reason (404  Not Found) on the line under its Err:.
                lines[-1] += " (%s)" % " ".join(raw.split())
            elif raw.strip():
                lines.append(raw.strip())
    # The most specific first: a full disk, then apt's summary (E:), then the failed fetches (Err:).
    errors = [line for line in lines if "No space left on device" in line]
    errors += [line for line in lines if line.startswith("E:")]
    errors += [line for line in lines if line.startswith("Err:")]
    if not errors and warnings:
        errors = [line for line in lines if line.startswith("W:")]
    return "; ".join(dict.fromkeys(errors))


def madison_versions(stdout: str, package: str) -> List[str]:
    """`apt-cache madison <package>` lines ` pkg | 13.0.1-1 | <url> Packages` -> ['13.0.1-1', ...]."""
    found = []
    for line in (stdout or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[0] == package and parts[1] and parts[1] not in found:
            found.append(parts[1])
    return found


def apt_options(root: str) -> List[str]:
    """apt -o options that keep every file of the probe under `root`."""
    return [
        "-o", "Dir::Etc::SourceList=%s/sources.list" % root,
        "-o", "Dir::Etc::SourceParts=%s/sources.list.d" % root,
        "-o", "Dir::State::Lists=%s/lists" % root,
        "-o", "Dir::Cache=%s/cache" % root,
        "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
        # The unprivileged _apt user could not write into a root-owned temporary directory.
        "-o", "APT::Sandbox::User=root",
        "-o", "Acquire::Languages=none",
        "-o", "APT::Get::List-Cleanup=false",
    ]


Runner = Callable[[Sequence[str]], Tuple[int, str, str]]


def _run(argv: Sequence[str], timeout: float = 300.0) -> Tuple[int, str, str]:
    env = dict(os.environ, LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, "", "E: %s" % exc
    return proc.returncode, proc.stdout, proc.stderr


def probe(url: str, key: Optional[str], package: str, *, run: Runner = _run,
          key_reader: Optional[Callable[[str], bytes]] = None) -> Probe:
    """The versions of `package` in the flat repository `url` (`deb [signed-by=key] url /`).

    key: the repository key's URL or a path on the host (None: the source has no signed-by and
    apt's own keyrings decide). key_reader reads a URL's bytes (the module passes Ansible's
    fetch_url); a path is read directly."""
    root = tempfile.mkdtemp(prefix="servelab-apt-probe-")
    try:
        for sub in ("sources.list.d", "lists/partial", "cache/archives/partial"):
            os.makedirs(os.path.join(root, sub))
        options = ""
        if key:
            try:
                if key.startswith("/"):
                    with open(key, "rb") as handle:
                        data = handle.read()
                elif key_reader is None:
                    raise ValueError("no way to fetch %s" % key)
                else:
                    data = key_reader(key)
            except (OSError, ValueError) as exc:
                return Probe(package, [], "the repository key %s could not be read: %s" % (key, exc))
            # apt takes an armored key only under the .asc suffix, a binary one under .gpg.
            name = "key.asc" if data.lstrip().startswith(b"-----BEGIN PGP") else "key.gpg"
            with open(os.path.join(root, name), "wb") as handle:
                handle.write(data)
            options = "[signed-by=%s/%s] " % (root, name)
        with open(os.path.join(root, "sources.list"), "w") as handle:
            handle.write("deb %s%s /\n" % (options, url))
        opts = apt_options(root)
        rc, out, err = run(["apt-get", "update", "-q"] + opts)
        reason = apt_reason(out, err)
        # apt-get update exits 0 when a source could not be fetched (Err: / W: lines): an error
        # line refuses too. A warning alone does not, unless nothing of the package was found.
        if rc != 0 or any(line.startswith(("E:", "Err:")) for line in reason.split("; ")):
            return Probe(package, [], reason or "apt-get update failed (rc %d)" % rc)
        rc, out, err = run(["apt-cache"] + opts + ["madison", package])
        if rc != 0:
            return Probe(package, [], apt_reason(out, err) or "apt-cache madison failed (rc %d)" % rc)
        versions = madison_versions(out, package)
        return Probe(package, versions, "" if versions else reason)
    finally:
        shutil.rmtree(root, ignore_errors=True)
