"""module_utils/netstamp.py: the one conversion of a kernel receive stamp (SO_TIMESTAMPNS
control message) onto the monotonic clock, and the one wall/monotonic offset, as the load
generator and the simulator both use them."""
from __future__ import annotations

import socket
import time

import pytest

from ansible_collections.servelab.serving.plugins.module_utils import netstamp
from ansible_collections.servelab.serving.plugins.module_utils.loadgen import http
from ansible_collections.servelab.serving.plugins.module_utils.simulator import listener

NOW_REALTIME = 1_700_000_000 * netstamp.NS_PER_S
NOW_MONOTONIC = 5_000 * netstamp.NS_PER_S


def cmsg(stamp_ns, level=socket.SOL_SOCKET, kind=netstamp.SO_TIMESTAMPNS):
    sec, nsec = divmod(stamp_ns, netstamp.NS_PER_S)
    return (level, kind, netstamp.TIMESPEC.pack(sec, nsec))


@pytest.fixture
def realtime(monkeypatch):
    monkeypatch.setattr(netstamp, "_realtime_ns", lambda: NOW_REALTIME)


@pytest.mark.parametrize("age_ns, expected", [
    (3_000_000, NOW_MONOTONIC - 3_000_000),     # the segment came 3 ms before the read
    (-50_000, NOW_MONOTONIC),                   # microseconds ahead: skew, "arrived now"
    (-5_000_000, None),                         # milliseconds ahead: the clock was stepped
    (netstamp.MAX_STAMP_AGE_NS, None),          # too old: stepped the other way
])
def test_a_stamp_in_ancdata_is_its_age_before_the_read(realtime, age_ns, expected):
    assert netstamp.stamp_from_ancdata([cmsg(NOW_REALTIME - age_ns)], NOW_MONOTONIC) == expected


def test_other_or_short_control_messages_give_no_stamp(realtime):
    assert netstamp.stamp_from_ancdata([], NOW_MONOTONIC) is None
    assert netstamp.stamp_from_ancdata([cmsg(NOW_REALTIME, kind=netstamp.SO_TIMESTAMPNS + 1)],
                                       NOW_MONOTONIC) is None
    short = (socket.SOL_SOCKET, netstamp.SO_TIMESTAMPNS, b"\0" * 8)
    assert netstamp.stamp_from_ancdata([short], NOW_MONOTONIC) is None
    # A usable stamp after an unusable one is the read's stamp.
    both = [cmsg(NOW_REALTIME + 10 * netstamp.NS_PER_S), cmsg(NOW_REALTIME - 1000)]
    assert netstamp.stamp_from_ancdata(both, NOW_MONOTONIC) == NOW_MONOTONIC - 1000


def test_the_wall_offset_moves_a_monotonic_time_onto_the_wall_clock():
    before = time.time_ns()
    wall = time.monotonic_ns() + netstamp.wall_offset_ns()
    assert before - 1_000_000 <= wall <= time.time_ns() + 1_000_000


def test_the_load_generator_and_the_simulator_convert_with_netstamp():
    """One conversion: loadgen's transport and the simulator's sockets use these functions (no
    second copy to drift)."""
    assert http.stamp_from_ancdata is netstamp.stamp_from_ancdata
    assert http.kernel_stamps_possible is netstamp.kernel_stamps_possible
    assert listener.netstamp is netstamp
