"""Unit tests of role proxmox_gpu_passthrough's Python: the PVE config block logic (module_utils),
its module, and the role's filters. The lab tests (tests/lab) run the same code on a real host."""
from __future__ import annotations

import os
import stat

import pytest
from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.servelab.serving.plugins.filter import proxmox_gpu_passthrough as filters
from ansible_collections.servelab.serving.plugins.module_utils.pve.passthrough import (
    PassthroughError, apply_block, parse_proc_devices, render_block, resolve_nodes, split_sections)


PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
  4 tty
195 nvidia-frontend
226 drm
509 nvidia-uvm
510 nvidia-caps

Block devices:
  7 loop
509 not-a-char-device
"""
MAJORS = parse_proc_devices(PROC_DEVICES)
MAIN = """arch: amd64
cores: 8
hostname: ct129
lxc.cgroup2.devices.allow: c 10:200 rwm
lxc.mount.entry: /dev/net/tun dev/net/tun none bind,create=file
memory: 16384
rootfs: local-lvm:vm-129-disk-0,size=64G
"""
SNAPSHOTS = """
[snap1]
arch: amd64
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
snaptime: 1764400000

[snap2]
arch: amd64
parent: snap1
snaptime: 1764500000
"""


def block(gpus=(0, 1), controls=("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")):
    return render_block(resolve_nodes(list(gpus), list(controls), MAJORS))


# ----- /proc/devices and node resolution --------------------------------------------------------

def test_proc_devices_reads_character_majors_only():
    assert MAJORS["nvidia-uvm"] == 509
    assert MAJORS["nvidia-caps"] == 510
    assert MAJORS["/dev/vc/0"] == 4
    assert "not-a-char-device" not in MAJORS and "loop" not in MAJORS


def test_nodes_take_their_majors_from_proc_devices():
    nodes = resolve_nodes([1, 0], ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps"], MAJORS)
    assert [(n.path, n.major, n.minor, n.kind) for n in nodes] == [
        ("/dev/nvidia0", 195, 0, "file"), ("/dev/nvidia1", 195, 1, "file"),
        ("/dev/nvidiactl", 195, 255, "file"), ("/dev/nvidia-uvm", 509, 0, "file"),
        ("/dev/nvidia-uvm-tools", 509, 1, "file"), ("/dev/nvidia-caps", 510, None, "dir")]
    moved = dict(MAJORS, **{"nvidia-uvm": 236})
    assert resolve_nodes([0], ["nvidia-uvm"], moved)[1].major == 236


def test_open_kernel_modules_register_195_as_nvidia():
    majors = {"nvidia": 195, "nvidia-uvm": 234}
    assert resolve_nodes([0], ["nvidiactl"], majors)[0].major == 195


def test_missing_driver_names_the_fix():
    with pytest.raises(PassthroughError, match="nvidia-uvm.*nvidia-modprobe -u.*proxmox_gpu_passthrough_control_nodes"):
        resolve_nodes([0], ["nvidia-uvm"], {"nvidia-frontend": 195})
    with pytest.raises(PassthroughError, match="modprobe nvidia"):
        resolve_nodes([0], [], {"nvidia-uvm": 509})


@pytest.mark.parametrize("indexes, message", [([], "at least one GPU"), ([0, 254], "0..253"), (["0"], "0..253")])
def test_bad_gpu_indexes_are_refused(indexes, message):
    with pytest.raises(PassthroughError, match=message):
        resolve_nodes(indexes, [], MAJORS)


def test_unknown_control_node_is_refused():
    with pytest.raises(PassthroughError, match="control_nodes: unknown node.*nvidia-fake"):
        resolve_nodes([0], ["nvidia-fake"], MAJORS)


def test_block_has_one_allow_rule_and_one_mount_per_node():
    lines = block()
    assert lines[0] == "# BEGIN servelab proxmox_gpu_passthrough" and lines[-1] == "# END servelab proxmox_gpu_passthrough"
    assert lines[1:6] == ["lxc.cgroup2.devices.allow: c 195:0 rwm", "lxc.cgroup2.devices.allow: c 195:1 rwm",
                          "lxc.cgroup2.devices.allow: c 195:255 rwm", "lxc.cgroup2.devices.allow: c 509:0 rwm",
                          "lxc.cgroup2.devices.allow: c 509:1 rwm"]
    assert lines[6] == "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"
    assert len(lines) == 2 + 5 + 5
    caps = render_block(resolve_nodes([0], ["nvidia-caps"], MAJORS), "lxc.cgroup.devices.allow")
    assert "lxc.cgroup.devices.allow: c 510:* rwm" in caps
    assert "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir" in caps
    with pytest.raises(PassthroughError, match="cgroup_key"):
        render_block(resolve_nodes([0], [], MAJORS), "lxc.cgroup3.devices.allow")


# ----- placing the block ----------------------------------------------------------------------

def test_block_ends_the_main_section_and_snapshots_stay_byte_identical():
    text = MAIN + SNAPSHOTS
    edit = apply_block(text, block())
    assert edit.changed and edit.snapshot_sections == 2
    main, rest = split_sections(edit.text)
    assert "\n".join(rest) + "\n" == SNAPSHOTS.lstrip("\n")
    assert main == MAIN.splitlines() + block() + [""]  # the blank line before [snap1] stays
    # blockinfile's insertbefore would use the *last* "[": the block must not be in any snapshot.
    assert edit.text.index("# BEGIN") < edit.text.index("[snap1]")


def test_second_apply_changes_nothing():
    once = apply_block(MAIN + SNAPSHOTS, block()).text
    again = apply_block(once, block())
    assert not again.changed and again.text == once


def test_new_major_replaces_the_old_block():
    old = apply_block(MAIN, block()).text
    new_majors = dict(MAJORS, **{"nvidia-uvm": 236})
    edit = apply_block(old, render_block(resolve_nodes([0, 1], ["nvidiactl", "nvidia-uvm"], new_majors)))
    assert edit.changed
    assert "c 236:0 rwm" in edit.text and "c 509:0 rwm" not in edit.text
    assert edit.text.count("# BEGIN servelab") == 1


def test_block_displaced_by_a_pve_rewrite_is_put_back_once():
    # PVE keeps '#' lines as the description and writes them first: the markers end up on top,
    # the lxc lines at the end of the main section.
    ours = block()
    displaced = "\n".join([ours[0], ours[-1]] + MAIN.splitlines() + ours[1:-1]) + "\n"
    edit = apply_block(displaced, ours)
    assert edit.changed
    assert edit.text == MAIN + "\n".join(ours) + "\n"


def test_hand_written_lines_for_the_same_nodes_are_replaced_others_kept():
    hand = ("lxc.cgroup2.devices.allow: c 195:* rwm\n"
            "lxc.cgroup2.devices.allow = c 509:* rwm\n"
            "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n")
    edit = apply_block(MAIN + hand + SNAPSHOTS, block())
    assert sorted(edit.removed) == sorted(hand.splitlines())
    main = "\n".join(split_sections(edit.text)[0])
    assert main.count("dev/nvidia0 none") == 1
    assert "lxc.cgroup2.devices.allow: c 10:200 rwm" in main and "/dev/net/tun" in main
    assert "lxc.mount.entry: /dev/nvidia0" in "\n".join(split_sections(edit.text)[1])  # snapshot's own line stays


def test_absent_removes_only_our_block():
    present = apply_block(MAIN + SNAPSHOTS, block()).text
    edit = apply_block(present, [], present=False)
    assert edit.changed and edit.text == MAIN + SNAPSHOTS
    assert not apply_block(MAIN.rstrip("\n"), [], present=False).changed  # no final newline: left alone


def test_native_pve_device_entry_for_a_passed_node_warns():
    edit = apply_block(MAIN + "dev0: /dev/nvidia0,mode=0666\n", block())
    assert edit.warnings and "dev0: /dev/nvidia0" in edit.warnings[0]


# ----- the module -------------------------------------------------------------------------------

class ModuleExit(Exception):
    def __init__(self, kind, result):
        super().__init__(kind)
        self.kind, self.result = kind, result


@pytest.fixture
def run_module(monkeypatch):
    from ansible_collections.servelab.serving.plugins.modules import pve_lxc_gpu_passthrough as module

    def stop_with(kind):
        def handler(self, **result):
            raise ModuleExit(kind, result)
        return handler

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", stop_with("exit"))
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", stop_with("fail"))

    def run(args, check_mode=False):
        args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=True)
        with patch_module_args(args), pytest.raises(ModuleExit) as caught:
            module.main()
        return caught.value

    return run


@pytest.fixture
def files(tmp_path):
    config = tmp_path / "129.conf"
    config.write_text(MAIN + SNAPSHOTS)
    os.chmod(config, 0o640)
    devices = tmp_path / "devices"
    devices.write_text(PROC_DEVICES)
    return config, devices


def test_module_check_mode_reports_and_diffs_without_writing(run_module, files):
    config, devices = files
    out = run_module(dict(path=str(config), proc_devices=str(devices), gpu_indexes=[0, 1]), check_mode=True)
    assert out.kind == "exit" and out.result["changed"]
    assert "# BEGIN servelab" in out.result["diff"]["after"] and out.result["diff"]["before"] == MAIN + SNAPSHOTS
    assert config.read_text() == MAIN + SNAPSHOTS


def test_module_writes_keeps_the_mode_and_is_idempotent(run_module, files):
    config, devices = files
    args = dict(path=str(config), proc_devices=str(devices), gpu_indexes=[0, 1])
    first = run_module(args)
    assert first.result["changed"] and first.result["snapshot_sections"] == 2
    assert [n["path"] for n in first.result["nodes"]][-1] == "/dev/nvidia-uvm-tools"
    assert config.read_text().count("# BEGIN servelab") == 1
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert not list(config.parent.glob("129.conf.tmp.*"))
    assert not run_module(args).result["changed"]


def test_module_fails_before_touching_anything(run_module, files, tmp_path):
    config, devices = files
    out = run_module(dict(path=str(tmp_path / "130.conf"), proc_devices=str(devices), gpu_indexes=[0]))
    assert out.kind == "fail" and "does not exist" in out.result["msg"] and "proxmox_vmid" in out.result["msg"]
    devices.write_text("Character devices:\n195 nvidia-frontend\n\nBlock devices:\n")
    out = run_module(dict(path=str(config), proc_devices=str(devices), gpu_indexes=[0]))
    assert out.kind == "fail" and "nvidia-uvm" in out.result["msg"]
    assert config.read_text() == MAIN + SNAPSHOTS


# ----- the role's filters -------------------------------------------------------------------------

def test_driver_version_from_the_proc_file():
    line = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
            "(dvs-builder@U22-I3-AE18-23-3)  Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 12.2.0\n")
    assert filters.driver_version(line) == "580.95.05"
    assert filters.driver_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.172.08  Tue") == "570.172.08"
    assert filters.driver_version("garbage") == "" and filters.driver_version(None) == ""


def test_smi_gpus_parses_the_csv():
    gpus = filters.smi_gpus(["0, GPU-aaa, NVIDIA RTX PRO 6000 Blackwell Server Edition, 580.95.05, 00000000:41:00.0", ""])
    assert gpus == [dict(index=0, uuid="GPU-aaa", name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
                         driver_version="580.95.05", pci_bus_id="00000000:41:00.0")]
    with pytest.raises(ValueError, match="unexpected nvidia-smi line"):
        filters.smi_gpus(["No devices were found"])


def test_node_problems_name_every_bad_node():
    stats = filters.stat_nodes(["/dev/nvidia0|character special file|c3|0|666",
                                "/dev/nvidia-uvm|character special file|1fd|0|600",
                                "/dev/nvidiactl|regular empty file|0|0|644",
                                "stat: cannot statx '/dev/nvidia1': No such file or directory"])
    nodes = [dict(path="/dev/nvidia0", major=195, minor=0, kind="file"),
             dict(path="/dev/nvidia1", major=195, minor=1, kind="file"),
             dict(path="/dev/nvidiactl", major=195, minor=255, kind="file"),
             dict(path="/dev/nvidia-uvm", major=511, minor=0, kind="file"),
             dict(path="/dev/nvidia-caps", major=510, minor=None, kind="dir")]
    problems = filters.node_problems(stats, nodes, "in container 129")
    assert problems == ["/dev/nvidia1 is missing in container 129 (want char device 195:1)",
                        "/dev/nvidiactl in container 129 is a regular empty file, not a character device",
                        "/dev/nvidia-uvm in container 129 is 509:0, want 511:0 (majors come from /proc/devices)"]
    assert filters.wrong_mode(stats, "0666") == ["/dev/nvidia-uvm", "/dev/nvidiactl"]
