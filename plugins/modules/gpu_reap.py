#!/usr/bin/python
# -*- coding: utf-8 -*-
"""gpu_reap: kill what a stopped inference server left on the GPUs, and prove memory is free."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_reap
short_description: Kill leftover GPU processes (SGLang/vLLM workers) and wait until GPU memory is free
description:
  - Finds the processes that use a GPU by scanning C(/proc/*/fd) (and memory maps) for
    O(device_glob), counting those with a CUDA context (mapping O(compute_device_glob)). Inside an LXC
    container C(nvidia-smi) reports host PIDs, so it cannot say which container process holds a
    GPU; the file descriptors can.
  - Adds processes in the server's O(cgroups) and processes whose executed command matches
    O(patterns) (by default the process titles of SGLang's scheduler, TP/GPU workers,
    detokenizer, draft runner and launcher, and of vLLM's EngineCore, workers and launcher)
    within O(pattern_scope) - by default only the reaping user's matches that hold a CUDA context
    or live in a servelab server cgroup, since a name alone is easily shared. Then their
    descendants, the process groups and sessions they lead, and orphaned groups (a dead
    launcher's workers, reparented to init); never a group or session led by a live process that
    is not a target (the user's shell, a tmux pane), never below a terminal multiplexer.
  - Never touches init, kernel threads, the init of a container, itself and its ancestors (the
    Ansible connection), sshd, Ansible, the NVIDIA daemons (persistenced, fabric manager, DCGM),
    LXC plumbing, terminal multiplexers and session managers (tmux, screen, zellij, login,
    C(systemd --user), login shells), or what O(protect) and O(protect_pids) name (with their
    descendants).
  - Sends SIGTERM, waits up to O(grace) for each process to exit, then SIGKILL (or C(cgroup.kill)
    for the server's cgroups, which also catches double-forked escapees), waits up to
    O(kill_timeout), and rescans for processes forked meanwhile. A zombie whose parent is not the
    reaper counts as gone.
  - Reports every process that disappeared during the reap, the targets' and those tied to
    them (a child that died with its parent), in RV(vanished).
  - Then polls GPU memory (NVML via nvidia-ml-py when importable, else C(nvidia-smi)) until every
    GPU is back to the baseline or O(memory_timeout) passes, leaving out the memory that the
    processes it spared hold (protected work, other users' jobs), per process as NVML reports it
    (RV(memory_excluded)). There are no fixed sleeps.
  - With O(container), runs on the Proxmox host (use C(delegate_to)) and considers only the
    processes in that container's cgroup, for processes that cannot be killed from inside it.
version_added: "0.1.0"
author: servelab (!UNKNOWN)
options:
  device_glob:
    description: Glob of the device files whose holders are GPU users. Tests point it at files of their own.
    type: str
    default: /dev/nvidia*
  compute_device_glob:
    description:
      - A holder of O(device_glob) is a GPU user only if it also memory-maps a file matching
        this. A CUDA context maps C(/dev/nvidia-uvm); NVML clients (nvidia-smi, DCGM, exporters)
        open the same device files, C(nvidia-uvm) included, but do not map it, and are left alone
        (listed in RV(spared)). So is a process that only initialised CUDA without a context
        (it holds no GPU memory).
      - Give an empty string to count every holder of O(device_glob), as C(fuser) would.
    type: str
    default: /dev/nvidia-uvm
  patterns:
    description:
      - Regular expressions searched in what each process executes and in its kernel name -
        its program, a Python interpreter's script or C(-m) module with the script's
        subcommand, a shell's script, a setproctitle title (C(sglang::scheduler_TP0)). Not in
        the rest of its arguments - C(tail -f .../servelab_simulator.pyz), an editor on a
        server's file, or the C(bash -c "python server.py; sleep 900") around a server (its
        python child matches) only name it, and are listed in RV(spared) as bystanders.
      - The default matches SGLang (C(^sglang::), C(-m sglang.launch_server), C(sglang serve)) and
        vLLM (C(^VLLM::), C(^VllmWorker), C(vllm serve), C(-m vllm.entrypoints.)).
      - Give V([]) to rely on the device scan and cgroups alone.
      - A match is a target only within O(pattern_scope).
    type: list
    elements: str
  pattern_scope:
    description:
      - Which processes a match of O(patterns) alone may take. Processes holding a CUDA context
        and members of O(cgroups) are targets whatever this says.
      - V(own_gpu) - processes of the user the reap runs as (from the Proxmox host with
        O(container), the container's root) that hold a CUDA context or live in a servelab
        server cgroup (C(<cgroup root>/servelab/...), where M(servelab.serving.llm_server)
        starts servers). Another user's look-alike and a CPU-only process that merely mentions
        C(vllm serve) are spared (listed in RV(spared)).
      - V(own) - every process of that user that matches, GPU or not (a launcher started by hand,
        outside llm_server's cgroups).
      - V(any) - every match, whoever runs it (the behaviour before this option). Needed when root
        reaps servers that run as another account.
    type: str
    choices: [own_gpu, own, any]
    default: own_gpu
  protect:
    description: Regular expressions; a matching process and its descendants are never touched.
    type: list
    elements: str
    default: []
  protect_pids:
    description: Process IDs that, with their descendants, are never touched.
    type: list
    elements: int
    default: []
  grace:
    description: Seconds to wait after SIGTERM before SIGKILL. The wait ends as soon as all have exited.
    type: float
    default: 10
  kill_timeout:
    description: Seconds to wait after SIGKILL for the processes to exit before reporting them as survivors.
    type: float
    default: 10
  cgroups:
    description:
      - cgroup directories the server was started in (the llm_server launcher uses
        C(<cgroup v2 root>/servelab/<name>)). Their processes are targets; where C(cgroup.kill)
        exists (cgroup v2, kernel 5.14+) the SIGKILL step uses it.
      - Relative paths are taken under the cgroup v2 root (C(/sys/fs/cgroup), or
        C(/sys/fs/cgroup/unified) on hybrid hosts), or under the container's cgroup with
        O(container). Globs are allowed. A missing directory is reported, not an error.
    type: list
    elements: str
    default: []
  container:
    description:
      - Proxmox host variant. The vmid of an LXC container; only processes in its cgroup are
        candidates, and each killed process is reported with its pid inside the container.
      - Run the task on the Proxmox host (C(delegate_to)).
    type: str
  container_cgroup_globs:
    description: Where the container's cgroup is; C({vmid}) is replaced by O(container).
    type: list
    elements: str
    default:
      - /sys/fs/cgroup/lxc/{vmid}
      - /sys/fs/cgroup/*/lxc/{vmid}
      - /sys/fs/cgroup/lxc.payload.{vmid}
      - /sys/fs/cgroup/*/lxc.payload.{vmid}
  scan_maps:
    description: Also count processes that map a device file without holding a descriptor on it.
    type: bool
    default: true
  wait_memory:
    description: Poll GPU memory after the kill until it is back to the baseline (or O(memory_timeout)).
    type: bool
    default: true
  memory_baseline_mib:
    description:
      - MiB used per GPU that is expected to stay and that the reap cannot attribute to a process
        it spared. One integer for every GPU, a list by GPU index, or a mapping of GPU index to
        MiB.
      - The memory of the compute processes the reap spared (protected, another user's, outside
        the container) is left out first, per process as NVML reports it (RV(memory_excluded)).
        Do not count it in the baseline where the pids NVML reports are this host's; inside a
        container they are host pids, nothing is left out (RV(memory_note) says so) and the
        baseline must cover protected work.
      - A GPU is back to baseline when its used memory, less the memory left out, is at most
        baseline + O(memory_threshold_mib). Without a baseline it is back when it has no compute
        process other than spared ones and at most O(memory_threshold_mib) used (less what is
        left out).
    type: raw
  memory_threshold_mib:
    description: Tolerance in MiB (see O(memory_baseline_mib)).
    type: int
    default: 512
  memory_timeout:
    description: Seconds to wait for the memory.
    type: float
    default: 60
  poll_interval:
    description: Longest pause between two polls (polls start at 5-10 ms and back off up to this).
    type: float
    default: 0.25
  gpus:
    description:
      - The GPUs whose memory to check, by index or UUID (C(GPU-...)); default all the reaper
        sees. With O(container) on a host with more GPUs than the container has, give the
        container's GPU UUIDs (from gpu_facts run inside it), since indices differ between the two.
    type: list
    elements: str
    default: []
  gpu_backend:
    description: How to read GPU memory. V(none) skips the memory check.
    type: str
    choices: [auto, nvml, nvidia-smi, none]
    default: auto
  nvidia_smi:
    description: The nvidia-smi executable (used when NVML is not importable).
    type: str
    default: nvidia-smi
  require_clean:
    description: Fail when a target survives or GPU memory does not get back to the baseline.
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: Lists what would be killed in RV(would_kill); nothing is signalled.
  diff_mode:
    support: full
    description: Before = the target processes, after = the survivors.
notes:
  - Runs with the Python standard library alone; nvidia-ml-py and psutil are not required.
  - The memory of a protected process is left out of the check where NVML's pids are this host's
    (a bare host, or the Proxmox host with O(container)). Inside a container NVML reports host
    pids, which match no local process; there, give O(memory_baseline_mib) for protected work
    (for example from a gpu_facts run before the server started).
"""

EXAMPLES = r"""
- name: Free the GPUs after stopping the server
  gpu_reap:
    cgroups: [servelab/sglang]
    grace: 10

- name: What would be killed (no signal sent)
  gpu_reap:
  check_mode: true
  register: reap_plan

- name: Keep a notebook's GPU work alive; its memory is the baseline
  gpu_reap:
    protect: ['jupyter-(lab|notebook)', 'ipykernel']
    memory_baseline_mib: "{{ gpu_facts_before.gpu_facts.gpus | map(attribute='memory_used_mib') | list }}"

- name: From the Proxmox host, for processes that will not die from inside container 129
  gpu_reap:
    container: "129"
  delegate_to: "{{ proxmox_host }}"
"""

RETURN = r"""
killed:
  description: Processes that were signalled and have exited.
  returned: always
  type: list
  elements: dict
  contains:
    pid: {description: PID (a host PID with O(container)), type: int}
    container_pid:
      description: PID inside its container (O(container), or when the pid namespace differs).
      type: int
    name: {description: Kernel process name (comm), type: str}
    cmdline: {description: Command line, type: str}
    signal: {description: What ended it, type: str, sample: SIGTERM}
    found_by:
      description: >-
        device_fd, device_mmap, pattern, cgroup, descendant, process_group or session; in
        RV(vanished) with C(side_effect), how it relates to a target (descendant, parent,
        process_group, session, spared)
      type: str
    seed_pid: {description: "For a process found through another one, that one's PID", type: int}
    detail: {description: "Device path, pattern, cgroup or relation", type: str}
    side_effect:
      description: >-
        RV(vanished) only - not a target, tied to one, and it exited during the reap without a
        signal of the reaper
      type: bool
  sample:
    - {pid: 4242, name: "sglang::schedul", cmdline: "sglang::scheduler_TP0", signal: SIGTERM,
       found_by: device_fd, seed_pid: null, detail: /dev/nvidia0}
would_kill:
  description: In check mode, what would be signalled (same fields as RV(killed) without signal).
  returned: always
  type: list
  elements: dict
survivors:
  description: >-
    Targets still running after SIGKILL and O(kill_timeout), with their state (C(D) is stuck in
    the kernel, often the driver).
  returned: always
  type: list
  elements: dict
vanished:
  description:
    - Processes that exited during the reap without a signal of the reaper ending them (same
      fields as RV(killed), with C(signal) null) - targets gone before they were signalled, or
      that ignored SIGTERM and exited on their own during O(grace); and, with C(side_effect)
      true, non-targets tied to a target (its other descendants, its parent, its group and
      session, the spared matches) that exited meanwhile, for example a protected child that
      died with its parent. Not counted as a change.
  returned: always
  type: list
  elements: dict
spared:
  description: >-
    Processes that matched (a pattern, the device scan) but are not targets, with the reason:
    protected, outside O(pattern_scope) (another user's, no CUDA context), a terminal
    multiplexer, no CUDA context (an NVML client).
  returned: always
  type: list
  elements: dict
memory_before:
  description: Per GPU, before anything was signalled.
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: GPU index, type: int}
    uuid: {description: GPU UUID, type: str}
    used_mib: {description: Memory used, type: int}
    total_mib: {description: Memory total, type: int}
    processes: {description: Compute processes on it, type: int}
    process_memory:
      description: >-
        Per compute process, its pid as the driver reports it (a host pid) and its memory; null
        where the backend cannot list them
      type: list
      elements: dict
memory_after:
  description: Per GPU, at the end of the wait.
  returned: always
  type: list
  elements: dict
memory_clean:
  description: Every GPU back to the baseline, less RV(memory_excluded); null when there was no GPU to check.
  returned: always
  type: bool
memory_excluded:
  description: >-
    Per GPU of RV(memory_after), the memory of spared processes left out of the check, and why
    each is spared.
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: GPU index, type: int}
    uuid: {description: GPU UUID, type: str}
    excluded_mib: {description: Memory left out, type: int}
    processes:
      description: "The spared processes: pid, name, used_mib, reason"
      type: list
      elements: dict
memory_source:
  description: nvml, nvidia-smi or none.
  returned: always
  type: str
memory_note:
  description: >-
    Why memory was not checked, when it was not; or what the check could not leave out (no
    per-process memory from the backend, GPU processes that are not local processes, as inside a
    container).
  returned: when there is something to say
  type: str
cgroups:
  description: The O(cgroups) entries, resolved, with their processes and whether C(cgroup.kill) was used.
  returned: always
  type: list
  elements: dict
container_cgroups:
  description: With O(container), the cgroup directories that define the container's processes.
  returned: always
  type: list
  elements: str
seconds:
  description: From the call to memory verified (or the timeout).
  returned: always
  type: float
phases:
  description: Seconds spent scanning, in the SIGTERM grace, in the SIGKILL wait and waiting for memory.
  returned: always
  type: dict
"""

import dataclasses

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import ReapOptions, reap
from ansible_collections.servelab.serving.plugins.module_utils.proc.cgroup import DEFAULT_CONTAINER_CGROUP_GLOBS
from ansible_collections.servelab.serving.plugins.module_utils.proc.select import DEFAULT_PATTERNS


def _lines(reports) -> str:
    return "".join("%d %s\n" % (r.pid, r.cmdline or "[%s]" % r.name) for r in reports)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            device_glob=dict(type="str", default="/dev/nvidia*"),
            compute_device_glob=dict(type="str", default="/dev/nvidia-uvm"),
            patterns=dict(type="list", elements="str"),
            pattern_scope=dict(type="str", default="own_gpu", choices=["own_gpu", "own", "any"]),
            protect=dict(type="list", elements="str", default=[]),
            protect_pids=dict(type="list", elements="int", default=[]),
            grace=dict(type="float", default=10.0),
            kill_timeout=dict(type="float", default=10.0),
            cgroups=dict(type="list", elements="str", default=[]),
            container=dict(type="str"),
            container_cgroup_globs=dict(type="list", elements="str",
                                        default=list(DEFAULT_CONTAINER_CGROUP_GLOBS)),
            scan_maps=dict(type="bool", default=True),
            wait_memory=dict(type="bool", default=True),
            memory_baseline_mib=dict(type="raw"),
            memory_threshold_mib=dict(type="int", default=512),
            memory_timeout=dict(type="float", default=60.0),
            poll_interval=dict(type="float", default=0.25),
            gpus=dict(type="list", elements="str", default=[]),
            gpu_backend=dict(type="str", default="auto",
                             choices=["auto", "nvml", "nvidia-smi", "none"]),
            nvidia_smi=dict(type="str", default="nvidia-smi"),
            require_clean=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    opts = ReapOptions(
        device_glob=p["device_glob"], compute_device_glob=p["compute_device_glob"],
        patterns=DEFAULT_PATTERNS if p["patterns"] is None else p["patterns"],
        pattern_scope=p["pattern_scope"],
        protect=p["protect"], protect_pids=p["protect_pids"], grace=p["grace"],
        kill_timeout=p["kill_timeout"], cgroups=p["cgroups"], container=p["container"],
        container_cgroup_globs=p["container_cgroup_globs"], scan_maps=p["scan_maps"],
        wait_memory=p["wait_memory"], memory_baseline_mib=p["memory_baseline_mib"],
        memory_threshold_mib=p["memory_threshold_mib"], memory_timeout=p["memory_timeout"],
        poll_interval=p["poll_interval"], gpus=p["gpus"], gpu_backend=p["gpu_backend"],
        nvidia_smi=p["nvidia_smi"], check_mode=module.check_mode,
    )
    try:
        result = reap(opts)
    except ValueError as exc:          # ReapInputError, or a bad regex in patterns/protect
        module.fail_json(msg=str(exc))

    out = dataclasses.asdict(result)
    if module._diff:
        before = result.would_kill if module.check_mode else result.killed + result.survivors
        out["diff"] = {"before": _lines(before), "after": _lines(result.survivors),
                       "before_header": "GPU processes (targets)", "after_header": "still running"}
    problems = []
    if result.survivors:
        problems.append("%d target(s) survived SIGKILL: %s" % (
            len(result.survivors), ", ".join("%d (%s, state %s)" % (r.pid, r.name, r.state)
                                             for r in result.survivors)))
    if result.memory_clean is False and not module.check_mode:
        excluded = {e.index: e for e in result.memory_excluded}

        def gpu_line(g) -> str:
            e = excluded.get(g.index)
            if not (e and e.processes):
                return "GPU%d %d MiB/%s procs" % (g.index, g.used_mib, g.processes)
            return "GPU%d %d MiB/%s procs (%d MiB of %d spared process(es) left out)" % (
                g.index, g.used_mib, g.processes, e.excluded_mib, len(e.processes))
        problems.append("GPU memory not back to baseline after %.1f s: %s (threshold %d MiB%s%s)"
                        % (opts.memory_timeout, ", ".join(gpu_line(g) for g in result.memory_after),
                           opts.memory_threshold_mib,
                           "" if opts.memory_baseline_mib is not None else
                           "; give memory_baseline_mib if protected work keeps memory",
                           "; " + result.memory_note if result.memory_note else ""))
    if problems and p["require_clean"]:
        module.fail_json(msg="; ".join(problems), **out)
    if problems:
        module.warn("; ".join(problems))
    module.exit_json(**out)


if __name__ == "__main__":
    main()
