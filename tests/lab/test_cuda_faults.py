"""upgrade-cuda.yml under the faults of issue 29, in the lab: each test injects one (a typo, a version
the repository lacks, a rollback killed half-way, ...) into the field's 12.8 container and checks
that the run stops before any change or leaves a working toolkit selected, and that the message
says what the host is left with. docs/upgrade-cuda-faults.md is the operator's side of it."""
from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from cudastack import (CT, FIELD_CUDA, ROLLOUT_STOP, STACK, SYSTEMD_ENV, UPGRADE, VENV, VERSIONS, Repos, build_repos, ct,
                       failure_messages, field_state, installed, reset_container, selected, snapshot)
from faultkit import (AlternativesPause, HoldingIndex, alive, kill_playbook, processes, start_playbook, wait_for)

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
    proc, log = start_playbook(lab, tmp_path, STACK, repos.role_vars(lab, repos.broken))
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


# ----- Fault 2: a failure after the toolkit step rolls the whole stack back ---------------------------------------
SGLANG_STATE = "/var/lib/servelab/sglang-rollback.json"
VENVS = "/opt/sglang/venvs"
MARKER = VENV + "/servelab-lab-field-venv"


def _exists(lab, path) -> bool:
    return ct(lab, "test -e %s && echo present || echo absent" % path).stdout.strip() == "present"


def _venv(lab) -> dict:
    """What /opt/sglang/venv is: kind, where it leads, its inode, the torch it runs and whether the field marker is there."""
    out = ct(lab, "if [ -L %(v)s ]; then echo link $(readlink %(v)s); elif [ -d %(v)s ]; then echo dir -; else echo absent -; fi\n"
                  "stat -L -c %%i %(v)s 2>/dev/null || echo -\n"
                  "%(v)s/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || echo -\n"
                  "test -e %(m)s && echo marked || echo unmarked\n"
                  "ls -A %(d)s 2>/dev/null | tr '\\n' ' '; echo\n" % {"v": VENV, "m": MARKER, "d": VENVS}).stdout
    lines = out.split("\n")
    kind, link = lines[0].split(" ", 1)
    return {"kind": kind, "link": None if link == "-" else link, "inode": lines[1], "torch": lines[2],
            "marked": lines[3] == "marked", "venvs": lines[4].split()}


def _field_host_with_a_marked_venv(lab, repos) -> dict:
    """The field's 12.8 host (cuda-toolkit-12-8, a real venv directory of cu128 torch) with a file in the venv
    that tells this very directory from a copy. Returns its _venv()."""
    field_state(lab, repos.cuda, pypi=repos.pypi)
    ct(lab, "touch %s" % MARKER)
    venv = _venv(lab)
    assert (venv["kind"], venv["torch"], venv["marked"]) == ("dir", "%s+cu128" % VERSIONS.torch, True), venv
    return venv


def _as_the_field_host_was(lab, venv_before, packages_before) -> None:
    """12.8 selected and working, the very venv directory of before, nothing of 13.0 left, dpkg clean."""
    assert selected(lab) == "/usr/local/cuda-12.8"
    assert "release 12.8" in ct(lab, "/usr/local/cuda/bin/nvcc --version").stdout
    assert installed(lab) == packages_before
    venv = _venv(lab)
    assert venv == dict(venv_before, venvs=[]), "the venv is not the one of before: %s" % venv
    for path in (SYSTEMD_ENV, STATE_FILE, SGLANG_STATE, "/etc/ansible/facts.d/servelab_sglang.fact",
                 "/etc/ansible/facts.d/servelab_cuda.fact"):
        assert not _exists(lab, path), path
    assert ct(lab, "dpkg --audit").stdout.strip() == ""


def test_a_stack_verify_failing_after_the_venv_switch_puts_venv_and_toolkit_back(lab, repos):
    """Fault 2, a failed verify after role sglang switched the venv: before, the rescue only recorded the task and
    13.0 stayed selected. A bad variable (sglang_cuda_version 12.8 with the 13.0 toolkit) builds a cu128 venv beside
    the field's, which passes role sglang's own verify and is switched to; the stack's verify refuses torch 12.8 with
    toolkit 13.0, and the rollback puts the field's venv directory back (the same inode), then the toolkit."""
    venv_before = _field_host_with_a_marked_venv(lab, repos)
    # The field venv lacks a pin (as one an operator changed by hand): the role builds a new one beside it.
    ct(lab, "%s/bin/pip uninstall -q -y flashinfer-jit-cache" % VENV)
    venv_before = _venv(lab)
    packages_before = installed(lab)
    run = lab.run_playbook(STACK, extravars=repos.role_vars(
        lab, sglang_cuda_version=FIELD_CUDA, sglang_torch_index_url=repos.pypi + "torch/cu128/",
        sglang_kernel_index_url=repos.pypi + "kernel/cu128/", sglang_flashinfer_index_url=repos.pypi + "flashinfer/cu128/"))
    assert run.rc != 0
    assert "Serve from the venv built beside it" in run.stdout, "the venv was to be switched before the stack's verify"
    message = failure_messages(run)
    assert "torch in the venv is built for CUDA 12.8, the toolkit is CUDA 13.0" in message, message
    built = re.search(r"the venv built beside it removed \((%s/sglang-%s-cu128-[0-9a-f]{10})\)"
                      % (VENVS, re.escape(VERSIONS.sglang)), message)
    assert built, message
    assert ("the SGLang venv %s put back: the venv directory (torch %s+cu128), as before" % (VENV, VERSIONS.torch)) \
        in message, message
    assert "/usr/local/cuda -> /usr/local/cuda-12.8 (nvcc release 12.8, as before)" in message
    assert "cuda-toolkit-13-0 removed (it was not installed before)" in message
    assert "The host is as it was before this run." in message
    _as_the_field_host_was(lab, venv_before, packages_before)
    assert "flashinfer-jit-cache" not in ct(lab, "%s/bin/pip freeze" % VENV).stdout, "the venv is as it was, pin missing"


def test_an_index_outage_and_a_killed_pip_leave_the_field_stack_and_the_rerun_converges(lab, repos, tmp_path):
    """Fault 2 with a pip index outage, and fault 3's pip left running by a killed controller. Before: 13.0 stayed
    selected with the venv's torch rebuilt in place half-way (pip into the venv in use), the drop-ins left, and a
    message implying a rollback. Now the new venv is built beside the one in use:
    1. the PyPI index hangs during the SGLang install and the controller is SIGKILLed there: pip goes on in the
       container, 13.0 is selected, the field's venv is untouched;
    2. a rerun finds that pip working on the venvs and refuses, naming it, before any change;
    3. the index fails (503): the orphan pip ends; a rerun during the outage fails in pip and rolls the stack back
       to the state the killed run recorded: 12.8, the field's venv directory, nothing of 13.0;
    4. with the index back, a rerun converges: 13.0, the venv a link to the new cu130 venv, the old one gone."""
    venv_before = _field_host_with_a_marked_venv(lab, repos)
    packages_before = installed(lab)
    index = HoldingIndex(lab, repos.pypi_dir)
    try:
        # pip waits on the index as long as it holds (its own timeout raised, so that it does not give up first).
        held = repos.role_vars(lab, sglang_pypi_index_url=index.url + "pypi/simple/", sglang_pip_extra_args="--timeout 900")
        index.hold()
        proc, log = start_playbook(lab, tmp_path, STACK, held)
        try:
            wait_for(index.held.is_set, "pip asking the PyPI index", proc)
            pips = wait_for(lambda: [p for p in processes(lab) if "/bin/pip install" in p[1] and VENVS in p[1]],
                            "pip running in the container", proc, timeout=60)
        finally:
            kill_playbook(proc, log)
        (pip_pid, pip_cmdline), = pips
        time.sleep(2)
        assert alive(lab, pip_pid), "the container's pip goes on after the controller died"
        # What the killed run left: 13.0 selected, the field's venv not touched, the states to roll back to.
        assert selected(lab) == "/usr/local/cuda-13.0"
        assert {k: v for k, v in _venv(lab).items() if k != "venvs"} == {k: v for k, v in venv_before.items() if k != "venvs"}
        cuda_state = json.loads(ct(lab, "cat %s" % STATE_FILE).stdout)
        sglang_state = json.loads(ct(lab, "cat %s" % SGLANG_STATE).stdout)
        assert cuda_state["selected_path"] == "/usr/local/cuda-12.8"
        assert sglang_state["venv"] == {"kind": "dir", "link": None, "parked": VENVS + "/previous"}, sglang_state

        # 2. The rerun while that pip still runs: named, waited for (3 s here), refused before any change.
        before = snapshot(lab)
        busy = lab.run_playbook(STACK, extravars=repos.role_vars(lab, sglang_lock_timeout=3))
        assert busy.rc != 0
        assert [(f.host, f.task) for f in busy.failures] == [(CT, "Check that no pip works on the venvs"),
                                                             (CT, ROLLOUT_STOP)], busy.failure_text()
        message = busy.failures[0].msg
        assert "apt, dpkg or pip is busy on the host after 3 s of waiting: PID %d (%s" % (pip_pid, pip_cmdline[:60]) \
            in message, message
        assert "holds pip on %s" % VENVS in message and "kill %d" % pip_pid in message
        assert "The venv servers run, %s, is the venv directory, as this run found it; this run changed nothing" % VENV \
            in message
        assert snapshot(lab) == before

        # 3. The outage: the orphan pip fails and ends; the rerun fails in pip and rolls the stack back.
        index.fail()
        wait_for(lambda: not alive(lab, pip_pid), "the orphan pip's end", timeout=180)
        down = lab.run_playbook(STACK, extravars=repos.role_vars(lab, sglang_pypi_index_url=index.url + "pypi/simple/"))
        assert down.rc != 0
        message = failure_messages(down)
        assert "Failed: Install SGLang and flashinfer-python from the PyPI index: " in message, message
        # pip's own words for an index that answers 503 to everything (it retries, then finds nothing).
        assert "No matching distribution found for sglang==%s" % VERSIONS.sglang in message
        assert re.search(r"the SGLang venv %s not touched: the venv directory \(torch %s\+cu128\), as before; the venv "
                         r"built beside it removed \(%s/sglang-%s-cu130-[0-9a-f]{10}\)"
                         % (VENV, re.escape(VERSIONS.torch), VENVS, re.escape(VERSIONS.sglang)), message), message
        assert "/usr/local/cuda -> /usr/local/cuda-12.8 (nvcc release 12.8, as before)" in message
        assert "The host is as it was before the interrupted run of %s." % cuda_state["recorded"] in message
        _as_the_field_host_was(lab, venv_before, packages_before)

        # 4. The index is back: the rerun converges.
        index.serve()
        good = lab.run_playbook(STACK, extravars=repos.role_vars(lab, sglang_pypi_index_url=index.url + "pypi/simple/"))
    finally:
        index.close()
    assert good.rc == 0, good.failure_text() or good.stdout[-4000:]
    assert selected(lab) == "/usr/local/cuda-13.0"
    venv = _venv(lab)
    assert venv["kind"] == "link" and venv["torch"] == "%s+cu130" % VERSIONS.torch and not venv["marked"], venv
    assert [VENVS + "/" + name for name in venv["venvs"]] == [venv["link"]], "the old venv is pruned once converged"
    assert not _exists(lab, STATE_FILE) and not _exists(lab, SGLANG_STATE)
    fact = json.loads(ct(lab, "cat /etc/ansible/facts.d/servelab_sglang.fact").stdout)
    assert (fact["venv"], fact["venv_dir"], fact["torch_cuda"]) == (VENV, venv["link"], "13.0")


# ----- Fault 3: apt and dpkg left running by a killed controller, then interrupted ---------------------------------
def test_a_killed_run_leaves_apt_and_dpkg_running_then_interrupted_and_the_reruns_name_then_repair_it(lab, repos, tmp_path):
    """Fault 3. Before: the preflight saw neither the apt-get and dpkg a killed controller leaves running in the
    container nor the interrupted dpkg a crash leaves, and the rerun failed in apt with "dpkg was interrupted, you
    must manually run 'dpkg --configure -a'". Now: the controller is killed while dpkg configures the toolkit; the
    rerun names the live apt-get and dpkg by PID and command line and refuses before any change; after they die
    (the container's crash) the rerun refuses naming `dpkg --configure -a` when repair is not allowed, and with the
    default repairs dpkg and converges."""
    field_state(lab, repos.cuda, venv_cuda=None)
    pause = AlternativesPause(lab)
    try:
        proc, log = start_playbook(lab, tmp_path, STACK, repos.role_vars(lab), skip_tags="sglang")
        try:
            _wrapper, postinst, dpkg, apt = wait_for(pause.paused, "the toolkit's postinst held", proc)
        finally:
            kill_playbook(proc, log)
        time.sleep(2)
        assert alive(lab, apt) and alive(lab, dpkg), "the container's apt-get and dpkg go on after the controller died"
        commands = dict(processes(lab))
        assert "apt-get" in commands[apt] and "dpkg" in commands[dpkg], (commands[apt], commands[dpkg])
        state = json.loads(ct(lab, "cat %s" % STATE_FILE).stdout)

        # The rerun while they run: both named, refused before any change.
        before = snapshot(lab)
        busy = lab.run_playbook(STACK, extravars=repos.role_vars(lab, cuda_toolkit_lock_timeout=3), skip_tags="sglang")
        assert busy.rc != 0
        assert [(f.host, f.task) for f in busy.failures] == [(CT, "Check that apt and dpkg may be used"),
                                                             (CT, ROLLOUT_STOP)], busy.failure_text()
        message = busy.failures[0].msg
        assert "apt, dpkg or pip is busy on the host after 3 s of waiting: " in message, message
        # Each process once, with what it holds: apt-get the frontend lock (and the archives'), dpkg dpkg's own.
        assert re.search(r"PID %d \(%s\) holds /var/lib/dpkg/lock-frontend(, /var/cache/apt/archives/lock)?[;.]"
                         % (apt, re.escape(commands[apt][:400])), message), message
        assert re.search(r"PID %d \(%s\) holds /var/lib/dpkg/lock[;.]" % (dpkg, re.escape(commands[dpkg][:400])),
                         message), message
        assert message.count("PID %d (" % apt) == 1 and "(kill %d; kill %d: " % (apt, dpkg) in message
        assert ("This run changed nothing; the state an interrupted run of %s recorded stays in %s for the next run"
                % (state["recorded"], STATE_FILE)) in message
        assert snapshot(lab) == before

        # The container dies mid-configure: dpkg is interrupted.
        ct(lab, "kill -9 %s; rm -f %s" % (" ".join(str(p) for p in (apt, dpkg, postinst, _wrapper)), "/run/servelab-lab-alt-pause"))
        wait_for(lambda: not alive(lab, dpkg) and not alive(lab, apt), "apt-get and dpkg killed", timeout=30, every=0.5)
    finally:
        pause.close()
    status = ct(lab, "dpkg-query -W -f='${db:Status-Abbrev}' cuda-toolkit-13-0").stdout.strip()
    assert status == "iF", status
    audit = ct(lab, "dpkg --audit").stdout
    assert "cuda-toolkit-13-0" in audit, audit
    # What every apt-get said next, and what main's rerun failed with.
    assert "E: dpkg was interrupted, you must manually run 'dpkg --configure -a'" in ct(lab, "apt-get check 2>&1 || true").stdout

    before = snapshot(lab)
    refused = lab.run_playbook(STACK, extravars=repos.role_vars(lab, cuda_toolkit_dpkg_repair=False), skip_tags="sglang")
    assert refused.rc != 0
    assert [(f.host, f.task) for f in refused.failures] == [
        (CT, "Check that apt and dpkg may be used"), (CT, ROLLOUT_STOP)], refused.failure_text()
    message = refused.failures[0].msg
    assert "dpkg on the host was interrupted (a run or a host that died mid-install): " in message, message
    assert "cuda-toolkit-13-0" in message
    assert "Repair it with `dpkg --configure -a` in the container (or set cuda_toolkit_dpkg_repair: true" in message
    assert snapshot(lab) == before

    repaired = lab.run_playbook(STACK, extravars=repos.role_vars(lab), skip_tags="sglang")
    assert repaired.rc == 0, repaired.failure_text() or repaired.stdout[-4000:]
    assert re.search(r"Wait for apt and dpkg to be free, repair an interrupted dpkg\] \**\n(\S+: )?changed: \[%s\]" % CT,
                     repaired.stdout), "the repair should be this run's change"
    assert ct(lab, "dpkg --audit").stdout.strip() == ""
    assert installed(lab)["cuda-toolkit-13-0"] == "13.0.1-1" and selected(lab) == "/usr/local/cuda-13.0"
    assert not _exists(lab, STATE_FILE)
