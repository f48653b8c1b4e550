"""Kernel receive stamps and the wall/monotonic clock offset, for the load generator and the
simulator alike (one conversion, so the client's chunk times and the server's truth agree).

A socket with SO_TIMESTAMPNS on gets, with every recvmsg, the kernel's CLOCK_REALTIME time of
the last segment the read returned. Every servelab time is CLOCK_MONOTONIC, so a stamp is brought
onto it by its age at the read (realtime now minus the stamp): the read's monotonic time minus
that age. A clock step between the two then costs at most that read's stamp: an age out of range
(older than MAX_STAMP_AGE_NS, or further than MAX_CLOCK_SKEW_NS in the future) gives no stamp,
and the caller uses the read time. Standard library only: it runs on bench clients and targets.
"""
from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Iterable, Optional, Tuple

NS_PER_S = 1_000_000_000
# Linux's SO_TIMESTAMPNS (its control message type is the same number); Python does not export it.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
TIMESPEC = struct.Struct("qq")
# The ancillary buffer one stamp needs (recvmsg's ancbufsize); 0 where the platform has no cmsg.
ANCILLARY = socket.CMSG_SPACE(TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
MAX_STAMP_AGE_NS = 10 * NS_PER_S             # older (or negative): the clock was stepped
# A stamp up to this far in the future is clock skew, not a step: on a VM the kernel's stamp
# (taken on the CPU that received the segment) and the vDSO's CLOCK_REALTIME (read on ours) can
# disagree by microseconds, so a read made right after the segment arrived sees a small
# negative age. It is read as "arrived now" instead of losing the kernel label.
MAX_CLOCK_SKEW_NS = 1_000_000

_realtime_ns = time.time_ns


def kernel_stamps_possible() -> bool:
    """Whether this platform gives receive stamps (Linux, with control messages)."""
    return sys.platform.startswith("linux") and bool(ANCILLARY)


def enable_rx_stamps(sock: socket.socket) -> None:
    """Ask the kernel to stamp what sock receives (raises OSError where it cannot). On a
    listening socket the accepted connections inherit it."""
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def stamp_from_age(now_ns: int, age_ns: int) -> Optional[int]:
    """A read's arrival on the monotonic clock from its kernel stamp's age (realtime now minus
    the stamp), or None where the age says the clock was stepped (the read time is used)."""
    if -MAX_CLOCK_SKEW_NS <= age_ns < MAX_STAMP_AGE_NS:
        return now_ns - max(age_ns, 0)
    return None


def stamp_from_ancdata(ancdata: Iterable[Tuple[int, int, bytes]], now_ns: int) -> Optional[int]:
    """The monotonic arrival time the kernel's stamp in recvmsg's ancdata gives for a read made
    at now_ns (monotonic, taken right after the recvmsg), or None where there is no usable one.
    The realtime clock is read here, per stamp, as close to now_ns as the caller allows."""
    stamp = None
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            kernel_stamp = stamp_from_age(now_ns, _realtime_ns() - (sec * NS_PER_S + nsec))
            if kernel_stamp is not None:
                stamp = kernel_stamp
    return stamp


def wall_offset_ns() -> int:
    """CLOCK_REALTIME minus CLOCK_MONOTONIC now: add it to a monotonic time to get the wall
    clock (to join samples of other hosts and processes). Read once per use: a step of the wall
    clock moves every time converted with one reading by the same amount."""
    return time.time_ns() - time.monotonic_ns()
