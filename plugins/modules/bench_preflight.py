#!/usr/bin/python
# -*- coding: utf-8 -*-
# bench_preflight is an action plugin (plugins/action/bench_preflight.py) that checks bench.yml's
# settings on the controller. This file documents it and is also the module the action runs on a
# host for what only that host can answer (a jsonl workload on the bench client, the installed
# SGLang's flags on a GPU server); the logic is plugins/module_utils/preflight.py (target) and
# plugins/plugin_utils/preflight/ (controller).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_preflight
short_description: Check every bench.yml setting before any server starts or any run directory is made
description:
  - "The first task of C(playbooks/bench.yml). On the controller, for every host of O(hosts)
    (C(gpu_servers)): the host's C(bench_*) variables (inventory, group_vars, C(-e)) over the bench
    role's defaults, templated in the host's context, as the role will see them."
  - "Unknown variables: every C(bench_*) variable a host or the controller has must be declared in
    C(roles/bench/meta/argument_specs.yml), the one definition of every bench option - those
    bench.yml reads outside the role (C(bench_report_baseline)) and the inventories' helpers
    (C(bench_time_scale), C(bench_draft_model)) included; anything else fails with the nearest
    known name (C(bench_concurency: unknown variable; did you mean bench_concurrency?)). A new
    variable must be declared there."
  - "Types as the role's argument spec declares them, strictly: a list or mapping given as a
    string fails (C(bench_concurrency: '1,2,5' is a string; give a YAML list [1, 2, 5])), numbers
    and booleans given as strings (C(-e key=value)) are accepted; whatever ansible-core's own
    argument spec validation would reject is rejected too."
  - "Ranges: C(bench_server_port) 1-65535, C(bench_level_seconds) > 0 and below llm_bench's
    C(level_timeout), C(bench_slo) values > 0 (keys C(ttft_ms), C(tpot_ms), C(e2e_ms)),
    C(bench_concurrency) levels >= 1, timeouts, regexes, C(bench_client) an inventory host."
  - "Profiles: unique names usable as server instance names, known keys (with the nearest known
    one), the engine (C(engine) or C(bench_engine)), then llm_server's own validation and
    rendering for that engine (SGLang for the newest pinned release). The workload's shape;
    then llm_bench's own option check over the options the role passes."
  - "On hosts: a jsonl workload is read and parsed on the bench client by llm_bench's own loader;
    an SGLang profile is rendered for the release installed on the GPU server and its flags
    checked against that release (what llm_server does before a launch); a vLLM profile needs
    vllm installed for C(bench_engine_python); a router derived profile needs HAProxy
    (C(bench_haproxy_binary)) on the GPU server. Checks on the controller's own host run in the
    same task; the others come back as RV(target_checks), which bench.yml runs with this module
    delegated to each host (O(workloads), O(servers), O(executables))."
  - "All problems are collected and reported in one failure, one line each, naming the variable,
    the fix, where the value was set (file:line when Ansible knows it) and the hosts. Nothing is
    started and nothing is written."
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  hosts:
    description:
      - The GPU servers whose settings are checked (controller mode, the action plugin only).
        bench.yml passes C(groups['gpu_servers']).
    type: list
    elements: str
  workloads:
    description:
      - Target mode, on the bench client. Items C({variable, hosts, where, workload}); each
        C(workload) is read with llm_bench's loader (RV(target_checks) of a controller run).
    type: list
    elements: dict
    default: []
  servers:
    description:
      - Target mode, on a GPU server. Items C({variable, hosts, where, request}); each C(request)
        holds llm_server options (C(name), C(engine), C(profile), C(host), C(port), C(python),
        C(env), C(state_dir)) rendered and flag-checked as llm_server does before a launch.
    type: list
    elements: dict
    default: []
  executables:
    description:
      - Target mode, on a GPU server. Items C({variable, hosts, where, path, needed_for, fix});
        each C(path) must be an executable file there (HAProxy, C(bench_haproxy_binary), when
        C(bench_derived_profiles) has C(router)).
    type: list
    elements: dict
    default: []
  profiles:
    description:
      - Controller mode, action only. Check these profiles instead of each host's
        C(bench_profiles) - tune.yml passes its trial profiles with every searched flag set
        (C(servelab.serving.tune) RV(servelab.serving.tune#module:probe_profiles)), so the flags
        are rendered and checked as C(bench_profiles) would be.
    type: list
    elements: dict
  help_flags:
    description:
      - Target mode, on a GPU server. Items C({variable, hosts, where, argv, flags}); C(argv)
        (a command engine's command line) is run with C(--help) appended, and every flag of
        C(flags) must appear in what it prints - the command's own argument definitions, as the
        release's C(server_args.py) is SGLang's. Placeholders (C({model}), C({host}), ...) are
        left out of C(argv).
    type: list
    elements: dict
    default: []
  results_root:
    description:
      - Controller mode, action only. The controller directory the run directories go under
        (bench.yml passes C(bench_results_root) as it will choose it). One under a regular file,
        on a kernel filesystem such as C(/proc), or not writable fails, naming
        C(bench_results_root) and the fix.
    type: str
  ports:
    description:
      - Target mode, on a GPU server. Items C({variable, hosts, where, port, needed_for,
        state_dir}); each C(port) (C(bench_server_port), and C(+1), C(+2) for a router derived
        profile) must be free there. A process listening on it is named; one of the servers
        recorded in C(state_dir) (an earlier run's leftover, which the run's reap ends) is not a
        problem.
    type: list
    elements: dict
    default: []
attributes:
  check_mode:
    support: full
    description: It only reads; check mode runs every check.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
  action:
    support: full
    description: With O(hosts) the action plugin works on the controller; the module runs only for the target checks.
notes:
  - Runs in check mode too. With O(hosts) it reads variables on the controller; the bench client
    and the GPU servers are contacted only for the target checks.
"""

EXAMPLES = r"""
- name: "servelab: preflight"
  servelab.serving.bench_preflight:
    hosts: "{{ groups['gpu_servers'] | default([]) }}"
  register: bench_preflight_result

- name: Check on each host what only that host can answer
  servelab.serving.bench_preflight:
    workloads: "{{ item.workloads }}"
    servers: "{{ item.servers }}"
    executables: "{{ item.executables }}"
    ports: "{{ item.ports }}"
  delegate_to: "{{ item.host }}"
  loop: "{{ bench_preflight_result.target_checks }}"
"""

RETURN = r"""
problems:
  description: "Every problem found: C({variable, message, where, hosts, text}); empty when all is well."
  returned: always
  type: list
  elements: dict
target_checks:
  description: "Controller mode: the checks left for other hosts, C([{host, workloads, servers, executables, ports}])."
  returned: success
  type: list
  elements: dict
progress:
  description: One line per problem (the progress callback prints them).
  returned: failure
  type: list
  elements: str
msg:
  description: What was checked, or every problem, one per line.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.servelab.serving.plugins.module_utils.preflight import run_checks

ARGUMENT_SPEC = dict(
    hosts=dict(type="list", elements="str"),
    workloads=dict(type="list", elements="dict", default=[]),
    servers=dict(type="list", elements="dict", default=[]),
    executables=dict(type="list", elements="dict", default=[]),
    ports=dict(type="list", elements="dict", default=[]),
    help_flags=dict(type="list", elements="dict", default=[]),
    profiles=dict(type="list", elements="dict"),
    results_root=dict(type="str"),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if module.params["hosts"]:
        module.fail_json(msg="bench_preflight: hosts is the action plugin's option (controller "
                             "mode); on a host give workloads and servers")
    problems = [p.as_dict() for p in run_checks(module.params["workloads"],
                                                module.params["servers"],
                                                module.params["executables"],
                                                module.params["ports"],
                                                module.params["help_flags"])]
    checked = ("%d workload(s), %d server profile(s), %d program(s), %d port(s), %d command "
               "flag set(s) checked" % (
                   len(module.params["workloads"]), len(module.params["servers"]),
                   len(module.params["executables"]), len(module.params["ports"]),
                   len(module.params["help_flags"])))
    if problems:
        module.fail_json(msg="\n".join(p["message"] for p in problems), problems=problems)
    module.exit_json(changed=False, problems=[], msg=checked)


if __name__ == "__main__":
    main()
