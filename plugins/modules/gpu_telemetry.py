#!/usr/bin/python
# -*- coding: utf-8 -*-
"""gpu_telemetry: a detached NVML sampler on the GPU server, started before a sweep and
stopped after it."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_telemetry
short_description: Sample the GPUs (SM utilisation, memory, power, SM clock) through a sweep
description:
  - V(started) forks a detached sampler process (its own session, output to a log, a pid file
    with its pid and start time) that appends one JSON line per O(interval) to
    C(<state_dir>/telemetry-<name>/telemetry.jsonl) - the wall-clock time and, per GPU, SM
    utilisation %, memory used MiB, power W and SM clock MHz, read through NVML (pynvml where
    importable, else servelab's ctypes binding of the driver's libnvidia-ml, so nvidia-ml-py is
    not needed on the GPU server).
  - The sampler ends itself after O(max_seconds), so it never outlives a run that could not stop it.
  - Without NVML (no driver, no GPU) the sampler writes one line saying why
    and exits; the task does not fail (RV(available=false), RV(reason)).
  - V(stopped) ends the sampler by its pid, only while that pid is still the process it started
    (pid and start time from C(/proc)), and returns where the samples are (and, with
    O(return_samples), the records).
  - Logic in C(module_utils/gpu/telemetry.py).
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  name:
    description: The sampler's name (one per name and O(state_dir)), e.g. the server instance's.
    type: str
    required: true
  state:
    description: V(started) starts a fresh sampler (stopping one of the same name first); V(stopped) ends it.
    type: str
    choices: [started, stopped]
    default: started
  state_dir:
    description: Where the sampler's directory C(telemetry-<name>) is made.
    type: path
    default: ~/.servelab/servers
  interval:
    description: Seconds between samples.
    type: float
    default: 0.5
  max_seconds:
    description: The sampler stops itself after this many seconds.
    type: float
    default: 21600.0
  host_label:
    description: Recorded in the file's first line (the inventory host the samples belong to).
    type: str
  profile:
    description: Recorded in the file's first line (the profile being measured).
    type: str
  return_samples:
    description: With V(stopped), return the records in RV(records) (the file can be fetched instead).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports what it would start or stop; forks and signals nothing.
  diff_mode:
    support: none
    description: Nothing to diff.
"""

EXAMPLES = r"""
- name: Sample the GPUs through the sweep
  servelab.serving.gpu_telemetry:
    name: servelab-baseline
    state: started
    max_seconds: 7200
  register: telemetry

- name: Stop sampling
  servelab.serving.gpu_telemetry:
    name: servelab-baseline
    state: stopped
  register: telemetry_stop

- name: Bring the samples to the controller
  ansible.builtin.fetch:
    src: "{{ telemetry_stop.path }}"
    dest: "results/run/telemetry/{{ inventory_hostname }}__baseline.jsonl"
    flat: true
  when: telemetry_stop.exists
"""

RETURN = r"""
path:
  description: The samples file on the target (JSON lines).
  returned: always
  type: str
  sample: /home/bench/.servelab/servers/telemetry-servelab-baseline/telemetry.jsonl
available:
  description: Whether NVML answered (false - no GPU telemetry here, RV(reason) says why).
  returned: always
  type: bool
reason:
  description: Why there is no telemetry; empty when there is.
  returned: always
  type: str
  sample: >-
    pynvml (nvidia-ml-py) not importable by /usr/bin/python3.12: No module named 'pynvml';
    libnvidia-ml.so.1 not loadable: libnvidia-ml.so.1: cannot open shared object file
    (NVML error -1)
pid:
  description: V(started) - the sampler's pid (null once it exited for want of NVML).
  returned: when state is started
  type: int
started_unix_ns:
  description: Wall-clock time the sampler was started (V(started)) or its first line (V(stopped)).
  returned: always
  type: int
replaced:
  description: V(started) - pids of a sampler of the same name that was still running and was stopped.
  returned: when state is started
  type: list
  elements: int
stopped:
  description: V(stopped) - the pid this call ended; null when none was running.
  returned: when state is stopped
  type: int
survivors:
  description: V(stopped) - pids still running after SIGTERM and SIGKILL (should be empty).
  returned: when state is stopped
  type: list
  elements: int
exists:
  description: V(stopped) - whether the samples file exists.
  returned: when state is stopped
  type: bool
samples:
  description: V(stopped) - sample lines in the file.
  returned: when state is stopped
  type: int
gpus:
  description: V(stopped) - GPUs sampled.
  returned: when state is stopped
  type: int
records:
  description: V(stopped) with O(return_samples) - the file's records.
  returned: when return_samples
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.servelab.serving.plugins.module_utils.gpu.telemetry import (
    TelemetryError,
    paths_for,
    running,
    start,
    stop,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", default="started", choices=["started", "stopped"]),
            state_dir=dict(type="path", default="~/.servelab/servers"),
            interval=dict(type="float", default=0.5),
            max_seconds=dict(type="float", default=21600.0),
            host_label=dict(type="str"),
            profile=dict(type="str"),
            return_samples=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["interval"] <= 0 or p["max_seconds"] <= 0:
        module.fail_json(msg="gpu_telemetry: interval and max_seconds must be > 0")
    paths = paths_for(p["state_dir"], p["name"])
    if module.check_mode:
        current = running(paths)
        if p["state"] == "started":
            module.exit_json(changed=True, path=paths.samples, available=False,
                             reason="check mode: not started", pid=None,
                             started_unix_ns=None,
                             replaced=[current.pid] if current else [])
        module.exit_json(changed=current is not None, path=paths.samples, available=False,
                         reason="check mode: not stopped", stopped=None, survivors=[],
                         exists=False, samples=0, gpus=None, started_unix_ns=None)
    try:
        if p["state"] == "started":
            labels = {k: p[k] for k in ("host_label", "profile") if p[k]}
            res = start(paths, p["interval"], p["max_seconds"], labels)
            module.exit_json(changed=True, path=res.path, available=res.available,
                             reason=res.reason, pid=res.pid,
                             started_unix_ns=res.started_unix_ns, replaced=res.replaced)
        res = stop(paths, with_records=p["return_samples"])
    except (TelemetryError, OSError) as exc:
        module.fail_json(msg="gpu_telemetry: %s" % exc)
    out = dict(changed=res.stopped is not None, path=res.path, available=res.available,
               reason=res.reason, stopped=res.stopped, survivors=res.survivors,
               exists=res.exists, samples=res.samples, gpus=res.gpus,
               started_unix_ns=res.started_unix_ns)
    if p["return_samples"]:
        out["records"] = res.records
    if res.survivors:
        module.fail_json(msg="gpu_telemetry: the sampler %s survived SIGKILL" % res.survivors,
                         **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
