"""The lab inventory mirrors inventory/sample: same groups, same hosts, every variable the sample
sets (no lab needed: the inventory is written to a scratch state directory)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from labctl import REPO, Lab, LabConfig

STRUCTURAL = ("ansible_connection", "proxmox_vmid", "proxmox_host")


def inventory(path: Path) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    out = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(path), "--list"],
                         capture_output=True, text=True, check=True, env=env, timeout=120).stdout
    return json.loads(out)


def groups(inv: dict) -> dict[str, list[str]]:
    return {name: sorted(body.get("hosts", [])) for name, body in inv.items() if name != "_meta"}


def test_lab_inventory_has_the_sample_groups_hosts_and_variables(tmp_path):
    lab = Lab(LabConfig(state=tmp_path))
    lab._write_inventory()
    sample = inventory(REPO / "inventory" / "sample")
    generated = inventory(lab.inventory_path)

    assert groups(generated) == groups(sample)
    for host, sample_vars in sample["_meta"]["hostvars"].items():
        lab_vars = generated["_meta"]["hostvars"][host]
        missing = sorted(set(sample_vars) - set(lab_vars))
        assert not missing, "%s: the lab inventory lacks %s" % (host, ", ".join(missing))
        for name in STRUCTURAL:
            assert lab_vars.get(name) == sample_vars.get(name), "%s: %s differs" % (host, name)
    assert generated["_meta"]["hostvars"]["ct129"]["ansible_host"] == lab.pve_address
