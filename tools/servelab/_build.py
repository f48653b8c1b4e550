"""setuptools build hook (pyproject.toml [tool.setuptools.cmdclass]): the wheel carries the
collection servelab.serving as package data, at servelab/_collection/ansible_collections/servelab/
serving/, copied from the repository root (the collection root) at build time. Nothing is written
into the source tree but setuptools' own build/ and *.egg-info (both ignored by git and by
galaxy.yml's build_ignore).

Loaded by setuptools from this file alone: standard library and setuptools only.
"""
from __future__ import annotations

import fnmatch
import os
import shutil

from setuptools.command.build_py import build_py

# Kept in step with servelab/_paths.py COLLECTION_ITEMS (tests/integration/test_api_cli.py checks).
COLLECTION_ITEMS = ("galaxy.yml", "meta", "plugins", "roles", "playbooks", "bench.yml",
                    "tune.yml", "upgrade-cuda.yml", "inventory", "ansible.cfg", "requirements.yml",
                    "requirements.txt")
SKIP = ("__pycache__", "*.pyc", "*.pyo", ".state", ".pytest_cache", ".ruff_cache", "*.tar.gz",
        ".*.swp")
TARGET = os.path.join("servelab", "_collection", "ansible_collections", "servelab", "serving")


def _skipped(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in SKIP)


def collection_files(root: str):
    """(source, relative path) of every file of the collection the wheel ships."""
    for item in COLLECTION_ITEMS:
        src = os.path.join(root, item)
        if os.path.isfile(src):
            yield src, item
            continue
        if not os.path.isdir(src):
            raise FileNotFoundError("the collection's %s is missing at %s" % (item, root))
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames[:] = sorted(d for d in dirnames if not _skipped(d))
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if _skipped(name) or not os.path.isfile(path):
                    continue
                yield path, os.path.relpath(path, root)


class BuildPy(build_py):
    """build_py, then the collection's files into build_lib (install_lib puts the whole build_lib
    tree in the wheel)."""

    def run(self):
        super().run()
        root = os.path.abspath(os.getcwd())
        if not os.path.isfile(os.path.join(root, "galaxy.yml")):
            raise FileNotFoundError("build servelab from the repository root (galaxy.yml)")
        target = os.path.join(self.build_lib, TARGET)
        if os.path.isdir(target):
            shutil.rmtree(target)
        for src, rel in collection_files(root):
            dest = os.path.join(target, rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(src, dest)

    def get_outputs(self, include_bytecode=1):
        outputs = list(super().get_outputs(include_bytecode))
        root = os.path.abspath(os.getcwd())
        if os.path.isfile(os.path.join(root, "galaxy.yml")):
            outputs += [os.path.join(self.build_lib, TARGET, rel)
                        for _src, rel in collection_files(root)]
        return outputs
