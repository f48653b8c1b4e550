"""A load generator whose caller went away (ansible-playbook interrupted or killed on the
controller, the bench client's connection closed) stops loading the server at once instead of at
the end of its level (loadgen/caller.py, checked by run_level's control loop and run_levels).

The caller here is this test: it runs the sweep in a child process whose stdout is a pipe, as
Ansible does, then closes its end of the pipe in the middle of a 30 s level."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.caller import caller_gone
from simproc import ServerProcess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_loadgen_fakeserver.py")

SWEEP = textwrap.dedent("""\
    import json, sys, time
    sys.path.insert(0, %r)
    import collection_link
    collection_link.importable()
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import run_levels
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load
    configs = [LevelConfig(base_url=sys.argv[1], model="m", concurrency=c, max_tokens=12,
                           level_seconds=30, level_timeout=120, server_metrics=False,
                           drain_timeout=30) for c in (2, 4)]
    sys.stderr.write("started\\n")
    sys.stderr.flush()
    t0 = time.monotonic()
    outcome = run_levels(configs, load({"kind": "builtin"}), drain_last=True)
    sys.stderr.write(json.dumps({"seconds": time.monotonic() - t0,
                                 "stop": [lv["stop_reason"] for lv in outcome.levels],
                                 "drain": [lv["drain_basis"] for lv in outcome.levels],
                                 "warnings": outcome.warnings}) + "\\n")
""") % os.path.join(REPO, "tools")


def test_a_pipe_whose_reader_is_gone_is_a_caller_gone():
    read, write = os.pipe()
    try:
        assert not caller_gone(write)
        os.close(read)
        read = None
        assert caller_gone(write)
    finally:
        os.close(write)
        if read is not None:
            os.close(read)
    with open(os.devnull, "w") as null:
        assert not caller_gone(null.fileno())


def test_the_sweep_stops_when_its_caller_goes_away(tmp_path):
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP)
    err = tmp_path / "stderr.txt"
    with ServerProcess(script=FAKE) as srv, open(err, "w") as errfh:
        child = subprocess.Popen([sys.executable, str(script), srv.url], stdout=subprocess.PIPE,
                                 stderr=errfh)
        try:
            deadline = time.monotonic() + 30
            while "started" not in err.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.5)                  # inside the first level's 30 s window
            closed = time.monotonic()
            child.stdout.close()             # the caller is gone: nobody reads the result
            child.wait(60)
            gone_for = time.monotonic() - closed
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    result = json.loads(err.read_text().strip().splitlines()[-1])
    # Stopped within a second or two of the caller leaving, not after the 30 s window, with no
    # drain and no second level.
    assert gone_for < 10, (gone_for, result)
    assert result["stop"] == ["aborted"] and result["drain"] == ["none"], result
    assert any("the caller (Ansible) went away" in w for w in result["warnings"]), result
