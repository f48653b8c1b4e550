"""Selection rules of the reaper on synthetic process tables (no processes are touched)."""
from __future__ import annotations

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.proc.devices import DeviceHit
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import ProcInfo, parse_stat
from ansible_collections.servelab.serving.plugins.module_utils.proc.select import (
    DEFAULT_PATTERNS, SelectionPolicy, compile_patterns, select_targets,
)

SELF = 900
ME = 0              # the uid the reap acts for in these tables
OTHER = 1000        # another user


def proc(pid, ppid, cmdline="", comm=None, pgid=None, sid=None, state="S", nspid=(),
         kernel=False, uid=ME):
    return ProcInfo(pid=pid, ppid=ppid, pgid=pgid if pgid is not None else pid,
                    sid=sid if sid is not None else pid, state=state,
                    comm=comm if comm is not None else (cmdline.split() or ["?"])[0][:15],
                    cmdline=cmdline, start_time=pid * 10, nspid=tuple(nspid),
                    kernel_thread=kernel, uid=uid)


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
    kw.setdefault("owner_uid", ME)
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
    sel = select_targets(t, {}, policy(patterns=[r"^sglang::"], pattern_scope="own"))
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
    sel = select_targets(t, {}, policy(patterns=["^launcher$"], pattern_scope="own"))
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
    sel = select_targets(t, {}, policy(patterns=["^launcher$"], pattern_scope="own"))
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


# ---------------------------------------------------------------------------------------------
# pattern_scope: how far a pattern match alone reaches

# executes `vllm serve` (an entry point through its shebang), CPU-only: a match by name alone
VLLM_LOOKALIKE = "/home/u/venv/bin/python3 /home/u/venv/bin/vllm serve /models/q"


def default_policy(**kw):
    return policy(patterns=list(DEFAULT_PATTERNS), **kw)


def test_another_users_lookalike_is_spared_under_own_gpu_and_own():
    t = table(*BASE, proc(100, 1, VLLM_LOOKALIKE, uid=OTHER))
    for scope in ("own_gpu", "own"):
        sel = select_targets(t, {}, default_policy(pattern_scope=scope))
        assert found(sel) == {}, scope
        assert "runs as uid 1000, not as uid 0" in sel.spared[100]
        assert "vllm" in sel.spared[100]                  # the pattern it matched is named
    sel = select_targets(t, {}, default_policy(pattern_scope="any"))
    assert found(sel) == {100: "pattern"}


def test_own_lookalike_without_gpu_or_server_cgroup_is_spared_by_default():
    t = table(*BASE, proc(100, 1, VLLM_LOOKALIKE))
    sel = select_targets(t, {}, default_policy())
    assert found(sel) == {}
    assert "holds no CUDA context and is in no servelab server cgroup" in sel.spared[100]
    sel = select_targets(t, {}, default_policy(pattern_scope="own"))
    assert found(sel) == {100: "pattern"}


def test_own_match_in_a_servelab_server_cgroup_is_taken_by_default():
    # a launcher llm_server started: CPU-only, but in its server's cgroup
    t = table(*BASE, proc(100, 1, "/opt/venv/bin/python3 -m sglang.launch_server --tp 8"))
    sel = select_targets(t, {}, default_policy(
        server_cgroup_members={100: "/sys/fs/cgroup/servelab/servelab-a-1234"}))
    assert found(sel) == {100: "pattern"}
    assert "servelab server cgroup /sys/fs/cgroup/servelab/servelab-a-1234" in \
        sel.targets[100].detail


def test_a_cuda_context_is_a_seed_whoever_owns_it():
    # device seeds keep their rule: another user's CUDA process on the GPU is a GPU user
    t = table(*BASE, proc(100, 1, "sglang::scheduler_TP0", uid=OTHER),
              proc(200, 1, "sglang::scheduler_TP1"))
    sel = select_targets(t, dev(100, 200), default_policy())
    assert found(sel) == {100: "device_fd", 200: "device_fd"}


def test_unknown_owner_spares_every_match_but_under_any():
    t = table(*BASE, proc(100, 1, VLLM_LOOKALIKE))
    sel = select_targets(t, {}, default_policy(owner_uid=None, pattern_scope="own"))
    assert found(sel) == {} and "not as uid None" in sel.spared[100]


def test_a_refused_match_inside_a_targets_tree_is_taken_and_not_listed_as_spared():
    # a CPU-only tokenizer (matches, no GPU) under a GPU worker: it is the worker's child
    t = table(*BASE, proc(100, 1, "sglang::scheduler_TP0"),
              proc(101, 100, "sglang::tokenizer_worker:100", pgid=100, sid=100))
    sel = select_targets(t, dev(100), default_policy())
    assert found(sel) == {100: "device_fd", 101: "descendant"}
    assert 101 not in sel.spared


# ---------------------------------------------------------------------------------------------
# Terminal multiplexers and session managers

def tmux_box():
    """A tmux server started as `tmux new -s srv 'vllm serve ...'` (its command line keeps that;
    comm is 'tmux: server'), with three windows (each a session of its own, led by the pane's
    shell): a vllm server on the GPU with a helper child, and two unrelated sleeps."""
    return table(
        *BASE,
        proc(500, 1, "tmux new -s srv vllm serve /models/q --port 8000", comm="tmux: server"),
        proc(510, 500, "-bash", comm="bash", pgid=510, sid=510),
        proc(511, 510, "/opt/venv/bin/python3 /opt/venv/bin/vllm serve /models/q", comm="vllm",
             pgid=511, sid=510),
        proc(512, 511, "VLLM::EngineCore", pgid=511, sid=510),
        proc(513, 511, "python3 -c resource_tracker", pgid=511, sid=510),
        proc(520, 500, "bash", pgid=520, sid=520),
        proc(521, 520, "sleep 1000", pgid=521, sid=520),
        proc(530, 500, "sleep 2000", pgid=530, sid=530))


def test_a_tmux_server_matched_by_its_command_line_is_never_a_seed():
    t = tmux_box()
    for scope in ("own_gpu", "own", "any"):
        sel = select_targets(t, {}, default_policy(pattern_scope=scope))
        assert 500 not in sel.targets, scope
        assert "terminal multiplexer or session manager (tmux: server)" in sel.spared[500]
        for window in (510, 520, 521, 530):
            assert window not in sel.targets, (scope, window)


def test_a_seed_inside_a_tmux_window_takes_only_its_own_job():
    t = tmux_box()
    sel = select_targets(t, dev(512), default_policy(pattern_scope="own"))
    # the engine (GPU), its launcher by pattern (it leads its job's group), the group's rest;
    # not the pane's login shell (the session leader: a live non-target), nor sibling windows
    assert found(sel) == {512: "device_fd", 511: "pattern", 513: "descendant"}
    # own_gpu: the launcher holds no GPU, so it is not a target, and the group it leads is
    # not grown into (a live non-target leads it); if it quits when its engine dies, the
    # reap reports it (related, as the engine's parent)
    sel = select_targets(t, dev(512), default_policy())
    assert found(sel) == {512: "device_fd"}
    assert "holds no CUDA context" in sel.spared[511]
    assert sel.related[511].found_by == "parent"


def test_descendants_stop_at_a_session_manager():
    # a launcher that started a tmux server (a user's helper script, say): the server and its
    # windows are not the launcher's tree, even though they descend from it
    t = table(*BASE, proc(100, 1, "python serve.py", pgid=100, sid=100),
              proc(101, 100, "sglang::scheduler_TP0", pgid=100, sid=100),
              proc(200, 100, "tmux new -d", comm="tmux: server", pgid=200, sid=200),
              proc(201, 200, "sleep 1000", pgid=201, sid=201),
              proc(300, 100, "-bash", comm="bash", pgid=300, sid=300),
              proc(301, 300, "vim notes", pgid=301, sid=300))
    sel = select_targets(t, dev(100), policy())
    assert found(sel) == {100: "device_fd", 101: "descendant"}
    assert "login shell (-bash)" in sel.never[300]


def test_without_builtin_protection_a_multiplexer_target_still_takes_no_windows():
    t = tmux_box()
    # its argv only names `vllm serve` (not what it executes): a pattern on its own name makes
    # the multiplexer a target
    sel = select_targets(t, {}, policy(patterns=list(DEFAULT_PATTERNS) + ["^tmux: server$"],
                                       pattern_scope="any", builtin_protect=False))
    assert found(sel) == {500: "pattern", 511: "pattern", 512: "pattern", 513: "descendant"}
    for window in (510, 520, 521, 530):
        assert window not in sel.targets


def test_group_led_by_a_shell_in_a_window_is_not_grown_into():
    # `bash -c "vllm serve x; sleep 1000"` in a window: vllm sits in the shell's group
    t = table(*BASE, proc(500, 1, "tmux", comm="tmux: server"),
              proc(510, 500, "bash -c vllm serve x; sleep 1000", comm="bash",
                   pgid=510, sid=510),
              proc(511, 510, "vllm serve x", comm="vllm", pgid=510, sid=510),
              proc(512, 510, "python3 unrelated.py", pgid=510, sid=510))
    # the shell only names `vllm serve` in its -c string (it runs bash): a bystander under
    # every scope, so its group (led by it, alive) is not taken and its other job lives
    for scope in ("own_gpu", "own", "any"):
        sel = select_targets(t, dev(511), default_policy(pattern_scope=scope))
        assert found(sel) == {511: "device_fd"}, scope
        assert "does not execute it (it runs bash -c)" in sel.spared[510], scope


# ---------------------------------------------------------------------------------------------
# related: the non-targets watched for side effects

def test_related_lists_non_targets_tied_to_targets():
    t = table(*BASE, proc(300, 1, "bash run.sh", pgid=300, sid=300),
              proc(301, 300, "python server.py", pgid=300, sid=300),
              proc(302, 301, "python keeper.py --protected", pgid=300, sid=300),
              proc(303, 300, "python preprocess.py", pgid=300, sid=300),
              proc(400, 1, VLLM_LOOKALIKE, uid=OTHER))
    sel = select_targets(t, dev(301), default_policy(protect=["--protected"]))
    assert found(sel) == {301: "device_fd"}
    rel = {pid: c.found_by for pid, c in sel.related.items()}
    assert rel == {302: "descendant", 300: "parent", 303: "process_group", 400: "spared"}
    assert sel.related[302].seed_pid == 301
    assert "not a target: protect pattern --protected" in sel.related[302].detail
    assert SELF not in sel.related and 800 not in sel.related
