"""A GPU container (gpu_servers): the passed-through nodes are there with the host's majors, the
user-space driver matches the host's, and every server llm_server recorded as running is alive and
listening (skipped where none was started). The CUDA toolkit and the venv are checked by
test_gpu_stack.py from the cuda_toolkit / sglang roles' local facts.
"""
from __future__ import annotations

import json
import shlex

import pytest

from hostcheck import driver_version, main_section, nvidia_mounts, proxmox_host_of, pve_container_config, setting, stat_nodes

GROUP = "gpu_servers"

# One command in the container: llm_server's state files (plugins/module_utils/server/state.py)
# and, for each, whether its PID still is that process (start time) and its port answers.
SERVER_PROBE = r"""
import glob, json, os, socket
out = []
for path in glob.glob(os.path.expanduser("~/.servelab/servers/*/state.json")):
    with open(path) as handle:
        state = json.load(handle)
    alive = False
    try:
        with open("/proc/%s/stat" % state.get("pid")) as handle:
            alive = int(handle.read().rsplit(")", 1)[1].split()[19]) == state.get("start_time")
    except (OSError, ValueError, IndexError):
        pass
    try:
        socket.create_connection((state.get("probe_host") or "127.0.0.1", state["port"]), timeout=5).close()
        listening = True
    except OSError:
        listening = False
    out.append(dict(state, alive=alive, listening=listening, name=state.get("name", path)))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def pve(request, in_group):
    pve_host = proxmox_host_of(request, in_group)
    return pve_host, pve_host.ansible.get_variables()


@pytest.fixture(scope="module")
def passed_nodes(in_group, pve):
    """(path, major, minor) on the Proxmox host of every node file its config binds into this container."""
    pve_host, pve_vars = pve
    main = main_section(pve_container_config(pve_host, pve_vars, in_group["proxmox_vmid"]))
    paths = [source for source, _target, options in nvidia_mounts(main) if "create=file" in options]
    if not paths:
        pytest.fail("no /dev/nvidia* mount entries for container %s on its Proxmox host" % in_group["proxmox_vmid"])
    return dict(stat_nodes(pve_host, paths)), paths


def test_device_nodes_match_the_host(host, passed_nodes):
    on_host, paths = passed_nodes
    inside = stat_nodes(host, paths)
    missing = sorted(set(paths) - set(inside))
    assert not missing, "missing in the container: %s" % ", ".join(missing)
    for path in paths:
        assert inside[path] == on_host[path], "%s: container %s, host %s" % (path, inside[path], on_host[path])


def test_user_space_driver_matches_the_host(host, pve, passed_nodes):
    pve_host, pve_vars = pve
    host_version = driver_version(pve_host.file(setting(pve_vars, "proxmox_gpu_passthrough_driver_version_file")).content_string)
    smi = setting(pve_vars, "proxmox_gpu_passthrough_container_nvidia_smi")
    result = host.run("%s --query-gpu=driver_version --format=csv,noheader" % smi)
    assert result.rc == 0, "nvidia-smi in the container failed: %s %s" % (result.stdout, result.stderr)
    versions = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    gpus = [path for path in passed_nodes[1] if path[len("/dev/nvidia"):].isdigit()]
    assert versions == [host_version] * len(gpus), \
        "container sees %s, host driver %s with %d GPU(s)" % (versions, host_version, len(gpus))


def test_recorded_servers_are_serving(host):
    servers = json.loads(host.run("python3 -c %s" % shlex.quote(SERVER_PROBE)).stdout or "[]")
    if not servers:
        pytest.skip("no llm_server state (~/.servelab/servers/*/state.json): no server was started here")
    for server in servers:
        if server["status"] != "running":
            continue
        assert server["alive"], "%s: recorded PID %s is gone (or was reused)" % (server["name"], server["pid"])
        assert server["listening"], "%s: nothing answers on %s:%s" % (server["name"], server["probe_host"], server["port"])
