"""The servelab callback: progress lines, the end-of-run summary, and never raising."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ansible_collections.servelab.serving.plugins.callback import progress as servelab_callback


class CapturingDisplay:
    verbosity = 0

    def __init__(self):
        self.lines = []

    def display(self, msg="", color=None, **kwargs):
        self.lines.append(str(msg))

    def vvv(self, msg, host=None):
        self.lines.append("VVV " + str(msg))

    def __getattr__(self, name):  # warning, deprecated, ...: accept and record
        return lambda *a, **k: self.lines.append(f"{name.upper()} {a}")


class FakeTask:
    def __init__(self, name, action="debug"):
        self.name, self.action = name, action

    def get_name(self):
        return self.name


def result(name, action, data, host="h1"):
    return SimpleNamespace(
        task=FakeTask(name, action), host=SimpleNamespace(name=host), result=data
    )


class BrokenTask(FakeTask):
    def get_name(self):
        raise RuntimeError("a task object from a future ansible-core")


@pytest.fixture
def callback():
    display = CapturingDisplay()
    cb = servelab_callback.CallbackModule(display=display)
    return cb, display


def test_servelab_task_lines_and_levels(callback):
    cb, display = callback
    cb.v2_runner_on_start(
        SimpleNamespace(name="h1"), FakeTask("servelab: sweep eagle3", "llm_bench")
    )
    levels = [
        {
            "profile": "eagle3",
            "concurrency": c,
            "output_tok_s": 10.0 * c,
            "requests": 5,
            "errors": 0,
            "client_limited": c == 4,
        }
        for c in (1, 4)
    ]
    cb.v2_runner_on_ok(
        result("servelab: sweep eagle3", "llm_bench", {"levels": levels, "msg": "done"})
    )
    text = "\n".join(display.lines)
    assert "servelab | h1 | servelab: sweep eagle3 | started" in text
    assert "servelab | h1 | servelab: sweep eagle3 | ok" in text
    # llm_bench's own progress line, whatever keys the row lacks (shown as "-").
    assert "?/eagle3 C=1: output 10.0 tok/s" in text and "?/eagle3 C=4: output 40.0 tok/s" in text
    assert "errors 0/5" in text
    assert "client-limited" in text.split("eagle3 C=4")[1]
    assert "client-limited" not in text.split("eagle3 C=1")[1].split("eagle3 C=4")[0]
    assert "done" in text


def test_other_tasks_are_quiet(callback):
    cb, display = callback
    cb.v2_runner_on_start(SimpleNamespace(name="h1"), FakeTask("Gather facts", "setup"))
    cb.v2_runner_on_ok(result("Gather facts", "setup", {"msg": "x"}))
    cb.v2_playbook_on_stats(None)
    assert display.lines == []


def test_summary_prints_report_table_and_failures(callback):
    cb, display = callback
    cb.v2_runner_on_ok(
        result(
            "servelab: report",
            "bench_report",
            {
                "table": "| C | profile |\n|---|---|\n| 1 | baseline |",
                "msg": "crossover: none",
                "run_id": "r1",
                "results_dir": "/x/r1",
                "files": ["/x/r1/summary.md", "/x/r1/plots/a.png"],
            },
        )
    )
    cb.v2_runner_on_failed(
        result(
            "Start the server for eagle3",
            "llm_server",
            {"msg": "server died\nlog tail..."},
            host="ct129",
        )
    )
    cb.v2_playbook_on_stats(None)
    text = "\n".join(display.lines)
    summary = text.split("servelab summary", 1)[1]
    assert "| 1 | baseline |" in summary and "crossover: none" in summary
    assert "/x/r1/summary.md" in summary and "a.png" not in summary
    assert "ct129 | Start the server for eagle3 | server died" in summary


@pytest.mark.parametrize(
    "bad",
    [
        SimpleNamespace(),  # no task, host or result
        result("servelab: x", "llm_bench", {"levels": "not a list of dicts"}),
        result("servelab: x", "llm_bench", {"levels": [None, 3], "progress": None, "msg": 42}),
        result("servelab: report", "bench_report", {"table": None, "files": None}),
        SimpleNamespace(task=BrokenTask("x", "llm_bench"), host=None, result=None),
    ],
)
def test_never_raises(callback, bad):
    cb, _display = callback
    cb.v2_runner_on_start(getattr(bad, "host", None), getattr(bad, "task", None))
    cb.v2_runner_on_ok(bad)
    cb.v2_runner_on_failed(bad)
    cb.v2_runner_on_unreachable(bad)
    cb.v2_playbook_on_stats(None)
