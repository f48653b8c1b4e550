"""servelab.serving as an installed collection, used from outside the checkout.

The collection tarball is built from the repository root (`ansible-galaxy collection build`),
installed into a fresh collections path (`ansible-galaxy collection install --no-deps -p`), and a
playbook in a temporary directory, with an Ansible configuration that names nothing of the
checkout, starts the simulator with `servelab.serving.llm_server`, sweeps it at two levels with
`servelab.serving.llm_bench`, stops it with `llm_server` and reads the run's levels.csv. The
`-vvv` output proves every servelab module came from the installed copy.

Whatever happens (a failed assertion, a hung playbook), the simulator is ended by PID from its
llm_server state file (PID + start time, the environment marker its children inherit, its
cgroup), and the test checks that nothing of it is left.
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import pytest
from importscan import heavy_imports  # tests/: the shared import scanner
from ansible_collections.servelab.serving.plugins.module_utils.proc import lifetime
from testports import free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)
GALAXY = os.path.join(BIN, "ansible-galaxy")
ANSIBLE_PLAYBOOK = os.path.join(BIN, "ansible-playbook")
SERVER_NAME = "collection-sim"
RUN_ID = "run1"
MARKER_VAR = "SERVELAB_SERVER"     # the launcher's inherited environment marker (proc layer)
HEAVY = ("pandas", "matplotlib")   # controller-only libraries: never in module_utils

# What a built tarball must never carry: the checkout's environment, results and caches.
FORBIDDEN_TOP = {".venv", "collections", "results", ".cache", ".git", ".ci", ".pytest_cache",
                 ".whl", ".gl", ".ansible", ".ruff_cache", ".mypy_cache"}
FORBIDDEN_ANYWHERE = re.compile(r"(^|/)(__pycache__|\.pytest_cache|\.ruff_cache|\.mypy_cache|"
                                r"\.state)(/|$)|\.pyc$|\.tar\.gz$")
MAX_TARBALL_BYTES = 3 * 1024 * 1024
# What only the checkout uses (galaxy.yml's build_ignore): its tests, benchmarks and their
# results, the Makefile and its tools, the dev and lint pins, the changelog fragments.
CHECKOUT_ONLY = {"tests", "benchmarks", "tools", "Makefile", "conftest.py", "pyproject.toml",
                 "requirements-dev.txt", "requirements-lint.txt", ".ansible-lint"}

pytestmark = pytest.mark.skipif(not os.path.exists(GALAXY),
                                reason="ansible-galaxy is not installed beside this python")

PLAYBOOK = """\
- name: Benchmark the simulator with the installed collection
  hosts: localhost
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
    sim_state_dir: "{state_dir}"
    sim_results_root: "{results_root}"
  tasks:
    - name: Start the simulator
      servelab.serving.llm_server:
        name: {name}
        engine: simulator
        port: {port}
        state_dir: "{{{{ sim_state_dir }}}}"
        profile:
          name: baseline
          simulator: {{profile: baseline, time_scale: 100}}
        ready_timeout: 60
      register: sim_server

    - name: Sweep, and stop the simulator whatever happens
      block:
        - name: "servelab: sweep"
          servelab.serving.llm_bench:
            base_url: "{{{{ sim_server.base_url }}}}"
            model: "{{{{ sim_server.model }}}}"
            profile: baseline
            concurrency: [1, 2]
            run_id: {run_id}
            results_root: "{{{{ sim_results_root }}}}"
            workload: {{kind: synthetic, input_tokens: 64, output_tokens: 16}}
            max_tokens: 16
            level_seconds: 1
            warmup_requests: 1
            level_timeout: 60
          register: sim_sweep
      always:
        - name: Stop the simulator
          servelab.serving.llm_server:
            name: {name}
            state: stopped
            state_dir: "{{{{ sim_state_dir }}}}"
          register: sim_stopped

    - name: Read levels.csv
      ansible.builtin.set_fact:
        sim_levels_lines: "{{{{ lookup('ansible.builtin.file', sim_results_root ~ '/{run_id}/levels.csv').splitlines() }}}}"

    - name: Check levels.csv has a header and the two levels
      ansible.builtin.assert:
        that:
          - sim_levels_lines | length == 3
          - sim_levels_lines[0].startswith('host,profile,concurrency,')
          - sim_levels_lines[1].startswith('localhost,baseline,1,')
          - sim_levels_lines[2].startswith('localhost,baseline,2,')

    - name: Keep the results for the test
      ansible.builtin.copy:
        content: >-
          {{{{ {{'server': sim_server, 'sweep': sim_sweep, 'stopped': sim_stopped,
               'levels_lines': sim_levels_lines}} | to_json }}}}
        dest: "{out}"
        mode: "0644"
"""

MINIMAL_CFG = """\
[defaults]
collections_path = {coll}
host_key_checking = False
retry_files_enabled = False
interpreter_python = auto_silent
"""


def clean_env(tmp_path, coll) -> dict:
    """An environment that names nothing of the checkout: no ANSIBLE_* from the caller (pytest's
    conftest sets ANSIBLE_CONFIG to the checkout's), no PYTHONPATH, a private ANSIBLE_HOME."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(MINIMAL_CFG.format(coll=coll))
    env.update(ANSIBLE_CONFIG=str(cfg), ANSIBLE_COLLECTIONS_PATH=str(coll),
               ANSIBLE_HOME=str(tmp_path / "ansible-home"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def run(cmd, cwd, env, timeout):
    """Run a command in its own process group; on timeout the whole group is killed (by the
    group id of the child we started), so no ansible worker outlives the test."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=str(cwd), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(10)
        pytest.fail("%s timed out after %ss:\n%s\n%s" % (cmd[0], timeout, out[-4000:], err[-2000:]))
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# --- the simulator's processes, found from its state file (stdlib only) ----------------------

# /proc/<pid>/stat field 22 (what the state file records against PID reuse), or None once gone
start_time = lifetime.running_start_time


def marked_pids(marker: str) -> list:
    """Live processes whose environment carries the launcher's marker for this server."""
    needle = ("%s=%s" % (MARKER_VAR, marker)).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as fh:
                if needle in fh.read().split(b"\0") and start_time(int(entry)) is not None:
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def server_leftovers(state_dir) -> list:
    """PIDs of the server recorded in <state_dir>/<name>/state.json that are still alive."""
    path = os.path.join(str(state_dir), SERVER_NAME, "state.json")
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return []
    pids = set(marked_pids(state["marker"])) if state.get("marker") else set()
    pid = state.get("pid")
    if pid and start_time(pid) is not None and start_time(pid) == state.get("start_time"):
        pids.add(pid)
    group = state.get("cgroup")
    if group and os.path.exists(os.path.join(group, "cgroup.procs")):
        with open(os.path.join(group, "cgroup.procs")) as fh:
            pids.update(int(line) for line in fh if line.strip())
    return sorted(p for p in pids if start_time(p) is not None)


def end_server(state_dir) -> list:
    """SIGKILL whatever is left of the server, by PID (and through its cgroup); return the PIDs
    that were found alive."""
    left = server_leftovers(state_dir)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while server_leftovers(state_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


# --- the tests --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    """The collection built from the repository root, as a user would build it."""
    out = tmp_path_factory.mktemp("build")
    env = clean_env(out, out / "no-collections")
    done = run([GALAXY, "collection", "build", "--output-path", out], REPO, env, 180)
    assert done.returncode == 0, done.stdout + done.stderr
    built = [p for p in out.iterdir() if p.name.endswith(".tar.gz")]
    assert len(built) == 1 and built[0].name.startswith("servelab-serving-"), built
    return built[0]


def test_tarball_is_small_and_holds_no_environment_or_heavy_module_utils(tarball):
    assert tarball.stat().st_size < MAX_TARBALL_BYTES, tarball.stat().st_size
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        for must in ("MANIFEST.json", "FILES.json", "meta/runtime.yml",
                     "plugins/modules/llm_server.py", "plugins/modules/llm_bench.py",
                     "plugins/action/llm_bench.py", "plugins/module_utils/simulator/server.py",
                     "plugins/module_utils/simulator/__init__.py", "plugins/module_utils/netstamp.py",
                     "plugins/module_utils/results/contract.py", "roles/bench/tasks/main.yml",
                     # the controller's Python requirements, and ansible-builder's pointer to them
                     "requirements.txt", "meta/execution-environment.yml"):
            assert must in names, must
        forbidden = [n for n in names if n.split("/")[0] in FORBIDDEN_TOP
                     or FORBIDDEN_ANYWHERE.search(n)]
        assert not forbidden, forbidden
        checkout_only = [n for n in names if n.split("/")[0] in CHECKOUT_ONLY
                         or n.startswith("changelogs/fragments")]
        assert not checkout_only, checkout_only
        heavy = {}
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith("plugins/module_utils/") \
                    and member.name.endswith(".py"):
                found = [name for name, _line in heavy_imports(
                    tar.extractfile(member).read().decode("utf-8"), heavy=HEAVY)]
                if found:
                    heavy[member.name] = found
        assert not heavy, "module_utils must stay stdlib-only (shipped to targets): %s" % heavy


def test_installed_collection_runs_a_sweep_from_outside_the_checkout(tmp_path, tarball):
    coll = tmp_path / "coll"
    work = tmp_path / "elsewhere"        # the playbook's directory: nothing of the checkout
    work.mkdir()
    state_dir = tmp_path / "servers"
    results_root = tmp_path / "results"
    out = tmp_path / "out.json"
    env = clean_env(work, coll)
    assert not str(work).startswith(REPO + os.sep)

    started = time.monotonic()
    done = run([GALAXY, "collection", "install", "--no-deps", "-p", coll, tarball], work, env, 180)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = coll / "ansible_collections" / "servelab" / "serving"
    assert (installed / "MANIFEST.json").is_file()
    assert not os.path.islink(installed) and os.path.realpath(installed) == str(installed)

    playbook = work / "bench.yml"
    playbook.write_text(PLAYBOOK.format(name=SERVER_NAME, port=free_port(), run_id=RUN_ID,
                                        state_dir=state_dir, results_root=results_root,
                                        out=out))
    try:
        done = run([ANSIBLE_PLAYBOOK, "-vvv", "-i", "localhost,", "-c", "local", playbook],
                   work, env, 240)
        played = time.monotonic() - started
        tail = done.stdout[-6000:] + done.stderr[-3000:]
        assert done.returncode == 0, tail
        # Every servelab module Ansible shipped came from the installed copy, none from REPO.
        used = re.findall(r"Using module file (\S+)", done.stdout)
        servelab = [p for p in used if "/servelab/serving/" in p]
        assert {os.path.basename(p) for p in servelab} >= {"llm_server.py", "llm_bench.py"}, used
        assert all(os.path.realpath(p).startswith(str(installed) + os.sep) for p in servelab), \
            servelab
        # The checkout shows up only as the interpreter's venv, never as a source of content.
        assert not re.findall(re.escape(REPO) + r"/(?!\.venv/)\S*", done.stdout + done.stderr)

        results = json.loads(out.read_text())
        server, sweep, stopped = results["server"], results["sweep"], results["stopped"]
        assert server["changed"] is True and server["action"] == "started"
        assert server["cmd"][1] == str(state_dir / SERVER_NAME / "servelab_simulator.pyz")
        assert [lv["concurrency"] for lv in sweep["levels"]] == [1, 2]
        assert stopped["action"] == "stopped" and stopped["stopped"]["port_free"] is True
        assert server["pid"] in [k["pid"] for k in stopped["stopped"]["killed"]]
        assert start_time(server["pid"]) is None

        run_dir = results_root / RUN_ID
        with open(run_dir / "levels.csv", newline="") as fh:
            levels = list(csv.DictReader(fh))
        assert [(lv["host"], lv["profile"], lv["concurrency"]) for lv in levels] == [
            ("localhost", "baseline", "1"), ("localhost", "baseline", "2")]
        for lv in levels:
            assert int(lv["requests"]) > 0 and lv["errors"] == "0", lv
            assert float(lv["output_tok_s"]) > 0
        assert results["levels_lines"] == (run_dir / "levels.csv").read_text().splitlines()
        assert sorted(os.listdir(run_dir / "parts")) == [
            "localhost__baseline__c1.json", "localhost__baseline__c1.jsonl",
            "localhost__baseline__c2.json", "localhost__baseline__c2.jsonl"]
        records = [json.loads(line) for line in
                   (run_dir / "requests.jsonl").read_text().splitlines()]
        assert {r["concurrency"] for r in records} == {1, 2}
        assert played < 60, "install + playbook took %.1f s" % played
    finally:
        left = end_server(state_dir)
    assert not server_leftovers(state_dir)
    assert not left, "the playbook left simulator processes running: %s" % left
