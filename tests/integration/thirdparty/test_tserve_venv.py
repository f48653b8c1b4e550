"""The installer of the third-party server's venv (tests/integration/thirdparty/tserve_venv.py):
idempotent and stamped, rebuilt when its pins change or an install never finished, one build for
concurrent callers, a failing step named; and its pins exact. Real venvs (python -m venv) with an
empty requirements file and a trivial smoke check: no download, but five venvs (~6 s each on two
busy cores), so it runs in the thirdparty tier beside the server it installs, not in the fast tier."""
from __future__ import annotations

import json
import os
import re
import threading

import pytest

import tserve_venv   # this folder (pytest puts it on sys.path)

pytestmark = pytest.mark.thirdparty

SMOKE = "print('smoke ok')"


@pytest.fixture()
def reqs(tmp_path):
    path = tmp_path / "requirements.txt"
    path.write_text("# nothing to install\n")
    return str(path)


def _ensure(tmp_path, reqs, **kw):
    return tserve_venv.ensure(str(tmp_path / "venv"), requirements=reqs, smoke=SMOKE, **kw)


def test_built_once_then_up_to_date_then_rebuilt_when_the_pins_change_or_it_never_finished(tmp_path, reqs):
    first = _ensure(tmp_path, reqs)
    assert first.installed and first.versions == "smoke ok"
    stamp = json.loads((tmp_path / "venv" / tserve_venv.STAMP_NAME).read_text())
    assert stamp["requirements_sha256"] and stamp["python_version"] and stamp["versions"] == "smoke ok"
    marker = tmp_path / "venv" / "left-by-the-first-build"
    marker.write_text("x")

    again = _ensure(tmp_path, reqs)
    assert not again.installed and marker.exists()          # nothing was touched

    with open(reqs, "a") as fh:
        fh.write("# a pin changed\n")
    changed = _ensure(tmp_path, reqs)
    assert changed.installed and not marker.exists()        # built from scratch

    # A killed install leaves the venv without its stamp (the stamp is written last).
    os.unlink(tmp_path / "venv" / tserve_venv.STAMP_NAME)
    assert _ensure(tmp_path, reqs).installed


def test_concurrent_callers_share_one_build(tmp_path, reqs):
    results = []
    threads = [threading.Thread(target=lambda: results.append(_ensure(tmp_path, reqs)))
               for _caller in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(r.installed for r in results) == [False, True]


def test_a_failing_smoke_check_names_it_and_writes_no_stamp(tmp_path, reqs):
    with pytest.raises(tserve_venv.InstallError, match="does not import"):
        tserve_venv.ensure(str(tmp_path / "venv"), requirements=reqs,
                           smoke="raise SystemExit('no serving stack')")
    assert not (tmp_path / "venv" / tserve_venv.STAMP_NAME).exists()


def test_the_pins_are_exact_and_name_the_cpu_torch():
    with open(tserve_venv.REQUIREMENTS) as fh:
        lines = [line.strip() for line in fh if line.strip() and not line.startswith("#")]
    assert lines and all(re.fullmatch(r"[a-z0-9-]+==[0-9][0-9A-Za-z.+]*", line) for line in lines), lines
    pins = dict(line.split("==") for line in lines)
    assert len(pins) == len(lines)
    # The CPU build: a bare torch pin would pull the CUDA wheels (several GB).
    assert pins["torch"] == "2.13.0+cpu"
    assert pins["transformers"] == "5.23.0"
    # The serving extra (transformers METADATA: Provides-Extra serving).
    assert {"fastapi", "uvicorn", "pydantic", "openai", "starlette", "rich", "accelerate"} <= set(pins)
