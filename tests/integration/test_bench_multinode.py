"""bench.yml with a multi-node profile: two ranks on loopback (node-a 127.0.0.1 in gpu_servers, node-b
127.0.0.2 outside it, one inventory group `pair`), through the `command` engine with a stand-in
rank (tests/data/sglang/fake_multinode_rank.py: rank 0 hosts the dist-init store and generates only
once every rank joined, as SGLang; rank 1 joins it and serves /health). Rank 1 is killed during the
sweep: the profile's always-section must still stop every rank, rank 0 first, and leave nothing.
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import threading
import time

import ansible_runner
import pytest
import yaml
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime
from ansible_collections.servelab.serving.plugins.module_utils.run import lock
from simproc import simulator_script  # tests/ (conftest.py puts it on sys.path)
from testports import free_port as _free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
FAKE_RANK = os.path.join(REPO, "tests", "data", "sglang", "fake_multinode_rank.py")

pytestmark = pytest.mark.slow


def _inventory(tmp_path, host_vars=None) -> str:
    path = tmp_path / "inventory.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}
    node_a = dict(local, ansible_host="127.0.0.1", bench_state_dir=str(tmp_path / "servers-a"),
                  **(host_vars or {}).get("node-a", {}))
    node_b = dict(local, ansible_host="127.0.0.2", bench_server_bind="127.0.0.2",
                  bench_state_dir=str(tmp_path / "servers-b"), **(host_vars or {}).get("node-b", {}))
    path.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_servers": {"hosts": {"node-a": node_a}},
        "bench_clients": {"hosts": {"localhost": local}},
        "pair": {"hosts": {"node-a": {}, "node-b": node_b}},
    }}}))
    return str(path)


def _kill_rank_1_during_the_sweep(results_root, events_file, done, killed):
    """When the ranks are recorded ready (the manifest's `nodes`, written just before the sweep),
    SIGKILL rank 1, as a host that dies under load."""
    while not done.is_set():
        for manifest in glob.glob(os.path.join(str(results_root), "*", "manifest.json")):
            try:
                text = open(manifest).read()
            except OSError:
                continue
            if '"nodes"' in text and os.path.exists(events_file):
                pids = re.findall(r"rank=1 launched pid=(\d+)", open(events_file).read())
                if pids:
                    time.sleep(0.5)  # into the sweep
                    os.kill(int(pids[0]), signal.SIGKILL)
                    killed.append(int(pids[0]))
                    return
        time.sleep(0.1)


def test_ranks_start_in_order_serve_from_rank_0_and_stop_together(tmp_path):
    events_file = str(tmp_path / "rank-events.log")
    port = _free_port()
    profile = {
        "name": "pair", "engine": "command", "nodes": {"group": "pair", "nnodes": 2},
        "command": ["{python}", FAKE_RANK, "--host", "{host}", "--port", "{port}",
                    "--node-rank", "{node_rank}", "--nnodes", "{nnodes}", "--dist-init-addr", "{dist_init_addr}",
                    "--events", events_file, "--simulator", simulator_script(),
                    "--profile", "baseline", "--time-scale", "10", "--model-name", "{model}"],
    }
    extravars = {
        "bench_profiles": [profile], "bench_concurrency": [1, 2], "bench_level_seconds": 2,
        "bench_warmup_requests": 1, "bench_server_port": port, "bench_dist_init_port": _free_port(),
        "bench_server_ready_timeout": 60, "bench_reap": False, "bench_gpu_telemetry": False,
        "bench_workload": {"kind": "synthetic", "input_tokens": 64, "output_tokens": 32, "count": 8},
        "bench_max_tokens": 32,
    }
    env = {"PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
           "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "SERVELAB_RESULTS_ROOT": str(tmp_path / "results")}
    (tmp_path / "runner").mkdir()
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_rank_1_during_the_sweep,
                              args=(tmp_path / "results", events_file, done, killed), daemon=True)
    killer.start()
    try:
        r = ansible_runner.run(private_data_dir=str(tmp_path / "runner"), project_dir=REPO,
                               playbook=os.path.join(REPO, "bench.yml"), inventory=_inventory(tmp_path),
                               extravars=extravars, envvars=env, quiet=True, timeout=600)
    finally:
        done.set()
        killer.join(5)
    out = r.stdout.read()
    events = open(events_file).read().splitlines()
    pids = {int(rank): int(pid) for rank, pid in re.findall(r"rank=(\d) launched pid=(\d+)", "\n".join(events))}
    try:
        assert r.rc == 0, out[-5000:]
        assert killed, "rank 1 was never seen ready: the kill did not happen\n" + "\n".join(events)

        def at(pattern):
            return next(i for i, line in enumerate(events) if re.search(pattern, line))

        # Rank order: rank 0 launched first; it served only once rank 1 had joined its store.
        assert at(r"rank=0 launched") < at(r"rank=1 launched") < at(r"rank=1 joined")
        assert at(r"rank=1 joined") < at(r"rank=0 all 2 ranks joined; serving"), events

        # The start loop: both launched (rank order), then rank 1 ready, then rank 0 ready.
        starts = [e["event_data"]["res"]["__bench_step"] for e in r.events
                  if e.get("event") == "runner_item_on_ok" and e["event_data"].get("task", "").startswith(
                      "Start the ranks in rank order, then wait for them, rank 0 last - pair")]
        assert [(s["host"], s["wait"]) for s in starts] == [
            ("node-a", False), ("node-b", False), ("node-b", True), ("node-a", True)]

        # Stopped together although rank 1 had died: every rank's stop ran, rank 0 first.
        stops = [e["event_data"]["res"]["__bench_node"] for e in r.events
                 if e.get("event") == "runner_item_on_ok"
                 and e["event_data"].get("task") == "Stop every rank, rank 0 first - pair"]
        assert stops == ["node-a", "node-b"], out[-3000:]
        deadline = time.monotonic() + 10
        while any(lifetime.is_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in pids.values() if lifetime.is_alive(pid)], "a rank survived the stop"

        # The sweep measured rank 0; the manifest records what each rank ran.
        manifest = json.load(open(glob.glob(str(tmp_path / "results" / "*" / "manifest.json"))[0]))
        record = manifest["profiles"]["pair"]["node-a"]
        assert record["status"] == "finished", record
        assert {host: node["rank"] for host, node in record["nodes"].items()} == {"node-a": 0, "node-b": 1}
        assert "--node-rank 1" in record["nodes"]["node-b"]["cmdline"]
        assert "--dist-init-addr 127.0.0.1:%d" % extravars["bench_dist_init_port"] in record["cmdline"]
    finally:
        for pid in pids.values():
            if lifetime.is_alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# Issue 26: every port the ranks bind is checked free before anything starts.


def _pair_vars():
    port, dist = _free_port(), _free_port()
    profile = {"name": "pair", "engine": "command", "nodes": {"group": "pair", "nnodes": 2},
               "command": ["{python}", FAKE_RANK, "--host", "{host}", "--port", "{port}",
                           "--node-rank", "{node_rank}", "--nnodes", "{nnodes}",
                           "--dist-init-addr", "{dist_init_addr}", "--simulator", simulator_script(),
                           "--profile", "baseline", "--model-name", "{model}"]}
    extravars = {"bench_profiles": [profile], "bench_concurrency": [1], "bench_level_seconds": 1,
                 "bench_server_port": port, "bench_dist_init_port": dist, "bench_reap": False,
                 "bench_gpu_telemetry": False}
    return extravars


def _run_pair(tmp_path, extravars, host_vars=None):
    env = {"PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
           "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "SERVELAB_RESULTS_ROOT": str(tmp_path / "results")}
    (tmp_path / "runner").mkdir()
    return ansible_runner.run(private_data_dir=str(tmp_path / "runner"), project_dir=REPO,
                              playbook=os.path.join(REPO, "bench.yml"),
                              inventory=_inventory(tmp_path, host_vars),
                              extravars=extravars, envvars=env, quiet=True, timeout=600)


def _run_pair_while_held(tmp_path, extravars, resources, failed_event):
    """bench.yml with the pair profile while this test (a live controller) holds `resources` for
    a run "first-run": returns (output, {failed task: its message}) of the refused run."""
    first = lock.acquire(lock.default_lock_dir(), resources, "first-run", lock.Controller.of_pid(os.getpid()))
    assert first.written
    try:
        r = _run_pair(tmp_path, extravars)
    finally:
        for record in first.written:
            os.remove(record.path)
    out = r.stdout.read()
    assert r.rc != 0, out[-3000:]
    failed = {e["event_data"].get("task"): e["event_data"]["res"].get("msg", "")
              for e in r.events if e.get("event") == failed_event}
    started = [e["event_data"].get("task") for e in r.events if e.get("event") == "runner_on_ok"]
    assert not [t for t in started if t and t.startswith("Start the ranks")]
    return out, failed


def _refused_run(tmp_path, held_address, which):
    """bench.yml with the pair profile while a socket of this test listens on `held_address`
    (which: the port extravar to listen on): returns (runner, extravars)."""
    extravars = _pair_vars()
    with socket.socket() as held:
        held.bind((held_address, extravars[which]))
        held.listen()
        r = _run_pair(tmp_path, extravars)
    return r, extravars


def _assert_refused_before_anything_started(tmp_path, r, variable, port, host):
    out = r.stdout.read()
    assert r.rc != 0, out[-3000:]
    assert "%s: port %d on this host, needed for" % (variable, port) in out, out[-3000:]
    # named: the process holding it, and the host it is held on
    assert "pid %d (" % os.getpid() in out and "bench preflight on %s:" % host in out, out[-3000:]
    started = [e["event_data"].get("task") for e in r.events if e.get("event") == "runner_on_ok"]
    assert not [t for t in started if t and t.startswith(("Start the ranks", "Lock the run"))]
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_a_held_port_on_a_rank_outside_gpu_servers_is_refused_before_anything_starts(tmp_path):
    # node-b (rank 1, not a GPU server) binds bench_server_port on 127.0.0.2.
    r, extravars = _refused_run(tmp_path, "127.0.0.2", "bench_server_port")
    _assert_refused_before_anything_started(tmp_path, r, "bench_server_port",
                                            extravars["bench_server_port"], "node-b")


def test_a_held_dist_init_port_on_rank_0_is_refused_before_anything_starts(tmp_path):
    r, extravars = _refused_run(tmp_path, "127.0.0.1", "bench_dist_init_port")
    _assert_refused_before_anything_started(tmp_path, r, "bench_dist_init_port",
                                            extravars["bench_dist_init_port"], "node-a")


def test_a_second_run_on_rank_0s_dist_init_port_is_refused_by_the_run_lock(tmp_path):
    """The dist-init port is locked with rank 0's run (lock.yml extra_ports): a run that holds
    it (here this test, a live controller) refuses a second one at its lock, before any rank."""
    extravars = _pair_vars()
    out, failed = _run_pair_while_held(tmp_path, extravars, lock.task_resources(
        {"state_dir": None, "port": extravars["bench_dist_init_port"], "extra_ports": []},
        lock.default_lock_dir()), "runner_on_failed")
    msg = failed.get("Hold the server state directory and port for this run", "")
    assert ("port %d on node-a (the multi-node dist-init port, bench_dist_init_port) is in use by run "
            "first-run" % extravars["bench_dist_init_port"]) in msg, (failed, out[-3000:])
    assert "server port %d" % extravars["bench_dist_init_port"] not in msg
    assert "bench_dist_init_port" in msg.rsplit("give this run another", 1)[-1]


def test_a_second_run_on_a_rank_hosts_state_directory_is_refused_and_a_run_releases_it(tmp_path):
    """Every rank's state directory and port is locked with the run (lock.yml: node-b, outside
    gpu_servers, is locked from its rank 0 in its own name): a run that holds node-b's state
    directory (this test, a live controller) refuses a second one before any rank starts, naming
    node-b; once it is free, the run locks it, and releases it at its end."""
    extravars = _pair_vars()
    # This run measures: a fast simulator and a small workload (as the first test's).
    extravars["bench_profiles"][0]["command"] += ["--events", str(tmp_path / "rank-events.log"),
                                                  "--time-scale", "10"]
    extravars.update(bench_warmup_requests=1, bench_max_tokens=32, bench_workload={
        "kind": "synthetic", "input_tokens": 64, "output_tokens": 32, "count": 8})
    state_b = str(tmp_path / "servers-b")
    os.makedirs(state_b)
    out, failed = _run_pair_while_held(tmp_path, extravars, [lock.state_dir_resource(state_b)],
                                       "runner_item_on_failed")
    msg = failed.get("Hold the other ranks' state directory and port on their hosts", "")
    assert "the server state directory %s on node-b is in use by run first-run" % os.path.realpath(state_b) in msg, (
        failed, out[-3000:])

    # Free: the next run takes node-b's lock (its record names node-b) and leaves none behind.
    seen = []
    (tmp_path / "runner").rename(tmp_path / "runner-refused")
    done = threading.Event()

    def watch():
        path = os.path.join(os.path.realpath(state_b), lock.STATE_DIR_LOCK)
        while not done.is_set():
            try:
                seen.append(json.load(open(path)))
                return
            except (OSError, ValueError):
                time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        r = _run_pair(tmp_path, extravars)
    finally:
        done.set()
        watcher.join(5)
    assert r.rc == 0, r.stdout.read()[-3000:]
    assert seen and seen[0]["inventory_host"] == "node-b", seen
    assert not os.path.exists(os.path.join(os.path.realpath(state_b), lock.STATE_DIR_LOCK))


def test_an_interrupt_cleans_up_the_rank_outside_gpu_servers_and_releases_its_lock(tmp_path):
    """Ctrl-C during the sweep of the pair profile: the interrupt cleanup (bench_interrupted.yml)
    stops every rank, also node-b's (not a GPU server: locked from its rank 0), and releases
    node-b's lock, so nothing of the run holds that state directory afterwards."""
    import sys  # pylint: disable=import-outside-toplevel

    from playbookproc import PlaybookProcess  # pylint: disable=import-outside-toplevel
    events_file = tmp_path / "rank-events.log"
    extravars = _pair_vars()
    extravars["bench_profiles"][0]["command"] += ["--events", str(events_file), "--time-scale", "10"]
    extravars.update(bench_run_id="pair-interrupted", bench_level_seconds=30, bench_warmup_requests=1,
                     bench_max_tokens=32, bench_workload={"kind": "synthetic", "input_tokens": 64,
                                                          "output_tokens": 32, "count": 8})
    varsfile = tmp_path / "vars.json"
    varsfile.write_text(json.dumps(extravars))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               SERVELAB_RESULTS_ROOT=str(tmp_path / "results"), PYTHONUNBUFFERED="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    run = PlaybookProcess([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
                           "-i", _inventory(tmp_path), "-e", "@%s" % varsfile,
                           os.path.join(REPO, "bench.yml")], env, REPO)
    state_b = os.path.realpath(str(tmp_path / "servers-b"))
    try:
        run.wait_for_line(r"llm_bench node-a/pair C=1: running", timeout=300)
        assert os.path.exists(os.path.join(state_b, lock.STATE_DIR_LOCK)), run.output[-3000:]
        os.killpg(run.proc.pid, signal.SIGINT)
        rc = run.wait(300)
    finally:
        run.kill()
    assert rc != 0, run.output[-3000:]
    events = events_file.read_text()
    pids = {int(rank): int(pid) for rank, pid in re.findall(r"rank=(\d) launched pid=(\d+)", events)}
    assert sorted(pids) == [0, 1], events
    assert not [pid for pid in pids.values() if lifetime.is_alive(pid)], events
    assert not os.path.exists(os.path.join(state_b, lock.STATE_DIR_LOCK)), run.output[-3000:]
    manifest = json.loads((tmp_path / "results" / "pair-interrupted" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted", run.output[-3000:]


# ---------------------------------------------------------------------------------------------
# The other ranks' hosts are reaped too: a zombie there would hold the GPUs the rank needs.


def test_a_zombie_on_a_rank_host_outside_gpu_servers_is_reaped_before_the_ranks_start(tmp_path):
    """node-b (rank 1, not a GPU server: its rank 0 locked it) holds a stale server: a python
    running a script its own host_vars' pattern names. The reap from rank 0 takes it before any
    rank starts, with node-b's settings (node-a's pattern names something else), spares a `tail`
    of the same file, and runs again after the ranks stopped."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    stale_dir = tmp_path / "stale-b"
    stale_dir.mkdir()
    stale = stale_dir / "stale_rank.py"
    stale.write_text("import time\ntime.sleep(600)\n")
    no_gpu = str(tmp_path / "no-gpu" / "nvidia*")

    def reap_vars(directory):
        return {"bench_reap_patterns": [re.escape(str(directory)) + r"/[^/ ]+\.py"],
                "bench_reap_pattern_scope": "own", "bench_reap_device_glob": no_gpu,
                "bench_reap_grace": 5}

    host_vars = {"node-a": reap_vars(tmp_path / "stale-a"), "node-b": reap_vars(stale_dir)}
    extravars = _pair_vars()
    extravars["bench_profiles"][0]["command"] += ["--events", str(tmp_path / "rank-events.log"),
                                                  "--time-scale", "10"]
    extravars.update(bench_reap=True, bench_warmup_requests=1, bench_max_tokens=32, bench_workload={
        "kind": "synthetic", "input_tokens": 64, "output_tokens": 32, "count": 8})
    zombie = subprocess.Popen([sys.executable, str(stale)], start_new_session=True)
    tail = subprocess.Popen(["tail", "-f", str(stale)], stdout=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        r = _run_pair(tmp_path, extravars, host_vars)
        out = r.stdout.read()
        assert r.rc == 0, out[-3000:]
        zombie.wait(timeout=30)          # taken (a signal), not left to run out
        assert zombie.returncode < 0, zombie.returncode
        assert tail.poll() is None, "the tail only names the file: a bystander"

        def reaped(when):
            return {e["event_data"]["res"]["__bench_rank_lock"]["__bench_rank_host"]:
                    [k["pid"] for k in e["event_data"]["res"].get("killed", [])]
                    for e in r.events if e.get("event") == "runner_item_on_ok"
                    and e["event_data"].get("task") == (
                        "Reap GPU zombies on the other ranks' hosts - %s pair" % when)}

        assert reaped("before") == {"node-b": [zombie.pid]}, out[-3000:]
        assert reaped("after") == {"node-b": []}, out[-3000:]
        tasks = [e["event_data"].get("task") for e in r.events if e.get("event") == "runner_on_start"]
        reap_at = tasks.index("Reap GPU zombies on the other ranks' hosts - before pair")
        start_at = tasks.index("Start the ranks in rank order, then wait for them, rank 0 last - pair")
        assert reap_at < start_at, tasks
    finally:
        for proc in (zombie, tail):
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
