#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Ansible module llm_server: start, stop or restart an LLM inference server from a profile."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: llm_server
short_description: Start, stop or restart an LLM inference server (SGLang, vLLM, simulator, any command)
description:
  - Renders a serving profile into one exact command line for the engine (per engine release for
    SGLang, whose flags move between releases), validates it before anything is touched, launches
    it detached in its own session and, where the machine allows, its own cgroup v2, and waits
    until the server really generates (SGLang C(/health_generate), else a 1-token completion).
  - C(state=started) is idempotent. The same config already serving is C(changed=false); a
    different config, a dead server or one that no longer generates is restarted.
  - C(state=stopped) sends SIGTERM to every process of the server (descendants, process group,
    session, cgroup, and children that double-forked away, found by an inherited environment
    marker), waits C(stop_grace), sends SIGKILL (C(cgroup.kill) where available) and confirms the
    port is free.
  - Log lines saying a requested feature was skipped (for example SGLang's
    "Skipping allreduce fusion") are returned in C(features_skipped), because a flag is not proof.
  - The simulator engine runs the package C(plugins/module_utils/simulator/), shipped with this
    module and written as one zipapp to C(<state_dir>/<name>/servelab_simulator.pyz) (rewritten
    only when its content changes).
  - Secrets reach the server and nothing else. Values of env keys that name a secret (SECRET,
    PASSWORD, PASSWD, PASSPHRASE, CREDENTIAL(S) or APIKEY as a word, unless a later word is PATH,
    FILE, MAP, ...; or a last word KEY, TOKEN, AUTH, PASS, as in C(HF_TOKEN), C(OPENAI_API_KEY)),
    of flags named so in C(extra_args) or C(command) (C(--api-key X), C(--hf-token=X)), of
    O(secret_names) and O(api_key) are masked in all of the module's output, failures and the
    C(-vvv) invocation included, returned redacted in C(cmd), C(cmdline) and C(env), and never
    written to the state file (0600, in a 0700 directory). The engine's own log may quote them
    (SGLang logs its arguments); it is 0600 and every log tail returned is redacted.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  name:
    description: >-
      Instance name; state, log and cgroup live under C(<state_dir>/<name>) and
      C(servelab/<name>).
    type: str
    required: true
  state:
    description: Desired state.
    type: str
    choices: [started, stopped, restarted]
    default: started
  engine:
    description:
      - C(sglang) runs C(<python> -m sglang.launch_server); C(vllm) runs C(vllm serve) from the
        venv of I(python); C(simulator) runs servelab's simulator; C(command) runs
        I(profile.command), any OpenAI-compatible server.
    type: str
    choices: [sglang, vllm, simulator, command]
    default: simulator
  profile:
    description:
      - The serving profile (see docs/plugin-notes.md, llm_server). Keys C(name), C(base) (a built-in profile to
        start from - C(baseline), C(eagle3), C(eagle3_v2)), C(model), C(served_model_name), C(tp),
        C(speculative) (C(algorithm), C(draft_model_path), C(num_steps), C(eagle_topk),
        C(num_draft_tokens)), C(spec_v2), C(flashinfer_allreduce_fusion) (true or a backend
        name), C(torch_symm_mem), C(mem_fraction_static), C(cuda_graph_max_bs),
        C(max_running_requests), C(enable_metrics), C(extra_args), C(env), C(simulator),
        C(command), C(ready) (C(path), C(method), C(body), C(status)).
      - Required unless I(state=stopped).
    type: dict
  model:
    description: Default for I(profile.model) (a profile's own C(model) wins).
    type: str
  host:
    description: Address the server binds to.
    type: str
    default: 127.0.0.1
  port:
    description: Port; default 30000 for sglang and the simulator, 8000 for vllm; required for command.
    type: int
  advertise_host:
    description: >-
      Host name put into C(base_url) for clients on other machines (default the bind address, or
      127.0.0.1 for a wildcard bind).
    type: str
  state_dir:
    description: Directory for per-server state, logs and the simulator script.
    type: path
    default: ~/.servelab/servers
  python:
    description:
      - Interpreter of the engine's venv (sglang, simulator; vllm is taken from the same bin
        directory). Default the interpreter running this module.
    type: path
  env:
    description: >-
      Environment for the server on top of the inherited one (for example CUDA_HOME, PATH,
      LD_LIBRARY_PATH from cuda_toolkit). Recorded in the result.
    type: dict
    default: {}
  engine_version:
    description:
      - Engine release to render flags for. Default the version installed for I(python); when
        given and different from the installed one, the task fails.
    type: str
  gpu_compute_capabilities:
    description:
      - Compute capabilities (X.Y) of the GPUs the server runs on, for example from C(gpu_facts). SGLang gates
        FlashInfer's allreduce fusion by GPU itself (0.5.14 and later refuse it at start outside SM 9.x/10.x);
        a fusion flag this SGLang would refuse or ignore on one of them is not rendered, and
        C(features_skipped) says so. Unset, the flag is rendered as the profile asks.
    type: list
    elements: str
  ready_timeout:
    description: Seconds to wait for the first successful generation.
    type: float
    default: 900
  probe_timeout:
    description: Seconds one readiness request may take.
    type: float
    default: 60
  stop_grace:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 15
  kill_timeout:
    description: Seconds to wait for processes to vanish after SIGKILL.
    type: float
    default: 15
  port_timeout:
    description: Seconds to wait for the port to be released after a stop.
    type: float
    default: 30
  cgroup:
    description: >-
      C(auto) (cgroup v2 at /sys/fs/cgroup or /sys/fs/cgroup/unified when writable), C(none), or a
      parent directory for C(<name>).
    type: str
    default: auto
  verify_flags:
    description: >-
      Check the rendered SGLang flags against the argument definitions of the installed SGLang
      before launching; unknown flags fail the task.
    type: bool
    default: true
  stop_on_failure:
    description: Stop the server (whole tree) when it fails to become ready.
    type: bool
    default: true
  wait:
    description:
      - Wait until the server is ready (C(true)), or return once it is launched (C(false)). A later
        C(state=started) call with the same config waits for it (up to I(ready_timeout) while it
        never was ready).
      - The ranks of a multi-node profile (I(profile.nodes)) become ready only together, so each
        is launched with C(wait=false), then waited for. A rank that is not ready then fails the
        task instead of being restarted alone (the others would wait for it forever).
    type: bool
    default: true
  api_key:
    description:
      - The engine's API key. SGLang gets C(--api-key); vLLM does not yet (its readiness probe
        could not send the key; a warning says the server runs open); the simulator and
        C(command) ignore it (a note says so).
      - Never shown or recorded; the config hash of a config with secrets is keyed.
    type: str
  secret_names:
    description:
      - More names to treat as secrets, beside the built-in rule. An entry starting with C(-)
        is a flag whose value is secret (C(--license)), any other an env key (C(MY_LICENSE),
        case-insensitive).
    type: list
    elements: str
    default: []
notes:
  - Rendering warnings (engine version outside the checked range, deprecated flags) are reported
    as Ansible warnings.
  - Supports check mode; it reports the action it would take (C(would_start), C(would_restart),
    C(would_stop)).
  - Linux only (uses /proc and cgroup v2).
"""

EXAMPLES = r"""
- name: SGLang EAGLE-3 on 8 GPUs
  servelab.serving.llm_server:
    name: sglang
    engine: sglang
    python: /opt/sglang/venv/bin/python
    host: 0.0.0.0
    port: 30000
    env: "{{ cuda_toolkit_env }}"
    profile:
      name: eagle3
      base: eagle3
      model: /models/Qwen3-Coder-30B-A3B-Instruct
      tp: 8
      flashinfer_allreduce_fusion: true
      speculative:
        draft_model_path: /models/Qwen3-Coder-30B-A3B-Instruct-EAGLE3
  register: server

- name: The simulator on a laptop
  servelab.serving.llm_server:
    name: sim
    engine: simulator
    port: 30123
    profile: {name: baseline, simulator: {profile: baseline, time_scale: 20}}

- name: Any OpenAI-compatible server
  servelab.serving.llm_server:
    name: tfserve
    engine: command
    port: 8000
    profile:
      name: transformers
      model: /tmp/model
      command: [transformers, serve, "{model}", --continuous-batching, --host, "{host}", --port, "{port}"]
      ready: {path: /v1/chat/completions, body: {messages: [{role: user, content: hi}], max_tokens: 1}}

- name: Stop it and everything it forked
  servelab.serving.llm_server:
    name: sglang
    state: stopped
"""

RETURN = r"""
name:
  description: The instance name, O(name).
  type: str
  returned: always
state:
  description: The requested state, O(state).
  type: str
  returned: always
engine:
  description: The engine, O(engine).
  type: str
  returned: when a profile was rendered or a state file exists
profile:
  description: The serving profile's name.
  type: str
  returned: when a profile was rendered or a state file exists
host:
  description: The address the server binds to.
  type: str
  returned: when a profile was rendered or a state file exists
port:
  description: The server's port.
  type: int
  returned: when a profile was rendered or a state file exists
action:
  description: >-
    started, restarted, unchanged, stopped, absent; in check mode would_start, would_restart,
    would_stop.
  type: str
  returned: always
reason:
  description: Why that action.
  type: str
  returned: always
pid:
  description: PID of the server's first process (its session and group leader).
  type: int
  returned: when running
cmd:
  description: The exact argv, secret values replaced by C(<redacted>).
  type: list
  elements: str
  returned: when a profile was rendered or a state file exists
cmdline:
  description: The argv as one shell-quoted string.
  type: str
  returned: same as cmd
env:
  description: >-
    Environment servelab set for the server (module env, profile env, rendered switches such as
    SGLANG_ENABLE_SPEC_V2), secret values replaced by C(<redacted>); the inherited environment
    is not listed.
  type: dict
  returned: same as cmd
config_hash:
  description: Hash of argv, env, engine version and readiness probe; equal hashes mean the same server.
  type: str
  returned: same as cmd
engine_version:
  description: Engine release the flags were rendered for (installed version unless given).
  type: str
  returned: for sglang and vllm
base_url:
  description: URL clients use, for example http://10.0.0.5:30000.
  type: str
  returned: same as cmd
model:
  description: The model name to send in requests.
  type: str
  returned: same as cmd
ready_seconds:
  description: Seconds from launch to the first successful generation.
  type: float
  returned: when started
features_skipped:
  description: >-
    Log lines saying a feature did not run, as '<feature>: <line> (xN)', and features left out of the
    command because the engine refuses them on these GPUs, as '<feature>: not rendered: <why>'.
  type: list
  elements: str
  returned: when started
engine_adjustments:
  description: >-
    Log lines saying the engine changed a setting (for example max_running_requests reset to 48
    for speculative decoding).
  type: list
  elements: str
  returned: when started
log_path:
  description: The server's log file (the previous run's is kept as <log>.1).
  type: str
  returned: same as cmd
state_path:
  description: The state file.
  type: str
  returned: same as cmd
cgroup:
  description: The server's cgroup directory, or null.
  type: str
  returned: when started
cgroup_reason:
  description: Why that cgroup, or why none.
  type: str
  returned: when started
notes:
  description: What servelab did not need to render, and why.
  type: list
  elements: str
  returned: always
ignored_keys:
  description: >-
    Profile keys the engine does not use (the simulator models speculation through its own
    settings).
  type: list
  elements: str
  returned: always
stopped:
  description: What a stop did - killed ([{pid, comm, signal}]), survivors, seconds, port_free.
  type: dict
  returned: when something was stopped
"""

from ansible.module_utils.basic import AnsibleModule
# server_manager imports server/simulator_file.py, which imports every module of the simulator
# package (and netstamp): AnsiballZ follows module_utils imports recursively, so the simulator
# ships with this module.
from ansible_collections.servelab.serving.plugins.module_utils import redact
from ansible_collections.servelab.serving.plugins.module_utils.server.manager import (
    ServerError,
    ServerRequest,
    run,
)


class _Module(AnsibleModule):
    """AnsibleModule that masks the request's secrets from the first message on.

    no_log_values is filled before validation, so even a validation failure (whose result
    carries the invocation, every parameter) prints no secret. Ansible calls this hook after
    loading the parameters; should a later Ansible not, main() adds them right after."""

    def _set_internal_properties(self, *args, **kwargs):
        super()._set_internal_properties(*args, **kwargs)
        self.no_log_values.update(_secrets(self.params))


def _secrets(params) -> set:
    """Every secret value in the module's parameters (raw or validated)."""
    names = params.get("secret_names")
    rules = redact.Rules.of(names if isinstance(names, list) else [])
    found = redact.collect_secrets({"profile": params.get("profile"), "env": params.get("env")},
                                   rules)
    if params.get("api_key"):
        found.add(str(params["api_key"]))
    return found


ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    state=dict(type="str", default="started", choices=["started", "stopped", "restarted"]),
    engine=dict(type="str", default="simulator",
                choices=["sglang", "vllm", "simulator", "command"]),
    profile=dict(type="dict"),
    model=dict(type="str"),
    host=dict(type="str", default="127.0.0.1"),
    port=dict(type="int"),
    advertise_host=dict(type="str"),
    state_dir=dict(type="path", default="~/.servelab/servers"),
    python=dict(type="path"),
    env=dict(type="dict", default={}),
    engine_version=dict(type="str"),
    gpu_compute_capabilities=dict(type="list", elements="str"),
    ready_timeout=dict(type="float", default=900.0),
    probe_timeout=dict(type="float", default=60.0),
    stop_grace=dict(type="float", default=15.0),
    kill_timeout=dict(type="float", default=15.0),
    port_timeout=dict(type="float", default=30.0),
    cgroup=dict(type="str", default="auto"),
    verify_flags=dict(type="bool", default=True),
    stop_on_failure=dict(type="bool", default=True),
    wait=dict(type="bool", default=True),
    api_key=dict(type="str", no_log=True),
    secret_names=dict(type="list", elements="str", default=[], no_log=False),
)


def main():
    module = _Module(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("state", "started", ("profile",)), ("state", "restarted", ("profile",))],
        supports_check_mode=True,
    )
    module.no_log_values.update(_secrets(module.params))
    params = dict(module.params)
    params["env"] = {str(k): str(v) for k, v in (params.get("env") or {}).items()}
    request = ServerRequest(check_mode=module.check_mode, **params)
    try:
        result = run(request)
    except ServerError as exc:
        module.fail_json(msg=exc.msg, **exc.details)
    except TimeoutError as exc:
        module.fail_json(msg=str(exc))
    out = result.as_dict()
    changed = out.pop("changed")
    # `warnings` is Ansible's own result key: hand them over through module.warn.
    for warning in out.pop("warnings") or []:
        module.warn(warning)
    module.exit_json(changed=changed, **out)


if __name__ == "__main__":
    main()
