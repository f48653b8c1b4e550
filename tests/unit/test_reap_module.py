"""gpu_reap run by ansible-playbook against localhost: check mode, changed, unchanged, bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_reap_helpers import (  # noqa: E402
    alive, repo_root, run_playbook, task_results, task_results_for,
)


PLAY = """
- hosts: localhost
  gather_facts: false
  vars:
    reap_args: &reap
      device_glob: "{glob}"
      compute_device_glob: "{uvm}"
      patterns: ["{token}-detok"]
      pattern_scope: own
      grace: 5
      gpu_backend: none
  tasks:
    - name: plan by default
      servelab.serving.gpu_reap:
        device_glob: "{glob}"
        compute_device_glob: "{uvm}"
        patterns: ["{token}-detok"]
        gpu_backend: none
      check_mode: true
    - name: plan
      servelab.serving.gpu_reap: *reap
      check_mode: true
      diff: true
      register: plan
    - name: reap
      servelab.serving.gpu_reap: *reap
      diff: true
    - name: again
      servelab.serving.gpu_reap: *reap
    - name: bad regex
      servelab.serving.gpu_reap:
        patterns: ["("]
        device_glob: "{glob}"
      ignore_errors: true
    - name: bad baseline
      servelab.serving.gpu_reap:
        device_glob: "{glob}"
        patterns: []
        memory_baseline_mib: plenty
      ignore_errors: true
    - name: bad scope
      servelab.serving.gpu_reap:
        device_glob: "{glob}"
        pattern_scope: everyone
      ignore_errors: true
"""


def test_gpu_reap_through_ansible(sp, tmp_path):
    worker = sp.start("worker", "--hold", sp.dev("nvidia0"), "--map-only", sp.dev("nvidia-uvm"))
    detok = sp.start("detok")
    decoy = sp.start("decoy")
    monitor = sp.start("monitor", "--hold", sp.dev("nvidiactl"),      # NVML-like: files open,
                       "--hold", sp.dev("nvidia-uvm"))                # nothing mapped
    out = run_playbook(PLAY.format(glob=sp.device_glob, uvm=sp.compute_glob, token=sp.token),
                       tmp_path)
    res = task_results(out)

    # pattern_scope own_gpu (default): the CPU-only detokenizer is only a name
    default = res["plan by default"]
    assert {p["pid"] for p in default["would_kill"]} == {worker["pid"]}
    assert "holds no CUDA context" in {s["pid"]: s["reason"]
                                       for s in default["spared"]}[detok["pid"]]

    plan = res["plan"]
    assert plan["changed"] is False and plan["killed"] == []
    assert {p["pid"] for p in plan["would_kill"]} == {worker["pid"], detok["pid"]}
    assert "%d " % worker["pid"] in plan["diff"]["before"]

    reap = res["reap"]
    assert reap["changed"] is True, reap
    killed = {p["pid"]: p for p in reap["killed"]}
    assert set(killed) == {worker["pid"], detok["pid"]}
    assert killed[worker["pid"]]["found_by"] == "device_fd"
    assert killed[detok["pid"]]["found_by"] == "pattern"
    assert killed[detok["pid"]]["signal"] == "SIGTERM"
    assert reap["diff"]["after"] == ""
    assert not alive(worker["pid"]) and not alive(detok["pid"])
    assert alive(decoy["pid"]), "the decoy was killed"
    assert alive(monitor["pid"]), "a device holder without CUDA context was killed"

    again = res["again"]
    assert again["changed"] is False and again["killed"] == [] and "failed" not in again

    assert res["bad regex"]["failed"] is True
    assert "patterns: '(' is not a valid regular expression" in res["bad regex"]["msg"]
    assert res["bad baseline"]["failed"] is True
    assert "memory_baseline_mib:" in res["bad baseline"]["msg"]
    assert res["bad scope"]["failed"] is True
    assert "pattern_scope" in res["bad scope"]["msg"] and "own_gpu" in res["bad scope"]["msg"]

    stats = out["stats"]["localhost"]
    assert stats["changed"] == 1 and stats["failures"] == 0 and stats["ignored"] == 3


INVENTORY = """
all:
  children:
    gpu_servers:
      hosts:
        ct129:
          ansible_connection: local
          ansible_python_interpreter: {python}
          proxmox_vmid: 129
          proxmox_host: pve1
    proxmox_hosts:
      hosts:
        pve1:
          ansible_connection: local
          ansible_python_interpreter: {python}
"""


def test_proxmox_host_example_play(sp, tmp_path):
    """playbooks/reap-from-proxmox-host.yml with both hosts played by localhost and container
    129's cgroup standing in as a directory: its servelab server cgroup (as llm_server makes it
    inside the container) lists one process, which matches the pattern. Only that one is
    reaped, and it is reported with its pid inside the container. The other matches are
    outside the container."""
    inside = sp.start("inside", "--hold", sp.dev("nvidia0"))
    outside = sp.start("outside", "--hold", sp.dev("nvidia0"))
    cg = tmp_path / "cg" / "lxc" / "129" / "ns"
    server_cg = cg / "servelab" / "servelab-a-1234"
    server_cg.mkdir(parents=True)
    (cg / "cgroup.procs").write_text("")
    (server_cg / "cgroup.procs").write_text("%d\n" % inside["pid"])
    inv = tmp_path / "hosts.yml"
    inv.write_text(INVENTORY.format(python=sys.executable))
    extra = json.dumps({"reap_patterns": [sp.token], "reap_gpu_backend": "none",
                        "reap_container_cgroup_globs": [str(tmp_path / "cg" / "lxc" / "{vmid}")]})
    root = repo_root()
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(root, "ansible.cfg"),
               ANSIBLE_STDOUT_CALLBACK="json",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", str(inv),
           "-e", extra, os.path.join(root, "playbooks", "reap-from-proxmox-host.yml")]
    for check in (True, False):
        proc = subprocess.run(cmd + (["--check"] if check else []), cwd=root, env=env,
                              capture_output=True, text=True, timeout=300, check=False)
        out = json.loads(proc.stdout[proc.stdout.index("{"):])
        res = task_results_for(out, "ct129")
        reap = res["Reap from the host"]
        assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:])
        listed = reap["would_kill"] if check else reap["killed"]
        assert [(k["pid"], k["container_pid"]) for k in listed] == [(inside["pid"], inside["pid"])]
        report = res["Report what was killed (host PID / container PID) and the memory"]
        assert report["msg"]["killed"] == ["%d/%d" % (inside["pid"], inside["pid"])]
        assert alive(inside["pid"]) is check
        assert alive(outside["pid"]), "a process outside the container's cgroup was killed"


def test_every_result_field_of_gpu_reap_is_documented():
    # What the module returns (ReapResult), against RETURN: ansible-test's validate-modules checks
    # the documentation against the argument spec, not against the results.
    import dataclasses

    import yaml

    from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import ReapResult
    from ansible_collections.servelab.serving.plugins.modules import gpu_reap
    ret = yaml.safe_load(gpu_reap.RETURN)
    fields = {f.name for f in dataclasses.fields(ReapResult)} - {"changed"}
    assert fields <= set(ret), "undocumented in RETURN: %s" % sorted(fields - set(ret))
