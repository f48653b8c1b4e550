"""Multi-node SGLang profiles: ranks from the host's place in the group, dist-init-addr from rank 0,
and the errors that stop a bad group before anything starts (server/multinode.py, the render hooks,
the controller-side filter)."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.servelab.serving.plugins.filter.multinode import (
    multinode_nodes,
    multinode_rank_records,
    multinode_steps,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.multinode import (
    NodesError,
    parse_nodes,
    resolve_nodes,
)
from ansible_collections.servelab.serving.plugins.module_utils.server.profiles import ProfileError, resolve_profile
from ansible_collections.servelab.serving.plugins.module_utils.server.render import render_server

GROUPS = {"sglang_nodes": ["gpu-a", "gpu-b", "gpu-c"], "gpu_servers": ["gpu-a"], "empty": []}
ADDRESSES = {"gpu-a": "10.0.0.11", "gpu-b": "10.0.0.12", "gpu-c": "10.0.0.13"}


def resolved(this, **raw):
    return resolve_nodes(dict({"group": "sglang_nodes"}, **raw), this, GROUPS, ADDRESSES)


@pytest.mark.parametrize("this, rank", [("gpu-a", 0), ("gpu-b", 1), ("gpu-c", 2)])
def test_rank_is_the_place_in_the_group_and_dist_init_is_rank_0(this, rank):
    nodes = parse_nodes(resolved(this, port=51000), "profile 'x'")
    assert (nodes.rank, nodes.nnodes, nodes.dist_init_addr) == (rank, 3, "10.0.0.11:51000")


def test_a_host_list_works_like_a_group_and_an_ipv6_address_is_bracketed():
    raw = resolve_nodes({"hosts": ["gpu-b", "gpu-a"]}, "gpu-a", GROUPS, {"gpu-b": "fd00::12"})
    nodes = parse_nodes(raw, "p")
    assert (nodes.rank, nodes.dist_init_addr) == (1, "[fd00::12]:50000")
    assert raw["addresses"] == {"gpu-b": "fd00::12", "gpu-a": "gpu-a"}   # no address: the name


@pytest.mark.parametrize("raw, this, message", [
    ({"group": "sglang_nodez"}, "gpu-a", "nodes.group 'sglang_nodez' is not a group of the inventory"),
    ({"group": "sglang_nodes"}, "gpu-z", "gpu-z is not in group 'sglang_nodes' (gpu-a, gpu-b, gpu-c)"),
    ({"group": "sglang_nodes", "nnodes": 2}, "gpu-a", "nodes.nnodes is 2 but group 'sglang_nodes' has 3 host(s)"),
    ({"group": "gpu_servers"}, "gpu-a", "1 host(s) in the node list; a multi-node profile needs at least 2"),
    ({"group": "empty"}, "gpu-a", "0 host(s)"),
    ({"hosts": ["gpu-a", "gpu-a"]}, "gpu-a", "lists gpu-a more than once"),
    ({"group": "sglang_nodes", "hosts": ["gpu-a", "gpu-b"]}, "gpu-a", "give group or hosts, not both"),
    ({"group": "sglang_nodes", "port": 80}, "gpu-a", "port must be in 1024-65530"),
    ({"grup": "sglang_nodes"}, "gpu-a", "unknown key(s) grup"),
    ({}, "gpu-a", "needs `group`"),
])
def test_bad_groups_are_refused_naming_the_fix(raw, this, message):
    with pytest.raises(NodesError) as err:
        resolve_nodes(raw, this, GROUPS, ADDRESSES)
    assert message in str(err.value)


def test_llm_server_checks_the_resolved_mapping_again():
    with pytest.raises(ProfileError, match=r"group 'sglang_nodes' was not resolved"):
        resolve_profile({"name": "x", "nodes": {"group": "sglang_nodes"}})
    with pytest.raises(ProfileError, match=r"gpu-z is not in nodes.hosts"):
        resolve_profile({"name": "x", "nodes": {"hosts": ["gpu-a", "gpu-b"], "this": "gpu-z"}})
    with pytest.raises(ProfileError, match=r"nnodes is 3 but nodes.hosts has 2"):
        resolve_profile({"name": "x", "nodes": {"hosts": ["gpu-a", "gpu-b"], "this": "gpu-a", "nnodes": 3}})


def sglang(nodes, **profile):
    raw = dict({"name": "big", "model": "/m", "tp": 24, "nodes": nodes}, **profile)
    return render_server(resolve_profile(raw), "sglang", "0.0.0.0", None, "/venv/bin/python",
                         engine_version="0.5.23")


def test_ranks_render_their_own_flags_and_readiness():
    rank0, rank1 = (sglang(resolved(h)) for h in ("gpu-a", "gpu-b"))
    assert rank0.cmd[-6:] == ("--nnodes", "3", "--node-rank", "0", "--dist-init-addr", "10.0.0.11:50000")
    assert rank1.cmd[-6:] == ("--nnodes", "3", "--node-rank", "1", "--dist-init-addr", "10.0.0.11:50000")
    # Rank 0 is ready when it generates; the others when SGLang's stand-in health server is up.
    assert (rank0.ready.path, rank1.ready.path) == ("/health_generate", "/health")
    assert rank0.config_hash != rank1.config_hash


def test_tp_must_split_evenly_over_the_nodes():
    with pytest.raises(ProfileError, match=r"tp 8 is not divisible by the 3 nodes"):
        sglang(resolved("gpu-a"), tp=8)
    with pytest.raises(ProfileError, match=r"nodes needs tp"):
        sglang(resolved("gpu-a"), tp=None)


def test_vllm_refuses_nodes_and_command_gets_placeholders():
    profile = resolve_profile({"name": "big", "model": "/m", "nodes": resolved("gpu-c")})
    with pytest.raises(ProfileError, match=r"rendered for engine sglang only"):
        render_server(profile, "vllm", "0.0.0.0", None, "/venv/bin/python", engine_version="0.33.0")
    command = resolve_profile({"name": "big", "nodes": resolved("gpu-c"),
                               "command": ["srv", "--rank", "{node_rank}", "--of", "{nnodes}", "--init",
                                           "{dist_init_addr}", "--port", "{port}"]})
    spec = render_server(command, "command", "127.0.0.1", 9000, "/venv/bin/python")
    assert spec.cmd == ("srv", "--rank", "2", "--of", "3", "--init", "10.0.0.11:50000", "--port", "9000")
    assert spec.ready.path == "/health"


def test_the_filter_reads_the_inventory_and_names_the_profile():
    hostvars = {"gpu-a": {"ansible_host": "10.0.0.11"}, "gpu-b": {}}
    groups = {"pair": ["gpu-a", "gpu-b"]}
    out = multinode_nodes({"group": "pair"}, "gpu-b", groups, hostvars, 52000, "big")
    assert out == {"group": "pair", "hosts": ["gpu-a", "gpu-b"], "addresses": {"gpu-a": "10.0.0.11", "gpu-b": "gpu-b"},
                   "port": 52000, "nnodes": 2, "this": "gpu-b"}
    with pytest.raises(AnsibleFilterError, match=r"bench_profiles big: nodes.group 'missing' is not a group"):
        multinode_nodes({"group": "missing"}, "gpu-b", groups, hostvars, None, "big")


def test_the_start_sequence_launches_in_rank_order_and_waits_for_rank_0_last():
    nodes = resolved("gpu-b")
    assert [(s["host"], s["rank"], s["wait"]) for s in multinode_steps(nodes)] == [
        ("gpu-a", 0, False), ("gpu-b", 1, False), ("gpu-c", 2, False),
        ("gpu-b", 1, True), ("gpu-c", 2, True), ("gpu-a", 0, True)]
    results = [{"__bench_step": step, "cmdline": "srv --rank %d" % step["rank"], "config_hash": "h%d" % step["rank"],
                "pid": 100 + step["rank"], "ready_seconds": 1.5} for step in multinode_steps(nodes)]
    assert multinode_rank_records(results) == {
        host: {"rank": rank, "cmdline": "srv --rank %d" % rank, "config_hash": "h%d" % rank, "pid": 100 + rank,
               "ready_seconds": 1.5} for rank, host in enumerate(nodes["hosts"])}
