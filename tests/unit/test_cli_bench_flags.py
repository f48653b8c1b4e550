"""`servelab bench`'s common-case flags (tools/servelab/_flags.py): parsed, checked and mapped
onto the bench role's own variables, a bad one refused with exit 2 before anything starts; and
what the CLI prints of the events at the default verbosity (tools/servelab/cli.py's _Printer)."""
from __future__ import annotations

import io

import pytest

import servelab   # tools/servelab (conftest.py puts tools/ on sys.path)
from servelab import cli

URL = "http://127.0.0.1:8000"


@pytest.fixture
def calls(monkeypatch):
    """servelab.run_bench replaced: what the CLI would run, nothing started."""
    seen = []

    def fake_run_bench(**kwargs):
        seen.append(kwargs)
        return servelab.RunResult(playbook="bench.yml", status="successful", rc=0)

    monkeypatch.setattr(servelab, "run_bench", fake_run_bench)
    return seen


def test_the_common_case_maps_onto_the_existing_bench_variables(calls):
    rc = cli.main(["bench", "--base-url", URL, "--model", "my-model", "-c", "1,2,4",
                   "--level-seconds", "20"])
    assert rc == 0
    [call] = calls
    assert call["inventory"] is None        # the embedded default: no inventory needed
    assert call["extravars"] == {
        "bench_base_url": URL,
        "bench_profiles": [{"name": "external", "engine": "external"}],
        "bench_model": "my-model",
        "bench_concurrency": [1, 2, 4],
        "bench_level_seconds": 20,
    }


def test_flags_are_declared_bench_variables():
    from ansible_collections.servelab.serving.plugins.plugin_utils.preflight.options import (
        bench_spec,
    )
    declared = set(bench_spec())
    assert set(cli._flags.FLAG_OF) <= declared, set(cli._flags.FLAG_OF) - declared


def test_flags_and_extra_vars_combine_and_the_profile_can_be_named(calls):
    rc = cli.main(["bench", "--base-url", URL + "/v1", "--model", "m", "--profile", "prod",
                   "--level-seconds", "2.5", "-e", "bench_warmup_requests=1"])
    assert rc == 0
    extravars = calls[0]["extravars"]
    assert extravars["bench_profiles"] == [{"name": "prod", "engine": "external"}]
    assert extravars["bench_level_seconds"] == 2.5 and extravars["bench_warmup_requests"] == 1
    assert "bench_concurrency" not in extravars     # the role's default levels


@pytest.mark.parametrize("argv, named", [
    (["-c", "1,x"], "-c/--concurrency: 'x'"),
    (["-c", "1,,2"], "-c/--concurrency: ''"),
    (["-c", "0"], "-c/--concurrency: '0'"),
    (["-c", "-1"], "-c/--concurrency"),
    (["--level-seconds", "0"], "--level-seconds: '0'"),
    (["--level-seconds", "soon"], "--level-seconds: 'soon'"),
    (["--level-seconds", "nan"], "--level-seconds: 'nan'"),
    (["--base-url", "localhost:8000", "--model", "m"], "--base-url: 'localhost:8000'"),
    (["--base-url", URL], "--base-url needs --model"),
    (["--profile", "prod"], "--profile"),
    (["-c", "1,2", "-e", "bench_concurrency=[1]"], "bench_concurrency set both"),
])
def test_a_bad_flag_exits_2_naming_it_and_starts_nothing(calls, capsys, argv, named):
    rc = cli.main(["bench", *argv])
    assert rc == 2
    assert named in capsys.readouterr().err
    assert calls == []


def _printed(events, verbosity=0) -> str:
    out = io.StringIO()
    printer = cli._Printer(stream=out, verbosity=verbosity)
    for event in events:
        printer(event)
    return out.getvalue()


METRICS_404 = ("llm_bench: no server metrics from http://127.0.0.1:9/metrics: GET "
               "http://127.0.0.1:9/metrics: HTTP 404 Not Found")
EVENTS = [
    {"event": "playbook_on_play_start", "event_data": {"play": "Benchmark"}},
    {"event": "playbook_on_task_start", "event_data": {"task": "Gather the facts"}},
    {"event": "runner_on_ok", "event_data": {"host": "localhost", "task": "Gather the facts",
                                             "res": {"changed": False}}},
    {"event": "playbook_on_task_start", "event_data": {"task": "servelab: sweep external"}},
    {"event": "verbose", "stdout": "llm_bench localhost/external C=1: 00:05 elapsed"},
    {"event": "runner_on_ok", "stdout": "\x1b[1;35m[WARNING]: %s\x1b[0m" % METRICS_404,
     "event_data": {"host": "localhost", "task": "servelab: sweep external",
                    "res": {"changed": True, "warnings": [METRICS_404]}}},
    {"event": "runner_on_failed", "event_data": {
        "host": "localhost", "task": "servelab: report", "res": {"msg": "no levels"}}},
]


def test_default_output_has_progress_warnings_and_failures_but_no_task_lines():
    text = _printed(EVENTS)
    assert "-- " not in text and "Gather the facts" not in text
    assert "llm_bench localhost/external C=1: 00:05 elapsed" in text
    assert "localhost: warning: %s" % METRICS_404 in text
    assert "localhost: failed (task 'servelab: report'): no levels" in text


def test_a_warning_repeated_by_a_loop_and_its_task_is_printed_once():
    def event(kind, task_uuid):
        return {"event": kind, "event_data": {"host": "h1", "task_uuid": task_uuid,
                                              "res": {"warnings": ["careful"]}}}
    text = _printed([event("runner_item_on_ok", "t1"), event("runner_on_ok", "t1"),
                     event("runner_on_ok", "t2")])
    assert text.count("careful") == 2       # once for t1 (item and task), once for t2


def test_verbose_shows_every_task_line_as_before():
    text = _printed(EVENTS, verbosity=1)
    assert "-- Gather the facts" in text and "-- servelab: sweep external" in text
    assert "   localhost: ok" in text and "   localhost: changed" in text
    assert "localhost: warning: %s" % METRICS_404 in text
