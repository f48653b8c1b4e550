"""upgrade-cuda.yml under the faults of issue 29, in the lab: each test injects one (a typo, a version
the repository lacks, a rollback killed half-way, ...) into the field's 12.8 container and checks
that the run stops before any change or leaves a working toolkit selected, and that the message
says what the host is left with. docs/upgrade-cuda-faults.md is the operator's side of it."""
from __future__ import annotations

import pytest

from cudastack import (CT, ROLLOUT_STOP, STACK, UPGRADE, Repos, build_repos, failure_messages, field_state,
                       reset_container, selected, snapshot)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def repos(lab, tmp_path_factory) -> Repos:
    """The repositories of test_cuda_upgrade.py; container 129 with its GPUs (playbooks/proxmox.yml)."""
    built = build_repos(lab, tmp_path_factory.mktemp("cuda-faults"))
    lab.set_fake_driver(lab.config.driver_version)
    lab.reset_pve_config()
    if "running" not in lab.pct("status", str(lab.config.vmid)).stdout:
        lab.pct("start", str(lab.config.vmid))
    passthrough = lab.run_playbook("playbooks/proxmox.yml")
    assert passthrough.rc == 0, passthrough.failure_text() or passthrough.stdout[-3000:]
    try:
        yield built
    finally:
        lab.set_fake_driver(lab.config.driver_version)
        reset_container(lab)
        lab.reset_pve_config()
        lab.pct("reboot", str(lab.config.vmid))


def test_a_misspelled_role_variable_stops_before_any_host_is_touched(lab, repos):
    """Fault 4: `cuda_toolkit_verison` ran the default 13.0.1 with rc 0."""
    field_state(lab, repos.cuda, venv_cuda=None)
    before, pve_before = snapshot(lab), lab.pve_config_path().read_text()
    run = lab.run_playbook(UPGRADE, extravars=repos.role_vars(lab, cuda_toolkit_verison="13.0.0"))
    assert run.rc != 0
    assert [(f.host, f.task) for f in run.failures] == [("localhost", "Refuse unknown role variables on every host")], \
        run.failure_text()
    message = failure_messages(run)
    assert "cuda_toolkit_verison: unknown variable; did you mean cuda_toolkit_version?" in message, message
    assert "[pve1, %s]" % CT in message and "Nothing was changed" in message
    assert "PLAY [Proxmox" not in run.stdout and "Configure GPU passthrough" not in run.stdout
    assert snapshot(lab) == before and lab.pve_config_path().read_text() == pve_before

    # gpu_stack.yml run alone refuses it too, on the container, before its first task.
    alone = lab.run_playbook(STACK, extravars=repos.role_vars(lab, sglang_torch_verison="2.14.1"))
    assert alone.rc != 0
    assert [(f.host, f.task) for f in alone.failures] == [(CT, "Refuse unknown role variables")], alone.failure_text()
    assert "sglang_torch_verison: unknown variable; did you mean sglang_torch_version?" in failure_messages(alone)
    assert snapshot(lab) == before


def test_a_version_the_repository_lacks_stops_in_preflight_with_apts_answer(lab, repos):
    """Fault 6: 13.0.9 was refused only after the apt source and key were rewritten, as "non-zero return code"."""
    field_state(lab, repos.cuda, venv_cuda=None)
    before = snapshot(lab)
    sources = lab.pct_exec(lab.config.vmid, "ls", "/etc/apt/sources.list.d").stdout
    run = lab.run_playbook(UPGRADE, extravars=repos.role_vars(lab, cuda_toolkit_version="13.0.9"))
    assert run.rc != 0
    assert [(f.host, f.task) for f in run.failures] == [
        (CT, "Check that the repository has cuda-toolkit-13-0=13.0.9-1"), (CT, ROLLOUT_STOP)], run.failure_text()
    message = run.failures[0].msg
    assert ("cuda-toolkit-13-0 13.0.9-1 (cuda_toolkit_version 13.0.9, cuda_toolkit_package_revision 1) is not in %s: "
            "apt finds 13.0.1-1, 13.0.0-1." % repos.cuda) in message, message
    assert "Nothing was changed (the host's apt sources and key are as they were)" in message
    assert "non-zero return code" not in message
    assert "Add NVIDIA's CUDA repository" not in run.stdout and "Remove the sources this role" not in run.stdout
    assert lab.pct_exec(lab.config.vmid, "ls", "/etc/apt/sources.list.d").stdout == sources
    assert snapshot(lab) == before
    assert selected(lab) == "/usr/local/cuda-12.8"


def test_an_unreadable_repository_stops_in_preflight_with_apts_reason(lab, repos):
    field_state(lab, repos.cuda, venv_cuda=None)
    before = snapshot(lab)
    gone = repos.cuda + "no-such-dir/"
    run = lab.run_playbook(STACK, extravars=repos.role_vars(lab, cuda_toolkit_repo_url=gone,
                                                            cuda_toolkit_repo_key_url=repos.cuda + repos.key_name))
    assert run.rc != 0
    message = run.failures[0].msg
    assert "%s could not be read from %s: " % (gone, CT) in message, message
    assert "404" in message and "Nothing was changed" in message
    assert snapshot(lab) == before
