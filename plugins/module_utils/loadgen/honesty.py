"""Client honesty: did the client, not the server, set the pace of a level? Stdlib only.

Every client process records its CPU time and its event-loop lag (probed every 10 ms,
loadgen/client.py); the controller adds the kernel's account of the reaped processes, its own
CPU and Ansible's on this machine (loadgen/cpu.py). A level is `client_limited` when a client
process used >= 90% of a core over the window, or its loop-lag p99 over the window was >= 2 ms,
or the bench side as a whole (clients, this module, Ansible) used >= 90% of the CPUs it may run
on. `processes: 0` (the default) picks the number of client processes per level so that it is
not (auto_processes).
"""
from __future__ import annotations

import math
from dataclasses import asdict
from typing import List, Optional

from ansible_collections.servelab.serving.plugins.module_utils.loadgen.cpu import LevelCpu, usable_cpus
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import LevelPart, LevelRow, NS_PER_S
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.sender import PRIORITY_REALTIME
from ansible_collections.servelab.serving.plugins.module_utils.results.level_verdict import (
    IN_FLIGHT_CAP, LATENESS_NOTE_MS, open_loop_flag,
)

CLIENT_CPU_LIMIT = 0.90          # fraction of one core over the window
CLIENT_LAG_LIMIT_MS = 2.0        # event-loop lag p99 over the window
# LATENESS_NOTE_MS (results/level_verdict.py): open loop, a send lateness p99 from there on is
# warned about, and open_loop_flag blames the client for a shortfall only from there on.


def call_both(first, second):
    """One callback that calls `first`, then `second` (when there is one)."""
    if second is None:
        return first

    def call():
        first()
        second()
    return call


def client_honesty(row: LevelRow, results: List[dict], part: LevelPart, nproc: int,
                   cpu: LevelCpu) -> None:
    """Fill the row's client fields (CPU, loop lag, client_limited) from the client processes'
    results and the kernel's account (cpu)."""
    reported = sum(r["cpu_total_ns"] for r in results)
    reaped = cpu.clients_ns()
    window_ns = part.we - part.ws if part.we > part.ws else 0
    row.client_processes = nproc
    # The kernel's account of the reaped client processes is complete (their own clocks stop
    # before the results are handed over); it can only be lower if something else reaped them.
    total_cpu = reaped if reaped is not None and reaped >= reported else reported
    row.client_cpu_s = round(total_cpu / NS_PER_S, 3)
    module_s, ansible_s = cpu.module_s(), cpu.ansible_s()
    row.module_cpu_s = None if module_s is None else round(module_s, 3)
    row.ansible_cpu_s = None if ansible_s is None else round(ansible_s, 3)
    util = cpu.host_window_util()
    row.host_cpu_util = None if util is None else round(util, 4)
    client_side = 0.0
    if window_ns:
        utils = [r["cpu_window_ns"] / window_ns for r in results if r["cpu_window_ns"]]
        cpu_window = sum(r["cpu_window_ns"] or 0 for r in results)
        row.client_cpu_util = round(max(utils), 4) if utils else None
        if part.window_output_tokens:
            row.client_cpu_us_per_token = round(cpu_window / 1e3 / part.window_output_tokens, 3)
        # Everything the bench side ran in the window (clients, this module, Ansible), in
        # CPUs: near all the CPUs it may use, it competes with itself whatever each part shows.
        client_side = (cpu_window + cpu.window_overhead_ns()) / window_ns
    lags = [r["lag_p99_s"] for r in results if r["lag_p99_s"] is not None]
    row.loop_lag_p99_ms = round(max(lags) * 1e3, 3) if lags else None
    row.loop_lag_max_ms = round(max(r["lag_max_s"] for r in results) * 1e3, 3)
    row.client_limited = bool(
        (row.client_cpu_util is not None and row.client_cpu_util >= CLIENT_CPU_LIMIT)
        or (row.loop_lag_p99_ms is not None and row.loop_lag_p99_ms >= CLIENT_LAG_LIMIT_MS)
        or client_side >= CLIENT_CPU_LIMIT * usable_cpus())


def auto_processes(concurrency: int, per_process: int = 128) -> int:
    """`processes: 0`: one client process per `per_process` workers, on at most all but one of
    the CPUs this process may use (that one is left to the controller, Ansible, and often the
    server itself). Measured on a 2-core machine serving the simulator locally (2026-12-02): at
    C=256 one process streams 21k tok/s at 56% of a core, not client-limited, and in the firehose
    one process sustained 200k events/s where two sharing the second core managed 150k."""
    spare = max(1, usable_cpus() - 1)
    return max(1, min(spare, math.ceil(concurrency / per_process)))


def lateness_warning(row: LevelRow, priorities: List[str]) -> Optional[str]:
    """Open loop: the note on arrivals sent late (p99 >= LATENESS_NOTE_MS), and why: the
    in-flight cap where results/level_verdict.open_loop_flag names it as the limit, else the
    sender (its priority, or the client's own loop under TLS)."""
    late = row.send_lateness_p99_ms
    if late is None or late < LATENESS_NOTE_MS:
        return None
    if open_loop_flag(asdict(row)).startswith(IN_FLIGHT_CAP):
        # The arrivals waited for a free slot under the cap, not for the sender: its priority
        # is beside the point (the sweep's in-flight cap warning, config.py, says what to raise).
        why = ("arrivals queued behind the in-flight cap of %d, not sent late by the client"
               % row.concurrency)
    elif not priorities:
        why = "arrivals sent from the client's own loop (TLS)"
    elif priorities == [PRIORITY_REALTIME]:
        why = "arrival sender at real-time priority"
    else:
        why = ("arrival sender priority: %s; real-time priority (root or CAP_SYS_NICE) lets "
               "it send on time on a busy machine" % ", ".join(priorities))
    return "C=%d: send lateness p99 %.2f ms (%s)" % (row.concurrency, late, why)


def client_warnings(row: LevelRow, cpu: LevelCpu) -> List[str]:
    """The level's notes about its client: sweeps sharing the bench client, a client-limited
    level."""
    c = row.concurrency
    warnings: List[str] = []
    if cpu.shared_with:
        warnings.append(
            "C=%d: the bench client ran %d other sweep(s) at the same time (other GPU servers "
            "benchmarked from it): they share its %d CPU(s); check client CPU and loop lag" % (
                c, cpu.shared_with, usable_cpus()))
    if row.client_limited:
        warnings.append(
            "C=%d: client-limited (client CPU %.0f%% of a core, loop lag p99 %s ms): add client "
            "processes or a faster bench client" % (
                c, 100 * (row.client_cpu_util or 0), row.loop_lag_p99_ms))
    return warnings
