"""A reaper pattern matches what a process executes, never a process that only names it.

What was seen (issue 26): with the local inventory's pattern
`<state_dir>/servelab-[^/ ]+/servelab_simulator\\.py` and pattern_scope `own`, the reaper SIGTERMed
`bash -c "<python> <state_dir>/servelab-child/servelab_simulator.py; sleep 900"` and
`tail -f <state_dir>/servelab-baseline/servelab_simulator.py` as `found_by: pattern`, and
`--check` selected the tail too.

The simulator runs as `<python> <state_dir>/<name>/servelab_simulator.pyz` (a zipapp); a server
started by an earlier release runs `.../servelab_simulator.py` and must still be found.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_reap_helpers import wait_until  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.gpu.reap import ReapOptions, reap  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.executes import executed  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.lifetime import is_alive  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.proc.select import (  # noqa: E402
    DEFAULT_PATTERNS, SelectionPolicy, compile_patterns, select_targets,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import ProcInfo  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.server.simulator_file import (  # noqa: E402
    LEGACY_SCRIPT_NAME, SCRIPT_NAME, build_archive,
)

SELF = 900
STATE = "/srv/results/.servers"
SIM = STATE + "/servelab-baseline/" + SCRIPT_NAME
LEGACY_SIM = STATE + "/servelab-baseline/" + LEGACY_SCRIPT_NAME
INVENTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "inventory",
                         "local", "group_vars", "all.yml")


def inventory_sim_pattern(state_dir: str) -> str:
    """The local inventory's bench_reap_patterns entry, as Jinja's regex_escape renders it."""
    with open(INVENTORY, encoding="utf-8") as fh:
        (entry,) = yaml.safe_load(fh)["bench_reap_patterns"]
    return entry.replace("{{ bench_state_dir | regex_escape }}", re.escape(state_dir))


SIM_PATTERN = inventory_sim_pattern(STATE)


@pytest.mark.parametrize("cmdline, view", [
    ("/usr/bin/python3 %s --port 30123" % SIM, "/usr/bin/python3 " + SIM),
    ("python3 -u -X dev -W ignore %s --port 1" % SIM, "python3 -u -X dev -W ignore " + SIM),
    ("/venv/bin/python3 -m sglang.launch_server --tp 8", "/venv/bin/python3 -m sglang.launch_server"),
    ("/venv/bin/python3 /venv/bin/vllm serve /models/q", "/venv/bin/python3 /venv/bin/vllm serve"),
    ("/venv/bin/sglang serve --model-path /m", "/venv/bin/sglang serve"),
    ("sglang::scheduler_TP0", "sglang::scheduler_TP0"),
    ("python3 -c import time; time.sleep(9) %s" % SIM, "python3 -c"),
    ("bash -c python3 %s; sleep 900" % SIM, "bash -c"),
    ("bash -ec python3 %s" % SIM, "bash -ec"),
    ("bash -o pipefail run.sh %s" % SIM, "bash -o pipefail run.sh"),
    ("tail -f " + SIM, "tail"),
    ("tail " + SIM, "tail"),
    ("vim servelab_simulator.py", "vim"),
    ("grep -r vllm serve notes", "grep"),
    ("less " + SIM, "less"),
])
def test_the_executed_view_keeps_the_program_script_module_and_subcommand(cmdline, view):
    assert executed(cmdline) == view


def proc(pid, ppid, cmdline, pgid=None, sid=None, comm=None):
    return ProcInfo(pid=pid, ppid=ppid, pgid=pgid or pid, sid=sid or pid, state="S",
                    comm=comm or os.path.basename(cmdline.split()[0])[:15], cmdline=cmdline,
                    start_time=pid * 10, uid=0)


BASE = (proc(1, 0, "/sbin/init", comm="systemd"),
        proc(SELF, 1, "python3 module"))


def policy(patterns, scope="own"):
    return SelectionPolicy(self_pid=SELF, patterns=compile_patterns("patterns", patterns),
                           pattern_scope=scope, owner_uid=0)


def test_the_inventory_pattern_matches_the_zipapp_and_the_legacy_script_that_run():
    pattern = re.compile(SIM_PATTERN)
    for script in (SIM, LEGACY_SIM):
        assert pattern.search(executed("/usr/bin/python3 %s --port 30123" % script)), script
        assert not pattern.search(executed("tail -f " + script)), script
    assert not pattern.search(executed("/usr/bin/python3 %s/servelab-x/other.pyz" % STATE))


@pytest.mark.parametrize("SIM", [SIM, LEGACY_SIM], ids=["zipapp", "legacy-py"])
def test_bystanders_that_name_the_simulator_are_spared_and_the_shells_child_is_taken(SIM):
    t = {p.pid: p for p in BASE + (
        # a shell whose child is the real target: both in the shell's group, which it leads
        proc(100, 1, "bash -c /usr/bin/python3 %s; sleep 900" % SIM, comm="bash"),
        proc(101, 100, "/usr/bin/python3 %s --port 30123" % SIM, pgid=100, sid=100),
        proc(200, 1, "tail -f " + SIM),
        proc(201, 1, "vim " + SIM),
        proc(202, 1, "grep " + os.path.basename(SIM) + " " + SIM),
        proc(203, 1, "python3 -c print(1) " + SIM),
        proc(204, 1, "less " + SIM))}
    for scope in ("own", "any"):
        sel = select_targets(t, {}, policy([SIM_PATTERN], scope))
        assert {p: c.found_by for p, c in sel.targets.items()} == {101: "pattern"}, scope
        for pid in (100, 200, 201, 202, 203, 204):
            assert "does not execute it" in sel.spared[pid], (scope, pid)
        assert "(it runs tail)" in sel.spared[200]
        # the shell is the target's parent: watched, not signalled
        assert sel.related[100].found_by == "parent"


def test_default_patterns_take_servers_and_spare_their_mentions():
    t = {p.pid: p for p in BASE + (
        proc(100, 1, "/venv/bin/python3 -m sglang.launch_server --tp 8"),
        proc(101, 1, "/venv/bin/python3 /venv/bin/vllm serve /models/q", comm="vllm"),
        proc(102, 1, "sglang::scheduler_TP0", comm="sglang::schedul"),
        proc(200, 1, "vim /src/sglang/launch_server.py -m sglang.launch_server"),
        proc(201, 1, "python3 notes.py --title vllm serve"),
        proc(202, 1, "bash -c python3 -m sglang.launch_server --tp 8; sleep 900"),
        proc(203, 1, "grep -m 1 sglang serve log.txt"))}
    sel = select_targets(t, {}, policy(DEFAULT_PATTERNS))
    assert set(sel.targets) == {100, 101, 102}
    assert all("does not execute it" in sel.spared[p] for p in (200, 201, 202, 203))


# ---------------------------------------------------------------------------------------------
# The case of the issue, with real processes


def _start(argv, **kw):
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kw)


def _end(popens):
    """End what the test started: its Popens, and a grandchild PID the reaper did not take."""
    for p in popens:
        if isinstance(p, int):
            if is_alive(p):
                os.kill(p, 9)
            continue
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as fh:
            return [int(c) for c in fh.read().split()]
    except OSError:
        return []


@pytest.mark.parametrize("script", [SCRIPT_NAME, LEGACY_SCRIPT_NAME], ids=["zipapp", "legacy-py"])
def test_reap_with_the_inventory_pattern_spares_tail_and_the_shell_and_kills_its_child(
        tmp_path, script):
    state = tmp_path / "state"
    sleeper = "import time\ntime.sleep(600)\n"
    for name in ("servelab-child", "servelab-baseline"):
        (state / name).mkdir(parents=True)
        if script == SCRIPT_NAME:        # a real zipapp, run as llm_server runs the simulator's
            (state / name / script).write_bytes(build_archive({"__main__.py": sleeper}))
        else:                            # a server an earlier release started
            (state / name / script).write_text(sleeper)
    child_sim = str(state / "servelab-child" / script)
    tail_sim = str(state / "servelab-baseline" / script)
    pattern = inventory_sim_pattern(str(state))
    devdir = tmp_path / "no-gpu"
    devdir.mkdir()
    popens = []
    try:
        shell = _start(["bash", "-c", "%s %s; sleep 900" % (sys.executable, child_sim)],
                       start_new_session=True)
        tail = _start(["tail", "-f", tail_sim], start_new_session=True,
                      stdout=subprocess.DEVNULL)
        popens += [shell, tail]
        # The python itself, not the shell's fork before its exec: that fork's cmdline is still
        # bash's, which names the script too (CI once saw the plan taken in that instant).
        runs_sim = "%s %s" % (sys.executable, child_sim)
        wait_until(lambda: any(_cmdline(c).strip() == runs_sim for c in _children(shell.pid)),
                   what="the shell's python child")
        child = next(c for c in _children(shell.pid) if _cmdline(c).strip() == runs_sim)
        popens.append(child)
        opts = dict(device_glob=str(devdir / "nvidia*"), compute_device_glob="",
                    patterns=[pattern], pattern_scope="own", gpu_backend="none", grace=5.0)

        plan = reap(ReapOptions(check_mode=True, **opts))
        assert [r.pid for r in plan.would_kill] == [child]
        spared = {s["pid"]: s["reason"] for s in plan.spared}
        assert "does not execute it (it runs tail)" in spared[tail.pid]
        assert "does not execute it (it runs bash -c)" in spared[shell.pid]

        res = reap(ReapOptions(**opts))
        assert [(r.pid, r.found_by) for r in res.killed] == [(child, "pattern")]
        assert not is_alive(child)
        # the shell goes on to its next command (bash execs the last one: it becomes the
        # sleep); the tail is untouched
        wait_until(lambda: _cmdline(shell.pid).startswith("sleep 900"),
                   what="the shell to go on to its next command")
        assert shell.poll() is None and tail.poll() is None
    finally:
        _end(popens)
        shutil.rmtree(str(state), ignore_errors=True)
