"""After a SIGKILL of ansible-playbook, the level in flight is measured again on resume.

What was seen (issue 26): the orphaned Ansible worker waited for its llm_bench module to finish
the level, wrote the level's complete part file about 4 s after the SIGKILL, and
`bench_resume` kept that level as finished. Now the worker ends as soon as ansible-playbook is
gone (plugin_utils/controller_watch.py), its module sees its caller gone and stops, and nothing
writes the level.
"""
from __future__ import annotations

import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_bench_lifecycle import bench, level_rows, processes_with, server_state, settings  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.proc.lifetime import is_alive  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.results import contract as results  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import STOP_WINDOW_COMPLETE  # noqa: E402


def test_a_sigkilled_runs_level_in_flight_is_not_written_and_resume_measures_it(tmp_path):
    run_id = "orphan-run"
    # C=2's window (6 s) is far longer than the worker needs to notice (0.2 s polls) and its
    # module to stop (0.5 s); before the fix its part file appeared some 6 s after the kill
    extra = settings(tmp_path, bench_run_id=run_id, bench_level_seconds=6)
    parts = tmp_path / "results" / run_id / results.PARTS_DIR
    with bench(tmp_path, extra) as run:
        run.wait_for_line(r"llm_bench localhost/baseline C=2: running")
        os.kill(run.proc.pid, signal.SIGKILL)
        run.wait(60)
        killed_at = time.monotonic()
        server = server_state(tmp_path / "servers")
        # everything of the run but the server (its own session: bench_resume's reap ends it)
        # ends on its own, well before C=2's window would have
        deadline = killed_at + 60
        while time.monotonic() < deadline and [
                p for p in processes_with(run.mark) if not p.startswith("%d " % server["pid"])]:
            time.sleep(0.2)
        left = [p for p in processes_with(run.mark) if not p.startswith("%d " % server["pid"])]
        assert left == [], left
        assert time.monotonic() - killed_at < 6, "the orphaned worker waited for its level"
    # C=1 is measured, C=2 is not: no complete part file of it, now or later
    assert set(level_rows(tmp_path / "results" / run_id)) == {("baseline", 1)}
    assert not [n for n in os.listdir(str(parts)) if "__c2" in n and n.endswith(".json")]

    with bench(tmp_path, dict(extra, bench_resume=run_id)) as resumed:
        rc = resumed.wait(300)
    out = resumed.output
    assert rc == 0, out[-5000:]
    assert "llm_bench localhost/baseline C=1: measured earlier in this run, kept" in out, out[-5000:]
    assert "llm_bench localhost/baseline C=2: running" in out, out[-5000:]
    rows = level_rows(tmp_path / "results" / run_id)
    assert set(rows) == {("baseline", 1), ("baseline", 2)}
    assert rows[("baseline", 2)]["stop_reason"] == STOP_WINDOW_COMPLETE
    assert not is_alive(server["pid"], server["start_time"])
