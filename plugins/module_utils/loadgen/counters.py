"""The counters a level's client processes share with its controller (an anonymous shared-memory
map of int64 slots, loadgen/level.py makes it): the layout, and the stop codes.

Globals first (G_*: window start/end, the stop code, the level's start), then one block of
C_SLOTS per client process (C_*), which only that process writes. The controller decides the
window and the stop from these, the client processes read the globals on every tick.
"""
from __future__ import annotations

STOP_NONE, STOP_DONE, STOP_TIMEOUT, STOP_FAILING, STOP_ABORT = 0, 1, 2, 3, 4

# Shared counters (int64 slots): globals, then one block per client process.
G_WS, G_WE, G_STOP, G_T0 = 0, 1, 2, 3
G_SLOTS = 8
(C_COMPLETED, C_WARM, C_WIN_SENT, C_WIN_DONE, C_OK, C_ERRORS, C_TOKENS, C_ERR_STREAK,
 C_SYNCED_WE) = range(9)
C_SLOTS = 9
