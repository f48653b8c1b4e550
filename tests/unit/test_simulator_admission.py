"""The simulator's one admission rule (simulator/admission.py): what it admits, that the live
server's scheduler and the offline predictor both admit through it, and that the predictions
are those of the single-file simulator before the rule was shared (pinned figures)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import deque

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.simulator import (
    admission, des, predictor, server,
)
from ansible_collections.servelab.serving.plugins.module_utils.simulator.profiles import PROFILES

P = dataclasses.replace(PROFILES["baseline"], max_running=3, max_prefill_tokens=100)


def tokens(req):
    return req["tokens"]


def gone(req):
    return req.get("gone", False)


def queue_of(*sizes):
    return deque({"id": i, "tokens": n} for i, n in enumerate(sizes))


def ids(reqs):
    return [r["id"] for r in reqs]


def test_fifo_up_to_the_free_slots():
    queue = queue_of(10, 10, 10, 10)
    assert ids(admission.admit(queue, 0, P, tokens)) == [0, 1, 2]
    assert ids(queue) == [3]
    assert admission.admit(queue_of(10), 3, P, tokens) == []          # no free slot


def test_the_prefill_budget_stops_admission_but_the_first_always_fits():
    queue = queue_of(60, 50, 10)
    assert ids(admission.admit(queue, 0, P, tokens)) == [0]           # 50 > 100 - 60: wait
    assert ids(queue) == [1, 2]                                       # FIFO: 10 does not jump
    assert ids(admission.admit(queue_of(500, 1), 0, P, tokens)) == [0]  # chunked prefill


def test_requests_that_ended_while_queued_are_dropped_without_a_slot():
    queue = queue_of(10, 10, 10, 10)
    queue[0]["gone"] = queue[2]["gone"] = True
    assert ids(admission.admit(queue, 1, P, tokens, gone)) == [1, 3]
    assert not queue


# predict_level figures of the single-file simulator (main @ 98094a9), full precision: moving the
# rule into admission.py changed no arithmetic.
PINNED = [
    ("baseline", 30, 494.4677779188186, 2440.7150444040203, 0.34149677380358723),
    ("eagle3", 5, 191.40393971786787, 1337.6697030971309, 0.0),
    ("eagle3_dynamic", 30, 493.87819973511654, 2495.2883525545913, 0.35712064302467644),
]


@pytest.mark.parametrize("profile, c, tok_s, ttft_ms, queued", PINNED)
def test_predictions_are_unchanged_and_admit_through_the_rule(monkeypatch, profile, c, tok_s,
                                                              ttft_ms, queued):
    calls = []

    def spy(*args, **kw):
        plan = admission.plan_step(*args, **kw)
        calls.append(len(plan.admitted))
        return plan

    monkeypatch.setattr(des, "plan_step", spy)      # the engine predict_level runs
    pred = predictor.predict_level(profile, c)
    assert (pred.output_tok_s, pred.ttft_ms, pred.mean_queued) == (tok_s, ttft_ms, queued)
    assert calls and sum(calls) >= 2 * c               # every admission went through the rule


def test_the_live_server_admits_through_the_same_rule(monkeypatch):
    """Two requests against max_running 1: the scheduler asks the rule every step, and the rule
    holds the second back while the first runs."""
    calls = []

    def spy(queue, prefilling, running, p, prompt_tokens, gone=None, **kw):
        plan = admission.plan_step(queue, prefilling, running, p, prompt_tokens, gone, **kw)
        new = plan.admitted
        calls.append((running, len(queue) + len(new), len(new)))
        return plan

    monkeypatch.setattr(server, "plan_step", spy)
    profile = dataclasses.replace(PROFILES["baseline"], max_running=1, request_overhead_ms=0.0)

    async def post(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = json.dumps({"prompt": "abcd", "max_tokens": 3, "ignore_eos": True}).encode()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        data = await reader.read()
        writer.close()
        return data

    async def run():
        srv = server.SimServer(server.ServerConfig(port=0, profile=profile, time_scale=100.0))
        await srv.start()
        try:
            return await asyncio.wait_for(asyncio.gather(post(srv.port), post(srv.port)), 30)
        finally:
            await srv.shutdown()

    answers = asyncio.run(run())
    assert all(a.startswith(b"HTTP/1.1 200") for a in answers), answers
    assert any(running == 1 and waiting >= 1 and admitted == 0
               for running, waiting, admitted in calls), calls
    assert sum(admitted for _r, _w, admitted in calls) == 2
