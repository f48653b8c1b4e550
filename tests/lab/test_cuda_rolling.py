"""upgrade-cuda.yml rolling over a fleet in the lab: containers 129 and 130 (added from the same cached
root filesystem, Lab.add_container) and a third gpu_servers host that nothing answers for. 130 gets the
repository whose 13.0.1 nvcc cannot start. With the defaults (one host at a time, stop at the first
failure) 129 is upgraded and verified, 130 fails and is rolled back, the rollout stops there and the
third host is never contacted. A second rolling run over the converged hosts changes nothing, and
two at a time the broken host's failure does not cut its batch mate off.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from cudastack import (ROLLOUT_STOP, UPGRADE, VENV, Repos, build_repos, ct, failure_messages, field_state,
                       installed, reset_container, selected)

pytestmark = pytest.mark.lab

SECOND = 130
FIRST_HOST, SECOND_HOST = "ct129", "ct%d" % SECOND
# A gpu_servers host after the broken one: if the rollout went on, Ansible would try to reach it.
AFTER_HOST = "ct-after-the-broken-one"
STACK_PLAY = "CUDA toolkit and SGLang stack in the GPU containers"


@dataclasses.dataclass
class Fleet:
    repos: Repos
    inventory: Path
    add_seconds: float


def task_events(run) -> list:
    """(host, task, event) of every task result of the run, in the order they happened."""
    events = []
    for path in (run.artifacts / "job_events").glob("*.json"):
        event = json.loads(path.read_text())
        data = event.get("event_data", {})
        if event.get("event", "").startswith("runner_on_") and data.get("host"):
            events.append((event["counter"], data["host"], data.get("task", ""), data.get("play", ""), event["event"]))
    return [item[1:] for item in sorted(events)]


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cuda-rolling")
    repos = build_repos(lab, tmp)
    lab.set_fake_driver(lab.config.driver_version)
    lab.reset_pve_config()
    if "running" not in lab.pct("status", str(lab.config.vmid)).stdout:
        lab.pct("start", str(lab.config.vmid))
    add_seconds = lab.add_container(SECOND)
    unused = lab.controller_address.rsplit(".", 1)[0] + ".254"
    inventory = lab.fleet_inventory(
        tmp / "inventory", [lab.config.vmid, SECOND],
        # Inventory variables, not extra vars: those would override 130's own repository.
        group_vars=repos.role_vars(lab),
        host_vars={SECOND_HOST: {"cuda_toolkit_repo_url": repos.broken,
                                 "cuda_toolkit_repo_key_url": repos.broken + repos.key_name}},
        extra_gpu_servers={AFTER_HOST: {"ansible_host": unused, "ansible_connection": "ssh",
                                        "ansible_ssh_common_args": "-o ConnectTimeout=3"}})
    try:
        yield Fleet(repos=repos, inventory=inventory, add_seconds=add_seconds)
    finally:
        lab.remove_container(SECOND)
        # Leave container 129 as the lab made it, for the other lab tests.
        reset_container(lab)
        lab.reset_pve_config()
        lab.pct("reboot", str(lab.config.vmid))


@pytest.fixture(scope="module")
def rollout(lab, fleet):
    """The field's 12.8 on both containers, then one rolling upgrade-cuda.yml with the defaults."""
    field_state(lab, fleet.repos.cuda, pypi=fleet.repos.pypi)
    field_state(lab, fleet.repos.broken, venv_cuda=None, vmid=SECOND)
    assert selected(lab) == selected(lab, SECOND) == "/usr/local/cuda-12.8"
    started = time.monotonic()
    run = lab.run_playbook(UPGRADE, inventory=fleet.inventory)
    print("[rolling] container %d added in %.1f s; rolling upgrade-cuda.yml over the fleet took %.0f s"
          % (SECOND, fleet.add_seconds, time.monotonic() - started))
    return run


def test_rollout_stops_at_the_broken_host_with_the_first_upgraded_and_verified(lab, fleet, rollout):
    run = rollout
    assert run.rc != 0
    # The first batch: upgraded, verified, nothing failed.
    assert run.failed(FIRST_HOST) == 0 and run.changed(FIRST_HOST) > 0, run.failure_text()
    assert selected(lab) == "/usr/local/cuda-13.0"
    assert installed(lab)["cuda-toolkit-13-0"] == "13.0.1-1"
    assert "release 13.0, V13.0.88" in ct(lab, "/usr/local/cuda/bin/nvcc --version").stdout
    sglang_fact = json.loads(ct(lab, "cat /etc/ansible/facts.d/servelab_sglang.fact").stdout)
    assert sglang_fact["torch_cuda"] == "13.0"
    assert "cu130" in ct(lab, "%s/bin/pip freeze --disable-pip-version-check | grep ^torch==" % VENV).stdout
    suite = lab.run_testinfra("gpu_servers", "tests/host/test_gpu_stack.py")   # lab.inventory_path: ct129
    assert suite.returncode == 0, suite.stdout[-3000:]

    # The second batch: 130's 13.0.1 failed, was rolled back to 12.8, and stopped the rollout.
    message = failure_messages(run)
    assert "CUDA 13.0.1 on %s failed, so the previous toolkit was put back" % SECOND_HOST in message, message
    assert "The host is as it was before this run." in message
    assert selected(lab, SECOND) == "/usr/local/cuda-12.8"
    assert installed(lab, SECOND) == {"cuda-keyring": "1.1-1", "cuda-toolkit-12-8": "12.8.1-1"}
    assert [(f.host, f.task) for f in run.failures][-1] == (SECOND_HOST, ROLLOUT_STOP), run.failure_text()
    assert {f.host for f in run.failures} == {SECOND_HOST}

    # One host at a time: 130 started after 129 was done; the third host was never contacted.
    stack = [(host, task) for host, task, play, _event in task_events(run) if play == STACK_PLAY]
    hosts_in_order = [host for host, _task in stack]
    assert hosts_in_order and AFTER_HOST not in hosts_in_order
    last_first = max(i for i, host in enumerate(hosts_in_order) if host == FIRST_HOST)
    first_second = hosts_in_order.index(SECOND_HOST)
    assert last_first < first_second, stack
    assert all(AFTER_HOST not in counts for counts in run.stats.values()), run.stats


def test_a_second_rolling_run_over_the_converged_hosts_changes_nothing(lab, fleet, rollout):
    assert rollout.failed(FIRST_HOST) == 0, "the rollout itself failed on the first host"
    run = lab.run_playbook(UPGRADE, inventory=fleet.inventory, limit="pve1,%s" % FIRST_HOST)
    assert run.rc == 0, run.failure_text()
    assert run.changed() == 0, "second run changed something:\n" + run.stdout[-5000:]


def test_two_at_a_time_the_broken_host_does_not_cut_its_batch_mate_off(lab, fleet, rollout):
    """gpu_stack_serial 2: 129 (converged) and 130 (broken again) in one batch. 130's failure is held
    to the batch's end, so 129 runs every task of the play (Ansible would otherwise end the play at
    130's failed task); 129 changes nothing; the rollout stops after the batch, the third host untouched."""
    assert rollout.failed(FIRST_HOST) == 0, "the rollout itself failed on the first host"
    run = lab.run_playbook(UPGRADE, inventory=fleet.inventory, extravars={"gpu_stack_serial": 2})
    assert run.rc != 0
    assert run.changed(FIRST_HOST) == 0 and run.failed(FIRST_HOST) == 0, run.failure_text()
    assert "CUDA 13.0.1 on %s failed, so the previous toolkit was put back" % SECOND_HOST in failure_messages(run)
    assert selected(lab, SECOND) == "/usr/local/cuda-12.8" and selected(lab) == "/usr/local/cuda-13.0"
    events = [(host, task) for host, task, play, _event in task_events(run) if play == STACK_PLAY]
    # 129 reached the play's last task (skipped there; 130 failed at it): it was not cut off.
    first_tasks = [task for host, task in events if host == FIRST_HOST]
    assert first_tasks[-1] == ROLLOUT_STOP and "servelab: CUDA stack before -> after" in first_tasks, first_tasks
    assert (SECOND_HOST, ROLLOUT_STOP) in events
    assert AFTER_HOST not in {host for host, _task in events}


def test_100_percent_at_one_host_at_a_time_still_stops_at_the_broken_host(lab, fleet, rollout):
    """gpu_stack_max_fail_percentage 100 with the default serial 1: 130 (broken) is a whole failed batch,
    and Ansible ends the play after a batch in which every host failed, whatever max_fail_percentage says
    (ansible-core playbook_executor.py), so the third host is never contacted. The check play says so."""
    assert rollout.failed(FIRST_HOST) == 0, "the rollout itself failed on the first host"
    run = lab.run_playbook(UPGRADE, inventory=fleet.inventory, extravars={"gpu_stack_max_fail_percentage": 100})
    assert run.rc != 0
    assert "always when every host of a batch failed" in run.stdout and "at 1 host at a time" in run.stdout
    assert "CUDA 13.0.1 on %s failed, so the previous toolkit was put back" % SECOND_HOST in failure_messages(run)
    events = [(host, task) for host, task, play, _event in task_events(run) if play == STACK_PLAY]
    assert (SECOND_HOST, ROLLOUT_STOP) in events
    assert AFTER_HOST not in {host for host, _task in events}, "100% at serial 1 does not go on past a failed batch"
