# -*- coding: utf-8 -*-
# Part of servelab's proxmox_gpu_passthrough role: controller-side parsing of what the host and
# the containers answered (driver version file, nvidia-smi CSV, stat lines), so the task files
# stay declarative. Standard library only; unit-tested by importing this file.
"""Filters of the proxmox_gpu_passthrough role."""
from __future__ import annotations

import re

_DRIVER_VERSION_RE = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")
# The field order the role asks nvidia-smi for (vars/main.yml: _proxmox_gpu_passthrough_smi_fields).
SMI_FIELDS = ("index", "uuid", "name", "driver_version", "pci_bus_id")
# `stat -L -c '%n|%F|%t|%T|%a'`: name, type, major and minor in hex, mode in octal.
STAT_FORMAT = "%n|%F|%t|%T|%a"
_CHAR_DEVICE = "character special file"


def driver_version(text) -> str:
    """Version from /proc/driver/nvidia/version ("NVRM version: ...  580.95.05  Release ..."), or ''."""
    match = _DRIVER_VERSION_RE.search("%s " % (text or ""))
    return match.group(1) if match else ""


def smi_gpus(lines) -> list[dict]:
    """Parse `nvidia-smi --query-gpu=index,uuid,name,driver_version,pci.bus_id --format=csv,noheader`."""
    gpus = []
    for line in lines or []:
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < len(SMI_FIELDS) or not fields[0].isdigit():
            raise ValueError("unexpected nvidia-smi line %r (wanted %s)" % (line, ",".join(SMI_FIELDS)))
        # A name never holds a comma in practice; join defensively if one ever does.
        name = ",".join(fields[2:len(fields) - 2])
        gpus.append(dict(index=int(fields[0]), uuid=fields[1], name=name,
                         driver_version=fields[-2], pci_bus_id=fields[-1]))
    return gpus


def stat_nodes(lines) -> dict:
    """Map path -> {type, major, minor, mode} from `stat -L -c '%n|%F|%t|%T|%a'` output lines."""
    nodes = {}
    for line in lines or []:
        parts = line.strip().split("|")
        if len(parts) != 5:
            continue  # stat's own error lines ("cannot statx ...") are not ours to parse
        path, kind, major, minor, mode = parts
        nodes[path] = dict(type=kind, major=int(major, 16), minor=int(minor, 16), mode=mode.zfill(4))
    return nodes


def node_problems(stats: dict, nodes: list, where: str = "") -> list[str]:
    """What is wrong with the nodes as seen (stats) against what they must be (nodes from the module)."""
    problems = []
    suffix = " %s" % where if where else ""
    for node in nodes or []:
        if node.get("kind") != "file":
            continue  # directories of nodes (nvidia-caps) are checked by their mount, not here
        seen = stats.get(node["path"])
        want = "%d:%d" % (node["major"], node["minor"])
        if seen is None:
            problems.append("%s is missing%s (want char device %s)" % (node["path"], suffix, want))
        elif seen["type"] != _CHAR_DEVICE:
            problems.append("%s%s is a %s, not a character device" % (node["path"], suffix, seen["type"]))
        elif (seen["major"], seen["minor"]) != (node["major"], node["minor"]):
            problems.append("%s%s is %d:%d, want %s (majors come from /proc/devices)"
                            % (node["path"], suffix, seen["major"], seen["minor"], want))
    return problems


def wrong_mode(stats: dict, mode: str) -> list[str]:
    """Paths whose mode differs from `mode` (octal string such as '0666')."""
    want = str(mode).zfill(4)
    return sorted(path for path, seen in stats.items() if seen["mode"] != want)


class FilterModule:
    def filters(self):
        return {
            "proxmox_gpu_passthrough_driver_version": driver_version,
            "proxmox_gpu_passthrough_smi_gpus": smi_gpus,
            "proxmox_gpu_passthrough_stat_nodes": stat_nodes,
            "proxmox_gpu_passthrough_node_problems": node_problems,
            "proxmox_gpu_passthrough_wrong_mode": wrong_mode,
        }
