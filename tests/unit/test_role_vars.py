"""Unknown role variables (plugins/plugin_utils/role_vars.py, action role_vars_check): a misspelled
`cuda_toolkit_verison` is refused with the close match, before upgrade-cuda.yml touches any host."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ansible_collections.servelab.serving.plugins.plugin_utils import role_vars

REPO = Path(__file__).resolve().parents[2]
ROLES = ("proxmox_gpu_passthrough", "cuda_toolkit", "sglang")
VARS_FILE = REPO / "playbooks" / "vars" / "role_variables.yml"


def _checked():
    spec = yaml.safe_load(VARS_FILE.read_text())
    elsewhere = spec["_servelab_variables_elsewhere"]
    roles = [role_vars.load_role(r, elsewhere=elsewhere) for r in spec["_servelab_checked_roles"]]
    roles += [role_vars.RoleVariables(p, (), tuple(sorted(elsewhere.items()))) for p in spec["_servelab_checked_prefixes"]]
    return roles


def test_the_known_names_come_from_every_entry_point_and_the_defaults():
    cuda = role_vars.load_role("cuda_toolkit")
    assert "cuda_toolkit_version" in cuda.known and "cuda_toolkit_repo_url" in cuda.known
    assert not [n for n in cuda.known if not n.startswith("cuda_toolkit_")]
    assert "sglang_venv" in role_vars.load_role("sglang").known


@pytest.mark.parametrize("typo, role, near", [
    ("cuda_toolkit_verison", "cuda_toolkit", "cuda_toolkit_version"),
    ("sglang_torch_verison", "sglang", "sglang_torch_version"),
    ("proxmox_gpu_passthrough_vmid", "proxmox_gpu_passthrough", "proxmox_gpu_passthrough_vmids"),
    ("gpu_stack_seriall", "gpu_stack", "gpu_stack_serial"),
])
def test_a_typo_is_named_with_the_close_match(typo, role, near):
    found = role_vars.unknown_variables([typo, "cuda_toolkit_version", "bench_x", "ansible_host"], _checked(),
                                        host="ct129", origins={typo: "inventory/x.yml:3"})
    assert [(f.name, f.role, f.suggestion) for f in found] == [(typo, role, near)]
    assert found[0].message == "%s: unknown variable; did you mean %s? (set in inventory/x.yml:3)" % (typo, near)
    text = role_vars.failure_message(found)
    assert "Nothing was changed" in text and "[ct129]" in text


def test_a_name_far_from_any_option_says_what_to_do():
    found = role_vars.unknown_variables(["sglang_my_helper_list"], _checked())
    assert found[0].suggestion is None
    assert "roles/sglang/meta/argument_specs.yml declares no such option" in found[0].message
    assert "without the sglang_ prefix" in found[0].message


def test_names_set_elsewhere_and_other_prefixes_pass():
    names = ["cuda_toolkit_env", "gpu_stack_serial", "gpu_stack_failed_task", "bench_profiles", "proxmox_vmid",
             "proxmox_host", "sglang_version"]
    assert role_vars.unknown_variables(names, _checked()) == []


def test_the_longest_prefix_owns_a_name():
    roles = [role_vars.RoleVariables("a", ("a_x",)), role_vars.RoleVariables("a_b", ("a_b_y",))]
    assert [f.role for f in role_vars.unknown_variables(["a_b_z", "a_q"], roles)] == ["a_b", "a"]


def test_a_role_without_an_argument_spec_is_an_error(tmp_path):
    (tmp_path / "r" / "defaults").mkdir(parents=True)
    with pytest.raises(ValueError, match="has no .*argument_specs.yml"):
        role_vars.load_role("r", roles_dir=str(tmp_path))


def test_the_shipped_inventories_use_only_known_names():
    names = set()
    for path in list((REPO / "inventory").rglob("*.yml")):
        doc = yaml.safe_load(path.read_text()) or {}
        stack = [doc]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                names.update(str(k) for k in item)
                stack.extend(item.values())
    assert role_vars.unknown_variables(names, _checked()) == []


def _first_play(tmp_path, extra: dict):
    """upgrade-cuda.yml against the sample inventory, limited to localhost: only its first play (on the
    controller) runs, the others have no host; the sample's addresses are never reached."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    extra_file = tmp_path / "extra.json"
    extra_file.write_text(json.dumps(extra))
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(REPO / "inventory" / "sample"),
                           "--limit", "localhost", "-e", "@%s" % extra_file, str(REPO / "upgrade-cuda.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_upgrade_cuda_refuses_a_typo_in_its_first_play(tmp_path):
    run = _first_play(tmp_path, {"cuda_toolkit_verison": "13.0.9"})
    assert run.returncode != 0, run.stdout[-3000:]
    out = run.stdout
    assert "cuda_toolkit_verison: unknown variable; did you mean cuda_toolkit_version?" in out, out[-3000:]
    assert "Nothing was changed" in out
    assert "Check gpu_stack_serial" not in out, "the run must stop at the check"


def test_upgrade_cuda_first_play_passes_known_names(tmp_path):
    run = _first_play(tmp_path, {"cuda_toolkit_version": "13.0.1", "gpu_stack_serial": 1})
    assert run.returncode == 0, run.stdout[-3000:]
    assert "TASK [Check gpu_stack_serial and gpu_stack_max_fail_percentage]" in run.stdout
