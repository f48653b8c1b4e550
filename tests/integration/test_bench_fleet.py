"""bench.yml over a fleet: two GPU servers benchmarked in parallel from a third, shared bench
client, each host in its own network namespace reached by Ansible over SSH (tests/fleetnet.py).

One run checks what issue 15 asks of a fleet: each server host with its own profile list
(host_vars), the load sent from the client host over the network (the controller cannot reach
the servers' network at all), every result file keyed by host, the report's fleet table (per
host and summed) and the hosts that disagree (gpu-b's simulator runs faster than gpu-a's), and,
with gpu-a's server killed by pid in the middle of its sweep, gpu-b's results whole, the play
failing and naming gpu-a and the task, and nothing of the run left on any host.

Root only (network namespaces, veth links, sshd): skipped otherwise, failed under CI (as
tests/lab is). About a minute: two levels of ~1 s per profile, the simulator at a stated
time_scale.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from playbookproc import PlaybookProcess  # tests/ (conftest.py)
from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import level_verdict
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import read_parts
from fleetnet import SERVERS, FleetNet, FleetNetUnavailable, ensure_sshd  # tests/ (conftest.py)
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSIBLE_PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
RUN_ID = "fleet-run"
LEVELS = [1, 2]
# gpu-b's simulator runs its model 4x faster than gpu-a's: the same profile, hosts that disagree.
SCALE = {"gpu-a": 20, "gpu-b": 80}


def _unlocked_ports(count: int) -> list:
    """Ports no run on this machine holds a lock record for (the lock directory is shared by the
    namespaces, like any machine-wide directory); the servers listen in the namespaces."""
    lock_dir = os.path.join(tempfile.gettempdir(), "servelab-locks")
    taken = set(os.listdir(lock_dir)) if os.path.isdir(lock_dir) else set()
    start = 30100 + os.getpid() % 500 * 2
    return [p for p in range(start, start + 100) if "port-%d.json" % p not in taken][:count]


pytestmark = pytest.mark.slow


def _unavailable(reason: str):
    if os.environ.get("CI"):
        pytest.fail("fleet test prerequisite missing under CI: %s" % reason, pytrace=False)
    pytest.skip(reason)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt("signal %d" % signum)


@pytest.fixture
def fleet_net(tmp_path):
    if os.geteuid() != 0:
        _unavailable("the fleet test needs root (network namespaces, veth links, sshd): run "
                     "`make test-integration` as root")
    try:
        ensure_sshd()
    except FleetNetUnavailable as err:
        _unavailable(str(err))
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    net = FleetNet(tmp_path / "net")
    try:
        yield net.up()
    finally:
        net.down()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        left = net.leftovers()
        assert not left, "fleet teardown left: %s" % "; ".join(left)


def simulator(profile: str, host: str) -> dict:
    return {"name": profile, "simulator": {"profile": profile, "time_scale": SCALE[host]}}


def inventory(net: FleetNet, tmp_path, ports: dict) -> dict:
    state = {h: str(tmp_path / ("state-" + h)) for h in SERVERS}
    servers = {}
    for host in SERVERS:
        servers[host] = dict(
            net.host_vars(host),
            # Reached from the client over the data network only; listening there only.
            bench_target_host=net.data(host), bench_server_bind=net.data(host),
            # The namespaces share one machine: each server its own state directory and port.
            bench_server_port=ports[host], bench_state_dir=state[host],
            bench_profiles=[simulator("baseline", host)])
    # gpu-b's own profile list (host_vars): one more profile than the group's.
    servers["gpu-b"]["bench_profiles"].append(simulator("eagle3", "gpu-b"))
    return {"all": {"children": {
        "gpu_servers": {"hosts": servers, "vars": {
            "bench_client": "client",
            # Only our simulators (both hosts' state directories), never this machine's GPUs.
            "bench_reap_device_glob": str(tmp_path / "no-gpu" / "nvidia*"),
            "bench_reap_patterns": [re.escape(str(tmp_path)) + r"/state-gpu-[ab]/servelab-[^/ ]+/"
                                    r"servelab_simulator\.pyz?"],
            "bench_reap_pattern_scope": "own",
            "bench_concurrency": LEVELS, "bench_level_seconds": 1, "bench_warmup_requests": 1,
            "bench_drain_timeout": 5, "bench_max_tokens": 32, "bench_min_latency_samples": 6,
            "bench_workload": {"kind": "synthetic", "input_tokens": 128, "output_tokens": 32,
                               "count": 8},
        }},
        "bench_clients": {"hosts": {"client": net.host_vars("client")}},
    }}}


class Playbook(PlaybookProcess):
    """ansible-playbook bench.yml in its own process group, its output collected."""

    def __init__(self, tmp_path, net: FleetNet, inv: dict):
        path = tmp_path / "hosts.json"
        path.write_text(json.dumps(inv))
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
                   SERVELAB_RESULTS_ROOT=str(tmp_path / "results"), ANSIBLE_NOCOLOR="1",
                   ANSIBLE_FORCE_COLOR="0", PYTHONUNBUFFERED="1", **net.ssh_env())
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        super().__init__([ANSIBLE_PLAYBOOK, "-i", str(path), "-e", "bench_run_id=" + RUN_ID,
                          os.path.join(REPO, "bench.yml")], env, REPO)


def server_state(tmp_path, host: str, name: str = "servelab-baseline") -> dict:
    return json.loads((tmp_path / ("state-" + host) / name / "state.json").read_text())


start_time = lifetime.running_start_time     # None once gone (an unreaped zombie is gone)


def cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def fleet_rows(summary: str) -> dict:
    """(profile, C) -> {column: cell} of the report's fleet table."""
    table = summary.split("## Fleet: output tok/s per host and summed", 1)[1].split("\n\n")[1]
    lines = [line.strip("|").split(" | ") for line in table.splitlines() if line.startswith("|")]
    header = [h.strip() for h in lines[0]]
    return {(cells[0].strip(), int(cells[1])): dict(zip(header, (c.strip() for c in cells),
                                                        strict=True))
            for cells in lines[2:]}


def figure(cell: str) -> float:
    return float(cell.split(" ± ")[0])


@pytest.mark.root
def test_two_servers_from_one_client_host_and_a_killed_server_costs_only_its_host(
        tmp_path, fleet_net):
    started = time.monotonic()
    ports = dict(zip(SERVERS, _unlocked_ports(2), strict=True))
    run = Playbook(tmp_path, fleet_net, inventory(fleet_net, tmp_path, ports))
    try:
        # Mid-run: gpu-a measures its second level when its server is killed (by pid, with the
        # pid's start time checked: the very process llm_server recorded).
        run.wait_for_line(r"llm_bench gpu-a/baseline C=2: running")
        killed = server_state(tmp_path, "gpu-a")
        assert start_time(killed["pid"]) == killed["start_time"], run.output[-3000:]
        os.kill(killed["pid"], signal.SIGKILL)
        rc = run.wait(300)
    finally:
        run.kill()
    seconds = time.monotonic() - started
    out = run.output
    assert rc != 0, out[-5000:]

    # The play fails naming the host, the profile and the task; gpu-b is not among the failures.
    failure = out.rsplit("Fail the run when a profile did not finish", 1)[-1]
    assert "1 profile(s) did not finish, on gpu-a:" in failure, out[-4000:]
    assert "baseline on gpu-a in 'servelab: sweep baseline'" in failure, out[-4000:]
    assert "on gpu-b" not in failure.split("The report of everything", 1)[0]

    run_dir = tmp_path / "results" / RUN_ID
    rows = {(r["host"], r["profile"], r["concurrency"]): r
            for r, _jsonl in read_parts(str(run_dir / results.PARTS_DIR))}
    # gpu-b: every level of both its profiles (its own list), whole.
    for profile in ("baseline", "eagle3"):
        for c in LEVELS:
            row = rows[("gpu-b", profile, c)]
            assert int(row["errors"]) == 0 and row["output_tok_s"] > 0, row
            assert not level_verdict(row).failed, row
    # gpu-a: its first level whole, the level it was killed in failed or not recorded, no eagle3.
    assert int(rows[("gpu-a", "baseline", 1)]["errors"]) == 0
    cut = rows.get(("gpu-a", "baseline", 2))
    assert cut is None or level_verdict(cut).failed, cut
    assert not any(h == "gpu-a" and p == "eagle3" for h, p, _c in rows)

    # The two baseline sweeps ran at once on the shared client: a level says so (loadgen/cpu.py).
    # At least the other server's: the count is of every sweep on the machine, and the client
    # "host" is this machine, where other tests may sweep at the same time (pytest-xdist).
    shared = [json.loads(path.read_text())["warnings"]
              for path in (run_dir / results.PARTS_DIR).glob("gpu-*__baseline__c*.json")]
    others = [int(m.group(1)) for ws in shared for w in ws
              for m in [re.search(r"ran (\d+) other sweep\(s\) at the same time", w)] if m]
    assert others and max(others) >= 1, shared

    # Keyed by host in every file.
    with open(run_dir / results.LEVELS, newline="") as fh:
        csv_keys = {(r["host"], r["profile"], int(r["concurrency"])) for r in csv.DictReader(fh)}
    assert csv_keys == set(rows)
    with open(run_dir / results.REQUESTS) as fh:
        request_hosts = {json.loads(line)["host"] for line in fh}
    assert request_hosts == {"gpu-a", "gpu-b"}
    levels_json = json.loads((run_dir / "levels.json").read_text())
    assert {(lv["host"], lv["profile"], lv["concurrency"]) for lv in levels_json["levels"]} == set(rows)
    pandas = pytest.importorskip("pandas")
    assert set(pandas.read_parquet(run_dir / "levels.parquet")["host"]) == {"gpu-a", "gpu-b"}
    assert set(pandas.read_parquet(run_dir / "requests.parquet")["host"]) == {"gpu-a", "gpu-b"}
    telemetry = sorted(p.name.split("__")[:2] for p in (run_dir / "telemetry").iterdir())
    assert telemetry == [["gpu-a", "baseline"], ["gpu-b", "baseline"], ["gpu-b", "eagle3"]]
    vllm = {p.name for p in (run_dir / "vllm_sweep").iterdir()}
    assert "SERVE--host=gpu-b-profile=eagle3-BENCH--max_concurrency=2" in vllm
    assert "SERVE--host=gpu-a-profile=baseline-BENCH--max_concurrency=1" in vllm
    manifest = json.loads((run_dir / results.MANIFEST).read_text())
    assert manifest["gpu_servers"] == ["gpu-a", "gpu-b"]
    assert manifest["hosts"]["gpu-b"]["bench"]["profiles"] == ["baseline", "eagle3"]
    assert manifest["hosts"]["gpu-a"]["bench"]["profiles"] == ["baseline"]
    assert {h: manifest["hosts"][h]["bench"]["client"] for h in SERVERS} == {
        "gpu-a": "client", "gpu-b": "client"}
    assert manifest["profiles"]["baseline"]["gpu-a"]["status"] == "failed"
    assert manifest["profiles"]["baseline"]["gpu-b"]["status"] == "finished"
    assert manifest["status"] == "finished" and not (run_dir / "in_flight").exists()

    # The report: per-host tables, the fleet table summed over the hosts, the failed host named,
    # and gpu-b (4x the simulated speed) called out against gpu-a at the level both measured.
    summary = (run_dir / results.SUMMARY).read_text()
    for host in SERVERS:
        assert "## Output tok/s per profile: %s" % host in summary
    assert "gpu-a: baseline failed in 'servelab: sweep baseline'" in summary
    assert "The other hosts' results (gpu-b) are whole." in summary
    fleet = fleet_rows(summary)
    one = fleet[("baseline", 1)]
    assert one["hosts summed"] == "2 of 2"
    total = figure(one["fleet output tok/s ± CI95"])
    assert total == pytest.approx(figure(one["gpu-a"]) + figure(one["gpu-b"]), abs=0.15)
    assert total == pytest.approx(rows[("gpu-a", "baseline", 1)]["output_tok_s"]
                                  + rows[("gpu-b", "baseline", 1)]["output_tok_s"], abs=0.1)
    two = fleet[("baseline", 2)]
    assert two["hosts summed"].startswith("1 of 2: without gpu-a"), two
    assert figure(two["fleet output tok/s ± CI95"]) == pytest.approx(
        rows[("gpu-b", "baseline", 2)]["output_tok_s"], abs=0.1)
    assert fleet[("eagle3", 1)]["gpu-a"] == "(not in its profiles)"
    disagree = summary.split("## Fleet: hosts that disagree", 1)[1].split("\n## ", 1)[0]
    assert "| baseline | gpu-b | gpu-a | 1 |" in disagree, disagree
    assert (run_dir / results.PLOTS_DIR / "fleet.png").is_file()

    # Nothing of the run is left: servers stopped, locks released on both hosts.
    for host in SERVERS:
        for name in ("servelab-baseline",) + (("servelab-eagle3",) if host == "gpu-b" else ()):
            state = server_state(tmp_path, host, name)
            assert start_time(state["pid"]) != state["start_time"], (host, name)
        assert not (tmp_path / ("state-" + host) / "run.lock.json").exists()
        assert not os.path.exists(os.path.join(tempfile.gettempdir(), "servelab-locks",
                                               "port-%d.json" % ports[host]))
    # In the namespaces, only sshd and its sessions (Ansible's persistent connections) remain.
    for host in ("gpu-a", "gpu-b", "client"):
        left = [cmdline(p) for p in fleet_net.netns_pids(host)]
        assert not [c for c in left if c and not c.startswith(("sshd", "/usr/sbin/sshd"))], (
            host, left)
    print("fleet run: %.0f s" % seconds)


def test_two_gpu_servers_on_one_machine_sharing_a_state_dir_and_port_are_refused(tmp_path):
    """Two inventory hosts that are one machine (both local connections) with the same
    bench_state_dir and port: refused at the lock, before a manifest or a server, naming both.
    No root needed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    shared = {"bench_server_port": port, "bench_state_dir": str(tmp_path / "state")}
    profile = [{"name": "baseline", "simulator": {"profile": "baseline", "time_scale": 20}}]
    inv = {"all": {"children": {"gpu_servers": {"hosts": {"gpu-a": {}, "gpu-b": {}}, "vars": dict(
        shared, ansible_connection="local", ansible_python_interpreter=sys.executable,
        bench_profiles=profile, bench_concurrency=[1], bench_reap=False,
        bench_gpu_telemetry=False)}}}}
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(inv))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               SERVELAB_RESULTS_ROOT=str(tmp_path / "results"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    done = subprocess.run([ANSIBLE_PLAYBOOK, "-i", str(path), "-e", "bench_run_id=shared",
                           os.path.join(REPO, "bench.yml")], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300, check=False)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    refusal = re.search(r"bench_lock: run shared refused: ([^\n]*)", out)
    assert refusal, out[-3000:]
    assert "also used by gpu-" in refusal.group(1) and "in this same run" in refusal.group(1)
    assert "bench_state_dir" in refusal.group(1)
    # Nothing started or written: no manifest, no server, no lock left.
    assert not (tmp_path / "results" / "shared" / results.MANIFEST).exists()
    assert not list((tmp_path / "state").glob("servelab-*"))
    assert not (tmp_path / "state" / "run.lock.json").exists()
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), "servelab-locks",
                                           "port-%d.json" % port))
