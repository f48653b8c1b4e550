"""Window membership at the boundaries, across processes. The controller takes a boundary's time
and then stores it; a client process that sends in between guesses against the old view (seen in
CI on a loaded 2-core machine: a request sent just after `we` counted as a window request). The
client settles membership by timestamp once it sees the boundary, and the controller ends the
level only when every process has settled against the published `we`."""
from __future__ import annotations

import mmap
from types import SimpleNamespace

from ansible_collections.servelab.serving.plugins.module_utils.loadgen import client as cl_mod
from ansible_collections.servelab.serving.plugins.module_utils.loadgen import counters as lv
from ansible_collections.servelab.serving.plugins.module_utils.loadgen import level as level_mod
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spool import RecordSpool
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import RequestTiming


def shared(nproc):
    buf = mmap.mmap(-1, 8 * (lv.G_SLOTS + lv.C_SLOTS * nproc))
    return memoryview(buf).cast("q")


def slot(shm, index, name):
    return shm[lv.G_SLOTS + index * lv.C_SLOTS + name]


def client(shm, index=0, nproc=1):
    cfg = LevelConfig(base_url="http://127.0.0.1:9", concurrency=2)
    return cl_mod._Client(cfg, index, nproc, [index], [b"x"], shm)


def finish(cl, *requests):
    """Requests finished with their live guesses: what _record keeps of them (the records
    themselves go to the spool, which settles membership against the final window)."""
    for req in requests:
        cl.done_t_send.append(req.t_send)
        cl.done_in_window.append(1 if req.in_window else 0)


def settled(cl):
    return [bool(g) for g in cl.done_in_window]


class Conn:
    """A connection as _reconcile sees one: the request in flight on it, or None."""

    def __init__(self, req):
        self.req = req


def timing(t_send, guessed):
    return RequestTiming(worker=0, request_id=t_send, t_send=t_send, in_window=guessed)


def test_reconcile_settles_the_guesses_by_timestamp_and_fixes_the_counters():
    shm = shared(1)
    cl = client(shm)
    # Live guesses as the races leave them, for ws=100, we=200:
    before = timing(50, False)          # right
    missed = timing(150, False)         # sent after ws was taken, before it was stored
    inside = timing(199, True)          # right
    late = timing(205, True)            # sent after we was taken, before it was stored
    finish(cl, before, missed, inside, late)
    running = timing(210, True)         # same race, still in flight
    cl.inflight = {Conn(running), Conn(None)}
    base = cl.base
    shm[base + lv.C_WIN_SENT] = 3        # inside, late, running
    shm[base + lv.C_WIN_DONE] = 2        # inside, late
    cl._reconcile(100, 200)
    # Settled against both boundaries: nothing finished can move any more, nothing is kept.
    assert settled(cl) == [] and not cl.track_done
    assert running.in_window is False
    assert slot(shm, 0, lv.C_WIN_SENT) == 2          # missed, inside
    assert slot(shm, 0, lv.C_WIN_DONE) == 2          # both finished
    assert slot(shm, 0, lv.C_SYNCED_WE) == 200
    assert cl.synced == (100, 200)


def test_the_spool_settles_the_finished_records_by_timestamp(tmp_path):
    spool = RecordSpool(str(tmp_path / "client-0.spool"))
    for t_send, guessed in ((50, False), (150, False), (199, True), (205, True)):
        spool.add(timing(t_send, guessed))
    spool.flush()
    assert [r.in_window for r in spool.records(100, 200)] == [False, True, True, False]
    assert [r.in_window for r in spool.records(100, 0)] == [False, True, True, True]


def test_reconcile_with_the_window_still_open_counts_everything_after_ws():
    shm = shared(1)
    cl = client(shm)
    missed, early = timing(150, False), timing(90, False)
    finish(cl, missed, early)
    cl._reconcile(100, 0)
    assert settled(cl) == [True]       # missed, now inside; early dropped (it cannot move)
    assert list(cl.done_t_send) == [150]
    assert slot(shm, 0, lv.C_WIN_SENT) == 1 and slot(shm, 0, lv.C_SYNCED_WE) == 0


def test_the_tick_reconciles_once_per_boundary_it_sees():
    shm = shared(1)
    cl = client(shm)
    calls = []
    cl._reconcile = lambda ws, we: (calls.append((ws, we)), setattr(cl, "synced", (ws, we)))
    cl.loop = SimpleNamespace(call_soon=lambda *a: None, call_later=lambda *a: None)
    cl._tick()
    shm[lv.G_WS] = 100
    cl._tick()
    cl._tick()
    shm[lv.G_WE] = 200
    cl._tick()
    cl._tick()
    assert calls == [(100, 0), (100, 200)]


def test_the_level_ends_only_after_every_process_settled_against_we():
    nproc = 2
    shm = shared(nproc)
    cfg = LevelConfig(base_url="http://127.0.0.1:9", concurrency=2, warmup_requests=0)
    ctl = level_mod._Controller(cfg, shm, nproc)
    shm[lv.G_T0], shm[lv.G_WS], shm[lv.G_WE] = 1, 100, 200
    for i in range(nproc):
        base = lv.G_SLOTS + i * lv.C_SLOTS
        shm[base + lv.C_OK] = shm[base + lv.C_WIN_SENT] = shm[base + lv.C_WIN_DONE] = 3
    shm[lv.G_SLOTS + lv.C_SYNCED_WE] = 200              # process 0 settled, process 1 not yet
    ctl.step(300)
    assert shm[lv.G_STOP] == lv.STOP_NONE
    shm[lv.G_SLOTS + lv.C_SLOTS + lv.C_SYNCED_WE] = 200
    ctl.step(310)
    assert shm[lv.G_STOP] == lv.STOP_DONE


def test_the_window_keeps_no_token_samples_unless_the_adaptive_rule_needs_them():
    shm = shared(1)
    for target, kept in ((None, 0), (2.0, 1)):
        cfg = LevelConfig(base_url="http://127.0.0.1:9", concurrency=2, warmup_requests=0,
                          target_ci_pct=target)
        ctl = level_mod._Controller(cfg, shm, 1)
        shm[lv.G_T0], shm[lv.G_WS], shm[lv.G_WE], shm[lv.G_STOP] = 1, 100, 0, 0
        shm[lv.G_SLOTS + lv.C_OK] = 1
        ctl.step(200)
        assert len(ctl.token_samples) == kept
