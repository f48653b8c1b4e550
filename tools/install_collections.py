"""Install the collections named in requirements.yml without Galaxy.

Galaxy is not reachable from every machine (CI here reaches PyPI only), but the `ansible`
community package on PyPI bundles every collection we need at known versions. We download that
one wheel (cached under .cache/) and extract only the collections requirements.yml lists, then
check that each extracted collection has the pinned version: a silent version drift would make
the lab and the field disagree.

Usage: python tools/install_collections.py requirements.yml DEST
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import zipfile

import yaml

# The `ansible` release whose bundled collections match requirements.yml's pins.
ANSIBLE_BUNDLE = "ansible==12.3.0"


def main(req_path: str, dest: str) -> int:
    with open(req_path, encoding="utf-8") as fh:
        wanted = {c["name"]: str(c["version"]) for c in yaml.safe_load(fh)["collections"]}
    cache = os.path.join(os.path.dirname(os.path.abspath(req_path)), ".cache", "wheels")
    os.makedirs(cache, exist_ok=True)
    wheels = glob.glob(os.path.join(cache, "ansible-12.3.0-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                        "--no-deps", "-d", cache, ANSIBLE_BUNDLE], check=True)
        wheels = glob.glob(os.path.join(cache, "ansible-12.3.0-*.whl"))
    prefixes = tuple("ansible_collections/%s/" % n.replace(".", "/") for n in wanted)
    with zipfile.ZipFile(wheels[0]) as zf:
        members = [n for n in zf.namelist() if n.startswith(prefixes)]
        zf.extractall(dest, members=members)
    for name, version in wanted.items():
        manifest = os.path.join(dest, "ansible_collections", *name.split("."), "MANIFEST.json")
        try:
            with open(manifest, encoding="utf-8") as fh:
                found = json.load(fh)["collection_info"]["version"]
        except FileNotFoundError:
            print(f"collection {name} is not in {ANSIBLE_BUNDLE}", file=sys.stderr)
            return 1
        if found != version:
            print(f"collection {name}: requirements.yml pins {version}, {ANSIBLE_BUNDLE} has {found}",
                  file=sys.stderr)
            return 1
        print(f"collection {name} {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
