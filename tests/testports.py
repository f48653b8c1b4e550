"""Ports for the tests' own servers: one helper, where each test module had its own bind-to-0.

A port the kernel hands out for bind(0) is in its ephemeral range (ip_local_port_range), the range
it also gives every outgoing connection: between the pick and the server's bind (seconds, through
ansible-playbook), another test's client may take that number, or the port beside it that a
derived router profile binds (P+1, P+2). CI saw both: "Start the two halves of eagle3_router"
failing, and a port still "in use" after the server had gone (a client's socket on it). So the
pick comes from below the ephemeral range, which the kernel never hands out by itself, and is
checked free with the ports after it that a run may bind.
"""
from __future__ import annotations

import random
import socket

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LOWEST = 20000          # above the well-known and most registered services' ports
BLOCK = 3               # P, and P+1 and P+2 of a derived router profile's two halves


def ephemeral_low(path: str = EPHEMERAL_RANGE) -> int:
    try:
        with open(path) as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768    # Linux's default


def bindable(port: int) -> bool:
    """Nothing is bound to 127.0.0.1:port (a listener, a client's socket, a TIME_WAIT)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(block: int = BLOCK) -> int:
    """A port P with P .. P + block - 1 free on 127.0.0.1, below the ephemeral range."""
    top = ephemeral_low() - block
    low = LOWEST if top > LOWEST + 1000 else 1024
    pick = random.SystemRandom()
    for _attempt in range(500):
        port = pick.randrange(low, top)
        if all(bindable(port + i) for i in range(block)):
            return port
    raise RuntimeError("no %d free ports in a row below %d on 127.0.0.1" % (block, top + block))
