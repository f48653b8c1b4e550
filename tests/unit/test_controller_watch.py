"""An action's worker ends itself once ansible-playbook is gone (plugin_utils/controller_watch.py).

The stand-in for ansible-playbook is a python process that forks the 'worker'; the worker runs a
30 s block under exit_when_gone; the test SIGKILLs the parent and watches the worker end."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from ansible_collections.servelab.serving.plugins.module_utils.proc.lifetime import is_alive
from ansible_collections.servelab.serving.plugins.plugin_utils.controller_watch import ControllerWatch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PARENT = textwrap.dedent("""\
    import os, sys, time
    sys.path.insert(0, %r)
    import collection_link
    collection_link.importable()
    from ansible_collections.servelab.serving.plugins.plugin_utils.controller_watch import (
        ControllerWatch)
    pid = os.fork()
    if pid == 0:
        watch = ControllerWatch()
        with watch.exit_when_gone("the test's level"):
            with open(sys.argv[1] + ".tmp", "w") as fh:
                fh.write(str(os.getpid()))
            os.rename(sys.argv[1] + ".tmp", sys.argv[1])
            time.sleep(30)
        os._exit(0)                     # reached only if the watch did not end it
    time.sleep(60)
""") % os.path.join(REPO, "tools")


def test_the_watch_sees_a_live_parent():
    assert not ControllerWatch().gone()


def test_a_worker_ends_within_a_second_of_its_controllers_sigkill(tmp_path):
    script = tmp_path / "controller.py"
    script.write_text(PARENT)
    ready = tmp_path / "worker.pid"
    parent = subprocess.Popen([sys.executable, str(script), str(ready)], start_new_session=True)
    worker = None
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.02)
        worker = int(ready.read_text())
        time.sleep(0.5)
        assert is_alive(worker), "the worker ended while its controller was alive"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        killed = time.monotonic()
        while is_alive(worker) and time.monotonic() - killed < 10:
            time.sleep(0.02)
        assert not is_alive(worker), "the orphaned worker went on"
        assert time.monotonic() - killed < 2
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if worker is not None and is_alive(worker):
            os.kill(worker, signal.SIGKILL)
