"""llm_server's secrets reach the server's process and nothing else (canary strings).

Real processes: the fake server (tests/data/sglang/fake_openai_server.py) takes any flag, as an
engine with --api-key does, and prints what it is told to, as SGLang prints its ServerArgs. The
secrets come the three ways a benchmark hands them over: a profile's env, the module's env
(bench_server_env) and extra_args. They must be in the server's environ and argv; they must
not be in the result, a failure, the state file, or Ansible's output at any verbosity.
"""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import uuid

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime
from ansible_collections.servelab.serving.plugins.module_utils.proc import tree as proc_tree
from ansible_collections.servelab.serving.plugins.module_utils.server import state as server_state
from ansible_collections.servelab.serving.plugins.module_utils.server.manager import (
    ServerError,
    ServerRequest,
    build_spec,
    run,
)
from testports import free_port  # tests/testports.py

# The fast tier (make test) runs this module too: see pyproject.toml's markers.
pytestmark = pytest.mark.core

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE = os.path.join(REPO, "tests", "data", "sglang", "fake_openai_server.py")
TAG = f"servelab-canary-{uuid.uuid4().hex}"
PROFILE_ENV, MODULE_ENV, ARG = TAG + "-profile-env", TAG + "-module-env", TAG + "-arg"


def profile(*extra, arg=ARG):
    return {"name": "keyed", "model": "m",
            "command": [sys.executable, FAKE, "--host", "{host}", "--port", "{port}",
                        "--served-model-name", "{model}", *extra],
            "env": {"HF_TOKEN": PROFILE_ENV},
            "extra_args": ["--api-key", arg,
                           # what SGLang prints at start, api_key included
                           "--log-line", f"server_args=ServerArgs(api_key='{arg}')"]}


@pytest.fixture
def servers(tmp_path):
    state_dir = str(tmp_path / "servers")
    names = []

    def request(name, **kw):
        names.append(name)
        kw.setdefault("engine", "command")
        kw.setdefault("state_dir", state_dir)
        kw.setdefault("env", {"OPENAI_API_KEY": MODULE_ENV})
        kw.setdefault("ready_timeout", 60)
        kw.setdefault("stop_grace", 3)
        kw.setdefault("port_timeout", 5)
        return ServerRequest(name=name, **kw)

    yield state_dir, request
    for name in names:
        try:
            run(ServerRequest(name=name, state="stopped", state_dir=state_dir, stop_grace=2,
                              port_timeout=2))
        except ServerError:
            pass
        state = server_state.load(state_dir, name)
        if state and lifetime.is_alive(state.pid, state.start_time):
            for pid in proc_tree.members(state.pid, state.start_time, state.marker):
                os.kill(pid, signal.SIGKILL)


def files_holding(directory, needle):
    found = []
    for root, _dirs, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as fh:
                if needle.encode() in fh.read():
                    found.append(path)
    return found


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_secrets_reach_the_server_and_nothing_else(servers):
    state_dir, request = servers
    port = free_port()
    result = run(request("keyed", port=port, profile=profile()))
    assert result.action == "started"
    assert TAG not in json.dumps(result.as_dict())
    assert result.env["HF_TOKEN"] == "<redacted>" and result.env["OPENAI_API_KEY"] == "<redacted>"
    assert "--api-key '<redacted>'" in result.cmdline

    # ... while the server itself got them
    environ = open(f"/proc/{result.pid}/environ", "rb").read().split(b"\0")
    assert f"HF_TOKEN={PROFILE_ENV}".encode() in environ
    assert f"OPENAI_API_KEY={MODULE_ENV}".encode() in environ
    assert ARG.encode() in open(f"/proc/{result.pid}/cmdline", "rb").read().split(b"\0")

    directory = os.path.join(state_dir, "keyed")
    state_path = os.path.join(directory, server_state.STATE_FILE)
    assert mode(directory) == 0o700 and mode(state_path) == 0o600
    # Only the engine's own log holds a secret (the fake prints it as SGLang would), and it is
    # the owner's alone.
    assert files_holding(state_dir, TAG) == [os.path.join(directory, server_state.LOG_FILE)]
    assert mode(os.path.join(directory, server_state.LOG_FILE)) == 0o600

    # A config with secrets is compared by a keyed hash: not the plain one anyone could
    # recompute from the (redacted) command line and a guessed key.
    spec, _plan = build_spec(request("keyed", port=port, profile=profile()))
    state = server_state.load(state_dir, "keyed")
    assert state.hash_salt and state.config_hash == result.config_hash != spec.config_hash

    again = run(request("keyed", port=port, profile=profile()))
    assert again.action == "unchanged" and again.config_hash == result.config_hash
    changed = run(request("keyed", port=port, profile=profile(arg=ARG + "-rotated")))
    assert changed.action == "restarted" and changed.config_hash != result.config_hash
    assert TAG not in json.dumps(changed.as_dict())

    stopped = run(ServerRequest(name="keyed", state="stopped", state_dir=state_dir))
    assert stopped.action == "stopped" and TAG not in json.dumps(stopped.as_dict())


def test_a_server_that_fails_shows_its_log_without_the_secrets(servers):
    state_dir, request = servers
    dies = profile("--exit-after", "0.3", "--exit-message",
                   f"fatal: refused --api-key {ARG} (HF_TOKEN={PROFILE_ENV})")
    with pytest.raises(ServerError) as err:
        run(request("dies", port=free_port(), profile=dies))
    shown = err.value.msg + json.dumps(err.value.details, default=str)
    assert TAG not in shown
    assert "log_tail" in err.value.details, err.value.msg   # which failure it was, if not this
    assert "fatal: refused --api-key <redacted>" in err.value.details["log_tail"]
    assert "--api-key '<redacted>'" in err.value.details["cmdline"]
    assert TAG not in open(os.path.join(state_dir, "dies", server_state.STATE_FILE)).read()


def test_the_engine_api_key_is_rendered_for_sglang_only():
    base = {"name": "p", "model": "/models/m"}
    sglang, _plan = build_spec(ServerRequest(name="s", engine="sglang", engine_version="0.5.23",
                                             profile=base, api_key=ARG, python=sys.executable))
    assert list(sglang.cmd[-2:]) == ["--api-key", ARG]
    vllm, _plan = build_spec(ServerRequest(name="v", engine="vllm", profile=base, api_key=ARG,
                                           python=sys.executable))
    assert ARG not in vllm.cmd and any("api_key is not passed to vllm" in w
                                       for w in vllm.warnings)
    sim, _plan = build_spec(ServerRequest(name="m", engine="simulator", profile=base, api_key=ARG,
                                          simulator_archive=b"stand-in"))
    assert ARG not in sim.cmd and any("simulator checks no API key" in n for n in sim.notes)
    with pytest.raises(ServerError, match="keep one of them"):
        build_spec(ServerRequest(name="s", engine="sglang", engine_version="0.5.23",
                                 profile=dict(base, extra_args=["--api-key", "x"]),
                                 api_key=ARG, python=sys.executable))


# The secrets come from variables (as from an inventory's group_vars), not from the playbook's
# text: Ansible quotes the lines around a failing task, so a secret typed into a task would be
# shown by Ansible itself, before any module could mask it.
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
  tasks:
    - name: start with secrets in every place
      servelab.serving.llm_server:
        name: ansible-keyed
        engine: command
        port: {port}
        state_dir: "{state_dir}"
        profile: "{{{{ keyed }}}}"
        env: {{OPENAI_API_KEY: "{{{{ module_env }}}}"}}
        api_key: "{{{{ api_key }}}}"
        secret_names: [MY_LICENSE]
    - name: an invalid option beside the secrets (validation fails before the module runs)
      servelab.serving.llm_server:
        name: ansible-keyed
        engine: command
        port: not-a-port
        state_dir: "{state_dir}"
        profile: "{{{{ keyed }}}}"
        env: {{MY_LICENSE: "{{{{ license }}}}", HF_TOKEN: "{{{{ module_env }}}}"}}
        secret_names: [MY_LICENSE]
      ignore_errors: true
    - name: stop
      servelab.serving.llm_server: {{name: ansible-keyed, state: stopped, state_dir: "{state_dir}"}}
"""


@pytest.mark.parametrize("verbosity", [[], ["-vvv"]])
def test_ansible_output_holds_no_secret_at_any_verbosity(servers, tmp_path, verbosity):
    state_dir, request = servers
    request("ansible-keyed")   # cleaned up by the fixture
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK.format(port=free_port(), state_dir=state_dir))
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps({"keyed": profile(), "module_env": MODULE_ENV,
                                 "api_key": TAG + "-api-key", "license": TAG + "-license"}))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_NOCOLOR="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
         "-e", f"@{extra}", *verbosity, str(playbook)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "changed=1" in output or "changed=2" in output      # it did start and stop
    assert "Unsupported parameters" not in output and "port" in output
    assert TAG not in output, output[output.find(TAG) - 400:output.find(TAG) + 200]
