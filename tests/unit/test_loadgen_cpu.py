"""The CPU a level costs beyond what the client processes report (loadgen/cpu.py): the kernel's
account of the reaped clients, this module's own CPU, Ansible's processes on the same machine,
and the machine's CPU busy; and client_limited seeing all of the bench side's load."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import cpu as cpumod
from ansible_collections.servelab.serving.plugins.module_utils.loadgen import honesty as hn
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import LevelPart
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import LevelRow

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def row():
    return LevelRow(host="h", profile="p", concurrency=4, requests=0, errors=0, window_s=1.0,
                    output_tok_s=None, output_tok_s_ci95=None, total_tok_s=None, request_s=None,
                    ttft_p50_ms=None, ttft_p90_ms=None, ttft_p99_ms=None, tpot_p50_ms=None,
                    tpot_p90_ms=None, tpot_p99_ms=None, itl_p50_ms=None, itl_p99_ms=None,
                    e2e_p50_ms=None, e2e_p99_ms=None, goodput_request_s=None,
                    client_limited=False)


class FakeCpu:
    """LevelCpu's figures, given."""

    def __init__(self, clients_ns=None, module_s=0.1, ansible_s=None, overhead_ns=0, util=None):
        self._clients, self._module, self._ansible = clients_ns, module_s, ansible_s
        self._overhead, self._util = overhead_ns, util

    def clients_ns(self):
        return self._clients

    def module_s(self):
        return self._module

    def ansible_s(self):
        return self._ansible

    def window_overhead_ns(self):
        return self._overhead

    def host_window_util(self):
        return self._util


def client_result(total_s, window_s):
    return {"cpu_total_ns": int(total_s * 1e9), "cpu_window_ns": int(window_s * 1e9),
            "lag_p99_s": 0.0001, "lag_max_s": 0.0002}


def honesty(results, cpu, window_s=1.0):
    r = row()
    part = LevelPart(ws=1, we=1 + int(window_s * 1e9))
    hn.client_honesty(r, results, part, len(results), cpu)
    return r


def test_client_cpu_is_the_kernels_account_of_the_reaped_clients():
    # The clients' own clocks stopped before they pickled their results: 2.0 s reported, the
    # kernel saw 2.3 s.
    r = honesty([client_result(1.0, 0.4), client_result(1.0, 0.4)], FakeCpu(clients_ns=2.3e9))
    assert r.client_cpu_s == pytest.approx(2.3)
    # Something else reaped them (the account is short): the processes' own sum stands.
    r = honesty([client_result(1.0, 0.4), client_result(1.0, 0.4)], FakeCpu(clients_ns=0.5e9))
    assert r.client_cpu_s == pytest.approx(2.0)


def test_module_ansible_and_host_figures_reach_the_row():
    r = honesty([client_result(1.0, 0.3)], FakeCpu(clients_ns=1e9, module_s=0.25, ansible_s=0.5,
                                                   util=0.42))
    assert (r.module_cpu_s, r.ansible_cpu_s, r.host_cpu_util) == (0.25, 0.5, 0.42)
    assert not r.client_limited


def test_client_limited_counts_the_module_and_ansible_beside_the_clients(monkeypatch):
    monkeypatch.setattr(hn, "usable_cpus", lambda: 2)
    # Two clients at 60% of a core each: neither is limited alone, nor are both (1.2 of 2 CPUs).
    results = [client_result(1.0, 0.6), client_result(1.0, 0.6)]
    assert not honesty(results, FakeCpu(clients_ns=2e9, overhead_ns=int(0.3e9))).client_limited
    # Ansible and the module add 0.7 CPU in the window: 1.9 of 2 CPUs on the bench side.
    assert honesty(results, FakeCpu(clients_ns=2e9, overhead_ns=int(0.7e9))).client_limited


def test_host_cpu_ticks_from_proc_stat(tmp_path):
    (tmp_path / "stat").write_text("cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 1 2 3 4 5 6 7 8\n")
    assert cpumod.host_cpu_ticks(str(tmp_path)) == (160, 980)
    (tmp_path / "stat").write_text("intr 1\n")
    assert cpumod.host_cpu_ticks(str(tmp_path)) is None


def test_children_cpu_counts_a_reaped_child():
    before = cpumod.children_cpu_ns()
    subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\n"
                    "while time.process_time() - t < 0.3: pass"], check=True)
    assert cpumod.children_cpu_ns() - before >= 0.25e9


ANSIBLE_STANDIN = textwrap.dedent("""\
    # A stand-in 'ansible-playbook': a busy worker fork beside a shell that runs the "module".
    import os, subprocess, sys, time
    worker = os.fork()
    if worker == 0:
        end = time.monotonic() + 90
        while time.monotonic() < end and os.getppid() != 1:
            pass
        os._exit(0)
    try:
        module = subprocess.run(["/bin/sh", "-c", sys.argv[1]], capture_output=True, text=True)
        sys.stdout.write(module.stdout)
        sys.stderr.write(module.stderr)
        print('{"worker": %d, "top": %d}' % (worker, os.getpid()))
    finally:
        os.kill(worker, 9)
        os.waitpid(worker, 0)
""")

MODULE = textwrap.dedent("""\
    import json, os, sys, time
    sys.path.insert(0, %r)
    import collection_link
    collection_link.importable()
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import cpu
    pids = cpu.ansible_pids()
    before = cpu.processes_cpu_ns(pids)
    # Until the busy worker has had 0.3 s of CPU (bounded): on a loaded machine it gets less
    # than a CPU, so a fixed sleep would test the machine's load, not the accounting. With no
    # ansible process found there is nothing to wait for.
    deadline = time.monotonic() + 30
    used_s = 0.0
    while pids and used_s < 0.3 and time.monotonic() < deadline:
        time.sleep(0.1)
        used_s = (cpu.processes_cpu_ns(pids) - before) / 1e9
    print(json.dumps({"me": os.getpid(), "pids": pids, "used_s": used_s}))
""") % os.path.join(REPO, "tools")


def test_ansible_processes_on_this_machine_are_found_without_our_own_subtree(tmp_path):
    standin = tmp_path / "ansible-playbook"
    standin.write_text(ANSIBLE_STANDIN)
    module = tmp_path / "AnsiballZ_llm_bench.py"
    module.write_text(MODULE)
    done = subprocess.run([sys.executable, str(standin), "%s %s" % (sys.executable, module)],
                          capture_output=True, text=True, timeout=60, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    seen, family = lines[0], lines[1]
    assert seen["pids"][0] == family["top"]               # the topmost ansible-* process
    assert family["worker"] in seen["pids"]                # its other forks (busy workers)
    assert seen["me"] not in seen["pids"]                  # never our own subtree
    assert seen["used_s"] >= 0.3                           # the busy worker's CPU is counted


def test_a_caller_not_run_by_ansible_has_none(tmp_path):
    module = tmp_path / "AnsiballZ_llm_bench.py"
    module.write_text(MODULE)
    done = subprocess.run([sys.executable, str(module)], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout)["pids"] == []


def test_level_cpu_marks_and_window_figures():
    cpu = cpumod.LevelCpu()
    cpu.mark_ws()
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    cpu.mark_we()
    cpu.finish()
    assert cpu.window_overhead_ns() >= 0.04e9
    assert cpu.module_s() >= 0.04
    util = cpu.host_window_util()
    assert util is None or 0.0 < util <= 1.0


@pytest.mark.parametrize("cpus, concurrency, expected", [
    (2, 1, 1), (2, 256, 1),            # a 2-core machine: one CPU is left to everything else
    (16, 1, 1), (16, 128, 1), (16, 129, 2), (16, 256, 2), (16, 5000, 15), (1, 256, 1)])
def test_automatic_processes_leave_a_cpu_to_the_rest(monkeypatch, cpus, concurrency, expected):
    monkeypatch.setattr(hn, "usable_cpus", lambda: cpus)
    assert hn.auto_processes(concurrency) == expected


SIBLING_STANDIN = textwrap.dedent("""\
    # A stand-in 'ansible-playbook' whose other worker runs a second sweep's load generator (a
    # second GPU server benchmarked from this same bench client): it names itself as one, forks a
    # busy client process (which inherits the name), and the measured "module" runs beside it.
    import os, subprocess, sys, time
    sys.path.insert(0, %r)
    import collection_link
    collection_link.importable()
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import cpu
    ready_r, ready_w = os.pipe()
    sibling = os.fork()
    if sibling == 0:
        cpu.mark_load_generator()
        client = os.fork()
        if client == 0:
            end = time.monotonic() + 60
            while time.monotonic() < end and os.getppid() != 1:
                pass
            os._exit(0)
        os.write(ready_w, b"%%d\\n" %% client)
        os.waitpid(client, 0)
        os._exit(0)
    client = int(os.read(ready_r, 64))
    try:
        module = subprocess.run(["/bin/sh", "-c", sys.argv[1]], capture_output=True, text=True)
        sys.stdout.write(module.stdout)
        sys.stderr.write(module.stderr)
        print('{"sibling": %%d, "client": %%d, "top": %%d}' %% (sibling, client, os.getpid()))
    finally:
        os.kill(client, 9)
        os.waitpid(sibling, 0)
""") % os.path.join(REPO, "tools")

SIBLING_MODULE = textwrap.dedent("""\
    import json, os, sys, time
    sys.path.insert(0, %r)
    import collection_link
    collection_link.importable()
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen import cpu
    cpu.mark_load_generator()
    pids = cpu.ansible_pids()
    before = cpu.processes_cpu_ns(pids)
    time.sleep(0.5)
    with open("/proc/self/comm") as fh:
        comm = fh.read().strip()
    print(json.dumps({"me": os.getpid(), "pids": pids, "comm": comm,
                      "others": cpu.other_load_generators(),
                      "shared_with": cpu.LevelCpu().shared_with,
                      "used_s": (cpu.processes_cpu_ns(pids) - before) / 1e9}))
""") % os.path.join(REPO, "tools")


def test_another_sweep_on_a_shared_client_is_not_ansibles_cpu_and_is_counted(tmp_path):
    standin = tmp_path / "ansible-playbook"
    standin.write_text(SIBLING_STANDIN)
    module = tmp_path / "AnsiballZ_llm_bench.py"
    module.write_text(SIBLING_MODULE)
    done = subprocess.run([sys.executable, str(standin), "%s %s" % (sys.executable, module)],
                          capture_output=True, text=True, timeout=60, check=True)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    seen, family = lines[0], lines[1]
    assert seen["comm"] == cpumod.LOADGEN_COMM
    assert seen["pids"][0] == family["top"]
    # The other sweep and its busy client process: not Ansible's, whatever CPU they burn.
    assert family["sibling"] not in seen["pids"] and family["client"] not in seen["pids"]
    assert seen["used_s"] < 0.2
    # Counted as one other sweep (its client process is part of it, not another one). Other
    # sweeps on this machine (a test run beside this one) are counted too: hence no equality.
    assert family["sibling"] in seen["others"] and family["client"] not in seen["others"]
    assert seen["shared_with"] == len(seen["others"])
