"""plugin_utils/interrupt.py: a cleanup playbook that outlives its time-out is ended whole, its
own children included (proc/terminate.end_group), and the user is told to run it by hand."""
from __future__ import annotations

import os
import signal
import sys

from ansible_collections.servelab.serving.plugins.module_utils.proc.lifetime import is_alive
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import read_process
from ansible_collections.servelab.serving.plugins.plugin_utils import interrupt

# A stand-in for the cleanup's ansible-playbook: it starts a child that ignores SIGTERM (a
# worker stuck on a host), writes the child's pid, and hangs.
HANGS = r"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "print('ready', flush=True); time.sleep(120)"], stdout=subprocess.PIPE)
child.stdout.readline()
open(sys.argv[1], "w").write("%d" % child.pid)
time.sleep(120)
"""


def test_a_cleanup_past_its_time_out_is_ended_with_everything_it_started(tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    monkeypatch.setattr(interrupt, "cleanup_command",
                        lambda *a, **k: [sys.executable, "-c", HANGS, str(pid_file)])
    monkeypatch.setattr(interrupt, "_fd", lambda number: None)
    said = []
    guard = interrupt.InterruptGuard(say=said.append)
    guard.main_pid = 1
    guard.cleanup_timeout, guard.cleanup_grace = 6.0, 0.5
    run = interrupt.OpenRun("r1", str(tmp_path), str(tmp_path / "r1"), locked_hosts=["gpu1"])
    guard._cleanup_playbook(run, "interrupted", "SIGINT")
    child = int(pid_file.read_text())
    info = read_process(child)
    try:
        assert info is None or not is_alive(child, info.start_time)
        assert "did not finish within 6 s and was stopped" in said[-1]
    finally:
        if info is not None and is_alive(child, info.start_time):
            os.kill(child, signal.SIGKILL)
