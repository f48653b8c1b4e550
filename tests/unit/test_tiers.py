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


def _make_variable(name: str) -> str:
    """A `NAME := value` line of the Makefile, as make reads it."""
    with open(os.path.join(os.path.dirname(TESTS), "Makefile")) as fh:
        for line in fh:
            if line.startswith(name + " :="):
                return line.split(":=", 1)[1].strip()
    raise AssertionError("no %s in the Makefile" % name)


THIRDPARTY = textwrap.dedent("""\
    import pytest

    @pytest.fixture(scope="module")
    def server():
        return 1

    @pytest.mark.thirdparty
    def test_serve(server):
        pass

    @pytest.mark.thirdparty
    @pytest.mark.core
    def test_serve_marked_core_too(server):
        pass
    """)


def test_thirdparty_is_integration_and_never_the_fast_tier(tmp_path):
    """A `thirdparty` test (a real server from PyPI on the CPU) under tests/integration is run by
    `make test-integration` (-m integration), in the one xdist group `thirdparty`, and never by
    the fast tier's FAST_TIER, not even when it is also marked `core`."""
    tree = tmp_path / "tree"
    (tree / "tests" / "integration" / "thirdparty").mkdir(parents=True)
    (tree / "tests" / "integration" / "thirdparty" / "test_tp.py").write_text(THIRDPARTY)
    (tree / "conftest.py").write_text(CONFTEST + textwrap.dedent("""
        def pytest_collection_finish(session):
            for item in session.items:
                print("ITEM", item.name, sorted({m.name for m in item.iter_markers()}),
                      [m.args for m in item.iter_markers("xdist_group")])
        """))
    (tree / "pytest.ini").write_text("[pytest]\nmarkers =\n" + "".join(
        "    %s\n" % m for m in ("lab", "integration", "gpu", "core", "root", "haproxy", "thirdparty")))

    def collect(expr):
        return subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-s", "-p", "no:cacheprovider",
             "-m", expr, "tests"], cwd=tree, capture_output=True, text=True, timeout=120, check=False)

    fast = collect(_make_variable("FAST_TIER"))
    assert fast.returncode == 5 and "ITEM" not in fast.stdout, fast.stdout + fast.stderr
    integration = collect("integration")
    assert integration.returncode == 0, integration.stdout + integration.stderr
    items = [line for line in integration.stdout.splitlines() if line.startswith("ITEM")]
    assert len(items) == 2, integration.stdout
    for line in items:
        assert "'integration'" in line and "'thirdparty'" in line and "[('thirdparty',)]" in line, line
