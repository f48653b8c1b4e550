"""upgrade-cuda.yml under the faults of issue 29, in the lab: each test injects one (a typo, a version
the repository lacks, a rollback killed half-way, ...) into the field's 12.8 container and checks
that the run stops before any change or leaves a working toolkit selected, and that the message
says what the host is left with. docs/upgrade-cuda-faults.md is the operator's side of it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudastack import (CT, ROLLOUT_STOP, STACK, SYSTEMD_ENV, UPGRADE, Repos, build_repos, ct, failure_messages,
                       field_state, installed, reset_container, selected, snapshot)

REPO = Path(__file__).resolve().parents[2]

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


# An apt hook in the container that holds the rollback's `apt-get ... remove` before dpkg starts (the
# moment the controller is killed), recording apt-get's PID; ordinary installs pass through.
PAUSE_HOOK, PAUSE_SCRIPT = "/etc/apt/apt.conf.d/99servelab-lab-pause", "/etc/apt/servelab-lab-pause.sh"
PAUSE_FLAG, PAUSED = "/run/servelab-lab-pause", "/run/servelab-lab-paused"
HOOK_TEXT = 'DPkg::Pre-Invoke { "/bin/sh %s $PPID"; };\n' % PAUSE_SCRIPT
# $1: apt-get's PID (the hook's shell is its child). Its command line is NUL-separated.
SCRIPT_TEXT = """#!/bin/sh
[ -e %(flag)s ] || exit 0
grep -qa remove /proc/$1/cmdline || exit 0
echo $1 > %(paused)s
while [ -e %(flag)s ]; do sleep 0.2; done
""" % {"flag": PAUSE_FLAG, "paused": PAUSED}
STATE_FILE = "/var/lib/servelab/cuda_toolkit-rollback.json"


def _start_playbook(lab, tmp_path, playbook, extravars):
    """ansible-playbook as its own process group (run_playbook waits; this one is to be killed)."""
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps(extravars))
    log = open(tmp_path / "play.log", "w")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(lab.inventory_path),
                             "-e", "@%s" % extra, str(REPO / playbook)], cwd=REPO, env=lab.ansible_env(),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, log


def _wait_for(lab, path, proc, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = ct(lab, "cat %s 2>/dev/null || true" % path).stdout.strip()
        if out:
            return out
        if proc.poll() is not None:
            raise AssertionError("the playbook ended (rc %s) before %s appeared" % (proc.returncode, path))
        time.sleep(2)
    raise AssertionError("%s did not appear within %d s" % (path, timeout))


def test_a_rollback_killed_before_its_package_step_leaves_12_8_and_the_rerun_finishes_it(lab, repos, tmp_path):
    """Fault 1: the rollback removed 13.0 before switching /usr/local/cuda back; killed in between, the
    next run took the broken 13.0 as "before" and said "The host is as it was before this run"."""
    field_state(lab, repos.broken, venv_cuda=None)
    before = installed(lab)
    lab.ct_path(PAUSE_SCRIPT).write_text(SCRIPT_TEXT)
    lab.ct_path(PAUSE_HOOK).write_text(HOOK_TEXT)
    ct(lab, "touch %s; rm -f %s" % (PAUSE_FLAG, PAUSED))
    proc, log = _start_playbook(lab, tmp_path, STACK, repos.role_vars(lab, repos.broken))
    try:
        apt_pid = int(_wait_for(lab, PAUSED, proc))
        # The controller dies mid-rollback, and the package work it started dies with the host's
        # apt (as after a crash): nothing of the rollback's package step ran.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        ct(lab, "kill -9 %d 2>/dev/null; rm -f %s" % (apt_pid, PAUSE_FLAG))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
        log.close()
        ct(lab, "rm -f %s %s %s %s" % (PAUSE_FLAG, PAUSED, PAUSE_HOOK, PAUSE_SCRIPT))
    # Every prefix of the rollback leaves a working toolkit selected: 12.8 is back already.
    assert selected(lab) == "/usr/local/cuda-12.8"
    assert "release 12.8" in ct(lab, "/usr/local/cuda/bin/nvcc --version").stdout
    assert ct(lab, "test -e %s && echo present || echo absent" % SYSTEMD_ENV).stdout.strip() == "absent"
    assert installed(lab)["cuda-toolkit-13-0"] == "13.0.1-1", "the kill came before the package step"
    state = json.loads(ct(lab, "cat %s" % STATE_FILE).stdout)
    assert state["selected_path"] == "/usr/local/cuda-12.8" and state["package_version"] == ""

    # The rerun rolls back to the state recorded before the first change, not to the half-restored host.
    run = lab.run_playbook(STACK, extravars=repos.role_vars(lab, repos.broken))
    assert run.rc != 0
    message = failure_messages(run)
    assert "/usr/local/cuda -> /usr/local/cuda-12.8 (nvcc release 12.8, as before)" in message, message
    assert "cuda-toolkit-13-0 removed (it was not installed before)" in message
    assert "The host is as it was before the interrupted run of %s." % state["recorded"] in message
    assert selected(lab) == "/usr/local/cuda-12.8"
    assert installed(lab) == before
    assert ct(lab, "test -e %s && echo present || echo absent" % STATE_FILE).stdout.strip() == "absent"

    # And with a good repository the host converges; the state file is gone with it.
    good = lab.run_playbook(STACK, extravars=repos.role_vars(lab), skip_tags="sglang")
    assert good.rc == 0, good.failure_text()
    assert selected(lab) == "/usr/local/cuda-13.0"
    assert ct(lab, "test -e %s && echo present || echo absent" % STATE_FILE).stdout.strip() == "absent"


def test_check_mode_on_the_field_host_with_its_venv_changes_nothing_and_passes(lab, repos):
    """Fault 5: --check on an unconverged host with a venv returned rc 2, verify failing on the cu128 torch
    that a real run replaces (the lab's check-mode test had no venv)."""
    field_state(lab, repos.cuda, pypi=repos.pypi)
    # As on a host an earlier run touched: role sglang's apt packages are there, so its check mode reaches pip.
    ct(lab, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-packaging >/dev/null")
    before = snapshot(lab)
    run = lab.run_playbook(UPGRADE, extravars=repos.role_vars(lab), check=True)
    assert run.rc == 0, run.failure_text() or run.stdout[-4000:]
    assert run.changed(CT) > 0, "check mode should report what it would change"
    assert "pip would change the venv" in run.stdout
    assert snapshot(lab) == before
