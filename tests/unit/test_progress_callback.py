"""The progress callback's task-name match (with the role's real task names), its heartbeat
while a server starts (lines, log tail, redaction, stopping), and the end-of-run table of levels
(every cell from level_views)."""
from __future__ import annotations

import glob
import os
import threading
import time
from types import SimpleNamespace

import pytest
import yaml

from ansible_collections.servelab.serving.plugins.callback import progress as servelab_callback
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import level_verdict
from ansible_collections.servelab.serving.plugins.module_utils.results.level_views import (
    cell_text, view_headers,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    LAYOUTS, VIEW_LINE,
)
from ansible_collections.servelab.serving.plugins.module_utils.results.parts import (
    write_level_files,
)
from ansible_collections.servelab.serving.plugins.plugin_utils import progress

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "servelab:"


def _task_names(tasks):
    for task in tasks or ():
        if not isinstance(task, dict):
            continue
        if task.get("name"):
            yield str(task["name"])
        for key in ("block", "rescue", "always"):
            yield from _task_names(task.get(key))


def role_task_names():
    names = []
    for path in sorted(glob.glob(os.path.join(REPO, "roles", "bench", "tasks", "*.yml"))):
        with open(path, encoding="utf-8") as fh:
            names += list(_task_names(yaml.safe_load(fh)))
    # as the strategy templates them before the callback sees them
    return [n.replace("{{ __bench_profile.name }}", "eagle3") for n in names]


def test_the_role_has_a_servelab_task():
    assert "servelab: sweep eagle3" in role_task_names()


@pytest.mark.parametrize("role", ["", "bench : ", "servelab.serving.bench : "])
def test_role_task_names_match(role):
    """Ansible names a role's task '<role> : <name>' (the FQCN of a collection's role on
    ansible-core 2.19): the prefix is matched on the task's own name."""
    names = role_task_names()
    for name in names:
        full = role + name
        assert progress.is_servelab_task(full, PREFIX) == name.startswith(PREFIX), full
        assert progress.bare_task_name(full) == name


@pytest.mark.parametrize("name, expected", [
    ("servelab: report", True),
    ("servelab.serving.bench : servelab: sweep baseline", True),
    ("bench : Start the server for eagle3", False),
    ("Write the run's manifest and point results/latest at it", False),
    ("servelab: a : b", True),                  # a name of its own with " : " in it
    ("my role : servelab: x", False),           # a role name has no spaces: not a role prefix
    ("", False),
])
def test_matcher(name, expected):
    assert progress.is_servelab_task(name, PREFIX) is expected
    assert progress.is_servelab_task(name, "") is False


# -- the callback's per-task lines for role tasks ---------------------------------------------

class CapturingDisplay:
    verbosity = 0

    def __init__(self):
        self.lines = []
        self._lock = threading.Lock()

    def display(self, msg="", color=None, **kwargs):
        with self._lock:
            self.lines.append(str(msg))

    def vvv(self, msg, host=None):
        self.lines.append("VVV " + str(msg))

    def __getattr__(self, name):
        return lambda *a, **k: self.lines.append(f"{name.upper()} {a}")


class FakeTask:
    def __init__(self, name, action="debug", args=None, uuid="t1"):
        self.name, self.action, self.args, self._uuid = name, action, args or {}, uuid

    def get_name(self):
        return self.name


def _result(task, data, host="h1"):
    return SimpleNamespace(task=task, host=SimpleNamespace(name=host), result=data)


@pytest.fixture
def callback(monkeypatch):
    display = CapturingDisplay()
    cb = servelab_callback.CallbackModule(display=display)
    options = {"heartbeat_interval": 0.05}
    monkeypatch.setattr(cb, "_option", options.get)
    yield cb, display, options
    cb._stop_heartbeat()


def _row(profile, c, tok_s, host="h1"):
    return {"host": host, "profile": profile, "concurrency": c, "output_tok_s": tok_s,
            "output_tok_s_ci95": 1.25, "ttft_p50_ms": 20.0 + c, "tpot_p50_ms": 5.0,
            "errors": 0, "requests": 10 * c, "window_s": 2.0, "window_complete": True}


def test_role_sweep_task_lines_fire(callback):
    cb, display, _options = callback
    task = FakeTask("servelab.serving.bench : servelab: sweep eagle3", "servelab.serving.llm_bench")
    cb.v2_runner_on_start(SimpleNamespace(name="h1"), task)
    cb.v2_runner_on_ok(_result(task, {"levels": [_row("eagle3", 1, 90.0)], "msg": "1 level(s)"}))
    text = "\n".join(display.lines)
    assert "servelab | h1 | servelab: sweep eagle3 | started" in text
    assert "servelab | h1 | servelab: sweep eagle3 | ok" in text
    assert "servelab |   h1/eagle3 C=1: output 90.0 ± 1.2 tok/s" in text
    assert "servelab |   1 level(s)" in text


# -- the end-of-run table ---------------------------------------------------------------------

def test_levels_table_is_aligned_and_made_of_level_views_cells():
    rows = [_row("baseline", 1, 90.0), _row("baseline", 30, 1234.5), _row("eagle3", 1, 95.25)]
    lines = progress.levels_table(rows)
    assert len(lines) == 2 + len(rows)
    header = lines[0].split("  ")
    header = [h.strip() for h in header if h.strip()]
    assert header == ["host", "profile", "C"] + view_headers(VIEW_LINE)
    for line, row in zip(lines[2:], rows):
        for cell in LAYOUTS[VIEW_LINE]:
            assert cell_text(cell, row) in line
    # aligned: every column starts at the same place on every line; numbers right-aligned
    assert len({len(line) for line in lines}) == 1
    starts = [i for i, ch in enumerate(lines[1]) if ch == "-" and (i == 0 or lines[1][i - 1] == " ")]
    for line in lines[2:]:
        assert line[starts[1]:].startswith(("baseline", "eagle3"))
    width = starts[4] - 2 - starts[3]
    for line, row in zip(lines[2:], rows):   # the figures right-aligned in their column
        assert line[starts[3]:starts[4] - 2] == cell_text(LAYOUTS[VIEW_LINE][0], row).rjust(width)
    assert progress.levels_table([]) == []


def test_levels_table_names_failed_levels():
    bad = dict(_row("eagle3", 5, 0.0), errors=50, requests=50, output_tok_s=None)
    lines = progress.levels_table([_row("eagle3", 1, 95.0), bad])
    assert lines[0].rstrip().endswith("note")
    note = level_verdict(bad).note
    assert note and lines[3].endswith(note) and not lines[2].endswith(note)


def test_summary_table_reads_the_run_parts(callback, tmp_path, monkeypatch):
    cb, display, _options = callback
    # the run's guard is not this test's: a stand-in that only records
    monkeypatch.setattr(servelab_callback, "GUARD", SimpleNamespace(
        run=None, signals=0, arm=lambda run: None, disarm=lambda: None, note_lock=lambda h: None))
    run_dir = tmp_path / "run1"
    parts = run_dir / "parts"
    parts.mkdir(parents=True)
    rows = [_row("baseline", 1, 90.0), _row("baseline", 2, 150.0), _row("eagle3", 1, 95.0),
            _row("eagle3", 2, 140.0)]
    for row in rows:
        write_level_files(str(parts), row, [], [])
    cb.v2_runner_on_ok(_result(FakeTask("Open the run", "servelab.serving.bench_run"), {
        "state": "opened", "run_id": "run1", "results_root": str(tmp_path),
        "run_dir": str(run_dir)}))
    sweep = FakeTask("bench : servelab: sweep eagle3", "llm_bench")
    # eagle3 swept first: the table keeps the run's order of profiles
    cb.v2_runner_on_ok(_result(sweep, {"levels": rows[2:], "results_dir": str(run_dir)}))
    cb.v2_runner_on_ok(_result(sweep, {"levels": rows[:2], "results_dir": str(run_dir)}))
    display.lines.clear()
    cb.v2_playbook_on_stats(None)
    text = "\n".join(display.lines)
    assert "levels of run run1 (4, %s):" % run_dir in text
    table = [line for line in display.lines if line.startswith("  h1 ")]
    assert [line.split()[1:3] for line in table] == [
        ["eagle3", "1"], ["eagle3", "2"], ["baseline", "1"], ["baseline", "2"]]


def test_summary_falls_back_to_the_results_rows(callback, tmp_path):
    cb, display, _options = callback
    sweep = FakeTask("servelab: sweep", "llm_bench")
    cb.v2_runner_on_failed(_result(sweep, {"levels": [_row("baseline", 1, 90.0)],
                                           "results_dir": str(tmp_path / "nowhere" / "r7"),
                                           "msg": "server died"}))
    cb.v2_playbook_on_stats(None)
    text = "\n".join(display.lines)
    assert "levels of run r7 (1," in text and "  h1    baseline" in text


# -- the heartbeat ----------------------------------------------------------------------------

def test_heartbeat_line():
    assert progress.heartbeat_line("h1", "eagle3", 45) == "h1 eagle3: server starting, 00:45 elapsed"
    assert progress.heartbeat_line("h1", "eagle3", 45, "Uvicorn running") == (
        "h1 eagle3: server starting, 00:45 elapsed | log: Uvicorn running")


def test_last_log_line_is_redacted(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("starting\nserver_args=ServerArgs(model_path='m', api_key='sk-canary-123456', "
                   "port=1)\n\n  \n")
    line = progress.last_log_line(str(log), secrets=())
    assert "sk-canary-123456" not in line and "<redacted>" in line and "model_path='m'" in line
    # a secret the task handed over is masked wherever it stands, whatever the text's shape
    log.write_text("server_args: api_key='sk-canary-123456' model=m\n")
    line = progress.last_log_line(str(log), secrets={"sk-canary-123456"})
    assert "sk-canary-123456" not in line and "model=m" in line
    log.write_text("error: unrecognized arguments: --api-key sk-canary-xyz\n")
    assert "sk-canary" not in progress.last_log_line(str(log))
    log.write_text("loading weights for MYSECRETVALUE42\n")
    assert progress.last_log_line(str(log), secrets={"MYSECRETVALUE42"}) == (
        "loading weights for <redacted>")
    assert progress.last_log_line(str(tmp_path / "missing.log")) is None
    assert progress.last_log_line(str(log), since=time.time() + 60) is None   # the old log
    log.write_text("x" * 500 + "\n")
    assert len(progress.last_log_line(str(log))) == progress.LOG_LINE_MAX


def _wait_for(predicate, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _start_task(uuid="s1"):
    return FakeTask("bench : Start the server for eagle3", "servelab.serving.llm_server",
                    {"state": "started", "name": "servelab-eagle3"}, uuid=uuid)


def test_heartbeat_runs_while_the_server_starts_and_stops_at_its_end(callback, tmp_path):
    cb, display, _options = callback
    task = _start_task()
    log = tmp_path / "servelab-eagle3" / "server.log"
    log.parent.mkdir()
    log.write_text("INFO loading the model HF_TOKEN=hf_canary_secret_1234\n")
    entry = servelab_callback._Starting("h1", "eagle3", str(log))
    cb._server_start = lambda host, task: entry
    cb.v2_playbook_on_task_start(task, False)
    cb.v2_runner_on_start(SimpleNamespace(name="h1"), task)
    assert _wait_for(lambda: any("server starting" in line for line in display.lines))
    beat = [line for line in display.lines if "server starting" in line][0]
    assert beat.startswith("servelab | h1 eagle3: server starting, 00:0")
    assert "| log: INFO loading the model HF_TOKEN=<redacted>" in beat
    assert "hf_canary" not in "\n".join(display.lines)
    thread = cb._heartbeat._thread
    cb.v2_runner_on_ok(_result(task, {"changed": True}))
    assert cb._heartbeat is None
    thread.join(2)
    assert not thread.is_alive()
    count = len(display.lines)
    time.sleep(0.2)
    assert len(display.lines) == count


@pytest.mark.parametrize("end", ["failed", "skipped", "unreachable", "stats", "interrupt"])
def test_heartbeat_stops(callback, end, monkeypatch):
    cb, display, _options = callback
    task = _start_task(uuid="s-" + end)
    cb._server_start = lambda host, task: servelab_callback._Starting(host.name, "eagle3")
    cb.v2_playbook_on_task_start(task, False)
    cb.v2_runner_on_start(SimpleNamespace(name="h1"), task)
    cb.v2_runner_on_start(SimpleNamespace(name="h2"), task)
    thread = cb._heartbeat._thread
    assert _wait_for(lambda: any("h2 eagle3: server starting" in line for line in display.lines))
    if end == "interrupt":
        monkeypatch.setattr(servelab_callback.GUARD, "signals", 1)
    elif end == "stats":
        cb.v2_playbook_on_stats(None)
    else:
        for host in ("h1", "h2"):
            res = _result(task, {}, host=host)
            {"failed": cb.v2_runner_on_failed, "skipped": cb.v2_runner_on_skipped,
             "unreachable": cb.v2_runner_on_unreachable}[end](res)
            if host == "h1":      # one host done, the other still starting
                assert cb._heartbeat is not None
    thread.join(2)
    assert not thread.is_alive()


def test_no_heartbeat_for_other_tasks_or_when_off(callback):
    cb, _display, options = callback
    cb.v2_playbook_on_task_start(FakeTask("bench : Stop the server of eagle3", "llm_server",
                                          {"state": "stopped"}), False)
    assert cb._heartbeat is None
    cb.v2_playbook_on_task_start(FakeTask("servelab: sweep", "llm_bench"), False)
    assert cb._heartbeat is None
    options["heartbeat_interval"] = 0
    cb.v2_playbook_on_task_start(_start_task(), False)
    assert cb._heartbeat is None


def test_server_start_without_variables_says_what_it_can(callback):
    cb, _display, _options = callback
    entry = cb._server_start(SimpleNamespace(name="h1"), _start_task())   # no variable manager
    assert entry.host == "h1" and entry.profile == "servelab-eagle3" and entry.log_path is None
