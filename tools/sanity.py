"""Run `ansible-test sanity` on this checkout as the collection servelab.serving.

ansible-test insists that the working directory's path end in
`ansible_collections/<namespace>/<name>`, and it resolves links, so the link under collections/
(tools/collection_link.py) does not do. We copy the files git would ship -- tracked ones plus
untracked ones git does not ignore, so it works before a commit -- into
`<tmp>/ansible_collections/servelab/serving` and run ansible-test there. The copy has no .git:
ansible-test then lists the files itself (its "unversioned" source), which is exactly the set we
copied; nothing else is needed. The collections servelab depends on (collections/, from
`make setup`) are linked beside it, so a reference to one of them resolves as it does in a
playbook.

Each sanity test runs in a virtual environment of its own that ansible-test builds from its
pinned requirements (pip, from PyPI; cached under ~/.ansible/test/venv), so the first run takes
longer. ansible-test creates those environments without pip and bootstraps it with a get-pip.py
it downloads from ci-files.testing.ansible.com, which CI cannot reach (PyPI only). Where that
script is not already cached we cache a stand-in (GET_PIP_SHIM): Python's own ensurepip, then
`pip install` of the very pip version ansible-test asks for, from PyPI.
Python 3.11 is the only interpreter servelab supports on the controller: `--python 3.11`.

Usage: python tools/sanity.py [--keep] [ANSIBLE_TEST_SANITY_ARGS...]
  Without arguments: the tests in TESTS. With arguments (e.g. `--test pep8`, `--list-tests`,
  `-v`), they replace the test selection and go to `ansible-test sanity` as they are.
  --keep   leave the copy in place and print where it is (to rerun ansible-test by hand).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMESPACE, NAME = "servelab", "serving"
PYTHON_VERSION = "3.11"

# ansible-test's default set, less the tests that do not apply to this collection:
# - changelog: `make lint` runs `antsibull-changelog lint` on changelogs/ itself, with the version
#   pinned in requirements-lint.txt (ansible-test's would build an environment of its own for it).
# - pslint: no PowerShell (it would skip itself anyway; listed so the choice is visible).
SKIP = ["changelog", "pslint"]


# Stands in for get-pip.py: ansible-test runs `python get-pip.py --disable-pip-version-check
# pip==X [--no-setuptools] [--no-wheel]` inside the new environment.
GET_PIP_SHIM = """\
# servelab tools/sanity.py: stand-in for get-pip.py (ci-files.testing.ansible.com is unreachable).
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"])
subprocess.check_call([sys.executable, "-m", "pip", "install", "-q"] + args)
"""


def pip_versions() -> set[str]:
    """The pip versions ansible-test bootstraps (get_venv_packages: `pip='24.2'`)."""
    import ansible_test

    path = os.path.join(os.path.dirname(ansible_test.__file__), "_internal", "python_requirements.py")
    with open(path, encoding="utf-8") as fh:
        versions = set(re.findall(r"\bpip\s*=\s*['\"]([0-9][0-9.]*)['\"]", fh.read()))
    if not versions:
        raise SystemExit("sanity: no pip version found in %s: update tools/sanity.py" % path)
    return versions


def ensure_get_pip(versions: set[str]) -> None:
    cache = os.path.expanduser("~/.ansible/test/cache")
    for version in versions:
        path = os.path.join(cache, "get_pip_%s.py" % version.replace(".", "_"))
        if not os.path.exists(path):
            os.makedirs(cache, exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(GET_PIP_SHIM)


def source_files(repo: str = REPO) -> list[str]:
    """The files git tracks or would add (untracked, not ignored) that exist in the work tree."""
    out = subprocess.run(
        ["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True, capture_output=True,
    ).stdout.decode("utf-8", "surrogateescape")
    seen: set[str] = set()
    files = []
    for rel in out.split("\0"):
        if not rel or rel in seen:
            continue
        seen.add(rel)
        path = os.path.join(repo, rel)
        # a tracked file deleted in the work tree, or a tracked link to a directory (a submodule
        # or a nested checkout): ansible-test sees what the next commit would hold.
        if os.path.lexists(path) and not (os.path.isdir(path) and not os.path.islink(path)):
            files.append(rel)
    return sorted(files)


def make_copy(root: str, repo: str = REPO) -> str:
    """Copy the collection under ROOT/ansible_collections/servelab/serving; return that path."""
    dest = os.path.join(root, "ansible_collections", NAMESPACE, NAME)
    for rel in source_files(repo):
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(repo, rel), target, follow_symlinks=False)
    # the dependencies (community.general, ansible.posix, ...) beside it, as collections_path has them
    installed = os.path.join(repo, "collections", "ansible_collections")
    if os.path.isdir(installed):
        for namespace in sorted(os.listdir(installed)):
            if namespace == NAMESPACE or not os.path.isdir(os.path.join(installed, namespace)):
                continue
            os.symlink(os.path.join(installed, namespace),
                       os.path.join(root, "ansible_collections", namespace))
    return dest


def command(args: list[str]) -> list[str]:
    ansible_test = os.path.join(os.path.dirname(sys.executable), "ansible-test")
    if not os.path.exists(ansible_test):
        ansible_test = shutil.which("ansible-test") or "ansible-test"
    cmd = [ansible_test, "sanity", "--python", PYTHON_VERSION, "--color", "no"]
    if args:
        return cmd + args
    for test in SKIP:
        cmd += ["--skip-test", test]
    return cmd


def main(argv: list[str]) -> int:
    keep = "--keep" in argv
    args = [a for a in argv if a != "--keep"]
    root = tempfile.mkdtemp(prefix="servelab-sanity-")
    try:
        ensure_get_pip(pip_versions())
        dest = make_copy(root)
        cmd = command(args)
        print("sanity: %s (in %s)" % (" ".join(cmd), dest), flush=True)
        env = dict(os.environ)
        # The sanity tests must judge the files, not this checkout's ansible.cfg.
        env.pop("ANSIBLE_CONFIG", None)
        return subprocess.run(cmd, cwd=dest, env=env, check=False).returncode
    finally:
        if keep:
            print("sanity: the copy stays in %s" % root)
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
