# -*- coding: utf-8 -*-
# Logic of the proxmox_gpu_passthrough role: NVIDIA device majors, the LXC passthrough block and
# its placement in a Proxmox VE container config. Standard library only, importable alone (the
# role's module is a thin wrapper; tests import this file directly).
"""Compute and place the NVIDIA passthrough block of a Proxmox VE LXC config.

A PVE container config (/etc/pve/lxc/<vmid>.conf) is one "main" section followed by optional
sections whose header is a line like ``[snapname]`` or ``[pve:pending]``. Everything after such
a header belongs to that snapshot, so the block must go into the main section, and snapshot
sections are never touched.

PVE keeps ``#`` lines as the container's description and, whenever it rewrites a config
(``pct set``, the web UI), moves them to the top. Our BEGIN/END marker comments can therefore
end up far from the lines they enclosed. Replacing "what is between the markers" alone would then
duplicate the block, so the edit also drops, from the main section, stray markers and any older
line that configures the same device (same mount target, or an allow rule for one of the majors
the block uses). The result is one block, at the end of the main section, whatever state PVE or a
hand edit left the file in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# /proc/devices names. The fixed major 195 shows up as "nvidia-frontend" (drivers with the
# frontend module) or "nvidia" (open kernel modules of recent branches): accept either.
FRONTEND_NAMES = ("nvidia-frontend", "nvidia")
UVM_NAME = "nvidia-uvm"
CAPS_NAME = "nvidia-caps"

# Control nodes the role knows: /proc/devices driver, fixed minor (None: every minor, for a
# directory of nodes) and how LXC must create the mount point.
CONTROL_NODES = {
    "nvidiactl": ("frontend", 255, "file"),
    "nvidia-modeset": ("frontend", 254, "file"),
    "nvidia-uvm": (UVM_NAME, 0, "file"),
    "nvidia-uvm-tools": (UVM_NAME, 1, "file"),
    "nvidia-caps": (CAPS_NAME, None, "dir"),
}

CGROUP_KEYS = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
DEFAULT_MARKER = "servelab proxmox_gpu_passthrough"

_SECTION_RE = re.compile(r"^\[[^\]]+\]\s*$")
# PVE accepts "key: value" and, for lxc.* keys, "key = value" too.
_LXC_LINE_RE = re.compile(r"^\s*(lxc\.[a-z0-9_.\-]+)\s*(?::|=)\s*(.*?)\s*$")
_ALLOW_RULE_RE = re.compile(r"^c\s+(\d+):(\d+|\*)\s+\S+$")


class PassthroughError(ValueError):
    """Bad input or host state; the message names what is wrong and how to fix it."""


@dataclass(frozen=True)
class DeviceNode:
    """One NVIDIA device node to pass through (path on the host, inside the container alike)."""

    path: str
    major: int
    minor: int | None  # None: all minors (a directory of nodes such as /dev/nvidia-caps)
    kind: str  # "file" or "dir": how LXC creates the mount point
    driver: str  # /proc/devices name the major came from

    @property
    def target(self) -> str:
        """Mount target relative to the container root, as lxc.mount.entry wants it."""
        return self.path.lstrip("/")

    def allow_rule(self) -> str:
        minor = "*" if self.minor is None else str(self.minor)
        return "c %d:%s rwm" % (self.major, minor)

    def mount_entry(self) -> str:
        return "%s %s none bind,optional,create=%s" % (self.path, self.target, self.kind)

    def as_dict(self) -> dict:
        return {
            "path": self.path,
            "major": self.major,
            "minor": self.minor,
            "kind": self.kind,
            "driver": self.driver,
        }


@dataclass
class BlockEdit:
    """Result of placing the block into a config text."""

    text: str
    changed: bool
    block: list[str]
    removed: list[str] = field(default_factory=list)  # old lines dropped outside our own block
    warnings: list[str] = field(default_factory=list)
    snapshot_sections: int = 0


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character-device majors by driver name from /proc/devices (block devices ignored)."""
    majors: dict[str, int] = {}
    in_char = False
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith(":"):
            in_char = line.lower().startswith("character devices")
            continue
        if not in_char or not line:
            continue
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def frontend_major(majors: dict[str, int]) -> int:
    for name in FRONTEND_NAMES:
        if name in majors:
            return majors[name]
    raise PassthroughError(
        "the NVIDIA kernel driver is not registered in /proc/devices (no 'nvidia-frontend' or "
        "'nvidia' character device): load the driver (modprobe nvidia) first"
    )


def resolve_nodes(gpu_indexes, control_nodes, majors: dict[str, int]) -> list[DeviceNode]:
    """The device nodes to pass through, with majors taken from /proc/devices."""
    if not gpu_indexes:
        raise PassthroughError("gpu_indexes is empty: pass at least one GPU index (nvidia-smi -L)")
    bad = [i for i in gpu_indexes if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < 254]
    if bad:
        raise PassthroughError("gpu_indexes must be integers 0..253, got %r" % (bad,))
    unknown = [n for n in control_nodes if n not in CONTROL_NODES]
    if unknown:
        raise PassthroughError(
            "control_nodes: unknown node(s) %s; known: %s" % (", ".join(unknown), ", ".join(sorted(CONTROL_NODES)))
        )
    front = frontend_major(majors)
    nodes = [DeviceNode("/dev/nvidia%d" % i, front, i, "file", "frontend") for i in sorted(set(gpu_indexes))]
    for name in control_nodes:
        driver, minor, kind = CONTROL_NODES[name]
        if driver == "frontend":
            major = front
        elif driver in majors:
            major = majors[driver]
        else:
            hint = "nvidia-modprobe -u -c 0" if driver == UVM_NAME else "the driver's %s support" % driver
            raise PassthroughError(
                "/dev/%s needs the %s driver, which is not in /proc/devices: load it (%s) or drop %s "
                "from proxmox_gpu_passthrough_control_nodes" % (name, driver, hint, name)
            )
        nodes.append(DeviceNode("/dev/" + name, major, minor, kind, driver))
    return nodes


def render_block(nodes: list[DeviceNode], cgroup_key: str = CGROUP_KEYS[0], marker: str = DEFAULT_MARKER) -> list[str]:
    """The block, PVE syntax: cgroup allow rules for every node, then one mount entry per node."""
    if cgroup_key not in CGROUP_KEYS:
        raise PassthroughError("cgroup_key must be one of %s, got %r" % (", ".join(CGROUP_KEYS), cgroup_key))
    lines = ["# BEGIN %s" % marker]
    seen = set()
    for node in nodes:
        rule = node.allow_rule()
        if rule not in seen:  # one rule per device even if two nodes share it (nvidia-caps)
            seen.add(rule)
            lines.append("%s: %s" % (cgroup_key, rule))
    lines.extend("lxc.mount.entry: %s" % node.mount_entry() for node in nodes)
    lines.append("# END %s" % marker)
    return lines


def split_sections(text: str) -> tuple[list[str], list[str]]:
    """(main section lines, remaining lines from the first [section] header on)."""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if _SECTION_RE.match(line):
            return lines[:index], lines[index:]
    return lines, []


def _conflicts(line: str, targets: set[str], majors: set[int]) -> bool:
    """Is this main-section line an older configuration of a device the block now owns?"""
    match = _LXC_LINE_RE.match(line)
    if not match:
        return False
    key, value = match.groups()
    if key == "lxc.mount.entry":
        fields = value.split()
        return len(fields) >= 2 and fields[1].strip("/") in targets
    if key in CGROUP_KEYS:
        rule = _ALLOW_RULE_RE.match(value)
        return bool(rule) and int(rule.group(1)) in majors
    return False


def apply_block(text: str, block: list[str], present: bool = True, marker: str = DEFAULT_MARKER) -> BlockEdit:
    """Place (present) or remove (absent) the block in a PVE container config text.

    The block goes at the end of the main section (after its last non-blank line, so the blank
    line PVE keeps before a snapshot header stays), which is also where PVE itself writes lxc.*
    keys: a PVE rewrite of the file then leaves our lines where they were.
    """
    begin, end = "# BEGIN %s" % marker, "# END %s" % marker
    main, sections = split_sections(text)
    targets, majors = set(), set()
    for line in block:
        match = _LXC_LINE_RE.match(line)
        if not match:
            continue
        key, value = match.groups()
        if key == "lxc.mount.entry":
            targets.add(value.split()[1].strip("/"))
        elif key in CGROUP_KEYS:
            rule = _ALLOW_RULE_RE.match(value)
            if rule:
                majors.add(int(rule.group(1)))

    kept: list[str] = []
    removed: list[str] = []
    inside = False
    for line in main:
        stripped = line.strip()
        if stripped == begin:
            inside = True
            continue
        if stripped == end:
            inside = False
            continue
        if inside:
            continue  # our previous block: replaced as a whole
        if present and _conflicts(line, targets, majors):
            removed.append(line)
            continue
        kept.append(line)

    if present:
        last = len(kept)
        while last > 0 and not kept[last - 1].strip():
            last -= 1
        new_main = kept[:last] + list(block) + kept[last:]
    else:
        new_main = kept

    warnings = []
    for line in new_main:
        # PVE 8.2+ native device passthrough would bind the same node a second time.
        if re.match(r"^dev\d+:\s*/dev/nvidia", line):
            warnings.append("main section has a PVE device entry for an NVIDIA node (%s): "
                            "it duplicates the block; remove it with pct set --delete" % line.strip())

    new_lines = new_main + sections
    changed = new_lines != text.splitlines()
    # Unchanged content keeps its exact bytes (a missing final newline is not our business).
    new_text = ("\n".join(new_lines) + ("\n" if new_lines else "")) if changed else text
    return BlockEdit(
        text=new_text,
        changed=changed,
        block=list(block) if present else [],
        removed=removed,
        warnings=warnings,
        snapshot_sections=sum(1 for line in sections if _SECTION_RE.match(line)),
    )
