"""Chunk arrival times from the kernel (http.RxStampTransport): a busy event loop that reaches a
socket late must not put its wait into TTFT. Against the stdlib fake server, a request is sent and
the loop is then kept busy for 200 ms before it reads: the kernel's stamp gives the server's TTFT,
the read time gives the wait."""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from ansible_collections.servelab.serving.plugins.module_utils import netstamp
from ansible_collections.servelab.serving.plugins.module_utils.loadgen import http
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import RequestTiming
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import load
from simproc import ServerProcess

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_loadgen_fakeserver.py")
BUSY_S = 0.2

pytestmark = pytest.mark.skipif(not http.kernel_stamps_possible(),
                                reason="kernel receive timestamps are Linux-only")


def one_request(url, mode):
    """TTFT of one request whose reads wait BUSY_S behind a busy loop; and the RxStats."""
    endpoint = http.Endpoint(url, http.API_OPENAI_CHAT)
    prompt = load({"kind": "builtin"}).prompts[0]
    wire = endpoint.wire(http.request_body(http.API_OPENAI_CHAT, "m", prompt, 4, False))
    stats = http.RxStats()
    done = []

    async def main():
        loop = asyncio.get_running_loop()
        finished = loop.create_future()

        def on_done(conn, req):
            done.append(req)
            conn.transport.close()
            finished.set_result(None)

        conn = await http.open_connection(loop, endpoint, http.API_OPENAI_CHAT, on_done,
                                          lambda conn: None, 10.0, 65536, mode, stats)
        conn.send(RequestTiming(worker=0, request_id=0, t_send=0), wire)
        time.sleep(BUSY_S)          # the loop is busy: the answer waits in the socket
        await asyncio.wait_for(finished, 10)
        await asyncio.sleep(0.01)   # connection_lost after the close

    asyncio.run(main())
    req = done[0]
    assert req.error is None, req.error
    return (req.t_first - req.t_send) / 1e6, stats


def test_the_kernel_stamp_keeps_the_loops_wait_out_of_ttft():
    with ServerProcess("--ttft-ms", "20", "--step-ms", "2", script=FAKE) as srv:
        kernel_ms, kernel_stats = one_request(srv.url, http.RX_KERNEL)
        user_ms, user_stats = one_request(srv.url, http.RX_USER)
    assert 19.0 <= kernel_ms < 60.0, kernel_ms          # the server's 20 ms, not the wait
    assert user_ms >= BUSY_S * 1e3 - 1, user_ms          # the read time holds the wait
    assert kernel_stats.mode == http.RX_KERNEL and kernel_stats.reads >= 1
    assert user_stats.mode == http.RX_USER


def test_a_level_says_which_clock_stamped_it():
    with ServerProcess("--ttft-ms", "10", "--step-ms", "2", script=FAKE) as srv:
        base = dict(base_url=srv.url, model="m", concurrency=2, max_tokens=6,
                    level_seconds=0.3, min_latency_samples=0, server_metrics=False,
                    drain_timeout=0)
        kernel = run_level(LevelConfig(**base), load({"kind": "builtin"})).row
        user = run_level(LevelConfig(rx_timestamps=http.RX_USER, **base),
                         load({"kind": "builtin"})).row
    assert kernel.rx_timestamps == http.RX_KERNEL and kernel.errors == 0
    assert user.rx_timestamps == http.RX_USER and user.errors == 0


def test_an_unknown_clock_is_refused_by_name():
    with pytest.raises(Exception, match="rx_timestamps"):
        LevelConfig(base_url="http://127.0.0.1:9", model="m", rx_timestamps="tsc").validate()


@pytest.mark.parametrize("age_ns, expected", [
    (3_000_000, 1_000_000_000 - 3_000_000),   # an ordinary age: the kernel's time
    (0, 1_000_000_000),
    (-50_000, 1_000_000_000),                 # microseconds in the future: skew, "arrived now"
    (-5_000_000, None),                       # milliseconds in the future: the clock was stepped
    (netstamp.MAX_STAMP_AGE_NS, None),        # too old: stepped the other way
])
def test_a_kernel_stamps_age_is_trusted_only_within_its_bounds(age_ns, expected):
    assert netstamp.stamp_from_age(1_000_000_000, age_ns) == expected
