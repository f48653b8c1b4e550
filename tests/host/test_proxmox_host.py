"""The Proxmox VE host after proxmox_gpu_passthrough: driver floor, one passthrough block per
container (before any snapshot section), majors as in /proc/devices, udev rule, nvidia-uvm at boot."""
from __future__ import annotations

import pytest

from hostcheck import (MARKER, char_majors, driver_of, driver_version, lxc_values, main_section,
                       nvidia_mounts, pve_container_config, setting, stat_nodes, version_tuple)

GROUP = "proxmox_hosts"


@pytest.fixture(scope="module")
def containers(in_group, inventory_runner):
    """vmid -> config text of every gpu_servers container this host holds."""
    me = in_group["inventory_hostname"]
    vmids = []
    for name in inventory_runner.get_hosts("gpu_servers"):
        variables = inventory_runner.get_variables(name)
        if variables.get("proxmox_host") == me and "proxmox_vmid" in variables:
            vmids.append(int(variables["proxmox_vmid"]))
    if not vmids:
        pytest.skip("no gpu_servers host has proxmox_host=%s: nothing is passed through here" % me)
    return sorted(vmids)


@pytest.fixture(scope="module")
def majors(host, in_group):
    return char_majors(host.file(setting(in_group, "proxmox_gpu_passthrough_proc_devices")).content_string)


def test_driver_meets_the_floor(host, in_group):
    text = host.file(setting(in_group, "proxmox_gpu_passthrough_driver_version_file")).content_string
    version = driver_version(text)
    floor = str(setting(in_group, "proxmox_gpu_passthrough_driver_min"))
    assert version, "no NVRM version line in the driver version file"
    assert version_tuple(version) >= version_tuple(floor), "driver %s is below the %s floor" % (version, floor)


def test_block_present_once_before_snapshots(host, in_group, containers):
    for vmid in containers:
        text = pve_container_config(host, in_group, vmid)
        main = main_section(text)
        begins = [i for i, line in enumerate(main) if line.strip() == "# BEGIN %s" % MARKER]
        ends = [i for i, line in enumerate(main) if line.strip() == "# END %s" % MARKER]
        assert len(begins) == 1 and len(ends) == 1, \
            "container %s: want one BEGIN and one END marker in the main section, got %d/%d" % (vmid, len(begins), len(ends))
        block = main[begins[0] + 1:ends[0]]
        assert block, "container %s: empty passthrough block" % vmid
        outside = main[:begins[0]] + main[ends[0] + 1:]
        mounts_outside = [target for _source, target, _options in nvidia_mounts(outside)]
        assert not mounts_outside, "container %s: NVIDIA mounts outside the block: %s" % (vmid, mounts_outside)
        targets = [target for _source, target, _options in nvidia_mounts(block)]
        assert len(targets) == len(set(targets)), "container %s: a node is mounted twice: %s" % (vmid, targets)


def test_block_majors_come_from_proc_devices(host, in_group, containers, majors):
    for vmid in containers:
        main = main_section(pve_container_config(host, in_group, vmid))
        mounts = nvidia_mounts(main)
        assert mounts, "container %s: no /dev/nvidia* mount entries" % vmid
        rules = set()
        for key in ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow"):
            rules |= {rule.split()[1] for rule in lxc_values(main, key) if rule.startswith("c ")}
        on_host = stat_nodes(host, [source for source, _target, options in mounts if "create=file" in options])
        for source, target, options in mounts:
            assert target == source.lstrip("/"), "mount %s lands on %s" % (source, target)
            owners = [majors[name] for name in driver_of(source) if name in majors]
            assert owners, "%s: its driver (%s) is not in /proc/devices" % (source, "/".join(driver_of(source)))
            if "create=file" not in options:
                assert "%d:*" % owners[0] in rules, "container %s: no allow rule for %s" % (vmid, source)
                continue
            kind, major, minor = on_host.get(source, ("missing", -1, -1))
            assert kind == "character special file", "%s on the host: %s" % (source, kind)
            assert major == owners[0], "%s is major %d, /proc/devices says %d" % (source, major, owners[0])
            assert "%d:%d" % (major, minor) in rules or "%d:*" % major in rules, \
                "container %s: no cgroup allow rule for %s (%d:%d)" % (vmid, source, major, minor)


def test_udev_rule_recreates_the_uvm_nodes(host, in_group):
    rule = host.file(setting(in_group, "proxmox_gpu_passthrough_udev_rules_file"))
    assert rule.exists, "udev rule %s missing" % rule.path
    text = rule.content_string
    assert 'KERNEL=="nvidia_uvm"' in text and "-u -c0" in text


def test_nvidia_uvm_loads_at_boot(host, in_group):
    modules = host.file(setting(in_group, "proxmox_gpu_passthrough_modules_load_file"))
    assert modules.exists
    assert "nvidia-uvm" in [line.strip() for line in modules.content_string.splitlines()]
