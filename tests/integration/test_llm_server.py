"""llm_server's logic end to end: real processes, real HTTP on 127.0.0.1, real state files.

The server is tests/data/sglang/fake_openai_server.py (it listens early, dies, double-forks or
logs SGLang's lines on request). Each test stops what it started through the manager and then
kills any leftover by PID, even when it fails.
"""
import os
import signal
import socket
import sys
import textwrap
import time
import uuid

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import read_process
from ansible_collections.servelab.serving.plugins.module_utils.server import ports as server_ports, state as server_state
from ansible_collections.servelab.serving.plugins.module_utils.server import simulator_file
from ansible_collections.servelab.serving.plugins.module_utils.server.manager import ServerError, ServerRequest, run
from testports import free_port  # tests/testports.py

# The fast tier (make test) runs this module too: see pyproject.toml's markers.
pytestmark = pytest.mark.core

FAKE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "data", "sglang",
                                    "fake_openai_server.py"))


@pytest.fixture
def lab(tmp_path):
    """Start servers with `lab.run(...)`; everything is stopped and killed by PID afterwards."""

    class Lab:
        state_dir = str(tmp_path / "servers")
        names = set()
        pid_files = []
        pids = set()

        def request(self, name, **kw):
            kw.setdefault("state_dir", self.state_dir)
            kw.setdefault("ready_timeout", 120)
            kw.setdefault("stop_grace", 5)
            kw.setdefault("port_timeout", 10)
            self.names.add(name)
            return ServerRequest(name=name, **kw)

        def run(self, name, **kw):
            result = run(self.request(name, **kw))
            if result.pid:
                self.pids.add(result.pid)
            return result

    lab = Lab()
    yield lab
    for name in lab.names:
        state = server_state.load(lab.state_dir, name)
        if state and state.pid:
            lab.pids.add(state.pid)
        try:
            run(ServerRequest(name=name, state="stopped", state_dir=lab.state_dir, stop_grace=2,
                              port_timeout=2))
        except ServerError:
            pass
    for pid_file in lab.pid_files:
        try:
            lab.pids.add(int(open(pid_file).read()))
        except (OSError, ValueError):
            pass
    for pid in lab.pids:
        if lifetime.is_alive(pid):
            os.kill(pid, signal.SIGKILL)


def fake_profile(name="p", *args, model="m"):
    return {"name": name, "model": model,
            "command": [sys.executable, FAKE, "--host", "{host}", "--port", "{port}",
                        "--served-model-name", "{model}", *args]}


def unique(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_started_is_idempotent_and_a_config_change_restarts(lab):
    name, port = unique("idem"), free_port()
    first = lab.run(name, engine="command", port=port, profile=fake_profile())
    assert (first.changed, first.action) == (True, "started")
    state = server_state.load(lab.state_dir, name)
    assert state.cmd == first.cmd and state.config_hash == first.config_hash
    assert state.pid == first.pid and state.status == "running"
    assert first.base_url == f"http://127.0.0.1:{port}" and first.model == "m"

    again = lab.run(name, engine="command", port=port, profile=fake_profile())
    assert (again.changed, again.action, again.pid) == (False, "unchanged", first.pid)

    changed = lab.run(name, engine="command", port=port, profile=fake_profile(model="other"))
    assert (changed.changed, changed.action) == (True, "restarted")
    assert "config changed" in changed.reason and changed.config_hash != first.config_hash
    assert changed.pid != first.pid and lifetime.is_alive(changed.pid)
    assert not lifetime.is_alive(first.pid)
    assert first.pid in {k["pid"] for k in changed.stopped["killed"]}
    assert os.path.exists(changed.log_path + ".1")          # the first run's log is kept


def test_a_server_that_stopped_generating_is_restarted(lab):
    """Up (process alive, port open) but not serving: the same config is not "unchanged"."""
    name, port = unique("sick"), free_port()
    profile = fake_profile("sick", "--generations", "1")
    first = lab.run(name, engine="command", port=port, profile=profile)
    again = lab.run(name, engine="command", port=port, profile=profile, probe_timeout=2)
    assert (again.changed, again.action) == (True, "restarted")
    assert "not ready" in again.reason and "HTTP 503" in again.reason
    assert again.pid != first.pid and not lifetime.is_alive(first.pid)


def test_a_dead_server_is_started_again(lab):
    name, port = unique("dead"), free_port()
    first = lab.run(name, engine="command", port=port, profile=fake_profile())
    os.kill(first.pid, signal.SIGKILL)
    assert lifetime.wait_until_gone([first.pid], timeout=30) == set()
    again = lab.run(name, engine="command", port=port, profile=fake_profile())
    assert (again.changed, again.action) == (True, "started")
    assert f"pid {first.pid}) is gone" in again.reason and again.pid != first.pid


def test_readiness_waits_for_a_generation_not_for_the_open_port(lab):
    """The server listens at once and refuses generation for 2 s, like an engine loading."""
    name, port = unique("late"), free_port()
    result = lab.run(name, engine="command", port=port,
                     profile=fake_profile("late", "--listen-early", "2"))
    log = open(result.log_path).read().splitlines()
    refused = [i for i, line in enumerate(log) if line.startswith("refused /v1/completions 503")]
    generated = [i for i, line in enumerate(log) if line.startswith("generated /v1/completions")]
    assert refused, "the port was open but generation refused: the probe must have seen that"
    assert generated and generated[0] > refused[-1]


def test_a_server_that_dies_fails_fast_with_its_log_tail(lab):
    name, port = unique("dies"), free_port()
    profile = fake_profile("dies", "--listen-early", "600", "--exit-after", "0.5",
                           "--exit-code", "3")
    t0 = time.monotonic()
    with pytest.raises(ServerError) as err:
        lab.run(name, engine="command", port=port, profile=profile, ready_timeout=600)
    assert time.monotonic() - t0 < 300      # far from the 600 s timeout: it did not wait for it
    assert err.value.details["exit_code"] == 3
    assert "exited with status 3" in err.value.msg
    assert "FATAL: CUDA out of memory (fake)" in err.value.msg
    assert "FATAL: CUDA out of memory (fake)" in err.value.details["log_tail"]
    assert server_state.load(lab.state_dir, name).status == "stopped"


def test_a_stop_that_fails_after_a_failed_start_keeps_the_log_tail(lab, monkeypatch):
    # CI saw a failed start whose stop failed too (its port seen held): the stop's error replaced
    # the start's, and the log saying why the server died was lost. Injected here: the port check
    # after the stop says the port is still held.
    from ansible_collections.servelab.serving.plugins.module_utils.server import manager
    monkeypatch.setattr(manager, "_wait_port_free", lambda port, timeout: False)
    name, port = unique("dies"), free_port()
    profile = fake_profile("dies", "--exit-after", "0.3", "--exit-code", "3")
    with pytest.raises(ServerError) as err:
        lab.run(name, engine="command", port=port, profile=profile)
    assert "exited with status 3" in err.value.msg
    assert "stopping it failed too" in err.value.msg and "still in use" in err.value.msg
    assert "FATAL: CUDA out of memory (fake)" in err.value.details["log_tail"]
    assert err.value.details["exit_code"] == 3
    assert "still in use" in err.value.details["stopped"]["error"]


def test_a_server_not_ready_in_time_is_stopped_and_the_port_freed(lab):
    name, port = unique("slow"), free_port()
    with pytest.raises(ServerError) as err:
        lab.run(name, engine="command", port=port,
                profile=fake_profile("slow", "--listen-early", "600"), ready_timeout=2)
    assert "not ready after 2 s" in err.value.msg and "HTTP 503" in err.value.msg
    stopped = err.value.details["stopped"]
    assert stopped["killed"] and stopped["port_free"] is True
    assert not server_ports.is_listening(port)


def test_stop_kills_a_tree_with_a_double_forked_child_and_frees_the_port(lab, tmp_path):
    name, port = unique("tree"), free_port()
    pid_file = str(tmp_path / "daemon.pid")
    lab.pid_files.append(pid_file)
    started = lab.run(name, engine="command", port=port,
                      profile=fake_profile("tree", "--double-fork", pid_file))
    daemon = int(open(pid_file).read())
    info = read_process(daemon)
    assert info.sid != started.pid and info.pgid != started.pid    # escaped session and group

    stopped = lab.run(name, state="stopped")
    assert (stopped.changed, stopped.action) == (True, "stopped")
    assert {started.pid, daemon} <= {k["pid"] for k in stopped.stopped["killed"]}
    assert not lifetime.is_alive(daemon) and not lifetime.is_alive(started.pid)
    assert stopped.stopped["port_free"] and not server_ports.is_listening(port)
    assert server_state.load(lab.state_dir, name).status == "stopped"

    again = lab.run(name, state="stopped")
    assert (again.changed, again.action) == (False, "unchanged")
    assert lab.run(unique("never"), state="stopped").action == "absent"


def test_check_mode_reports_and_touches_nothing(lab):
    name, port = unique("check"), free_port()
    would = lab.run(name, engine="command", port=port, profile=fake_profile(), check_mode=True)
    assert (would.changed, would.action, would.pid) == (True, "would_start", None)
    assert would.cmd and not server_ports.is_listening(port)
    assert not os.path.exists(os.path.join(lab.state_dir, name))

    started = lab.run(name, engine="command", port=port, profile=fake_profile())
    same = lab.run(name, engine="command", port=port, profile=fake_profile(), check_mode=True)
    assert (same.changed, same.action) == (False, "unchanged")
    other = lab.run(name, engine="command", port=port, profile=fake_profile(model="x"),
                    check_mode=True)
    assert (other.changed, other.action) == (True, "would_restart")
    stop = lab.run(name, state="stopped", check_mode=True)
    assert (stop.changed, stop.action) == (True, "would_stop")
    assert started.pid in {p["pid"] for p in stop.stopped["would_kill"]}
    assert lifetime.is_alive(started.pid)                 # still serving
    assert server_state.load(lab.state_dir, name).config_hash == started.config_hash


def test_a_foreign_listener_on_the_port_is_refused_before_launch(lab):
    name = unique("busy")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ServerError) as err:
            lab.run(name, engine="command", port=port, profile=fake_profile())
    assert f"port {port} is already in use by pid {os.getpid()}" in err.value.msg
    assert server_state.load(lab.state_dir, name) is None


def test_bad_profile_fails_before_anything_is_touched(lab):
    name = unique("bad")
    with pytest.raises(ServerError) as err:
        lab.run(name, engine="command", port=free_port(), profile={"name": "x", "tpp": 1})
    assert "unknown key(s) tpp" in err.value.msg
    assert not os.path.exists(os.path.join(lab.state_dir, name))


def test_env_is_passed_and_recorded(lab):
    name, port = unique("env"), free_port()
    profile = dict(fake_profile(), env={"PROFILE_VAR": "p"})
    result = lab.run(name, engine="command", port=port, profile=profile,
                     env={"CUDA_HOME": "/usr/local/cuda-13.0"})
    assert result.env == {"CUDA_HOME": "/usr/local/cuda-13.0", "PROFILE_VAR": "p"}
    environ = open(f"/proc/{result.pid}/environ", "rb").read().split(b"\0")
    assert b"CUDA_HOME=/usr/local/cuda-13.0" in environ and b"PROFILE_VAR=p" in environ


def test_simulator_engine_runs_the_materialised_zipapp(lab):
    """A stand-in zipapp (the fake server as its __main__.py) in place of the simulator's: the
    mechanism is the same (tests/unit/test_simulator_file.py runs the real one)."""
    name, port = unique("sim"), free_port()
    source = open(FAKE).read()
    archive = simulator_file.build_archive({"__main__.py": source})
    profile = {"base": "eagle3", "tp": 8, "simulator": {"profile": "eagle3", "time_scale": 20}}
    result = lab.run(name, engine="simulator", port=port, profile=profile,
                     simulator_archive=archive)
    script = os.path.join(lab.state_dir, name, "servelab_simulator.pyz")
    assert open(script, "rb").read() == archive
    assert result.cmd[:2] == [sys.executable, script]
    assert {"--profile", "eagle3", "--time-scale", "20"} <= set(result.cmd)
    assert set(result.ignored_keys) == {"tp", "speculative", "enable_metrics"}
    assert "generated /health_generate" in open(result.log_path).read()

    same = lab.run(name, engine="simulator", port=port, profile=profile, simulator_archive=archive)
    assert same.changed is False
    newer_archive = simulator_file.build_archive({"__main__.py": source + "\n# a newer simulator\n"})
    newer = lab.run(name, engine="simulator", port=port, profile=profile,
                    simulator_archive=newer_archive)
    assert newer.action == "restarted" and open(script, "rb").read() == newer_archive


FAKE_SGLANG_FLAGS = ("--model-path", "--host", "--port", "--tp-size", "--speculative-algorithm",
                     "--speculative-draft-model-path", "--speculative-num-steps",
                     "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                     "--flashinfer-allreduce-fusion-backend", "--enable-metrics")
FAKE_SGLANG_ARGS = "def add_cli_args(parser):\n" + "".join(
    f"    parser.add_argument({flag!r})\n" for flag in FAKE_SGLANG_FLAGS) + (
    "    parser.add_argument('--enable-flashinfer-allreduce-fusion', action='store_true',\n"
    "                        help='(Deprecated: use --flashinfer-allreduce-fusion-backend=auto)')\n")
FAKE_LAUNCH_SERVER = '''
import runpy, sys
if "--flashinfer-allreduce-fusion-backend" in sys.argv:
    print("[TP0] FlashInfer workspace preflight probe failed (fake). Skipping allreduce fusion.",
          flush=True)
    print("[TP1] FlashInfer workspace preflight probe failed (fake). Skipping allreduce fusion.",
          flush=True)
sys.argv = [{fake!r}] + sys.argv[1:]
runpy.run_path({fake!r}, run_name="__main__")
'''


@pytest.fixture
def fake_sglang(tmp_path):
    """A python whose `sglang` is 0.5.23 with a small server_args.py and a launch_server that
    runs the fake server: version detection, flag check and log scan run for real on it."""
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "__init__.py").write_text("")
    (site / "sglang" / "srt" / "server_args.py").write_text(FAKE_SGLANG_ARGS)
    (site / "sglang" / "srt" / "environ.py").write_text("")
    (site / "sglang" / "launch_server.py").write_text(FAKE_LAUNCH_SERVER.format(fake=FAKE))
    dist = site / "sglang-0.5.23.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    python = tmp_path / "python"
    python.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        PYTHONPATH={site} exec {sys.executable} "$@"
        """))
    python.chmod(0o755)
    return str(python)


def test_sglang_engine_version_flag_check_and_skipped_features(lab, fake_sglang):
    name, port = unique("sgl"), free_port()
    profile = {"base": "eagle3", "model": "/models/t", "tp": 2,
               "flashinfer_allreduce_fusion": True,
               "speculative": {"draft_model_path": "/models/d"}}
    result = lab.run(name, engine="sglang", port=port, python=fake_sglang, profile=profile)
    assert result.engine_version == "0.5.23"                       # read from the installed one
    assert result.cmd[:3] == [fake_sglang, "-m", "sglang.launch_server"]
    assert result.cmd[result.cmd.index("--flashinfer-allreduce-fusion-backend") + 1] == "auto"
    assert len(result.features_skipped) == 1
    assert result.features_skipped[0].startswith("flashinfer_allreduce_fusion: [TP0]")
    assert result.features_skipped[0].endswith("(x2)")


def test_sglang_flags_the_installed_release_lacks_fail_before_launch(lab, fake_sglang):
    name, port = unique("sglbad"), free_port()
    profile = {"name": "b", "model": "/models/t", "extra_args": ["--no-such-flag", "1"]}
    with pytest.raises(ServerError) as err:
        lab.run(name, engine="sglang", port=port, python=fake_sglang, profile=profile)
    assert "rejects the rendered command" in err.value.msg and "--no-such-flag" in err.value.msg
    assert not server_ports.is_listening(port)
    assert server_state.load(lab.state_dir, name) is None


def test_an_engine_version_other_than_the_installed_one_is_refused(lab, fake_sglang):
    with pytest.raises(ServerError) as err:
        lab.run(unique("sglver"), engine="sglang", port=free_port(), python=fake_sglang,
                engine_version="0.5.13.post1", profile={"name": "b", "model": "/m"})
    assert "engine_version is 0.5.13.post1 but" in err.value.msg and "0.5.23" in err.value.msg


def test_same_name_in_two_state_dirs_are_two_servers(lab, tmp_path):
    """Instance names are unique per state directory only; the cgroup is machine-wide. Stopping
    one must not kill the other (it did when the cgroup was named after the instance alone)."""
    name, port = unique("twin"), free_port()
    first = lab.run(name, engine="command", port=port, profile=fake_profile())
    other_dir = str(tmp_path / "other-servers")
    second = run(lab.request(name, engine="command", port=free_port(), profile=fake_profile(),
                             state_dir=other_dir))
    lab.pids.add(second.pid)
    try:
        if first.cgroup and second.cgroup:
            assert first.cgroup != second.cgroup
        stopped = run(lab.request(name, state="stopped", state_dir=other_dir))
        assert stopped.changed and not lifetime.is_alive(second.pid)
        assert lifetime.is_alive(first.pid), "stopping a namesake killed this server"
        again = lab.run(name, engine="command", port=port, profile=fake_profile())
        assert (again.changed, again.action) == (False, "unchanged")
    finally:
        try:
            run(lab.request(name, state="stopped", state_dir=other_dir))
        except ServerError:
            pass


def test_wait_false_launches_and_a_later_call_waits_for_it(lab):
    """The ranks of a multi-node profile: launched without waiting, then waited for."""
    name, port = unique("nowait"), free_port()
    profile = fake_profile("nowait", "--listen-early", "2")
    launched = lab.run(name, engine="command", port=port, profile=profile, wait=False)
    assert (launched.changed, launched.action, launched.ready_seconds) == (True, "started", None)
    assert "not waited for" in launched.reason and lifetime.is_alive(launched.pid)
    waited = lab.run(name, engine="command", port=port, profile=profile)
    assert (waited.changed, waited.action, waited.pid) == (False, "unchanged", launched.pid)
    assert waited.ready_seconds >= 1.5     # counted from the launch: it refused for 2 s
    assert server_state.load(lab.state_dir, name).ready_seconds == waited.ready_seconds


def test_a_rank_that_is_not_ready_fails_and_is_not_restarted_alone(lab):
    name, port = unique("rank"), free_port()
    profile = dict(fake_profile("rank", "--listen-early", "600"),
                   nodes={"hosts": ["a", "b"], "this": "b", "addresses": {"a": "127.0.0.1"}, "port": 50000})
    launched = lab.run(name, engine="command", port=port, profile=profile, wait=False)
    with pytest.raises(ServerError) as err:
        lab.run(name, engine="command", port=port, profile=profile, ready_timeout=2)
    assert "rank of a multi-node profile" in err.value.msg and "not restarted alone" in err.value.msg
    state = server_state.load(lab.state_dir, name)
    # Rank 1's readiness is SGLang's stand-in GET /health (the fake has none: 404).
    assert state.ready["path"] == "/health" and "HTTP 404" in err.value.msg
    assert state.pid == launched.pid and lifetime.is_alive(launched.pid), "it must not have been restarted"
