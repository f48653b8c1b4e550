"""Role sglang's pins and rules against the released packages on PyPI (marker pypi).

- roles/sglang/vars/releases.yml is what the wheels say: tools/sglang_release_facts.py re-derives it
  (sglang and flashinfer-python wheels `pip download --no-deps`, the kernel's PEP 658 metadata), so a
  hand edit, or a release whose gates moved, fails here;
- the role's PyPI pins (sglang, torch, sglang-kernel, flashinfer-python) resolve together for the GPU
  hosts' platform (`pip install --dry-run --ignore-installed --report`), and the old kernel default
  (0.4.7, which pins torch 2.13.0) does not;
- the pins PyPI cannot check (flashinfer-cubin, flashinfer-jit-cache: FlashInfer's index; the +cu130
  kernel and torch builds: SGLang's and PyTorch's indexes) by their public version against the
  metadata of the wheels that depend on them.

Downloads and reports are cached under .cache/sglang-wheels/ (git-ignored): a rerun reads no network
except for the resolution reports, which are cached by their pins too.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import sglang_release_facts as facts

pytestmark = pytest.mark.pypi

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "sglang"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
# Every manylinux tag a Debian 12 x86_64 host (glibc 2.36) takes: the wheels of sglang's
# dependencies carry anything from manylinux2014 to manylinux_2_34.
HOST = ["--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
        "--platform", "linux_x86_64"] + [a for i in range(17, 35) for a in ("--platform", "manylinux_2_%d_x86_64" % i)]


def _defaults():
    return {"sglang": DEFAULTS["sglang_version"], "torch": DEFAULTS["sglang_torch_version"],
            "sglang-kernel": DEFAULTS["sglang_kernel_version"], "flashinfer-python": DEFAULTS["sglang_flashinfer_version"]}


def resolve(pins: dict) -> tuple:
    """(rc, report or None, stderr) of pip resolving the exact pins on PyPI, cached by the pins."""
    specs = ["%s==%s" % kv for kv in sorted(pins.items())]
    cache = Path(facts.CACHE) / "resolve"
    cache.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(" ".join(specs + HOST).encode()).hexdigest()[:16]
    saved = cache / (name + ".json")
    if saved.exists():
        stored = json.loads(saved.read_text())
        return stored["rc"], stored["report"], stored["stderr"]
    report = cache / ("%s.%d.report.json" % (name, os.getpid()))      # per worker (pytest -n)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                           "--report", str(report), "--target", str(cache / "unused")] + HOST + specs,
                          capture_output=True, text=True, timeout=1200, check=False, env=facts.pip_env())
    # A network failure is not an answer: only pip's own verdicts are cached.
    if done.returncode != 0 and "ResolutionImpossible" not in done.stderr and "conflict" not in done.stderr:
        pytest.fail("pip could not reach PyPI to resolve %s: %s" % (specs, done.stderr[-800:]))
    result = json.loads(report.read_text()) if done.returncode == 0 else None
    partial = saved.with_suffix(".%d.part" % os.getpid())
    partial.write_text(json.dumps({"rc": done.returncode, "report": result, "stderr": done.stderr[-4000:]}))
    partial.replace(saved)
    report.unlink(missing_ok=True)
    return done.returncode, result, done.stderr[-4000:]


def test_releases_yml_is_what_the_wheels_say():
    derived = facts.render(facts.derive())
    assert (ROLE / "vars" / "releases.yml").read_text() == derived, \
        "roles/sglang/vars/releases.yml differs from the wheels: rerun tools/sglang_release_facts.py"


def test_the_role_defaults_resolve_together_on_pypi():
    pins = _defaults()
    rc, report, stderr = resolve(pins)
    assert rc == 0, stderr
    got = {facts.normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    assert {name: got.get(name) for name in pins} == pins
    # FlashInfer's cubin is not among sglang 0.5.23's requirements: nothing pulls it from PyPI.
    assert "flashinfer-cubin" not in got


def test_the_old_kernel_default_does_not_resolve():
    rc, _report, stderr = resolve(dict(_defaults(), **{"sglang-kernel": "0.4.7"}))
    assert rc != 0 and "Cannot install sglang-kernel==0.4.7 and sglang==0.5.23" in stderr, stderr
    # Without sglang too: 0.4.7 pins torch==2.13.0, against the torch 2.14.1 pin.
    rc, _report, stderr = resolve({"sglang-kernel": "0.4.7", "torch": DEFAULTS["sglang_torch_version"]})
    assert rc != 0 and "Cannot install sglang-kernel==0.4.7 and torch==2.14.1" in stderr, stderr


def test_pins_off_pypi_match_the_wheels_that_depend_on_them():
    """flashinfer-cubin/-jit-cache take flashinfer-python's version (the role installs one version of
    the three); the +cu130 torch and kernel builds carry the public versions sglang's METADATA pins."""
    sglang = facts.sglang_facts(facts.wheel("sglang", DEFAULTS["sglang_version"]))
    assert sglang["requires"]["torch"] == DEFAULTS["sglang_torch_version"]
    assert sglang["requires"]["sglang-kernel"] == DEFAULTS["sglang_kernel_version"]
    assert sglang["requires"]["flashinfer-python"] == DEFAULTS["sglang_flashinfer_version"]
    kernel = facts.kernel_facts(facts.metadata_report("sglang-kernel", DEFAULTS["sglang_kernel_version"]))
    assert kernel["requires"]["torch"] == DEFAULTS["sglang_torch_version"]
    # PyPI really lacks them, so the FlashInfer index is the one to ask (and the README says so).
    assert DEFAULTS["sglang_flashinfer_version"] not in facts.pypi_versions("flashinfer-cubin")
    assert facts.pypi_versions("flashinfer-jit-cache") == []


def test_the_gates_read_from_the_pinned_sources():
    """The numbers issue 24 found, read again from the sources: SM12x fusion from FlashInfer 0.6.17,
    SGLang 0.5.14+ refuse outside SM90/SM10X, SGLang 0.5.23's kernel floor 0.4.9."""
    assert 12 in facts.flashinfer_facts(facts.wheel("flashinfer-python", DEFAULTS["sglang_flashinfer_version"]))["fusion_majors"]
    assert facts.flashinfer_facts(facts.wheel("flashinfer-python", "0.6.16.post4"))["fusion_majors"] == [9, 10]
    assert facts.flashinfer_facts(facts.wheel("flashinfer-python", "0.6.17"))["fusion_majors"] == [9, 10, 12]
    sglang = facts.sglang_facts(facts.wheel("sglang", DEFAULTS["sglang_version"]))
    assert (sglang["fusion_majors"], sglang["fusion_elsewhere"], sglang["kernel_floor"]) == ([9, 10], "refuse", "0.4.9")
    older = facts.sglang_facts(facts.wheel("sglang", "0.5.13.post1"))
    assert (older["fusion_majors"], older["fusion_elsewhere"]) == ([9, 10], "skip")
