"""Role proxmox_gpu_passthrough in the lab: the real play (playbooks/proxmox.yml) against the lab's
Proxmox host and its container 129, with the lab's driver stand-ins playing a 580 (or 570) driver."""
from __future__ import annotations

import json
import re
import time

import pytest

pytestmark = pytest.mark.lab

PLAYBOOK = "playbooks/proxmox.yml"
PVE = "pve1"
BEGIN = "# BEGIN servelab proxmox_gpu_passthrough"
END = "# END servelab proxmox_gpu_passthrough"
SECTION_RE = re.compile(r"^\[[^\]]+\]\s*$", re.M)

# Two snapshots, each with GPU lines of its own time (an old hand-written block, a stale major):
# they must come out byte for byte, and the block must land before the first one.
SNAPSHOTS = """
[before-cuda13]
arch: amd64
hostname: ct129
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 508:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
memory: 16384
snaptime: 1764400000

[after-driver-580]
# BEGIN servelab proxmox_gpu_passthrough
lxc.cgroup2.devices.allow: c 195:0 rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
# END servelab proxmox_gpu_passthrough
arch: amd64
hostname: ct129
parent: before-cuda13
snaptime: 1764500000
"""


def expected_nodes(lab) -> dict[str, str]:
    """path -> "major:minor" of every node for the lab's GPUs, majors as its stand-in /proc/devices has them."""
    uvm = lab.fake_majors["nvidia-uvm"]
    nodes = {"/dev/nvidia%d" % i: "195:%d" % i for i in range(lab.config.gpus)}
    nodes.update({"/dev/nvidiactl": "195:255", "/dev/nvidia-uvm": "%d:0" % uvm, "/dev/nvidia-uvm-tools": "%d:1" % uvm})
    return nodes


def expected_block(lab) -> list[str]:
    nodes = expected_nodes(lab)
    return ([BEGIN] + ["lxc.cgroup2.devices.allow: c %s rwm" % dev for dev in nodes.values()]
            + ["lxc.mount.entry: %s %s none bind,optional,create=file" % (path, path[1:]) for path in nodes] + [END])


def main_and_rest(text: str) -> tuple[str, str]:
    match = SECTION_RE.search(text)
    return (text[:match.start()], text[match.start():]) if match else (text, "")


def reboots(lab, since: int) -> list[list[str]]:
    return [call for call in lab.pct_log()[since:] if call[:3] == ["pct", "reboot", str(lab.config.vmid)]]


def container_nodes(lab) -> dict[str, str]:
    """path -> "major:minor" of the NVIDIA nodes inside container 129."""
    out = lab.pct_exec(lab.config.vmid, "sh", "-c", "stat -c '%n %t %T' /dev/nvidia* 2>/dev/null || true").stdout
    nodes = {}
    for line in out.splitlines():
        path, major, minor = line.split()
        nodes[path] = "%d:%d" % (int(major, 16), int(minor, 16))
    return nodes


@pytest.fixture
def pve(lab):
    """The lab back at its starting point: a 580 driver, container 129 running, its config without GPU lines."""
    lab.set_fake_driver(lab.config.driver_version)
    lab.reset_pve_config()
    if "running" not in lab.pct("status", str(lab.config.vmid)).stdout:
        lab.pct("start", str(lab.config.vmid))
    return lab


def test_role_converges_then_changes_nothing(pve):
    lab = pve
    calls = len(lab.pct_log())
    first = lab.run_playbook(PLAYBOOK)
    assert first.rc == 0, first.failure_text() or first.stdout[-3000:]
    assert first.changed(PVE) > 0

    text = lab.pve_config_path().read_text()
    assert text.startswith(lab.pristine_pve_config()), "the rest of the config must stay as it was"
    assert text[len(lab.pristine_pve_config()):].splitlines() == expected_block(lab)
    assert len(reboots(lab, calls)) == 1, "a changed block restarts the running container once"
    # The restart applied the block: every node is in the container with the host's numbers.
    assert container_nodes(lab) == expected_nodes(lab)

    calls = len(lab.pct_log())
    second = lab.run_playbook(PLAYBOOK)
    assert second.rc == 0, second.failure_text()
    assert second.changed() == 0, "second run changed something:\n" + second.stdout[-4000:]
    assert reboots(lab, calls) == [], "unchanged block, yet the container was restarted"
    assert lab.pve_config_path().read_text() == text


def test_block_lands_before_snapshots_which_stay_untouched(pve):
    lab = pve
    hand_line = "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
    before = lab.pristine_pve_config() + hand_line + SNAPSHOTS
    lab.reset_pve_config(before)
    calls = len(lab.pct_log())

    run = lab.run_playbook(PLAYBOOK)
    assert run.rc == 0, run.failure_text()

    after = lab.pve_config_path().read_text()
    main, rest = main_and_rest(after)
    assert rest == main_and_rest(before)[1], "snapshot sections changed"
    # The hand-written line of the same node is replaced by the block, which ends the main section.
    assert main == lab.pristine_pve_config() + "\n".join(expected_block(lab)) + "\n\n"
    assert after.count(BEGIN) == 2  # ours, and the one inside snapshot [after-driver-580]
    assert len(reboots(lab, calls)) == 1


def test_check_mode_reports_the_change_and_writes_nothing(pve):
    lab = pve
    stale = "lxc.cgroup2.devices.allow: c 195:* rwm\n"
    before = lab.pristine_pve_config() + stale
    lab.reset_pve_config(before)
    calls = len(lab.pct_log())

    run = lab.run_playbook(PLAYBOOK, check=True, diff=True)
    assert run.rc == 0, run.failure_text()
    assert run.changed(PVE) > 0
    assert "+" + BEGIN in run.stdout and "-" + stale.strip() in run.stdout, "no diff of the config shown"
    assert lab.pve_config_path().read_text() == before
    assert reboots(lab, calls) == []


@pytest.mark.parametrize("case, expected", [
    ("driver 570", ["NVIDIA driver 570.172.08 on pve1 is older than proxmox_gpu_passthrough_driver_min (580)",
                    "Upgrade the host driver first"]),
    ("no driver", ["The NVIDIA kernel driver is not loaded on pve1", "/srv/servelab-lab/proc/driver/nvidia/absent"]),
    ("no GPU", ["nvidia-smi on pve1 lists no GPU"]),
    ("no reboot after upgrade", ["nvidia-smi on pve1 reports driver 580.95.05, the loaded kernel module is 580.82.07"]),
    ("bad variable", ["proxmox_gpu_passthrough_control_nodes", "nvidia-fake"]),
])
def test_preflight_fails_clearly_and_touches_nothing(pve, case, expected):
    lab = pve
    extravars = {}
    if case == "driver 570":
        lab.set_fake_driver("570.172.08")
    elif case == "no driver":
        extravars["proxmox_gpu_passthrough_driver_version_file"] = "/srv/servelab-lab/proc/driver/nvidia/absent"
    elif case == "no GPU":
        lab.set_fake_driver(lab.config.driver_version, gpus=0)
    elif case == "no reboot after upgrade":
        lab.set_fake_driver(lab.config.driver_version, kernel_version="580.82.07")
    else:
        extravars["proxmox_gpu_passthrough_control_nodes"] = ["nvidiactl", "nvidia-fake"]
    calls = len(lab.pct_log())

    run = lab.run_playbook(PLAYBOOK, extravars=extravars)
    assert run.rc != 0
    messages = " ".join(failure.msg for failure in run.failures)
    for text in expected:
        assert text in messages, messages
    assert lab.pve_config_path().read_text() == lab.pristine_pve_config(), "a failed preflight must not touch the config"
    assert reboots(lab, calls) == []


def test_nvidia_uvm_gets_loaded_and_its_nodes_created(pve):
    lab = pve
    lab.set_fake_driver(lab.config.driver_version, uvm_loaded=False)
    lab.pve_exec("rm", "-f", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    assert "nvidia-uvm" not in lab.pve_path("/srv/servelab-lab/proc/devices").read_text()

    run = lab.run_playbook(PLAYBOOK)
    assert run.rc == 0, run.failure_text()
    uvm = lab.fake_majors["nvidia-uvm"]
    assert re.search(r"^\s*%d nvidia-uvm$" % uvm, lab.pve_path("/srv/servelab-lab/proc/devices").read_text(), re.M)
    out = lab.pve_exec("stat", "-c", "%n %t %T %a", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools").stdout.split("\n")
    assert out[0] == "/dev/nvidia-uvm %x 0 666" % uvm and out[1] == "/dev/nvidia-uvm-tools %x 1 666" % uvm
    assert container_nodes(lab)["/dev/nvidia-uvm"] == "%d:0" % uvm


def test_container_driver_mismatch_fails_verify(pve):
    lab = pve
    lab.set_fake_driver(lab.config.driver_version, container_version="580.65.06")

    run = lab.run_playbook(PLAYBOOK)
    assert run.rc != 0
    messages = " ".join(failure.msg for failure in run.failures)
    assert "user-space driver 580.65.06" in messages and "host runs driver %s" % lab.config.driver_version in messages, messages


def test_testinfra_suites_pass_and_catch_breakage(pve):
    lab = pve
    run = lab.run_playbook(PLAYBOOK)
    assert run.rc == 0, run.failure_text()

    host_suite = lab.run_testinfra("proxmox_hosts")
    assert host_suite.returncode == 0, host_suite.stdout[-4000:]
    for name in ("test_driver_meets_the_floor", "test_block_present_once_before_snapshots",
                 "test_block_majors_come_from_proc_devices", "test_udev_rule_recreates_the_uvm_nodes"):
        assert re.search(r"PASSED \S+::%s\[ansible://pve1\]" % name, host_suite.stdout), host_suite.stdout[-3000:]
    ct_suite = lab.run_testinfra("gpu_servers")
    assert ct_suite.returncode == 0, ct_suite.stdout[-4000:]
    for name in ("test_device_nodes_match_the_host", "test_user_space_driver_matches_the_host"):
        assert re.search(r"PASSED \S+::%s\[ansible://ct129\]" % name, ct_suite.stdout), ct_suite.stdout[-3000:]

    # The suites fail when the state is wrong: a second mount of a node in the host's config ...
    text = lab.pve_config_path().read_text()
    lab.reset_pve_config("lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file\n" + text)
    broken = lab.run_testinfra("proxmox_hosts")
    assert broken.returncode != 0 and "test_block_present_once_before_snapshots" in broken.stdout, broken.stdout[-3000:]
    # ... and a node missing in the container.
    lab.reset_pve_config(text)
    lab.pct_exec(lab.config.vmid, "sh", "-c", "umount /dev/nvidia5 && rm /dev/nvidia5")
    missing = lab.run_testinfra("gpu_servers")
    assert missing.returncode != 0 and "/dev/nvidia5" in missing.stdout, missing.stdout[-3000:]


def test_server_state_check_follows_the_recorded_process(lab):
    """tests/host's server check against a state file as llm_server writes it, server up then gone."""
    vmid = lab.config.vmid
    start = ("mkdir -p /root/.servelab/servers/probe && cd /tmp && "
             "setsid python3 -m http.server 30123 --bind 127.0.0.1 >/dev/null 2>&1 < /dev/null & echo $!")
    pid = int(lab.pct_exec(vmid, "sh", "-c", start).stdout.split()[-1])
    try:
        stat = lab.pct_exec(vmid, "cat", "/proc/%d/stat" % pid).stdout
        state = dict(name="probe", engine="command", profile="probe", status="running", config_hash="x", cmd=[],
                     env={}, host="127.0.0.1", port=30123, probe_host="127.0.0.1", base_url="http://127.0.0.1:30123",
                     model=None, log_path="/dev/null", marker="probe", pid=pid,
                     start_time=int(stat.rsplit(")", 1)[1].split()[19]))
        lab.ct_path("/root/.servelab/servers/probe/state.json").write_text(json.dumps(state))
        for _i in range(50):  # the server binds a moment after the fork
            if lab.pct_exec(vmid, "python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 30123), 1)",
                            check=False).returncode == 0:
                break
            time.sleep(0.2)
        serving = lab.run_testinfra("gpu_servers", "tests/host/test_gpu_server.py", extra=("-k", "recorded_servers"))
        assert serving.returncode == 0 and "PASSED" in serving.stdout, serving.stdout[-3000:]
    finally:
        lab.pct_exec(vmid, "kill", str(pid), check=False)
    gone = lab.run_testinfra("gpu_servers", "tests/host/test_gpu_server.py", extra=("-k", "recorded_servers"))
    lab.pct_exec(vmid, "rm", "-rf", "/root/.servelab/servers/probe")
    assert gone.returncode != 0 and "recorded PID %d is gone" % pid in gone.stdout, gone.stdout[-3000:]
