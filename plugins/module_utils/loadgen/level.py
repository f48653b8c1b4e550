"""The load generator: runs one load level and measures it (docs/architecture.md, 'Measurement'). Stdlib only.

This module is the level's controller (run_level); the load itself comes from client processes
(loadgen/client.py, open loop: loadgen/openloop.py), configured by a LevelConfig
(loadgen/spec.py), judged for client honesty by loadgen/honesty.py.

The level, on the client's monotonic clock:
  start ── warmup ── ws ══════ window ══════ we ── tail ── stop
- warmup: the window opens (ws) once every worker finished `warmup_requests` requests (closed
  loop; default 1), so the synchronized start and cold caches are over; open loop, once
  warmup_requests x concurrency requests finished.
- window: closes (we) once it lasted `level_seconds` and at least `min_window_requests` were sent
  in it, or `max_requests` were sent in it, or half of `level_timeout` has passed (then the level
  is flagged `window_complete: false`). Requests sent inside [ws, we) are the window requests.
- tail: the load stays on (workers keep sending) until every window request finished, so each of
  them ran under the full load; then the tail requests still in flight are cancelled (recorded as
  `cancelled: ...`, not counted as errors) and the level ends.
- `level_timeout` bounds everything; window requests cut by it are errors.

Processes: `processes` forked client processes, each with its own event loop and a share of the
workers (or of the arrival rate). They share a few counters through an anonymous shared-memory
map (loadgen/counters.py); the parent process is only the controller: it decides ws/we/stop from
those counters, samples the server's `/metrics`, and merges the processes' partial results
(metrics.LevelPart). Their request records go to disk as they finish (loadgen/spool.py): the
level's rows come back as files, streamed into the part file by the caller.
`processes: 0` (the default) picks them per level (honesty.auto_processes).
Samples: the window stays open until `min_latency_samples` requests were sent in it (bounded by
level_timeout); a level with fewer succeeded window requests says so (`latency_samples`).
"""
from __future__ import annotations

import mmap
import multiprocessing
import shutil
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ansible_collections.servelab.serving.plugins.module_utils import netstamp
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.caller import caller_gone
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.client import _client_main
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.counters import (
    C_ERR_STREAK, C_ERRORS, C_OK, C_SLOTS, C_SYNCED_WE, C_TOKENS, C_WARM, C_WIN_DONE,
    C_WIN_SENT, C_COMPLETED, G_SLOTS, G_STOP, G_T0, G_WE, G_WS, STOP_ABORT, STOP_DONE,
    STOP_FAILING, STOP_TIMEOUT,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.cpu import LevelCpu, mark_load_generator
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.honesty import (
    auto_processes, call_both, client_honesty, client_warnings, lateness_warning,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import (
    RX_KERNEL, RX_USER, Endpoint, http_get, request_body,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.live import (
    PHASE_TAIL, PHASE_WARMUP, PHASE_WINDOW, LiveFile, LiveRecord,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.metrics import (
    LevelPart, LevelRow, NS_PER_S, batch_means_ci95, level_row,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.server_metrics import (
    MetricsSampler, window_figures,
)
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig, LoadgenError
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spool import RequestRows, spool_directory
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import Workload
from ansible_collections.servelab.serving.plugins.module_utils.proc.terminate import end_children
from ansible_collections.servelab.serving.plugins.module_utils.results.levels import (
    STOP_ABORTED, STOP_LEVEL_TIMEOUT, STOP_SERVER_FAILING, STOP_UNKNOWN, STOP_WINDOW_COMPLETE,
    level_date, row_dict,
)

# What a workload may ask of the level beyond its prompts (workloads.LEVEL_HOOKS): `arrivals`,
# each prompt sent at its own time (a trace, openloop.py); `conversations`, turns in order per
# worker (client.py). loadgen/config.py refuses a workload whose hook is not here.
WORKLOAD_HOOKS = ("arrivals", "conversations")
CONTROL_S = 0.010                # controller poll interval
CALLER_CHECK_TICKS = 50          # every 0.5 s: is Ansible still reading (loadgen/caller.py)?
CLIENT_EXIT_S = 5.0              # a client process ends within this of its result (or is ended)

STOP_REASONS = {STOP_DONE: STOP_WINDOW_COMPLETE, STOP_TIMEOUT: STOP_LEVEL_TIMEOUT,
                STOP_FAILING: STOP_SERVER_FAILING, STOP_ABORT: STOP_ABORTED}


@dataclass
class LevelResult:
    row: LevelRow
    requests: RequestRows           # (a list of row dicts where a test builds one)
    warnings: List[str] = field(default_factory=list)
    sender_priority: Optional[str] = None   # open loop: what the arrival sender ran at

    def row_dict(self) -> dict:
        return row_dict(self.row)


class _Controller:
    """The parent's part of a level: ws, we and the stop, decided from the shared counters."""

    def __init__(self, cfg: LevelConfig, shm, nproc: int):
        self.cfg = cfg
        self.shm = shm
        self.nproc = nproc
        self.closed_loop = cfg.load_mode == "concurrency"
        c = int(cfg.concurrency)
        per_worker = 1 if cfg.warmup_requests is None else int(cfg.warmup_requests)
        # Open loop has no workers: the same number of requests in total (per unit of the cap).
        self.warmup = per_worker if self.closed_loop else per_worker * c
        # The window stays open until enough requests were sent in it: the minimum asked for,
        # and the latency samples (each window request yields one once it succeeded).
        self.min_window = max(cfg.min_window_requests if cfg.min_window_requests is not None
                              else (c if self.closed_loop else 10), cfg.min_latency_samples)
        self.window_complete = True
        # (t_ns, cumulative tokens) inside the window, for the adaptive-precision rule only:
        # 100 a second, kept only when target_ci_pct asks for them.
        self.token_samples: List = []
        self.on_ws = None
        self.on_we = None

    def total(self, slot: int) -> int:
        shm = self.shm
        return sum(shm[G_SLOTS + i * C_SLOTS + slot] for i in range(self.nproc))

    def live_ci_pct(self, now: int) -> Optional[float]:
        """Batch-means CI (% of the mean) of output tok/s so far in the window, from the
        cumulative token counters (the final figure is recomputed exactly afterwards)."""
        samples = self.token_samples
        b = self.cfg.ci_batches
        if len(samples) < 2 * b:
            return None
        t_start, t_end = samples[0][0], samples[-1][0]
        edges = [t_start + (t_end - t_start) * i // b for i in range(b + 1)]
        values, j = [], 0
        for edge in edges:
            while j + 1 < len(samples) and samples[j + 1][0] <= edge:
                j += 1
            values.append(samples[j][1])
        dt = (t_end - t_start) / b / NS_PER_S
        rates = [(values[i + 1] - values[i]) / dt for i in range(b)]
        mean = sum(rates) / b
        half = batch_means_ci95(rates)
        if not mean or half is None:
            return None
        return 100.0 * half / mean

    def live_record(self, now: int) -> LiveRecord:
        """The level so far, for its live file (loadgen/live.py): a few sums of the counters."""
        shm, cfg = self.shm, self.cfg
        ws, we = shm[G_WS], shm[G_WE]
        phase = PHASE_TAIL if we else PHASE_WINDOW if ws else PHASE_WARMUP
        return LiveRecord(
            concurrency=int(cfg.concurrency), elapsed_s=round((now - shm[G_T0]) / NS_PER_S, 3),
            phase=phase, window_s=round(((we or now) - ws) / NS_PER_S, 3) if ws else 0.0,
            level_seconds=float(cfg.level_seconds), requests=self.total(C_COMPLETED),
            errors=self.total(C_ERRORS), tokens=self.total(C_TOKENS),
            request_rate=float(cfg.request_rate) if cfg.load_mode == "rate" else None,
            repeat=int(cfg.repeat))

    def step(self, now: int) -> None:
        shm, cfg = self.shm, self.cfg
        if shm[G_STOP]:
            return
        t0 = shm[G_T0]
        if now - t0 >= cfg.level_timeout * NS_PER_S:
            shm[G_STOP] = STOP_TIMEOUT
            return
        ok = self.total(C_OK)
        errors = self.total(C_ERRORS)
        c = int(cfg.concurrency)
        failing_after = max(2 * c, 8)
        if (ok == 0 and errors >= c + 3) or self.total(C_ERR_STREAK) >= failing_after:
            shm[G_STOP] = STOP_FAILING
            return
        ws = shm[G_WS]
        if not ws:
            if self.closed_loop:
                # Every worker finished its warmup requests (0: no warmup, only a first success).
                warm = self.warmup == 0 or self.total(C_WARM) >= c
            else:
                warm = self.total(C_COMPLETED) >= self.warmup
            if warm and ok > 0:
                shm[G_WS] = now
                if self.on_ws:
                    self.on_ws()
            elif now - t0 >= cfg.level_timeout * NS_PER_S / 2:
                # No window possible in time: stop; the level reports whole-run figures only.
                self.window_complete = False
                shm[G_STOP] = STOP_TIMEOUT
            return
        we = shm[G_WE]
        if not we:
            sent = self.total(C_WIN_SENT)
            if cfg.target_ci_pct:
                self.token_samples.append((now, self.total(C_TOKENS)))
            long_enough = now - ws >= cfg.level_seconds * NS_PER_S and sent >= self.min_window
            if long_enough and cfg.target_ci_pct:
                ci = self.live_ci_pct(now)
                long_enough = ci is not None and ci <= cfg.target_ci_pct
            capped = cfg.max_requests is not None and sent >= int(cfg.max_requests)
            late = now - t0 >= cfg.level_timeout * NS_PER_S / 2
            if long_enough or capped or late:
                if late and not (long_enough or capped):
                    self.window_complete = False
                shm[G_WE] = now
                if self.on_we:
                    self.on_we()
            return
        # Every process has settled its window requests against this we (_reconcile), so
        # the counters are exact, not the live guesses; then wait for the last to finish.
        synced = all(shm[G_SLOTS + i * C_SLOTS + C_SYNCED_WE] == we for i in range(self.nproc))
        if synced and self.total(C_WIN_DONE) >= self.total(C_WIN_SENT):
            shm[G_STOP] = STOP_DONE


def _fork_context():
    try:
        return multiprocessing.get_context("fork")
    except ValueError:  # pragma: no cover - platforms without fork
        raise LoadgenError("processes: the load generator needs fork() (Linux, macOS)") from None


def run_level(cfg: LevelConfig, workload: Workload) -> LevelResult:
    """Run one load level against the server and measure it."""
    try:
        cfg.validate()
    except ValueError as exc:
        raise LoadgenError(str(exc)) from None
    endpoint = Endpoint(cfg.base_url, cfg.api, cfg.api_key)
    wires = [endpoint.wire(request_body(cfg.api, cfg.model, p, p.max_tokens or cfg.max_tokens,
                                        p.ignore_eos or cfg.ignore_eos, cfg.extra_body,
                                        cfg.per_chunk_usage))
             for p in workload.prompts]
    if not wires:
        raise LoadgenError("workload: no prompts")
    arrivals = workload.arrivals_s or None
    if arrivals and cfg.load_mode != "rate":
        raise LoadgenError("workload.kind trace: replays arrivals, so it needs load_mode: rate "
                           "(concurrency then caps the requests in flight)")
    conversations = workload.conversations or None
    if conversations and cfg.load_mode == "rate":
        raise LoadgenError("workload.kind multi_turn: a turn is sent when the previous answer is "
                           "in, so it needs load_mode: concurrency")
    spool_dir = spool_directory()
    try:
        return _measure(cfg, endpoint, wires, spool_dir, arrivals, conversations)
    except BaseException:
        # A level that failed or was interrupted leaves no records behind.
        shutil.rmtree(spool_dir, ignore_errors=True)
        raise


def _measure(cfg: LevelConfig, endpoint: Endpoint, wires: List[bytes], spool_dir: str,
             arrivals: Optional[List[float]] = None,
             conversations: Optional[List[List[int]]] = None) -> LevelResult:
    """run_level's level, its records spooled under `spool_dir` (the caller's to remove)."""
    c = int(cfg.concurrency)
    nproc = max(1, min(int(cfg.processes) or auto_processes(c), c))
    worker_sets = [list(range(i, c, nproc)) for i in range(nproc)]
    shm_map = mmap.mmap(-1, 8 * (G_SLOTS + C_SLOTS * nproc))
    shm = memoryview(shm_map).cast("q")
    ctx = _fork_context()
    mark_load_generator()   # before the fork: the client processes carry the name too
    controller = _Controller(cfg, shm, nproc)
    sampler = None
    warnings: List[str] = []
    cpu = LevelCpu()
    shm[G_T0] = time.monotonic_ns()
    procs, pipes = [], []
    results: Dict[int, dict] = {}
    try:
        for i in range(nproc):
            parent_end, child_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_client_main, name="servelab-loadgen-%d" % i,
                            args=(cfg, i, nproc, worker_sets[i], wires, shm_map, child_end,
                                  spool_dir, arrivals, conversations),
                            daemon=True)
            p.start()
            child_end.close()
            procs.append(p)
            pipes.append(parent_end)
        if cfg.server_metrics:
            sampler = MetricsSampler(endpoint.url(cfg.metrics_path), http_get,
                                     interval=cfg.metrics_interval).start()
        controller.on_ws = call_both(cpu.mark_ws, sampler.sample_now if sampler else None)
        controller.on_we = call_both(cpu.mark_we, sampler.sample_now if sampler else None)
        grace_deadline = None
        ticks = 0
        orphaned = False
        # The figures so far for a watcher, about once a second (cfg.progress_file; None: off).
        live = LiveFile(cfg.progress_file)
        while len(results) < nproc:
            now = time.monotonic_ns()
            controller.step(now)
            live.tick(now, lambda: controller.live_record(now))  # noqa: B023 - called at once
            ticks += 1
            if not shm[G_STOP] and ticks % CALLER_CHECK_TICKS == 0 and caller_gone():
                # ansible-playbook was interrupted or killed: nobody will read this level; stop
                # loading the server now rather than at the end of the level.
                orphaned = True
                shm[G_STOP] = STOP_ABORT
            for i, pipe in enumerate(pipes):
                if i not in results and pipe.poll(0):
                    try:
                        results[i] = pipe.recv()
                    except EOFError:
                        results[i] = {"error": "client process %d exited without a result "
                                               "(exit code %s)" % (i, procs[i].exitcode)}
                    if "error" in results[i] and not shm[G_STOP]:
                        shm[G_STOP] = STOP_ABORT
            if shm[G_STOP] and grace_deadline is None:
                grace_deadline = now + 60 * NS_PER_S
            if grace_deadline is not None and now > grace_deadline:
                for i in range(len(procs)):
                    if i not in results:
                        results[i] = {"error": "client process %d did not finish within 60 s "
                                               "of the stop signal" % i}
                break
            for i, p in enumerate(procs):
                if i not in results and not p.is_alive() and not pipes[i].poll(0):
                    results[i] = {"error": "client process %d died (exit code %s)"
                                           % (i, p.exitcode)}
                    shm[G_STOP] = shm[G_STOP] or STOP_ABORT
            time.sleep(CONTROL_S)
    finally:
        if not shm[G_STOP]:
            shm[G_STOP] = STOP_ABORT
        # They end by themselves once they see the stop; one that does not is ended through
        # proc/terminate.py, and reaped here by multiprocessing (so it knows it has gone).
        end_children([p.pid for p in procs if p.pid], CLIENT_EXIT_S, grace=CLIENT_EXIT_S,
                     kill_timeout=CLIENT_EXIT_S, reap=False)
        for p in procs:
            p.join(CLIENT_EXIT_S)
        cpu.finish()        # every client process was reaped (or terminated and reaped)
        samples = sampler.stop() if sampler else []
        for pipe in pipes:
            pipe.close()
    errors = [r["error"] for r in results.values() if "error" in r]
    if errors:
        raise LoadgenError("load generator failed:\n" + "\n".join(errors))
    stop = shm[G_STOP]
    ws, we = shm[G_WS], shm[G_WE]
    shm.release()
    shm_map.close()
    if we <= ws:
        ws = we = 0
    merged = LevelPart()
    for i in range(nproc):
        merged.merge(results[i]["part"])
    merged.ws, merged.we = ws, we
    row = level_row(cfg.host_label, cfg.profile, c, merged, cfg.slo, cfg.percentiles or ())
    merged.remove_files()       # the figures are taken: the samples' files are done with
    row.repeat = int(cfg.repeat)
    row.load_mode = cfg.load_mode
    row.request_rate = float(cfg.request_rate) if cfg.load_mode == "rate" else None
    if cfg.load_mode == "rate" and row.window_s:
        row.arrival_rate_s = round(row.requests / row.window_s, 4)
        # What the schedule drew for the window: a short window's shortfall against the rate
        # is this draw's, unless fewer than these were sent in it (open_loop_flag).
        row.scheduled_requests = merged.window_scheduled
    row.min_latency_samples = int(cfg.min_latency_samples)
    row.stop_reason = STOP_REASONS.get(stop, STOP_UNKNOWN)
    row.window_complete = bool(ws and we and controller.window_complete)
    row.window_start_ns, row.window_end_ns = ws, we
    if ws and we:   # on the wall clock too, to join the GPU server's telemetry samples
        wall_offset = netstamp.wall_offset_ns()
        row.window_start_unix_ns, row.window_end_unix_ns = ws + wall_offset, we + wall_offset
        row.date = level_date(row.window_start_unix_ns)
    client_honesty(row, [results[i] for i in range(nproc)], merged, nproc, cpu)
    reads = sum(results[i]["rx_reads"] for i in range(nproc))
    stamped = sum(results[i]["rx_kernel_reads"] for i in range(nproc))
    row.rx_timestamps = RX_KERNEL if reads and stamped == reads else RX_USER
    if samples:
        row.server_metrics = window_figures(samples, ws, we)
    elif sampler is not None and sampler.note:
        warnings.append(sampler.note)
    if not row.window_complete:
        warnings.append(
            "C=%d: window incomplete (%s; %d window requests, window %.1f s): raise "
            "level_timeout or lower min_window_requests" % (
                c, row.stop_reason, row.requests, row.window_s))
    if row.latency_samples < row.min_latency_samples:
        warnings.append(
            "C=%d: latency percentiles from %d window requests, fewer than min_latency_samples "
            "(%d): raise level_timeout (the window closed at half of it)" % (
                c, row.latency_samples, row.min_latency_samples))
    priorities = sorted({r["sender_priority"] for r in results.values()
                         if r.get("sender_priority")})
    late = lateness_warning(row, priorities)
    if late:
        warnings.append(late)
    if orphaned:
        warnings.append("C=%d: aborted: the caller (Ansible) went away during the level" % c)
    warnings += client_warnings(row, cpu)
    # The rows stay in the client processes' files until the caller streams them to the part
    # file (spool.py); merged by send time, as they were sorted in memory.
    requests = RequestRows([results[i]["rows"] for i in range(nproc)], spool_dir)
    return LevelResult(row=row, requests=requests, warnings=warnings,
                       sender_priority=", ".join(priorities) or None)
