"""The collection's Python requirements (issue 28, item 7): declared where Ansible users look
(requirements.txt at the collection root, meta/execution-environment.yml for ansible-builder),
pinned for the checkout in requirements-dev.txt, and checked by the report step, whose error
names what is missing and the command that installs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from packaging.requirements import Requirement

from ansible_collections.servelab.serving.plugins.plugin_utils import controller_requirements as cr

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def _requirements(name):
    with open(os.path.join(REPO, name), encoding="utf-8") as fh:
        return [Requirement(line.split("#")[0].strip()) for line in fh
                if line.split("#")[0].strip() and not line.startswith("-")]


def test_requirements_txt_holds_the_report_packages_and_every_one_is_pinned_for_the_venv():
    runtime = {r.name: r for r in _requirements("requirements.txt")}
    assert set(runtime) == {dist for _module, dist in cr.REPORT_PACKAGES}
    # No test or Ansible pins for collection users: ansible-core is theirs.
    assert "ansible-core" not in runtime and "pytest" not in runtime
    pins = {r.name: r for r in _requirements("requirements-dev.txt")}
    for name, wanted in runtime.items():
        pinned = [str(s.version) for s in pins[name].specifier if s.operator == "=="]
        assert pinned and wanted.specifier.contains(pinned[0]), (name, pinned, wanted)


def test_ansible_builder_is_pointed_at_requirements_txt():
    with open(os.path.join(REPO, "meta", "execution-environment.yml"), encoding="utf-8") as fh:
        ee = yaml.safe_load(fh)
    assert ee["dependencies"]["python"] == "requirements.txt"


def test_the_error_names_the_missing_packages_and_the_install_command():
    def no_pyarrow(name):
        return None if name == "pyarrow" else object()

    gone = cr.missing(find_spec=no_pyarrow)
    assert gone == ["pyarrow"]
    text = cr.requirements_error("bench_report", gone, python="/usr/bin/python3")
    assert text.startswith("bench_report needs pyarrow on the controller")
    assert text.endswith("install them with: /usr/bin/python3 -m pip install -r "
                         + cr.REQUIREMENTS_FILE)
    # the file of the collection the plugin was loaded from (here the checkout, through its link)
    assert os.path.samefile(cr.REQUIREMENTS_FILE, os.path.join(REPO, "requirements.txt"))
    assert cr.requirements_error("bench_report", []) is None
    assert cr.install_command("py", requirements="/nonexistent") == (
        "py -m pip install pandas numpy matplotlib pyarrow")


BLOCKER = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError("blocked by the test")
        return None
sys.meta_path.insert(0, _Block())
"""


@pytest.mark.skipif(not os.path.exists(os.path.join(BIN, "ansible")), reason="no ansible")
def test_bench_report_fails_before_reading_anything_naming_the_install_command(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"),
               ANSIBLE_COLLECTIONS_PATH=os.path.join(REPO, "collections"),
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="0")
    done = subprocess.run(
        [os.path.join(BIN, "ansible"), "localhost", "-m", "servelab.serving.bench_report",
         "-a", "results_dir=%s" % (tmp_path / "nope")],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120, check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "bench_report needs pyarrow on the controller" in out, out
    assert "-m pip install -r" in out and "requirements.txt" in out, out
