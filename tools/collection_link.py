"""Make this checkout resolvable as the collection servelab.serving.

The repository root is the collection root (galaxy.yml). Ansible finds collections under
`<collections_path>/ansible_collections/<namespace>/<name>`, so we link
`collections/ansible_collections/servelab/serving` to the checkout: playbooks, ansible-test and
pytest then import `ansible_collections.servelab.serving.plugins...` from the working tree itself,
never from a stale copy.

Usage: python tools/collection_link.py [COLLECTIONS_DIR]   (default: collections/ beside this checkout)
"""
from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMESPACE, NAME = "servelab", "serving"


def ensure_link(collections_dir: str = os.path.join(REPO, "collections")) -> str:
    """Create (or repair) the link; return the collection path it provides."""
    parent = os.path.join(collections_dir, "ansible_collections", NAMESPACE)
    os.makedirs(parent, exist_ok=True)
    link = os.path.join(parent, NAME)
    target = os.path.relpath(REPO, parent)
    if os.path.islink(link) and os.path.realpath(link) == os.path.realpath(REPO):
        return link
    if os.path.lexists(link):
        if not os.path.islink(link):
            raise SystemExit("%s exists and is not a link to this checkout: move it away" % link)
        os.unlink(link)
    os.symlink(target, link)
    return link


def importable() -> None:
    """Put the link's collections dir on sys.path: `ansible_collections.servelab.serving` then
    imports from this checkout as a namespace package, with or without Ansible installed
    (benchmarks and the GPU machine's checks run without it)."""
    ensure_link()
    collections = os.path.join(REPO, "collections")
    if collections not in sys.path:
        sys.path.insert(0, collections)


if __name__ == "__main__":
    print("collection servelab.serving -> %s" % ensure_link(*sys.argv[1:2]))
