"""llm_server through Ansible itself: AnsiballZ packaging, argument spec, check mode, fail_json.

One small playbook on localhost (connection local), written by the test: start, start again
(changed=false), check mode with another config, a server that dies (failure with the log tail),
stop. The fake server (tests/data/sglang/fake_openai_server.py) is the engine.
"""
import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime, tree as proc_tree
from ansible_collections.servelab.serving.plugins.module_utils.server import state as server_state
from ansible_collections.servelab.serving.plugins.module_utils.server import simulator_file
from testports import free_port  # tests/testports.py

# The fast tier (make test) runs this module too: see pyproject.toml's markers.
pytestmark = pytest.mark.core

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE = os.path.join(REPO, "tests", "data", "sglang", "fake_openai_server.py")
SIMULATOR = os.path.join(REPO, "plugins", "module_utils", "simulator")

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
    fake_profile:
      name: fake
      model: m
      command: ["{python}", "{fake}", "--host", "{{host}}", "--port", "{{port}}",
                "--served-model-name", "{{model}}", "--listen-early", "1"]
  tasks:
    - name: start
      servelab.serving.llm_server: {{name: "{name}", engine: command, port: {port}, state_dir: "{state_dir}",
                   profile: "{{{{ fake_profile }}}}", env: {{CUDA_HOME: /usr/local/cuda-13.0}},
                   ready_timeout: 120}}
      register: first
    - name: start again, same config
      servelab.serving.llm_server: {{name: "{name}", engine: command, port: {port}, state_dir: "{state_dir}",
                   profile: "{{{{ fake_profile }}}}", env: {{CUDA_HOME: /usr/local/cuda-13.0}}}}
      register: second
    - name: another config, check mode
      servelab.serving.llm_server: {{name: "{name}", engine: command, port: {port}, state_dir: "{state_dir}",
                   profile: "{{{{ fake_profile | combine({{'model': 'other'}}) }}}}"}}
      check_mode: true
      register: third
    - name: a server that dies
      servelab.serving.llm_server:
        name: "{name}-dies"
        engine: command
        port: {port2}
        state_dir: "{state_dir}"
        profile:
          name: dies
          command: ["{python}", "{fake}", "--port", "{{port}}", "--listen-early", "600",
                    "--exit-after", "0.3"]
      register: dies
      ignore_errors: true
    - name: a bad profile
      servelab.serving.llm_server: {{name: "{name}-bad", engine: sglang, port: {port2}, state_dir: "{state_dir}",
                   engine_version: "0.5.23", profile: {{base: eagle3, model: /m}}}}
      register: bad
      ignore_errors: true
    - name: stop
      servelab.serving.llm_server: {{name: "{name}", state: stopped, state_dir: "{state_dir}"}}
      register: fourth
    - name: keep the results for the test
      copy:
        content: "{{{{ {{'first': first, 'second': second, 'third': third, 'dies': dies,
                       'bad': bad, 'fourth': fourth}} | to_json }}}}"
        dest: "{out}"
"""


def ansible_playbook(playbook, tmp_path):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["ANSIBLE_CONFIG"] = os.path.join(REPO, "ansible.cfg")
    env["ANSIBLE_LOCAL_TEMP"] = str(tmp_path / "ansible-tmp")
    env["ANSIBLE_NOCOLOR"] = "1"
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                           "-i", "localhost,", str(playbook)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture
def cleanup(tmp_path):
    state_dir = str(tmp_path / "servers")
    names = []
    yield state_dir, names
    for name in names:
        state = server_state.load(state_dir, name)
        if state and lifetime.is_alive(state.pid, state.start_time):
            members = proc_tree.members(state.pid, state.start_time, state.marker)
            for pid in members:
                os.kill(pid, signal.SIGKILL)


def test_llm_server_through_ansible_playbook(tmp_path, cleanup):
    state_dir, names = cleanup
    name = f"ans-{uuid.uuid4().hex[:8]}"
    names += [name, f"{name}-dies"]
    out = tmp_path / "results.json"
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(python=sys.executable, fake=FAKE, name=name,
                                        port=free_port(), port2=free_port(),
                                        state_dir=state_dir, out=out))
    done = ansible_playbook(playbook, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    results = json.loads(out.read_text())
    first, second, third = results["first"], results["second"], results["third"]
    assert first["changed"] is True and first["action"] == "started"
    assert first["env"] == {"CUDA_HOME": "/usr/local/cuda-13.0"}
    assert first["cmd"][:2] == [sys.executable, FAKE] and first["cmdline"]
    assert first["config_hash"] and first["base_url"].startswith("http://127.0.0.1:")
    assert first["ready_seconds"] > 0 and first["model"] == "m"
    assert second["changed"] is False and second["action"] == "unchanged"
    assert second["pid"] == first["pid"]
    assert third["changed"] is True and third["action"] == "would_restart"
    dies = results["dies"]
    assert dies["failed"] is True and dies["exit_code"] == 3
    assert "FATAL: CUDA out of memory (fake)" in dies["msg"]
    bad = results["bad"]
    assert bad["failed"] is True
    assert "speculative.draft_model_path is required for EAGLE3" in bad["msg"]
    fourth = results["fourth"]
    assert fourth["changed"] is True and fourth["stopped"]["port_free"] is True
    assert first["pid"] in [k["pid"] for k in fourth["stopped"]["killed"]]
    assert not lifetime.is_alive(first["pid"])


SIM_PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
  tasks:
    - servelab.serving.llm_server:
        name: "{name}"
        engine: simulator
        port: {port}
        state_dir: "{state_dir}"
        profile: {{name: baseline, simulator: {{profile: baseline, time_scale: 20}}}}
        ready_timeout: 120
      register: sim
    - servelab.serving.llm_server: {{name: "{name}", state: stopped, state_dir: "{state_dir}"}}
    - copy: {{content: "{{{{ sim | to_json }}}}", dest: "{out}"}}
"""


@pytest.mark.skipif(not os.path.exists(SIMULATOR),
                    reason="plugins/module_utils/simulator/ is not in this checkout yet")
def test_simulator_is_shipped_by_ansiballz_and_runs(tmp_path, cleanup):
    state_dir, names = cleanup
    name = f"sim-{uuid.uuid4().hex[:8]}"
    names.append(name)
    out = tmp_path / "sim.json"
    playbook = tmp_path / "sim.yml"
    playbook.write_text(SIM_PLAYBOOK.format(name=name, port=free_port(), state_dir=state_dir,
                                            out=out))
    done = ansible_playbook(playbook, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    sim = json.loads(out.read_text())
    script = os.path.join(state_dir, name, "servelab_simulator.pyz")
    assert sim["changed"] is True and sim["cmd"][1] == script
    # What AnsiballZ shipped and the module packed is the checkout's package, byte for byte: the
    # zipapp built here from the checkout's sources is the same file.
    with open(script, "rb") as fh:
        assert fh.read() == simulator_file.simulator_archive()
