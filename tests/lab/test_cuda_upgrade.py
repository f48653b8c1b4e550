"""upgrade-cuda.yml in the lab: container 129 moves from CUDA 12.8 (as the field host had it: NVIDIA's
cuda-keyring, cuda-toolkit-12-8, an SGLang venv built for cu128) to 13.0.1 with roles cuda_toolkit and
sglang, against local repositories these tests build and serve: a signed APT repository with
NVIDIA-like packages (aptrepo/) and PyPI-style indexes with stand-in wheels (pypirepo/). The roles
see them only through their normal variables (repository URL, key URL, index URLs).
"""
from __future__ import annotations

import json
import re

import pytest

from cudastack import (CT, OLD_FLASHINFER, OLD_KERNEL, ROLLOUT_STOP, STACK, SYSTEMD_ENV, UPGRADE, VENV, VERSIONS, Repos, build_repos, ct,
                       failure_messages, field_state, installed, job_alive, reset_container, selected, snapshot,
                       start_gpu_job)

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def repos(lab, tmp_path_factory) -> Repos:
    """Build and serve the repositories; give container 129 its GPUs (playbooks/proxmox.yml) once."""
    built = build_repos(lab, tmp_path_factory.mktemp("cuda-lab"))
    lab.set_fake_driver(lab.config.driver_version)
    lab.reset_pve_config()
    if "running" not in lab.pct("status", str(lab.config.vmid)).stdout:
        lab.pct("start", str(lab.config.vmid))
    passthrough = lab.run_playbook("playbooks/proxmox.yml")
    assert passthrough.rc == 0, passthrough.failure_text() or passthrough.stdout[-3000:]
    try:
        yield built
    finally:
        # Leave container 129 as the lab made it, for the other lab tests.
        lab.set_fake_driver(lab.config.driver_version)
        reset_container(lab)
        lab.reset_pve_config()
        lab.pct("reboot", str(lab.config.vmid))


def test_check_mode_on_a_fresh_host_changes_nothing(lab, repos):
    reset_container(lab, purge_helpers=True)
    before = snapshot(lab)

    run = lab.run_playbook(UPGRADE, extravars=repos.role_vars(lab), check=True)
    assert run.rc == 0, run.failure_text() or run.stdout[-4000:]
    assert run.changed(CT) > 0, "check mode should report what it would change"
    assert snapshot(lab) == before


@pytest.fixture(scope="module")
def upgraded(lab, repos):
    """The field's 12.8 host, then upgrade-cuda.yml to 13.0.1 (the run, and the state before it)."""
    field_state(lab, repos.cuda, pypi=repos.pypi)
    assert selected(lab) == "/usr/local/cuda-12.8"
    run = lab.run_playbook(UPGRADE, extravars=repos.role_vars(lab))
    return run


def test_upgrade_installs_13_0_1_beside_12_8_and_selects_it(lab, repos, upgraded):
    run = upgraded
    assert run.rc == 0, run.failure_text() or run.stdout[-5000:]
    assert installed(lab) == {"cuda-keyring": "1.1-1", "cuda-toolkit-12-8": "12.8.1-1", "cuda-toolkit-13-0": "13.0.1-1"}
    assert selected(lab) == "/usr/local/cuda-13.0"
    assert "release 13.0, V13.0.88" in ct(lab, "/usr/local/cuda/bin/nvcc --version").stdout
    # Selected by hand (manual), so a later toolkit package cannot take /usr/local/cuda over.
    query = ct(lab, "update-alternatives --query cuda").stdout
    assert "Status: manual" in query and "Value: /usr/local/cuda-13.0" in query, query
    assert re.findall(r"^Alternative: (\S+)", query, re.M) == ["/usr/local/cuda-12.8", "/usr/local/cuda-13.0"]

    # The repository: our deb822 source with its key replaced the keyring's .list (same URL, other key).
    sources = ct(lab, "ls /etc/apt/sources.list.d; cat /etc/apt/sources.list.d/servelab-cuda.sources").stdout
    assert "cuda-debian12-x86_64.list" not in sources
    assert "URIs: %s" % repos.cuda in sources and "Signed-By: /etc/apt/keyrings/servelab-cuda.asc" in sources

    env = ct(lab, "bash -lc 'echo $CUDA_HOME; command -v nvcc; echo $LD_LIBRARY_PATH' </dev/null").stdout.split()
    assert env == ["/usr/local/cuda", "/usr/local/cuda/bin/nvcc", "/usr/local/cuda/lib64"]

    fact = json.loads(ct(lab, "cat /etc/ansible/facts.d/servelab_cuda.fact").stdout)
    assert (fact["selected"], fact["installed"], fact["package_version"]) == ("13.0", ["12.8", "13.0"], "13.0.1-1")
    assert fact["nvcc_version"] == "13.0.88"
    assert fact["env"] == {"CUDA_HOME": "/usr/local/cuda", "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
                           "PATH": "/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

    # The venv was rebuilt for cu130 with one FlashInfer version across its three packages.
    freeze = set(ct(lab, "%s/bin/pip freeze --disable-pip-version-check" % VENV).stdout.split())
    fi = VERSIONS.flashinfer
    assert {"torch==%s+cu130" % VERSIONS.torch, "sglang==%s" % VERSIONS.sglang, "flashinfer-python==" + fi,
            "flashinfer-cubin==" + fi, "flashinfer-jit-cache==%s+cu130" % fi,
            "sglang-kernel==%s+cu130" % VERSIONS.kernel} <= freeze
    assert not any("cu128" in line for line in freeze)
    sglang_fact = json.loads(ct(lab, "cat /etc/ansible/facts.d/servelab_sglang.fact").stdout)
    assert (sglang_fact["torch_cuda"], sglang_fact["sglang_version"]) == ("13.0", VERSIONS.sglang)
    # The kernel: pinned, its CUDA build checked (the library links libcudart.so.13).
    assert sglang_fact["kernel"] == {"package": "sglang-kernel", "version": VERSIONS.kernel + "+cu130", "cudart": ["13"]}
    # python -m sglang.check_env (the stand-in prints SGLang's format) parsed into the fact.
    check_env = sglang_fact["check_env"]
    assert check_env["torch"] == "%s+cu130" % VERSIONS.torch and check_env["cuda_available"] is False
    assert {k: check_env["packages"][k] for k in ("sglang", "sgl_kernel", "flashinfer")} == \
        {"sglang": VERSIONS.sglang, "sgl_kernel": VERSIONS.kernel, "flashinfer": fi}
    assert check_env["topology"].splitlines()[0].split() == ["GPU%d" % i for i in range(8)] + \
        ["CPU", "Affinity", "NUMA", "Affinity", "GPU", "NUMA", "ID"], check_env["topology"]
    # The rules: FlashInfer 0.7.2 builds the fusion for SM 12 (the venv has it), SGLang 0.5.23 refuses it
    # there, so with sglang_require_allreduce_fusion: false the GPUs are recorded as running without it.
    assert sglang_fact["compat"]["gpus"] == [{"gpus": "0,1,2,3,4,5,6,7", "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
                                              "arch": "12.0", "rule": "12.0", "fusion": False, "flashinfer_min": "0.6.17",
                                              "cuda_min": "12.8", "sglang_allows": False}]
    assert sglang_fact["compat"]["require_fusion"] is False
    fusion = sglang_fact["allreduce_fusion"]
    assert fusion["available"] is True and fusion["archs"] == {"12.0": True}, fusion
    assert fusion["supported_majors"] == [9, 10, 12]
    # The hypervisor line SGLang prints with two colons is read as such, not as topology.
    assert "Hypervisor" not in check_env["topology"]
    # The smoke test ran and says there is no GPU to compute on (the lab has none).
    smoke = sglang_fact["smoke"]
    assert smoke["gpu"] is False and smoke["reason"].startswith("no GPU") and smoke["devices"] == [], smoke
    assert smoke["jit"]["ran"] is False and smoke["jit"]["nvcc_release"] == "13.0", smoke["jit"]

    # Every systemd service gets the toolkit too (the manager's DefaultEnvironment drop-in).
    dropin = ct(lab, "cat %s" % SYSTEMD_ENV).stdout
    assert "[Manager]" in dropin and '"CUDA_HOME=/usr/local/cuda"' in dropin, dropin
    assert '"LD_LIBRARY_PATH=/usr/local/cuda/lib64"' in dropin and '"PATH=/usr/local/cuda/bin:' in dropin
    assert fact["systemd_env_file"] == SYSTEMD_ENV

    # The before/after table, printed at the end of the play.
    table = [line for line in run.stdout.splitlines() if re.search(r"\|\s*(selected|torch CUDA)\*?\s*\|", line)]
    assert any(re.search(r"selected\*\s*\|\s*12\.8\s*\|\s*13\.0\s*\|", line) for line in table), table
    torch = re.escape(VERSIONS.torch)
    assert any(re.search(r"torch CUDA\*\s*\|\s*12\.8 \(torch %s\+cu128\)\s*\|\s*13\.0 \(torch %s\+cu130\)" % (torch, torch),
                         line) for line in table), table


def test_rerun_changes_nothing(lab, repos, upgraded):
    assert upgraded.rc == 0, "the upgrade itself failed"
    run = lab.run_playbook(UPGRADE, extravars=repos.role_vars(lab))
    assert run.rc == 0, run.failure_text()
    assert run.changed() == 0, "second run changed something:\n" + run.stdout[-5000:]


def test_testinfra_suite_passes_and_catches_a_wrong_selection(lab, repos, upgraded):
    assert upgraded.rc == 0, "the upgrade itself failed"
    suite = lab.run_testinfra("gpu_servers", "tests/host/test_gpu_stack.py")
    assert suite.returncode == 0, suite.stdout[-4000:]
    assert re.search(r"\b5 passed\b", suite.stdout), suite.stdout[-2000:]

    # Someone switches the link back by hand: the suite says so.
    ct(lab, "update-alternatives --set cuda /usr/local/cuda-12.8 >/dev/null")
    try:
        broken = lab.run_testinfra("gpu_servers", "tests/host/test_gpu_stack.py")
        assert broken.returncode != 0 and "test_selected_toolkit_is_the_recorded_one" in broken.stdout, \
            broken.stdout[-3000:]
    finally:
        ct(lab, "update-alternatives --set cuda /usr/local/cuda-13.0 >/dev/null")


def test_the_package_is_pinned_and_going_back_needs_allow_downgrade(lab, repos, upgraded):
    assert upgraded.rc == 0, "the upgrade itself failed"
    assert installed(lab)["cuda-toolkit-13-0"] == "13.0.1-1"
    before = snapshot(lab)
    refused = lab.run_playbook(STACK, extravars=repos.role_vars(lab, cuda_toolkit_version="13.0.0"))
    assert refused.rc != 0
    message = failure_messages(refused)
    assert "cuda-toolkit-13-0 13.0.1-1 is installed on %s, newer than the requested 13.0.0-1" % CT in message, message
    assert "cuda_toolkit_allow_downgrade: true" in message
    assert snapshot(lab) == before

    # Allowed: exactly 13.0.0-1, although apt's candidate is 13.0.1-1.
    run = lab.run_playbook(STACK, extravars=repos.role_vars(lab, cuda_toolkit_version="13.0.0",
                                                            cuda_toolkit_allow_downgrade=True))
    assert run.rc == 0, run.failure_text()
    assert installed(lab)["cuda-toolkit-13-0"] == "13.0.0-1"
    assert "release 13.0, V13.0.48" in ct(lab, "/usr/local/cuda/bin/nvcc --version").stdout
    assert json.loads(ct(lab, "cat /etc/ansible/facts.d/servelab_cuda.fact").stdout)["package_version"] == "13.0.0-1"


def test_driver_570_stops_in_preflight_naming_the_driver_needed(lab, repos):
    field_state(lab, repos.cuda, venv_cuda=None)
    before = snapshot(lab)
    lab.set_fake_driver("570.172.08")
    try:
        # upgrade-cuda.yml: the host's preflight stops everything before the container play starts.
        run = lab.run_playbook(UPGRADE, extravars=repos.role_vars(lab))
        assert run.rc != 0
        assert [f.host for f in run.failures] == ["pve1"], run.failure_text()
        assert "570.172.08" in run.failures[0].msg and "580" in run.failures[0].msg
        assert "cuda_toolkit" not in run.stdout, "the container play must not have started"
        # The container play alone (gpu_stack.yml) stops in its own preflight, naming the driver it needs.
        alone = lab.run_playbook(STACK, extravars=repos.role_vars(lab))
    finally:
        lab.set_fake_driver(lab.config.driver_version)
    assert alone.rc != 0
    # The failure, then the rollout's stop at the end of the batch (playbooks/gpu_stack.yml).
    assert [(f.host, f.task) for f in alone.failures][1:] == [(CT, ROLLOUT_STOP)], alone.failure_text()
    assert alone.failures[0].host == CT
    message = alone.failures[0].msg
    assert "NVIDIA driver 570.172.08 on %s is too old for CUDA 13.0.1" % CT in message, message
    assert "needs driver >= 580" in message and "Nothing was changed" in message
    assert snapshot(lab) == before, "a failed preflight must not touch the container"


def test_gpu_job_blocks_the_switch_unless_reaping_is_allowed(lab, repos):
    field_state(lab, repos.cuda, venv_cuda=None)
    before = snapshot(lab)
    pid = start_gpu_job(lab)
    try:
        run = lab.run_playbook(STACK, extravars=repos.role_vars(lab))
        assert run.rc != 0
        message = failure_messages(run)
        assert "GPU jobs are running on %s: PID %d (sglang::scheduler_TP0" % (CT, pid) in message, message
        assert "cuda_toolkit_reap: true" in message
        assert job_alive(lab, pid), "the job must be left alone without cuda_toolkit_reap"
        assert snapshot(lab) == before
    finally:
        ct(lab, "kill %d 2>/dev/null || true" % pid)


def test_broken_toolkit_rolls_back_to_12_8_after_reaping(lab, repos):
    field_state(lab, repos.broken, venv_cuda=None)
    before = snapshot(lab)
    pid = start_gpu_job(lab)
    try:
        run = lab.run_playbook(STACK, extravars=repos.role_vars(lab, repos.broken, cuda_toolkit_reap=True))
        assert not job_alive(lab, pid), "cuda_toolkit_reap: true should have stopped the GPU job"
    finally:
        ct(lab, "kill %d 2>/dev/null || true" % pid)
    assert run.rc != 0
    message = failure_messages(run)
    assert "CUDA 13.0.1 on %s failed, so the previous toolkit was put back" % CT in message, message
    assert "/usr/local/cuda-13.0/bin/nvcc --version failed (rc 127)" in message and "libnvptxcompiler" in message
    assert "/usr/local/cuda -> /usr/local/cuda-12.8 (nvcc release 12.8, as before)" in message
    assert "cuda-toolkit-13-0 removed (it was not installed before)" in message
    assert "The host is as it was before this run." in message
    assert selected(lab) == "/usr/local/cuda-12.8"
    assert installed(lab) == {"cuda-keyring": "1.1-1", "cuda-toolkit-12-8": "12.8.1-1"}
    assert "servelab_cuda.fact" not in ct(lab, "ls /etc/ansible/facts.d 2>/dev/null || true").stdout
    # The systemd drop-in this run wrote is gone again.
    assert ct(lab, "test -e %s && echo present || echo absent" % SYSTEMD_ENV).stdout.strip() == "absent"
    # What changed for good: the repository source (replacing the keyring's), the profile script,
    # the (empty) drop-in directory.
    after = snapshot(lab)
    changed = set(after.splitlines()) ^ set(before.splitlines())
    assert all(re.search(r"sources\.list\.d|keyrings|profile\.d|/var/lib/apt/lists|python3-debian|alt cuda|"
                         r"^/etc/systemd/system\.conf\.d d ", line) for line in changed), sorted(changed)


def test_venv_left_on_cu128_makes_the_stack_verify_roll_back(lab, repos):
    """Without role sglang (skipped), torch stays a CUDA 12.8 build: the stack verify refuses 13.0."""
    field_state(lab, repos.cuda, pypi=repos.pypi)
    run = lab.run_playbook(STACK, extravars=repos.role_vars(lab), skip_tags="sglang")
    assert run.rc != 0
    message = failure_messages(run)
    assert "torch in the venv is built for CUDA 12.8, the toolkit is CUDA 13.0" in message, message
    assert "/usr/local/cuda -> /usr/local/cuda-12.8 (nvcc release 12.8, as before)" in message
    assert "The host is as it was before this run." in message
    assert selected(lab) == "/usr/local/cuda-12.8"
    assert "cuda-toolkit-13-0" not in installed(lab)


def test_broken_update_of_13_0_puts_13_0_0_back(lab, repos):
    field_state(lab, repos.broken, venv_cuda=None,
                toolkits=(("cuda-toolkit-12-8", None), ("cuda-toolkit-13-0", "13.0.0-1")))
    assert selected(lab) == "/usr/local/cuda-13.0"

    run = lab.run_playbook(STACK, extravars=repos.role_vars(lab, repos.broken))
    assert run.rc != 0
    message = failure_messages(run)
    assert "cuda-toolkit-13-0 back at 13.0.0-1" in message, message
    assert installed(lab)["cuda-toolkit-13-0"] == "13.0.0-1"
    assert selected(lab) == "/usr/local/cuda-13.0"
    assert "release 13.0, V13.0.48" in ct(lab, "/usr/local/cuda/bin/nvcc --version").stdout


def _refused_in_preflight(lab, repos, **extra):
    """upgrade-cuda.yml with `extra` on the field's 12.8 host: it must stop in the container's preflight,
    before role cuda_toolkit installs anything; the container is left as it was. Returns the message."""
    field_state(lab, repos.cuda, venv_cuda=None)
    lab.set_fake_driver(lab.config.driver_version, gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                        compute_cap="12.0")
    before = snapshot(lab)
    run = lab.run_playbook(UPGRADE, extravars=repos.role_vars(lab, **extra))
    assert run.rc != 0
    assert [(f.host, f.task) for f in run.failures][1:] == [(CT, ROLLOUT_STOP)], run.failure_text()
    assert run.failures[0].host == CT
    assert "Install the toolkit package" not in run.stdout, "role cuda_toolkit must not have started installing"
    assert snapshot(lab) == before, "a failed preflight must not touch the container"
    assert selected(lab) == "/usr/local/cuda-12.8"
    message = run.failures[0].msg
    assert "Nothing was installed." in message, message
    return message


def test_sm120_with_the_default_sglang_and_fusion_required_stops_in_preflight(lab, repos):
    """Issue 24, defect 1: SGLang 0.5.23 raises at start for allreduce fusion on SM 12.0, whatever
    FlashInfer builds. The role's default (fusion required) stops before anything is installed."""
    message = _refused_in_preflight(lab, repos, sglang_require_allreduce_fusion=True)
    assert ("GPU 0,1,2,3,4,5,6,7 NVIDIA RTX PRO 6000 Blackwell Server Edition (SM 12.0) on %s: SGLang %s refuses "
            "FlashInfer's allreduce fusion there (the server fails at start)" % (CT, VERSIONS.sglang)) in message, message
    assert "sglang/srt/layers/flashinfer_comm_fusion.py:48" in message
    assert "Fix: set sglang_require_allreduce_fusion: false" in message and "no recorded SGLang release" in message


def test_the_old_kernel_default_stops_in_preflight(lab, repos):
    """Issue 24, defect 3: sglang-kernel 0.4.7 put back. SGLang 0.5.23 pins 0.4.10, and 0.4.7 pins torch 2.13.0."""
    message = _refused_in_preflight(lab, repos, sglang_kernel_version=OLD_KERNEL)
    assert 'sglang_kernel_version is 0.4.7, but SGLang %s requires sglang-kernel==0.4.10' % VERSIONS.sglang in message
    assert 'Fix: set sglang_kernel_version: "0.4.10"' in message
    assert "sglang_kernel_version 0.4.7 requires torch==2.13.0" in message


def test_a_flashinfer_off_sglangs_own_pin_stops_in_preflight(lab, repos):
    """FlashInfer 0.6.16 (the old SM12x minimum): SGLang 0.5.23 pins flashinfer-python 0.7.2, so the pins
    check refuses it before the GPU rules (whose SM12x minimum is now 0.6.17) are reached."""
    message = _refused_in_preflight(lab, repos, sglang_flashinfer_version=OLD_FLASHINFER)
    assert ("sglang_flashinfer_version is %s, but SGLang %s requires flashinfer-python==0.7.2"
            % (OLD_FLASHINFER, VERSIONS.sglang)) in message, message


def test_kernel_wheel_of_the_wrong_cuda_build_stops_verify(lab, repos):
    """A kernel wheel labelled +cu130 whose library links the CUDA 12 runtime: verify names it. The venv was built
    beside the one in use, which stays as it was, and the toolkit goes back with it (issue 29, fault 2: role
    sglang's failure used to leave 13.0 selected)."""
    field_state(lab, repos.cuda, pypi=repos.pypi)
    inode = ct(lab, "stat -c %%i %s" % VENV).stdout.strip()
    run = lab.run_playbook(STACK, extravars=repos.role_vars(
        lab, sglang_kernel_index_url=repos.pypi + "kernel-wrong/cu130/"))
    assert run.rc != 0
    message = failure_messages(run)
    assert ("sglang-kernel %s+cu130 links libcudart.so.12 (CUDA 12), expected CUDA 13: a wheel of another CUDA build"
            % VERSIONS.kernel) in message, message
    assert re.search(r"SGLang stack in /opt/sglang/venvs/sglang-%s-cu130-[0-9a-f]{10} on %s: " % (re.escape(VERSIONS.sglang), CT),
                     message), message
    assert "It was built beside %s, which servers run and which was not touched" % VENV in message
    assert "the SGLang venv %s not touched: the venv directory (torch %s+cu128), as before" % (VENV, VERSIONS.torch) in message
    assert "The host is as it was before this run." in message
    assert selected(lab) == "/usr/local/cuda-12.8" and "cuda-toolkit-13-0" not in installed(lab)
    assert ct(lab, "stat -c %%i %s; ls -A /opt/sglang/venvs" % VENV).stdout.split() == [inode]
