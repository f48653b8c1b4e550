"""`servelab tune`'s flags (tools/servelab/_tune_flags.py): each mapped onto one existing tune_* or
bench_* variable, a bad value or a flag and a -e setting the same variable refused with exit 2
before anything starts."""
from __future__ import annotations

import pytest

import servelab   # tools/servelab (conftest.py puts tools/ on sys.path)
from servelab import cli


@pytest.fixture
def calls(monkeypatch):
    """servelab.run_tune replaced: what the CLI would run, nothing started."""
    seen = []

    def fake_run_tune(**kwargs):
        seen.append(kwargs)
        return servelab.RunResult(playbook="tune.yml", status="successful", rc=0)

    monkeypatch.setattr(servelab, "run_tune", fake_run_tune)
    return seen


def test_the_flags_map_onto_the_tune_variables(calls):
    rc = cli.main(["tune", "--space", "max_running_requests=16,32,64",
                   "--space", "mem_fraction_static=0.8,0.85", "--slo", "ttft_ms=500,tpot_ms=50",
                   "--trials", "6", "--minutes", "30", "--metric", "output_tok_s",
                   "--resume", "20261206T010203Z-tune-1"])
    assert rc == 0
    [call] = calls
    assert call["extravars"] == {
        "tune_space": {"max_running_requests": [16, 32, 64], "mem_fraction_static": [0.8, 0.85]},
        "bench_slo": {"ttft_ms": 500.0, "tpot_ms": 50.0},
        "tune_budget": {"trials": 6, "minutes": 30.0},
        "tune_objective": {"metric": "output_tok_s", "percentile": 99},
        "bench_resume": "20261206T010203Z-tune-1"}


@pytest.mark.parametrize("argv, words", [
    (["--space", "max_running_requests"], "--space: 'max_running_requests' is not FLAG=V1,V2"),
    (["--slo", "ttft=500"], "--slo: 'ttft=500' is not LIMIT=MS"),
    (["--trials", "0"], "--trials: '0' is not a whole number >= 1"),
    (["--metric", "qps"], "--metric: 'qps' is not goodput or output_tok_s"),
    (["--trials", "3", "-e", "tune_budget={trials: 4}"], "tune_budget set both by a flag"),
])
def test_bad_flags_are_refused_before_anything_runs(calls, capsys, argv, words):
    assert cli.main(["tune"] + argv) == 2
    assert words in capsys.readouterr().err
    assert calls == []
