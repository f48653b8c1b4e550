"""The preflight's rules for a GPU server benchmarked from a bench client on another machine
(plugins/plugin_utils/preflight/fleet.py, through the preflight package): the target
address and the server's bind address must not be loopback there, and the message names the
host, its client and the fix. The playbook end of it is tests/integration/test_bench_fleet.py."""
from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.plugin_utils.preflight import fleet as fleet_checks
from ansible_collections.servelab.serving.plugins.plugin_utils import preflight as pf

from test_preflight import OPTIONS, host, texts


def run(*inputs):
    return pf.run_preflight(list(inputs), OPTIONS, ["localhost", "gpu1", "gpu2", "client1"])


@pytest.mark.parametrize("address,loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("LOCALHOST", True), ("10.78.0.2", False), ("0.0.0.0", False), ("gpu1.example", False),
    ("", False)])
def test_loopback_addresses(address, loopback):
    assert fleet_checks.is_loopback(address) is loopback


def test_same_machine_is_the_same_name_or_two_local_connections():
    conn = {"localhost": "local", "gpu-a": "local", "gpu-b": "ssh", "client1": None}.get
    assert fleet_checks.same_machine("gpu-b", "gpu-b", conn)
    assert fleet_checks.same_machine("gpu-a", "localhost", conn)
    assert not fleet_checks.same_machine("gpu-b", "localhost", conn)
    assert not fleet_checks.same_machine("gpu-a", "client1", conn)


def test_a_remote_client_with_the_loopback_defaults_is_refused_naming_host_client_and_fix():
    inp = host("gpu1", bench_client="client1")
    inp.client_is_local = False
    report = run(inp)
    assert [p.variable for p in report.problems] == ["bench_target_host", "bench_server_bind"]
    target, bind = texts(report)
    assert "127.0.0.1 is a loopback address, but gpu1 is benchmarked from client1" in target
    assert "Set bench_target_host to gpu1's address as client1 reaches it" in target
    assert target.endswith("[gpu1]")
    assert "listen on its own loopback only" in bind and "0.0.0.0" in bind


def test_a_reachable_setup_passes_and_so_does_a_client_on_the_same_machine():
    remote = host("gpu1", bench_client="client1", bench_target_host="10.78.0.2",
                  bench_server_bind="0.0.0.0")
    remote.client_is_local = False
    local = host("gpu2")                     # loopback defaults, client on the same machine
    local.client_is_local = True
    report = run(remote, local)
    assert report.ok, texts(report)


def test_only_the_bind_address_when_the_target_is_right():
    inp = host("gpu1", bench_client="client1", bench_target_host="10.78.0.2")
    inp.client_is_local = False
    assert [p.variable for p in run(inp).problems] == ["bench_server_bind"]


def test_a_host_of_external_profiles_only_starts_no_server_here():
    inp = host("gpu1", bench_client="client1",
               bench_profiles=[{"name": "prod", "engine": "external",
                                "base_url": "http://10.0.0.5:8000"}])
    inp.client_is_local = False
    assert run(inp).ok, texts(run(inp))
