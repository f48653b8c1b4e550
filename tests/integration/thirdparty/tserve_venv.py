"""The venv of `transformers serve` (a real third-party OpenAI-compatible server from PyPI) for the
tests marked `thirdparty`: separate from the project's .venv (torch and transformers have no place
there), cached under .cache/thirdparty/ (git-ignored; `make clean` removes it), installed from the
exact pins of requirements-transformers-serve.txt beside this file.

    python tests/integration/thirdparty/tserve_venv.py          # install, or say it is up to date
    python tests/integration/thirdparty/tserve_venv.py --force  # reinstall

Idempotent and stamped: the stamp (written last, after `pip check` and an import of the serving
stack passed) holds the digest of the requirements file and of the Python that built the venv; a
venv whose stamp matches is used as it is, anything else (no stamp, another digest, an install that
was killed half way) is removed and built again. A lock file serialises concurrent callers (pytest
workers, two checkouts' tests never share it: the cache is per checkout).

Standard library only: it runs under any python3 >= 3.11 (the project's .venv or the system's).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
REQUIREMENTS = os.path.join(HERE, "requirements-transformers-serve.txt")
CACHE = os.path.join(REPO, ".cache", "thirdparty")
VENV = os.path.join(CACHE, "transformers-serve")
STAMP_NAME = ".servelab-stamp.json"
# What proves the venv can serve: transformers' own check of the serving extra
# (transformers/utils/import_utils.py:972 is_serve_available) and the CLI's module.
SMOKE = ("import torch, transformers; from transformers.utils.import_utils import is_serve_available; "
         "import transformers.cli.serve; assert is_serve_available(), 'serving extra missing'; "
         "print(torch.__version__, transformers.__version__)")
INSTALL_TIMEOUT = 1800


class InstallError(RuntimeError):
    """The venv could not be built; the message says which step and what pip said."""


@dataclass
class Result:
    venv: str
    python: str
    installed: bool          # False: the stamp matched, nothing was done
    seconds: float
    versions: str            # "torch transformers", from the venv itself


def base_python() -> str:
    """The interpreter the venv is built from: this one's base (not a venv's own python, so
    the server venv does not depend on .venv)."""
    base = os.path.join(sys.base_prefix, "bin", "python3")
    return base if os.path.isfile(base) else sys.executable


def wanted_stamp(python: str, requirements: str = REQUIREMENTS) -> dict:
    with open(requirements, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    version = subprocess.run([python, "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True, timeout=60).stdout.strip()
    return {"requirements_sha256": digest, "python": python, "python_version": version}


def read_stamp(venv: str) -> dict:
    try:
        with open(os.path.join(venv, STAMP_NAME), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def venv_python(venv: str = VENV) -> str:
    return os.path.join(venv, "bin", "python")


def _run(step: str, argv: list) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
    if done.returncode != 0:
        raise InstallError("%s failed (exit %d): %s\n%s" % (
            step, done.returncode, " ".join(argv), (done.stdout + done.stderr)[-4000:]))
    return done.stdout


def _smoke(venv: str, smoke: str) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([venv_python(venv), "-c", smoke], capture_output=True, text=True,
                          timeout=300, check=False, env=env)
    if done.returncode != 0:
        raise InstallError("the serving stack does not import in %s: %s" % (venv, done.stderr[-3000:]))
    return done.stdout.strip()


def ensure(venv: str = VENV, force: bool = False, python: str = "",
           requirements: str = REQUIREMENTS, smoke: str = SMOKE) -> Result:
    """The venv at `venv`, built from `requirements` unless its stamp says it already is; `smoke`
    (Python run by the venv) must pass before the stamp is written."""
    python = python or base_python()
    started = time.monotonic()
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)        # another caller building it: wait for it
        want = wanted_stamp(python, requirements)
        have = read_stamp(venv)
        if not force and have and {k: have.get(k) for k in want} == want:
            return Result(venv, venv_python(venv), False, time.monotonic() - started, have.get("versions", ""))
        shutil.rmtree(venv, ignore_errors=True)
        _run("creating the venv", [python, "-m", "venv", venv])
        # --no-deps: the file is the whole set; --only-binary: nothing is built from source here.
        # torch==2.13.0+cpu is on no PyPI page: PIP_FIND_LINKS (/opt/wheels on the project's
        # machines) or PyTorch's CPU index (PIP_EXTRA_INDEX_URL) must offer it.
        _run("pip install -r %s (the CPU torch: PIP_FIND_LINKS or PyTorch's CPU index as "
             "PIP_EXTRA_INDEX_URL)" % requirements,
             [venv_python(venv), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              "--no-deps", "--only-binary=:all:", "-r", requirements])
        _run("pip check (a dependency missing from the pins, or a conflict)",
             [venv_python(venv), "-m", "pip", "check"])
        versions = _smoke(venv, smoke)
        seconds = time.monotonic() - started
        stamp = dict(want, versions=versions, install_seconds=round(seconds, 1),
                     installed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        partial = os.path.join(venv, STAMP_NAME + ".part")
        with open(partial, "w", encoding="utf-8") as fh:
            json.dump(stamp, fh, indent=1)
        os.replace(partial, os.path.join(venv, STAMP_NAME))
        return Result(venv, venv_python(venv), True, seconds, versions)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--venv", default=VENV, help="where the venv goes (default %(default)s)")
    p.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    args = p.parse_args(argv)
    try:
        res = ensure(args.venv, force=args.force)
    except InstallError as exc:
        print("tserve_venv: %s" % exc, file=sys.stderr)
        return 1
    print("tserve_venv: %s %s in %.1f s (torch, transformers: %s)" % (
        res.venv, "installed" if res.installed else "up to date", res.seconds, res.versions))
    return 0


if __name__ == "__main__":
    sys.exit(main())
