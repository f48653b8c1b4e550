"""llm_bench's options through Ansible: the action validates with the module's own spec on the
controller, so a typo or a bad value fails before a level runs and before a run dir exists."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")


def run(tmp_path, options: str):
    # Port 9 on loopback (discard): nothing listens, so any request sent would fail the play
    # with a connection error, not with the option error the tests expect.
    play = textwrap.dedent("""\
        - hosts: localhost
          gather_facts: false
          tasks:
            - name: "servelab: sweep"
              servelab.serving.llm_bench:
                base_url: http://127.0.0.1:9
                model: m
                run_id: run1
                results_root: "{root}"
        {options}
        """).format(root=tmp_path / "results",
                    options=textwrap.indent(textwrap.dedent(options), " " * 8))
    path = tmp_path / "pb.yml"
    path.write_text(play)
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([ANSIBLE_PLAYBOOK, "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=%s" % sys.executable, str(path)],
                          capture_output=True, text=True, env=env, timeout=120,
                          cwd=str(tmp_path), check=False)


@pytest.mark.parametrize("options, expected", [
    ("concurency: [1, 2]\nconcurrency: [1]\n", "concurency"),
    ("concurrency: [1]\nlevel_seconds: 0\n", "level_seconds"),
    ("concurrency: [1, x]\n", "concurrency"),
    ("concurrency: [1]\napi: grpc\n", "api"),
])
def test_bad_options_fail_on_the_controller_before_any_level(tmp_path, options, expected):
    proc = run(tmp_path, options)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert expected in out
    assert "running (window" not in out          # no level was started
    assert not (tmp_path / "results" / "run1").exists()
