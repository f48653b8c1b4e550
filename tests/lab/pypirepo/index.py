"""Lay wheels out as a PEP 503 "simple" index that pip can use with --index-url."""
from __future__ import annotations

import hashlib
import html
import shutil
from collections import defaultdict
from pathlib import Path

from .wheel import normalize


def project_of(wheel: Path) -> str:
    return normalize(wheel.name.split("-", 1)[0])


def write_simple_index(root: Path, wheels: list[Path]) -> Path:
    """root/index.html lists the projects; root/<project>/ holds its wheels and an index.html."""
    by_project: dict[str, list[Path]] = defaultdict(list)
    for wheel in wheels:
        by_project[project_of(wheel)].append(wheel)
    root.mkdir(parents=True, exist_ok=True)
    for project, files in sorted(by_project.items()):
        directory = root / project
        directory.mkdir(exist_ok=True)
        links = []
        for wheel in sorted(files):
            shutil.copy2(wheel, directory / wheel.name)
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            links.append('<a href="%s#sha256=%s">%s</a><br/>' % (html.escape(wheel.name), digest,
                                                                 html.escape(wheel.name)))
        (directory / "index.html").write_text(
            "<!DOCTYPE html>\n<html><body>\n<h1>Links for %s</h1>\n%s\n</body></html>\n" % (project, "\n".join(links)))
    listing = "\n".join('<a href="%s/">%s</a><br/>' % (p, p) for p in sorted(by_project))
    (root / "index.html").write_text("<!DOCTYPE html>\n<html><body>\n%s\n</body></html>\n" % listing)
    return root
