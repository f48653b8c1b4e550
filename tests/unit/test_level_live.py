"""A level's figures so far: the file the level's controller rewrites (module_utils/loadgen/
live.py), read back and rendered as the line llm_bench's action prints during the level
(plugin_utils/progress.py's live_line), and when the action watches it (live_watch.py)."""
from __future__ import annotations

import json
import os

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.live import (
    NS_PER_S, LiveFile, LiveRecord, read_live,
)
from ansible_collections.servelab.serving.plugins.plugin_utils import live_watch
from ansible_collections.servelab.serving.plugins.plugin_utils.progress import live_line


def record(**overrides) -> LiveRecord:
    values = dict(concurrency=4, elapsed_s=12.4, phase="window", window_s=8.2,
                  level_seconds=20.0, requests=57, errors=0, tokens=15314)
    values.update(overrides)
    return LiveRecord(**values)


def test_the_line_shows_elapsed_phase_requests_and_tok_s_so_far():
    assert live_line("localhost/external C=4", record()) == (
        "localhost/external C=4: 00:12 elapsed · window 8/20 s · 57 requests · 1235 tok/s so far")


def test_the_line_in_warm_up_in_the_tail_and_with_errors():
    warm = live_line("h/p C=1", record(phase="warmup", window_s=0.0, requests=0, tokens=0,
                                       elapsed_s=0.0))
    assert warm == "h/p C=1: 00:00 elapsed · warm-up · 0 requests · - tok/s so far"
    tail = live_line("h/p C=1", record(phase="tail", window_s=20.0, errors=1, requests=1))
    assert "tail (window closed at 20 s)" in tail and "1 request, 1 error" in tail


def test_the_file_is_written_at_most_once_an_interval_and_read_back(tmp_path):
    path = str(tmp_path / "level.json")
    live = LiveFile(path, interval=1.0)
    made = []

    def make():
        made.append(1)
        return record(requests=len(made))

    live.tick(5 * NS_PER_S, make)
    live.tick(5 * NS_PER_S + NS_PER_S // 2, make)      # within the interval: nothing made
    assert len(made) == 1 and read_live(path) == record(requests=1)
    live.tick(6 * NS_PER_S, make)
    assert len(made) == 2 and read_live(path).requests == 2
    assert os.listdir(tmp_path) == ["level.json"]       # the temporary file was renamed
    assert json.loads((tmp_path / "level.json").read_text())["tokens"] == 15314


def test_no_file_no_work_and_a_failed_write_turns_the_file_off(tmp_path):
    LiveFile(None).tick(0, lambda: 1 / 0)               # never asked for a record
    live = LiveFile(str(tmp_path / "gone" / "level.json"))
    live.tick(0, record)
    assert live.path is None                            # and the level goes on
    assert read_live(str(tmp_path / "missing.json")) is None
    (tmp_path / "bad.json").write_text("{not json")
    assert read_live(str(tmp_path / "bad.json")) is None


class _Conn:
    def __init__(self, transport):
        self.transport = transport


def test_the_action_watches_only_a_local_module_and_only_when_lines_are_on():
    env = {}
    watch = live_watch.live_watch(_Conn("local"), print, environ=env)
    try:
        assert watch is not None and watch.interval == live_watch.DEFAULT_INTERVAL_S
        assert os.path.dirname(watch.path) == watch.directory
    finally:
        watch.close()
    assert not os.path.exists(watch.directory)
    assert live_watch.live_watch(_Conn("ssh"), print, environ=env) is None
    assert live_watch.live_watch(_Conn("local"), print,
                                 environ={live_watch.INTERVAL_ENV: "0"}) is None
    assert live_watch.interval_s({live_watch.INTERVAL_ENV: "often"}) == 0.0


def test_a_watch_sweeps_the_directories_of_gone_processes_and_keeps_everything_else(tmp_path):
    """A SIGKILLed ansible-playbook never runs the action's finally: its watch directory stays.
    The next watch removes it once the process that made it is gone, and nothing else."""
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    stale = tmp_path / ("servelab-live-%d-abc123" % gone.pid)
    stale.mkdir()
    (stale / live_watch.FILE_NAME).write_text("{}")
    alive = tmp_path / ("servelab-live-%d-def456" % os.getppid())
    alive.mkdir()
    older = tmp_path / "servelab-live-q1w2e3"            # an earlier release's name: no PID
    older.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / ("servelab-live-%d-link" % gone.pid)
    link.symlink_to(target)
    watch = live_watch.LiveWatch(print, 5.0, parent=str(tmp_path))
    try:
        assert not stale.exists()
        assert alive.is_dir() and older.is_dir() and link.is_symlink() and target.is_dir()
        assert os.path.basename(watch.directory).startswith("servelab-live-%d-" % os.getpid())
        assert live_watch.sweep_stale(str(tmp_path)) == []      # its own is kept: it runs
    finally:
        watch.close()
    assert not os.path.exists(watch.directory)


def test_a_level_given_a_progress_file_leaves_its_last_figures_there(tmp_path):
    """run_level against the fake server: the file's last snapshot counts what the level did
    (the finished requests' tokens come from the client processes' shared counter)."""
    from simproc import ServerProcess
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
    from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load

    fake = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_loadgen_fakeserver.py")
    path = str(tmp_path / "level.json")
    with ServerProcess("--ttft-ms", "5", "--step-ms", "2", script=fake) as srv:
        res = run_level(LevelConfig(base_url=srv.url, model="m", concurrency=2, max_tokens=12,
                                    level_seconds=1.5, level_timeout=60, server_metrics=False,
                                    # no warm-up: the live count has them, run_requests has not
                                    warmup_requests=0, processes=2, progress_file=path),
                        load({"kind": "builtin"}))
    last = read_live(path)
    assert last is not None and last.concurrency == 2
    # Live, every finished request counts, also those cancelled at the level's end (the row
    # keeps them apart: cancelled_tail, not run_requests; 98 > 96 read at C=2 under CI).
    finished = res.row.run_requests + res.row.cancelled_tail
    assert 0 < last.requests <= finished
    assert 0 < last.tokens <= finished * 12
    assert last.phase in ("window", "tail") and last.elapsed_s > 0
