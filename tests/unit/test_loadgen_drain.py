"""The wait for an idle server between levels (loadgen/drain.py, through config.run_levels).

Each path against a real server process on loopback, ended by PID (simproc.ServerProcess):
- metric: the stdlib fake server (SGLang's gauge names), which keeps a disconnected client's
  request running for a while (--busy-after-disconnect-ms): the drain waits for it; the
  simulator, which cancels such a request at once: the drain is quick, and its gauge (also with
  --abort-delay-ms, a request that runs on after its client left) counts what really runs;
- probe: the fake server without /metrics, whose TTFT stays slow while it works on abandoned
  requests (--busy-ttft-ms);
- timeout (with its warning), drain_timeout 0, the last level, a server that never answers.
The abandoned work lasts 1.5 s, so a drain that does not really wait (< 1.0 s) fails the tests,
and one that waits without cause (>= 0.9 s on a server that cancels at once) fails them too.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import drain
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.config import run_levels
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import http_get
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import CANCELLED_PREFIX
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.server_metrics import (
    parse_prometheus,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    DRAIN_METRIC, DRAIN_NONE, DRAIN_PROBE, DRAIN_TIMEOUT,
)
from simproc import ServerProcess

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_loadgen_fakeserver.py")
WORKLOAD = load({"kind": "builtin"})
ABANDONED_S = 1.5       # how long the servers below keep working after a disconnect


@contextlib.contextmanager
def simulator(tmp_path, *args):
    """The simulator's fixed profile: 20 tokens, one every 10 ms (a request lasts ~0.2 s)."""
    with ServerProcess("--host", "127.0.0.1", "--profile", "fixed", "--ttft-ms", "10",
                       "--step-ms", "10", *args, truth_log=tmp_path / "sim.jsonl") as srv:
        yield srv


@contextlib.contextmanager
def fake(tmp_path, *args):
    with ServerProcess("--ttft-ms", "20", "--step-ms", "8", *args, script=FAKE,
                       truth_log=tmp_path / ("fake-%d.jsonl" % time.monotonic_ns())) as srv:
        yield srv


def configs(url, levels=(2, 2), **kw):
    base = dict(base_url=url, model="m", max_tokens=20, ignore_eos=True, level_seconds=0.3,
                level_timeout=30, min_latency_samples=0, metrics_interval=0.2,
                drain_timeout=10.0)
    base.update(kw)
    return [LevelConfig(**dict(base, concurrency=c)) for c in levels]


def drain_warnings(outcome):
    return [w for w in outcome.warnings if "drain_timeout" in w]


def cancelled_tail(outcome, index=0):
    return [r for r in outcome.requests_by_level[index]
            if (r.get("error") or "").startswith(CANCELLED_PREFIX)]


# ---------------------------------------------------------------------------------------------
# metric path


def test_metric_path_waits_for_work_the_server_keeps_after_a_disconnect(tmp_path):
    with fake(tmp_path, "--busy-after-disconnect-ms", str(ABANDONED_S * 1000)) as srv:
        outcome = run_levels(configs(srv.url), WORKLOAD)
    first, last = outcome.levels
    assert cancelled_tail(outcome), "the level must have left work behind for this test"
    assert first["drain_basis"] == DRAIN_METRIC
    # The tail was cancelled just before the drain began; the server held it 1.5 s more.
    assert ABANDONED_S - 0.5 <= first["drain_s"] < ABANDONED_S + 3, first["drain_s"]
    assert (last["drain_basis"], last["drain_s"]) == (DRAIN_NONE, None)     # the last level
    assert drain_warnings(outcome) == []


def test_metric_path_is_quick_when_the_server_cancels_at_once(tmp_path):
    """The simulator cancels a disconnected client's request at once and its
    sglang:num_running_reqs says so: the drain ends in well under the 1.5 s above."""
    with simulator(tmp_path) as srv:
        outcome = run_levels(configs(srv.url), WORKLOAD)
        gauge = drain.busy_requests(parse_prometheus(http_get(srv.url + "/metrics", 2.0)))
    first = outcome.levels[0]
    assert cancelled_tail(outcome)
    assert first["drain_basis"] == DRAIN_METRIC
    assert first["drain_s"] < 0.9, first["drain_s"]
    assert gauge == 0            # and it stays 0 after the last level's cancelled tail


def test_the_simulators_gauge_counts_a_cancelled_request_only_while_it_runs(tmp_path):
    """--abort-delay-ms 1000 on requests of 1.5 s: a cancelled tail request keeps running (and
    counting) 1 s, then the late abort ends it and the gauge falls to 0."""
    late_s = 1.0
    with simulator(tmp_path, "--abort-delay-ms", str(late_s * 1000)) as srv:
        result = run_level(configs(srv.url, max_tokens=150, warmup_requests=0)[0], WORKLOAD)
        ended = time.monotonic()
        assert [r for r in result.requests if (r["error"] or "").startswith(CANCELLED_PREFIX)]
        readings = []
        while time.monotonic() - ended < late_s + 0.8:
            text = http_get(srv.url + "/metrics", 2.0)
            readings.append((time.monotonic() - ended, drain.busy_requests(parse_prometheus(text))))
            time.sleep(0.1)
    # Still running (abandoned, not yet aborted) early on; 0 once the late abort came.
    assert any(busy > 0 for t, busy in readings if t < late_s - 0.4), readings
    assert all(busy == 0 for t, busy in readings if t > late_s + 0.3), readings


# ---------------------------------------------------------------------------------------------
# probe path


@pytest.mark.parametrize("busy_s", [ABANDONED_S, 0.0])
def test_probe_path_waits_until_the_ttft_is_back_to_idle(tmp_path, busy_s):
    with fake(tmp_path, "--metrics", "none", "--busy-after-disconnect-ms", str(busy_s * 1000),
              "--busy-ttft-ms", "150") as srv:
        outcome = run_levels(configs(srv.url), WORKLOAD)
        srv.stop()
        truth = srv.truth_records()
    first, last = outcome.levels
    assert cancelled_tail(outcome)
    assert first["drain_basis"] == DRAIN_PROBE
    if busy_s:
        assert busy_s - 0.5 <= first["drain_s"] < busy_s + 3, first["drain_s"]
    else:
        assert first["drain_s"] < 0.9, first["drain_s"]
    assert (last["drain_basis"], last["drain_s"]) == (DRAIN_NONE, None)
    # The probes reached the server (it logged more finished streams than the levels have
    # finished requests) but are in no level's requests or figures.
    finished = sum(1 for level in outcome.requests_by_level for r in level if r["error"] is None)
    assert len(truth) >= finished + drain.PROBE_IDLE_COUNT + drain.PROBE_SETTLE
    assert all(row["requests"] <= len(reqs) for row, reqs in
               zip(outcome.levels, outcome.requests_by_level))
    assert drain_warnings(outcome) == []


def test_server_metrics_off_means_probes_not_metrics(tmp_path):
    """The fake server's gauge is truthful, but server_metrics false keeps the drain off
    /metrics too."""
    with fake(tmp_path) as srv:
        outcome = run_levels(configs(srv.url, server_metrics=False), WORKLOAD)
    assert outcome.levels[0]["drain_basis"] == DRAIN_PROBE


# ---------------------------------------------------------------------------------------------
# timeout, off, last level, never hangs


@pytest.mark.parametrize("server", ["metric", "probe"])
def test_timeout_is_recorded_and_warned(tmp_path, server):
    args = () if server == "metric" else ("--metrics", "none", "--busy-ttft-ms", "150")
    with fake(tmp_path, "--busy-after-disconnect-ms", "5000", *args) as srv:
        outcome = run_levels(configs(srv.url, drain_timeout=0.8), WORKLOAD)
    first = outcome.levels[0]
    assert first["drain_basis"] == DRAIN_TIMEOUT
    assert 0.8 <= first["drain_s"] < 1.5, first["drain_s"]
    [warning] = drain_warnings(outcome)
    assert warning.startswith("C=2: ") and "may have started with a loaded server" in warning
    assert outcome.levels[1]["drain_basis"] == DRAIN_NONE


def test_drain_timeout_zero_waits_for_nothing(tmp_path):
    with fake(tmp_path, "--metrics", "none", "--busy-after-disconnect-ms", "5000",
              "--busy-ttft-ms", "150") as srv:
        outcome = run_levels(configs(srv.url, levels=(2, 2, 2), drain_timeout=0), WORKLOAD)
        srv.stop()
        truth = srv.truth_records()
    assert [(r["drain_basis"], r["drain_s"]) for r in outcome.levels] == [(DRAIN_NONE, None)] * 3
    finished = sum(1 for level in outcome.requests_by_level for r in level if r["error"] is None)
    assert len(truth) == finished            # no probe was sent
    assert drain_warnings(outcome) == []


def test_a_single_level_is_not_drained_unless_another_call_follows(tmp_path):
    with fake(tmp_path, "--busy-after-disconnect-ms", str(ABANDONED_S * 1000)) as srv:
        alone = run_levels(configs(srv.url, levels=(2,)), WORKLOAD)
        followed = run_levels(configs(srv.url, levels=(2,)), WORKLOAD, drain_last=True)
    assert (alone.levels[0]["drain_basis"], alone.levels[0]["drain_s"]) == (DRAIN_NONE, None)
    assert followed.levels[0]["drain_basis"] == DRAIN_METRIC
    assert followed.levels[0]["drain_s"] >= ABANDONED_S - 0.5


def test_a_server_that_never_answers_cannot_hold_the_drain_past_its_bound():
    """A listening socket nobody accepts from: connects succeed, nothing ever answers."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)
        url = "http://127.0.0.1:%d" % hole.getsockname()[1]
        cfg = configs(url, drain_timeout=1.0)[0]
        drainer = drain.Drainer(cfg)
        t0 = time.monotonic()
        drainer.prepare()
        prepared = time.monotonic() - t0
        outcome = drainer.drain("C=2")
    assert prepared < 2.0, prepared
    assert outcome.basis == DRAIN_TIMEOUT and 1.0 <= outcome.seconds < 2.0, outcome
    assert "idle probe failed" in outcome.warning


def test_idle_tolerance_and_gauges():
    assert drain.idle_tolerance_ms(4.0) == 9.0           # +5 ms for a fast server
    assert drain.idle_tolerance_ms(100.0) == 150.0       # x1.5 for a slow one
    assert drain.busy_requests({"vllm:num_requests_running": 0.0,
                                "vllm:num_requests_waiting": 2.0}) == 2.0
    assert drain.busy_requests({"sglang:num_running_reqs": 0.0}) == 0.0
    assert drain.busy_requests({"sglang:gen_throughput": 0.0}) is None
    assert drain.drain_plan(3, 30.0) == [True, True, False]
    assert drain.drain_plan(3, 30.0, drain_last=True) == [True, True, True]
    assert drain.drain_plan(3, 0.0, drain_last=True) == [False, False, False]
