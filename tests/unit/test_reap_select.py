"""Selection rules of the reaper on synthetic process tables (no processes are touched)."""
from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import DeviceHit
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import ProcInfo, parse_stat
from ansible_collections.servelab.serving.plugins.module_utils.proc.select import (
    DEFAULT_PATTERNS, SelectionPolicy, compile_patterns, select_targets,
)

SELF = 900


def proc(pid, ppid, cmdline="", comm=None, pgid=None, sid=None, state="S", nspid=(),
         kernel=False):
    return ProcInfo(pid=pid, ppid=ppid, pgid=pgid if pgid is not None else pid,
                    sid=sid if sid is not None else pid, state=state,
                    comm=comm if comm is not None else (cmdline.split() or ["?"])[0][:15],
                    cmdline=cmdline, start_time=pid * 10, nspid=tuple(nspid),
                    kernel_thread=kernel)


def table(*procs):
    return {p.pid: p for p in procs}


BASE = (
    proc(1, 0, "/sbin/init", comm="systemd"),
    proc(2, 0, "", comm="kthreadd", kernel=True),
    proc(50, 1, "sshd: /usr/sbin/sshd -D", comm="sshd"),
    proc(800, 50, "bash -c python3 module", comm="bash", sid=800, pgid=800),
    proc(SELF, 800, "python3 module", comm="python3", sid=800, pgid=800),
)


def policy(**kw):
    kw.setdefault("self_pid", SELF)
    for key in ("patterns", "protect"):
        if key in kw:
            kw[key] = compile_patterns(key, kw[key])
    return SelectionPolicy(**kw)


def dev(*pids):
    return {p: DeviceHit("device_fd", ["/dev/nvidia0"]) for p in pids}


def found(sel):
    return {pid: c.found_by for pid, c in sel.targets.items()}


@pytest.mark.parametrize("title", [
    "sglang::scheduler_TP0", "sglang::scheduler_DP1_TP3", "sglang::detokenizer",
    "sglang::gpu_worker_TP2_PP0", "sglang::async_draft_runner(gpu=3)",
    "/opt/sglang/venv/bin/python3 -m sglang.launch_server --model-path /models/x --tp 8",
    "/opt/sglang/venv/bin/sglang serve --model-path /models/x",
    "VLLM::EngineCore", "VLLM::EngineCore_DP0", "VLLM::Worker_TP1", "VLLM::APIServer_0",
    "VllmWorker TP0", "/usr/bin/vllm serve Qwen/Qwen3",
    "python -m vllm.entrypoints.openai.api_server",
])
def test_default_patterns_match_worker_titles(title):
    pats = compile_patterns("patterns", DEFAULT_PATTERNS)
    assert any(p.search(title) for p in pats), title


@pytest.mark.parametrize("cmdline", [
    "vim sglang/launch_server.py", "tail -f /var/log/sglang.launch_server.log",
    "python3 my_vllm_tools.py", "grep sglang::scheduler", "less vllm_serve_notes.md",
])
def test_default_patterns_leave_lookalikes_alone(cmdline):
    pats = compile_patterns("patterns", DEFAULT_PATTERNS)
    assert not any(p.search(cmdline) for p in pats), cmdline


def test_comm_is_matched_too():
    # setproctitle also sets comm (cut to 15 chars); the cmdline can be anything
    t = table(*BASE, proc(100, 1, "python3 -c spawn_main", comm="sglang::schedul"))
    sel = select_targets(t, {}, policy(patterns=[r"^sglang::"]))
    assert found(sel) == {100: "pattern"}


def test_descendants_of_a_device_holder():
    t = table(*BASE, proc(100, 1, "python server.py"),
              proc(101, 100, "python worker", pgid=100, sid=100),
              proc(102, 101, "python helper", pgid=100, sid=100))
    sel = select_targets(t, dev(100), policy())
    assert found(sel) == {100: "device_fd", 101: "descendant", 102: "descendant"}
    assert sel.targets[102].seed_pid == 100


def test_orphans_reparented_to_init_are_found_through_their_dead_launchers_group():
    # launcher 100 died; its workers (one on the GPU, one CPU-only) were reparented to init
    t = table(*BASE, proc(101, 1, "sglang::scheduler_TP0", pgid=100, sid=100),
              proc(102, 1, "python3 -c resource_tracker", pgid=100, sid=100))
    sel = select_targets(t, dev(101), policy())
    assert found(sel) == {101: "device_fd", 102: "process_group"}


def test_group_and_session_led_by_a_target_are_taken():
    t = table(*BASE, proc(100, 1, "launcher", pgid=100, sid=100),
              proc(110, 1, "reparented worker", pgid=100, sid=100),
              proc(120, 1, "other group, same session", pgid=120, sid=100))
    sel = select_targets(t, {}, policy(patterns=["^launcher$"]))
    assert found(sel) == {100: "pattern", 110: "process_group", 120: "session"}


def test_group_of_a_live_non_target_leader_is_left_alone():
    # `bash run.sh` runs the server in its group next to an unrelated job: the shell is alive
    # and not a target, so its group is not ours to take
    t = table(*BASE, proc(300, 1, "bash run.sh", pgid=300, sid=300),
              proc(301, 300, "python server.py", pgid=300, sid=300),
              proc(302, 300, "python preprocess.py", pgid=300, sid=300))
    sel = select_targets(t, dev(301), policy())
    assert found(sel) == {301: "device_fd"}


def test_leaderless_session_alone_does_not_pull_in_other_groups():
    # an SSH login ended; two nohup jobs in their own groups stay in the leaderless session
    t = table(*BASE, proc(401, 1, "python server.py", pgid=401, sid=400),
              proc(402, 1, "python etl.py", pgid=402, sid=400))
    sel = select_targets(t, dev(401), policy())
    assert found(sel) == {401: "device_fd"}


def test_protect_spares_the_process_and_its_descendants():
    t = table(*BASE, proc(100, 1, "jupyter-lab"), proc(101, 100, "ipykernel", pgid=100, sid=100),
              proc(200, 1, "python train.py"))
    sel = select_targets(t, dev(101, 200), policy(protect=["jupyter"]))
    assert found(sel) == {200: "device_fd"}
    assert "descendant of protected 100" in sel.spared[101]


def test_protect_pids():
    t = table(*BASE, proc(100, 1, "python a.py"), proc(200, 1, "python b.py"))
    sel = select_targets(t, dev(100, 200), policy(protect_pids=[200]))
    assert found(sel) == {100: "device_fd"}
    assert sel.spared[200] == "protect_pids"


def test_builtin_protection_covers_the_daemon_not_what_runs_under_it():
    t = table(*BASE, proc(60, 1, "/usr/bin/nvidia-persistenced --user nvidia",
                          comm="nvidia-persistenced"),
              proc(70, 50, "sshd: root@pts/0", comm="sshd"),
              proc(71, 70, "python gpu_job.py", pgid=71, sid=71))
    sel = select_targets(t, dev(60, 71), policy())
    assert found(sel) == {71: "device_fd"}
    assert "built-in" in sel.spared[60]
    sel = select_targets(t, dev(60, 71), policy(builtin_protect=False))
    assert set(found(sel)) == {60, 71}


def test_ansible_processes_are_protected():
    t = table(*BASE, proc(500, 1, "/usr/bin/python3 /usr/bin/ansible-playbook bench.yml",
                          comm="ansible-playboo"),
              proc(510, 1, "/usr/bin/python3 /root/.ansible/tmp/x/AnsiballZ_command.py"))
    sel = select_targets(t, {}, policy(patterns=["python3"]))
    assert found(sel) == {}


def test_self_and_ancestors_never_even_when_matching_or_holding():
    t = table(*BASE, proc(100, 1, "python3 other"))
    sel = select_targets(t, dev(SELF, 800, 100), policy(patterns=["python3", "bash"],
                                                        builtin_protect=False))
    assert found(sel) == {100: "device_fd"}
    assert SELF not in sel.targets and 800 not in sel.targets and 50 not in sel.targets
    assert sel.spared[SELF] == "the reaper itself"


def test_expansion_never_reaches_our_ancestry():
    # the reaper runs from a shell that sits in the server's session (started from it, then
    # reparented): the session is taken, the reaper's chain is not
    t = table(proc(1, 0, "/sbin/init"), proc(100, 1, "launcher", pgid=100, sid=100),
              proc(800, 1, "bash", pgid=800, sid=100),
              proc(SELF, 800, "python3 module", pgid=800, sid=100),
              proc(101, 100, "worker", pgid=100, sid=100))
    sel = select_targets(t, {}, policy(patterns=["^launcher$"]))
    assert found(sel) == {100: "pattern", 101: "descendant"}


def test_inits_kernel_threads_and_zombies_are_never_targets():
    t = table(*BASE, proc(3000, 2999, "/sbin/init", nspid=(3000, 1)),
              proc(3001, 3000, "python server.py", nspid=(3001, 57)),
              proc(3002, 1, "", comm="sglang::schedul", state="Z"),
              proc(3, 2, "", comm="sglang::fake", kernel=True))
    sel = select_targets(t, dev(3000, 3001), policy(patterns=["^sglang::"]))
    assert found(sel) == {3001: "device_fd"}
    assert "pid namespace" in sel.spared[3000]


def test_scope_restricts_candidates():
    t = table(*BASE, proc(100, 1, "python a"), proc(101, 100, "python a-child", pgid=100),
              proc(200, 1, "python b"))
    sel = select_targets(t, dev(100, 200), policy(scope={100}))
    assert found(sel) == {100: "device_fd"}


def test_cgroup_members_are_seeds():
    t = table(*BASE, proc(100, 1, "python server"), proc(101, 1, "python escapee", sid=101))
    sel = select_targets(t, {}, policy(cgroup_members={100: "/cg/s", 101: "/cg/s"}))
    assert found(sel) == {100: "cgroup", 101: "cgroup"}


def test_later_rounds_take_what_appeared_in_reaped_groups():
    t = table(*BASE, proc(150, 1, "forked while dying", pgid=100, sid=100))
    sel = select_targets(t, {}, policy(owned_groups={100}, exclude={100}))
    assert found(sel) == {150: "process_group"}


def test_bad_regex_names_the_option():
    with pytest.raises(ValueError, match=r"protect: '\(' is not a valid regular expression"):
        compile_patterns("protect", ["("])


def test_parse_stat_with_spaces_and_parens_in_comm():
    fields = parse_stat(
        "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0")
    assert fields.comm == "a) b (c" and fields.state == "S"
    assert fields.ppid == 1 and fields.pgid == 4242 and fields.start_time == 12345
