"""Helpers of the testinfra suites (tests/host): PVE config and /proc parsing, one-command stats."""
from __future__ import annotations

import re
import shlex

import pytest
import testinfra

# What the proxmox_gpu_passthrough role defaults to; inventories may override per host.
ROLE_DEFAULTS = {
    "proxmox_gpu_passthrough_driver_version_file": "/proc/driver/nvidia/version",
    "proxmox_gpu_passthrough_proc_devices": "/proc/devices",
    "proxmox_gpu_passthrough_config_dir": "/etc/pve/lxc",
    "proxmox_gpu_passthrough_driver_min": "580",
    "proxmox_gpu_passthrough_udev_rules_file": "/etc/udev/rules.d/70-nvidia-passthrough.rules",
    "proxmox_gpu_passthrough_modules_load_file": "/etc/modules-load.d/nvidia-uvm.conf",
    "proxmox_gpu_passthrough_container_nvidia_smi": "nvidia-smi",
}
MARKER = "servelab proxmox_gpu_passthrough"
SECTION_RE = re.compile(r"^\[[^\]]+\]\s*$")


def setting(variables: dict, name: str):
    return variables.get(name, ROLE_DEFAULTS[name])


def main_section(text: str) -> list[str]:
    """Lines of a PVE container config before its first [snapshot]/[pve:pending] section."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if SECTION_RE.match(line):
            return lines[:index]
    return lines


def char_majors(proc_devices: str) -> dict[str, int]:
    """Character-device majors by name, read independently of the role's own parser."""
    text = proc_devices.split("Block devices:")[0]
    return {name: int(number) for number, name in re.findall(r"^\s*(\d+)\s+(\S+)\s*$", text, re.M)}


def stat_nodes(host, paths) -> dict[str, tuple[str, int, int]]:
    """path -> (type, major, minor) for every path that exists, in one command."""
    if not paths:
        return {}
    out = host.run("stat -L -c '%%n|%%F|%%t|%%T' %s 2>/dev/null" % " ".join(shlex.quote(p) for p in paths)).stdout
    nodes = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 4:
            nodes[parts[0]] = (parts[1], int(parts[2], 16), int(parts[3], 16))
    return nodes


def proxmox_host_of(request, variables) -> testinfra.host.Host:
    """The Proxmox host holding a container (its `proxmox_host` inventory variable)."""
    name = variables.get("proxmox_host")
    if not name:
        pytest.skip("%s has no proxmox_host variable: not a Proxmox container" % variables["inventory_hostname"])
    inventory = request.config.getoption("ansible_inventory")
    spec = "ansible://%s" % name + ("?ansible_inventory=%s" % inventory if inventory else "")
    return testinfra.get_host(spec)


def driver_version(text: str) -> str:
    """Version from an NVIDIA driver version file ("NVRM version: ... 580.95.05 ...")."""
    match = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", text + " ")
    return match.group(1) if match else ""


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def lxc_values(lines, key: str) -> list[str]:
    """Values of `key: value` / `key = value` lines (PVE accepts both for lxc.* keys)."""
    pattern = re.compile(r"^\s*%s\s*(?::|=)\s*(.*?)\s*$" % re.escape(key))
    return [m.group(1) for m in map(pattern.match, lines) if m]


def nvidia_mounts(lines) -> list[tuple[str, str, str]]:
    """(source, target, options) of the lxc.mount.entry lines that bind /dev/nvidia* nodes."""
    entries = []
    for value in lxc_values(lines, "lxc.mount.entry"):
        fields = value.split()
        if len(fields) >= 4 and fields[0].startswith("/dev/nvidia"):
            entries.append((fields[0], fields[1], fields[3]))
    return entries


def driver_of(path: str) -> tuple[str, ...]:
    """/proc/devices names that may own a node's major (195 shows as nvidia-frontend or nvidia)."""
    name = path.rsplit("/", 1)[-1]
    if name.startswith("nvidia-uvm"):
        return ("nvidia-uvm",)
    if name.startswith("nvidia-caps"):
        return ("nvidia-caps",)
    return ("nvidia-frontend", "nvidia")


def pve_container_config(pve_host, variables_of_pve: dict, vmid) -> str:
    path = "%s/%s.conf" % (setting(variables_of_pve, "proxmox_gpu_passthrough_config_dir"), vmid)
    config = pve_host.file(path)
    if not config.exists:
        pytest.fail("%s does not exist on the Proxmox host" % path)
    return config.content_string
