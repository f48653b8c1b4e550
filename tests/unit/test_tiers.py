"""The tiers' markers and pytest-xdist's groups (tests/tiers.py), under a real
`pytest -n 2 --dist loadgroup` in a scratch tree: the lab's tests keep to one worker, a module's
shared fixture runs once, and ungrouped tests still spread over both workers. (Under pytest 9
with pytest-xdist 3.8 the groups are silently split: this is what catches that.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFTEST = textwrap.dedent("""\
    import os, sys
    import pytest
    sys.path.insert(0, %r)
    import tiers

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(config, items):
        tiers.mark(items, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))
    """) % TESTS

# Each test writes which worker ran it, with its markers, into the log directory.
RECORD = textwrap.dedent("""\
    import json, os, time
    import pytest

    def record(request, name):
        marks = sorted({m.name for m in request.node.iter_markers()})
        path = os.path.join(os.environ["TIERS_LOG"], name + ".json")
        with open(path, "w") as fh:
            json.dump({"worker": os.environ.get("PYTEST_XDIST_WORKER"), "marks": marks}, fh)
        time.sleep(0.2)      # long enough that one worker cannot take everything
    """)

LAB = RECORD + "".join(textwrap.dedent("""
    def test_lab_%d(request):
        record(request, "lab_%d")
    """) % (i, i) for i in range(3))

SHARED = RECORD + textwrap.dedent("""
    @pytest.fixture(scope="module")
    def bench_run():
        with open(os.path.join(os.environ["TIERS_LOG"], "setups"), "a") as fh:
            fh.write("x")
        return 1
    """) + "".join(textwrap.dedent("""
    def test_reads_%d(request, bench_run):
        record(request, "shared_%d")
    """) % (i, i) for i in range(3))

FREE = RECORD + "".join(textwrap.dedent("""
    def test_free_%d(request):
        record(request, "free_%d")
    """) % (i, i) for i in range(6))


def test_groups_hold_under_xdist_and_folders_give_the_tier(tmp_path):
    tree = tmp_path / "tree"
    for folder, name, text in (("lab", "test_lab.py", LAB),
                               ("integration", "test_shared.py", SHARED),
                               ("unit", "test_free.py", FREE)):
        (tree / "tests" / folder).mkdir(parents=True)
        (tree / "tests" / folder / name).write_text(text)
    (tree / "conftest.py").write_text(CONFTEST)
    (tree / "pytest.ini").write_text("[pytest]\nmarkers =\n    lab\n    integration\n    gpu\n")
    log = tmp_path / "log"
    log.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "tests"],
        cwd=tree, env=dict(os.environ, TIERS_LOG=str(log)), capture_output=True, text=True,
        timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = {p.stem: json.loads(p.read_text()) for p in log.glob("*.json")}
    assert len(ran) == 12, sorted(ran)
    assert len({ran["lab_%d" % i]["worker"] for i in range(3)}) == 1, ran
    assert len({ran["shared_%d" % i]["worker"] for i in range(3)}) == 1, ran
    assert (log / "setups").read_text() == "x"                  # the shared fixture ran once
    assert {r["worker"] for r in ran.values()} == {"gw0", "gw1"}, ran
    assert "lab" in ran["lab_0"]["marks"] and "integration" in ran["shared_0"]["marks"]
    assert not {"lab", "integration", "gpu"} & set(ran["free_0"]["marks"])
