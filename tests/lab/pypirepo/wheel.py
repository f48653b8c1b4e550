"""Build a pure-Python wheel (py3-none-any) with zipfile: METADATA, WHEEL, entry points, RECORD."""
from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from pathlib import Path


def normalize(name: str) -> str:
    """PEP 503 project name (the simple index's directory name)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(dist: str, version: str, files: dict[str, str], outdir: Path, *,
                requires: list[str] | None = None, console_scripts: dict[str, str] | None = None,
                summary: str = "servelab lab stand-in") -> Path:
    """Write `<dist>-<version>-py3-none-any.whl` into outdir and return its path.

    files: archive path -> text (the importable package); console_scripts: name -> "module:function".
    """
    stem = "%s-%s" % (re.sub(r"[-_.]+", "_", dist), version)
    dist_info = stem + ".dist-info"
    metadata = ["Metadata-Version: 2.1", "Name: %s" % dist, "Version: %s" % version, "Summary: %s" % summary]
    metadata += ["Requires-Dist: %s" % requirement for requirement in requires or []]
    contents = {path: text.encode() for path, text in files.items()}
    contents[dist_info + "/METADATA"] = ("\n".join(metadata) + "\n").encode()
    contents[dist_info + "/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: servelab-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if console_scripts:
        contents[dist_info + "/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            "%s = %s\n" % item for item in console_scripts.items())).encode()
    record_name = dist_info + "/RECORD"
    record = "".join("%s,%s,%d\n" % (path, _record_hash(data), len(data)) for path, data in contents.items())
    record += "%s,,\n" % record_name
    contents[record_name] = record.encode()

    outdir.mkdir(parents=True, exist_ok=True)
    wheel = outdir / (stem + "-py3-none-any.whl")
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in contents.items():
            info = zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return wheel
