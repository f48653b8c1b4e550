"""Every port a run binds on a host is locked with the run and checked free first (issue 26).

What was seen: a derived `router` profile binds bench_server_port + 1 and + 2, but the run lock
held only bench_server_port: a second run on P+1 got its lock, made a run directory and failed
at "Start the server". And a port already held by another process was found only at server
start, after the run directory was made."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.servelab.serving.plugins.module_utils import preflight as target
from ansible_collections.servelab.serving.plugins.module_utils.run import lock
from testports import free_port  # tests/testports.py


@pytest.fixture
def listener():
    """A process of its own listening on a free loopback port: (pid, port)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import socket, sys, time\n"
         "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
         "print(s.getsockname()[1], flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait(30)


def params(port, extra=()):
    return {"state_dir": None, "port": port, "extra_ports": list(extra)}


def test_a_routers_halves_are_locked_with_the_server_port(tmp_path):
    lock_dir = str(tmp_path / "locks")
    port = free_port()
    first = lock.acquire(lock_dir, lock.task_resources(params(port, [port + 1, port + 2]),
                                                       lock_dir),
                         "first-run", lock.Controller.of_pid(os.getpid()))
    assert sorted(r.port for r in first.written) == [port, port + 1, port + 2]
    # a second run on the router's speculative half is refused, nothing written for it
    second = lock.acquire(lock_dir, lock.task_resources(params(port + 1), lock_dir),
                          "second-run", lock.Controller.of_pid(os.getppid()))
    assert [(c.resource, c.holder.run_id) for c in second.conflicts] == [
        ("port:%d" % (port + 1), "first-run")]
    assert second.written == []


def item(port, state_dir, needed_for="the speculative half of the router"):
    return {"variable": "bench_server_port", "port": port, "needed_for": needed_for,
            "state_dir": str(state_dir), "hosts": ["gpu1"], "where": "vars.yml:2"}


def test_a_busy_port_is_refused_naming_the_variable_and_the_holder(tmp_path, listener):
    pid, port = listener
    [problem] = target.run_checks([], [], [], [item(port, tmp_path / "servers")])
    assert problem.message.startswith("bench_server_port: port %d on this host, needed for the "
                                      "speculative half of the router, is already in use by "
                                      "pid %d (" % (port, pid)), problem.message
    assert "stop that process or set bench_server_port to a free port" in problem.message
    assert problem.hosts == ("gpu1",) and problem.where == "vars.yml:2"


def test_a_free_port_and_this_state_dirs_own_leftover_server_pass(tmp_path, listener):
    pid, port = listener
    assert target.run_checks([], [], [], [item(free_port(), tmp_path / "servers")]) == []
    # the listener recorded as a server of the run's state directory: the reap ends it
    server = tmp_path / "servers" / "servelab-baseline"
    server.mkdir(parents=True)
    (server / "state.json").write_text(json.dumps({"pid": pid}))
    assert target.run_checks([], [], [], [item(port, tmp_path / "servers")]) == []


def test_a_multi_node_profiles_other_ranks_have_the_port_checked_on_their_hosts():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_preflight import nodes_host, run  # pylint: disable=import-outside-toplevel
    report = run(nodes_host())
    assert report.problems == []
    ports = {c.host: [(p["port"], p["needed_for"]) for p in c.ports]
             for c in report.target_checks}
    port = nodes_host().values["bench_server_port"]
    assert ports["gpu1"] == [(50000, "the dist-init store of multi-node profile big (rank 0)"),
                             (port, "the server")]
    assert ports["gpu2"] == [(port, "rank 1 of multi-node profile big (nodes)")]


def test_rank_0s_dist_init_port_is_checked_on_rank_0_and_locked_with_the_run():
    """Issue 26: rank 0 binds the dist-init port (bench_dist_init_port, or the profile's
    nodes.port): checked free on rank 0's host, and in rank 0's extra_ports (lock.yml)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_preflight import nodes_host, run  # pylint: disable=import-outside-toplevel
    from ansible_collections.servelab.serving.plugins.filter.multinode import (  # pylint: disable=import-outside-toplevel
        multinode_dist_init_ports,
    )
    report = run(nodes_host(bench_dist_init_port=51000))
    [dist] = [p for c in report.target_checks for p in c.ports if p["port"] == 51000]
    assert dist["variable"] == "bench_dist_init_port" and dist["hosts"] == ["gpu1"]
    report = run(nodes_host(nodes={"group": "pair", "port": 52000}))
    [dist] = [p for c in report.target_checks for p in c.ports if p["port"] == 52000]
    assert dist["variable"] == "bench_profiles[0] (big).nodes.port", dist
    # rank 1's host does not check rank 0's store
    report = run(nodes_host("gpu2"))
    assert not [p for c in report.target_checks for p in c.ports if p["port"] == 50000]

    groups = {"pair": ["gpu1", "gpu2"]}
    profiles = [{"name": "big", "nodes": {"group": "pair"}},
                {"name": "other", "nodes": {"hosts": ["gpu1", "gpu2"], "port": 50100}},
                {"name": "one"}]
    assert multinode_dist_init_ports(profiles, "gpu1", groups, 50000) == [50000, 50100]
    assert multinode_dist_init_ports(profiles, "gpu2", groups, 50000) == []


def test_the_other_ranks_hosts_are_locked_from_rank_0_unless_they_lock_themselves():
    """Issue 26: every rank's state directory and port is locked with the run. A rank host
    outside the play (not a GPU server) is locked by rank 0's host (lock.yml, delegated) and
    released by bench.yml's end; a GPU server of the play takes its own locks."""
    from ansible_collections.servelab.serving.plugins.filter.multinode import (  # pylint: disable=import-outside-toplevel
        multinode_fleet_rank_hosts, multinode_rank_hosts,
    )
    groups = {"pair": ["gpu1", "r1"], "trio": ["gpu1", "r2", "gpu2"]}
    profiles = [{"name": "big", "nodes": {"group": "pair"}},
                {"name": "huge", "nodes": {"group": "trio"}},
                {"name": "far", "engine": "external", "nodes": {"group": "pair"}},
                {"name": "listed", "nodes": {"hosts": ["gpu1", "r1", "r3"]}},
                {"name": "one"}]
    assert multinode_rank_hosts(profiles, "gpu1", groups) == ["r1", "r2", "gpu2", "r3"]
    assert multinode_rank_hosts(profiles, "gpu1", groups, ["gpu1", "gpu2"]) == ["r1", "r2", "r3"]
    assert multinode_rank_hosts(profiles, "gpu2", groups, ["gpu1", "gpu2"]) == []   # not rank 0
    hostvars = {"gpu1": {"bench_profiles": profiles}, "gpu2": {}, "r2": {"bench_state_dir": "/srv/r2"},
                "gpu3": {"bench_profiles": [{"name": "x", "nodes": {"hosts": ["gpu3", "r1", "r4"]}}],
                         "bench_state_dir": "/srv/gpu3"}}
    assert multinode_fleet_rank_hosts(["gpu1", "gpu2", "gpu3"], hostvars, groups, "/srv/default") == [
        {"host": "r1", "state_dir": "/srv/default"}, {"host": "r2", "state_dir": "/srv/r2"},
        {"host": "r3", "state_dir": "/srv/default"}, {"host": "r1", "state_dir": "/srv/gpu3"},
        {"host": "r4", "state_dir": "/srv/gpu3"}]
