"""Where the collection servelab.serving is: this checkout, or the copy the wheel ships.

From a checkout (tools/servelab/ two levels below galaxy.yml) the checkout itself is the collection,
resolved through `collections/ansible_collections/servelab/serving` (tools/collection_link.py), so
a run uses the working tree and the dependencies `make setup` installed beside it. From an
installed wheel it is `servelab/_collection/ansible_collections/servelab/serving`, which the build
copied in (servelab/_build.py).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
NAMESPACE, NAME = "servelab", "serving"
# What the wheel ships of the collection (servelab/_build.py copies them; the tests check it).
COLLECTION_ITEMS = ("galaxy.yml", "meta", "plugins", "roles", "playbooks", "bench.yml",
                    "tune.yml", "upgrade-cuda.yml", "inventory", "ansible.cfg", "requirements.yml",
                    "requirements.txt")
# Ansible's own default collections paths: where the collection's dependencies
# (community.general, ansible.posix) are found when the wheel's copy is used.
DEFAULT_COLLECTIONS_PATHS = (os.path.expanduser("~/.ansible/collections"),
                             "/usr/share/ansible/collections")


@dataclass(frozen=True)
class Collection:
    root: str                  # the collection's directory (galaxy.yml, bench.yml, ...)
    collections_paths: tuple   # what ANSIBLE_COLLECTIONS_PATH lists, the collection's first
    checkout: bool             # True: a source checkout (its results/ is the default root)

    @property
    def import_root(self) -> str:
        """The directory holding `ansible_collections/servelab/serving`."""
        return self.collections_paths[0]


def _is_collection(path: str) -> bool:
    galaxy = os.path.join(path, "galaxy.yml")
    if not (os.path.isfile(galaxy) and os.path.isfile(os.path.join(path, "bench.yml"))):
        return False
    with open(galaxy, encoding="utf-8") as fh:
        text = fh.read()
    return "namespace: %s" % NAMESPACE in text and "name: %s" % NAME in text


def _checkout() -> str | None:
    root = os.path.dirname(os.path.dirname(HERE))
    return root if _is_collection(root) else None


def _user_paths() -> tuple:
    given = os.environ.get("ANSIBLE_COLLECTIONS_PATH") or os.environ.get("ANSIBLE_COLLECTIONS_PATHS")
    if given:
        return tuple(p for p in given.split(os.pathsep) if p)
    return DEFAULT_COLLECTIONS_PATHS


def _checkout_link(root: str) -> str:
    """collections/ of the checkout, with the link to it made or repaired (collection_link.py)."""
    collections = os.path.join(root, "collections")
    link = os.path.join(collections, "ansible_collections", NAMESPACE, NAME)
    if not (os.path.islink(link) and os.path.realpath(link) == os.path.realpath(root)):
        sys.path.insert(0, os.path.join(root, "tools"))
        try:
            import collection_link   # tools/collection_link.py of the checkout
        finally:
            sys.path.pop(0)
        collection_link.ensure_link(collections)
    return collections


def locate() -> Collection:
    """The checkout when this package runs from one, else the copy installed with it."""
    root = _checkout()
    if root is not None:
        collections = _checkout_link(root)
        return Collection(root=root, collections_paths=(collections,) + _user_paths(),
                          checkout=True)
    base = os.path.join(HERE, "_collection")
    root = os.path.join(base, "ansible_collections", NAMESPACE, NAME)
    if not _is_collection(root):
        raise RuntimeError(
            "servelab: the collection servelab.serving is not installed beside this package "
            "(%s is missing): reinstall with `pip install .` from the repository" % root)
    return Collection(root=root, collections_paths=(base,) + _user_paths(), checkout=False)


def importable(collection: Collection | None = None) -> Collection:
    """Make `ansible_collections.servelab.serving.plugins...` importable (no Ansible needed)."""
    collection = collection or locate()
    if collection.import_root not in sys.path:
        sys.path.insert(0, collection.import_root)
    return collection
