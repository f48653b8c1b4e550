"""server/simulator_file.py: the simulator package shipped as one zipapp, built the same from the
same sources, rewritten only when its content changes, and complete (it runs in an interpreter
that sees nothing of this checkout)."""
from __future__ import annotations

import glob
import io
import os
import subprocess
import sys
import zipfile

from ansible_collections.servelab.serving.plugins.module_utils.server import simulator_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE_UTILS = os.path.join(REPO, "plugins", "module_utils")
PREFIX = "ansible_collections/servelab/serving/plugins/module_utils/"


def test_the_zipapp_holds_every_module_of_the_package_as_the_checkout_has_it():
    archive = simulator_file.simulator_archive()
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        names = set(zf.namelist())
        package = {PREFIX + os.path.relpath(p, MODULE_UTILS)
                   for p in glob.glob(os.path.join(MODULE_UTILS, "simulator", "*.py"))}
        controller = {PREFIX + f"simulator/{name}.py" for name in simulator_file.CONTROLLER_ONLY}
        assert controller <= package                     # each one named exists
        package -= controller
        assert package <= names, sorted(package - names)
        assert not controller & names                    # and stays on the controller
        for name in package | {PREFIX + "netstamp.py"}:
            with open(os.path.join(MODULE_UTILS, name[len(PREFIX):]), encoding="utf-8") as fh:
                assert zf.read(name).decode("utf-8") == fh.read(), name
        assert zf.read("__main__.py").decode() == simulator_file.MAIN
        assert zf.read("ansible_collections/__init__.py") == b""


def test_the_same_sources_build_the_same_bytes():
    sources = simulator_file.simulator_sources()
    assert simulator_file.build_archive(sources) == simulator_file.build_archive(dict(sources))
    changed = dict(sources, **{"__main__.py": simulator_file.MAIN + "# changed\n"})
    assert simulator_file.build_archive(changed) != simulator_file.build_archive(sources)


def test_materialise_writes_only_when_the_content_changes(tmp_path):
    one = simulator_file.build_archive({"__main__.py": "print('one')\n"})
    two = simulator_file.build_archive({"__main__.py": "print('two')\n"})
    path, written = simulator_file.materialise(str(tmp_path), one)
    assert written and path == str(tmp_path / "servelab_simulator.pyz")
    os.utime(path, ns=(1, 1))
    assert simulator_file.materialise(str(tmp_path), one) == (path, False)
    assert os.stat(path).st_mtime_ns == 1                    # not rewritten
    assert simulator_file.materialise(str(tmp_path), two) == (path, True)
    assert open(path, "rb").read() == two


def test_the_zipapp_runs_alone_in_an_isolated_interpreter(tmp_path):
    """-I: no PYTHONPATH, no user site, no script directory of this checkout; the archive's own
    (regular) packages come first on sys.path, so a module missing from it fails here."""
    path, _written = simulator_file.materialise(str(tmp_path), simulator_file.simulator_archive())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run([sys.executable, "-I", path, "--profile", "nope"], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    # Every module imported (cli imports the server, which imports the rest) and the command
    # line parsed: the profile's check answers, not an ImportError.
    assert done.returncode == 2, done.stderr
    assert "unknown profile 'nope'" in done.stderr and "Traceback" not in done.stderr
    helped = subprocess.run([sys.executable, "-I", path, "--help"], cwd=str(tmp_path), env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: servelab_simulator.pyz")
