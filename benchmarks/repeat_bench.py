"""Repeatability on a real engine: servelab's load generator and an independent aiohttp client,
side by side, against one `transformers serve` (prints figures; no asserts).

It starts `transformers serve --continuous-batching` with the random-weight Llama the engine
recipe builds (tests/gpu/engine/build_random_llm.py) as a child process (ended by its PID), warms
it up, then for each repeat and each concurrency C runs both clients one after the other, the
order alternating between repeats so that drift in the engine hits both:

  servelab  run_level (closed loop, 1 warm-up request per worker): output tok/s over its window,
            TTFT p50, client_limited.
  aiohttp   benchmarks/client_baselines.py's naive request (one aiohttp session per request,
            json.loads of every chunk), driven closed loop by C coroutines; the window opens
            once every coroutine finished one request (as servelab's does) and lasts as long;
            tok/s = content chunks arriving in the window (x tokens per chunk from the final
            usage), TTFT p50 of the requests sent in it. Also the figure such clients usually
            print: all tokens / (first send .. last end), ramp and tail included ("whole run").

Beside every figure, over that run's own window: NVML utilization.gpu (mean), SM activity from
NVML GPM where the GPU has it (Hopper on), GPU memory used; the engine process tree's CPU
(/proc/<pid>/stat utime+stime of the server and its descendants, as cores) and its busiest
thread (% of one core); the client's CPU (this process and its load-generator children, as
cores). A separate sampler process takes them every --sample-ms, so it costs neither client a
share of its interpreter. Then per client per C: mean, min, max, spread (max-min)/mean, CV.

Usage (device machine; the wheels from tests/gpu/engine/fetch-wheels.sh carried in .whl):

  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && \\
      python3 benchmarks/repeat_bench.py --write-md "$OUT/repeat.md"

Without a GPU, against the simulator (checks the script, figures mean nothing):

  python3 benchmarks/repeat_bench.py --simulator --seconds 2 --max-tokens 16 --repeats 2

Options: --levels 16,64 --repeats 3 --seconds 15 (window) --max-tokens 128 --hidden 1024
--layers 4 (the model: the recipe's small size, as in tests/gpu/test_transformers_serve.py)
--budget-s (no new run starts past it; the table says what was skipped)
--write-md PATH (and PATH with .json: every run's raw figures).
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import itertools
import json
import multiprocessing
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ENGINE_DIR = os.path.join(REPO, "tests", "gpu", "engine")
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "tools"))
import collection_link  # noqa: E402
collection_link.importable()
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.http import request_body  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.level import run_level  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.spec import LevelConfig  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.loadgen.workloads import builtin  # noqa: E402
from ansible_collections.servelab.serving.plugins.plugin_utils.report.table import Table  # noqa: E402

import client_baselines  # noqa: E402

NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}   # as tests/gpu/gpu_env.py
CLK_TCK = os.sysconf("SC_CLK_TCK")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--levels", default="16,64")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=15.0, help="measurement window per run")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--model-dir", default="/tmp/model")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--warmup-s", type=float, default=3.0,
                   help="a discarded servelab run at the highest C before the first figure")
    p.add_argument("--sample-ms", type=float, default=100.0)
    p.add_argument("--budget-s", type=float, default=None,
                   help="start no run past this many seconds from the start")
    p.add_argument("--simulator", action="store_true",
                   help="the servelab simulator instead of transformers serve (no GPU needed)")
    p.add_argument("--sim-profile", default="baseline")
    p.add_argument("--log-dir", default=None, help="where the engine's log goes")
    p.add_argument("--write-md", default=None, metavar="PATH")
    return p.parse_args(argv)


# --- the sampler (its own process) -----------------------------------------------------------

def _proc_table():
    """{pid: (ppid, utime+stime ticks)} of every process now."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        table[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
    return table


def _tree(table, root, exclude=()):
    """{pid: ticks} of `root` and its descendants in `table`."""
    if root not in table:
        return {}
    children: Dict[int, List[int]] = {}
    for pid, (ppid, _t) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in exclude:
            continue
        out[pid] = table[pid][1]
        todo.extend(children.get(pid, ()))
    return out


def _thread_ticks(pid):
    """({tid: utime+stime ticks}, {tid: ns waited on a run queue}) of the threads of `pid`."""
    ticks, wait = {}, {}
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return ticks, wait
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/stat" % (pid, tid), "rb") as fh:
                raw = fh.read()
            with open("/proc/%d/task/%s/schedstat" % (pid, tid), "rb") as fh:
                sched = fh.read().split()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        ticks[int(tid)] = int(rest[11]) + int(rest[12])
        wait[int(tid)] = int(sched[1])
    return ticks, wait


def _host_ticks():
    """(busy, steal) ticks of the whole machine, from /proc/stat (busy: not idle/iowait/steal)."""
    with open("/proc/stat", "rb") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    idle, iowait, steal = v[3], v[4], v[7] if len(v) > 7 else 0
    return sum(v[:8]) - idle - iowait - steal, steal


class _Gpu:
    """NVML readings of GPU 0: utilization.gpu, memory used, and SM activity / occupancy from
    GPM (between this sample and the previous one) where the GPU and driver have it."""

    def __init__(self):
        self.note = []
        self.handle = None
        self.gpm = None
        try:
            import pynvml
            self.nv = pynvml
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:  # noqa: BLE001 - no GPU: figures are None, the reason kept
            self.note.append("NVML: %s" % exc)
            return
        try:
            if not pynvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                raise RuntimeError("device not supported")
            self.gpm = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
            pynvml.nvmlGpmSampleGet(self.handle, self.gpm[0])
        except Exception as exc:  # noqa: BLE001
            self.gpm = None
            self.note.append("GPM (SM activity): %s" % exc)

    def read(self):
        if self.handle is None:
            return None, None, None, None
        nv = self.nv
        util = nv.nvmlDeviceGetUtilizationRates(self.handle).gpu
        mem = nv.nvmlDeviceGetMemoryInfo(self.handle).used / 2 ** 20
        sm = occ = None
        if self.gpm is not None:
            try:
                nv.nvmlGpmSampleGet(self.handle, self.gpm[1])
                mg = nv.c_nvmlGpmMetricsGet_t()
                mg.version = nv.NVML_GPM_METRICS_GET_VERSION
                mg.numMetrics = 2
                mg.sample1, mg.sample2 = self.gpm[0], self.gpm[1]
                mg.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
                mg.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_OCCUPANCY
                nv.nvmlGpmMetricsGet(mg)
                sm, occ = mg.metrics[0].value, mg.metrics[1].value
                self.gpm.reverse()
            except Exception as exc:  # noqa: BLE001
                self.note.append("GPM read: %s" % exc)
                self.gpm = None
        return util, mem, sm, occ

    def info(self):
        if self.handle is None:
            return {}
        nv = self.nv

        def s(v):
            return v.decode() if isinstance(v, bytes) else v
        return {"gpu": s(nv.nvmlDeviceGetName(self.handle)),
                "driver": s(nv.nvmlSystemGetDriverVersion()),
                "gpu_memory_mib": round(nv.nvmlDeviceGetMemoryInfo(self.handle).total / 2 ** 20)}


def _sampler_main(conn, client_root, interval):
    me = os.getpid()
    gpu = _Gpu()
    engine_root = None
    samples = []   # (t_ns, engine {pid: ticks}, engine-main {tid: ticks}, client {pid: ticks}, gpu)
    next_t = time.monotonic()
    while True:
        if conn.poll(max(0.0, next_t - time.monotonic())):
            msg = conn.recv()
            if msg[0] == "engine":
                engine_root = msg[1]
                conn.send(True)
            elif msg[0] == "info":
                conn.send(dict(gpu.info(), notes=sorted(set(gpu.note))))
            elif msg[0] == "window":
                conn.send(_window(samples, msg[1], msg[2]))
            elif msg[0] == "stop":
                conn.send(True)
                return
            continue
        next_t += interval
        if next_t < time.monotonic():          # fell behind (a slow read): do not bunch up
            next_t = time.monotonic() + interval
        try:
            t = time.monotonic_ns()
            table = _proc_table()
            eng = _tree(table, engine_root) if engine_root else {}
            threads, waits = _thread_ticks(engine_root) if engine_root else ({}, {})
            # The client: this process and its children (the load generator's), not the engine.
            cli = _tree(table, client_root, exclude=(me, engine_root))
            samples.append((t, eng, threads, cli, gpu.read(), waits, _host_ticks()))
        except Exception as exc:  # noqa: BLE001 - one bad sample must not end the sampler
            gpu.note.append("sample failed: %s: %s" % (type(exc).__name__, exc))


def _cores(a, b, key):
    """CPU cores used between samples a and b by the processes (or threads) in slot `key`."""
    span = (b[0] - a[0]) / 1e9
    if span <= 0:
        return None
    ticks = sum(t - a[key].get(pid, 0) for pid, t in b[key].items())
    return ticks / CLK_TCK / span


def _window(samples, ws, we):
    inside = [s for s in samples if ws <= s[0] <= we]
    out = {"samples": len(inside)}
    if len(inside) < 2:
        return out
    a, b = inside[0], inside[-1]
    out["engine_cpu_cores"] = _cores(a, b, 1)
    out["client_cpu_cores"] = _cores(a, b, 3)
    span = (b[0] - a[0]) / 1e9
    busiest = sorted(((t - a[2].get(tid, 0)) / CLK_TCK / span, tid) for tid, t in b[2].items())
    out["engine_busiest_thread"] = busiest[-1][0] if busiest else None
    if busiest:     # how long that thread was runnable but waited for a CPU, share of the window
        tid = busiest[-1][1]
        out["engine_busiest_runq_wait"] = (b[5].get(tid, 0) - a[5].get(tid, 0)) / 1e9 / span
    out["engine_runq_wait_cores"] = sum(w - a[5].get(tid, 0) for tid, w in b[5].items()) / 1e9 / span
    out["host_busy_cores"] = (b[6][0] - a[6][0]) / CLK_TCK / span
    out["host_steal_cores"] = (b[6][1] - a[6][1]) / CLK_TCK / span
    out["engine_processes"] = len(b[1])

    def mean(i):
        v = [s[4][i] for s in inside if s[4][i] is not None]
        return sum(v) / len(v) if v else None
    out["gpu_util_mean"] = mean(0)
    out["gpu_mem_mib_max"] = max((s[4][1] for s in inside if s[4][1] is not None), default=None)
    out["sm_active_mean"] = mean(2)
    out["sm_occupancy_mean"] = mean(3)
    return out


class Sampler:
    def __init__(self, interval_s):
        ctx = multiprocessing.get_context("fork")   # before any thread or CUDA in this process
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_sampler_main, args=(child, os.getpid(), interval_s),
                                name="repeat-bench-sampler", daemon=True)
        self.proc.start()
        child.close()

    def ask(self, *msg, timeout=60.0):
        self.conn.send(msg)
        if not self.conn.poll(timeout):
            raise RuntimeError("the sampler process did not answer %r in %.0f s" % (msg[0], timeout))
        return self.conn.recv()

    def stop(self):
        try:
            self.ask("stop", timeout=10)
        except (OSError, EOFError, RuntimeError):
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()          # its PID: multiprocessing sends SIGKILL to it alone


# --- the engine --------------------------------------------------------------------------------

def _descendants(pid):
    table = _proc_table()
    return [p for p in _tree(table, pid) if p != pid]


class Engine:
    """transformers serve (or the simulator) as a child process, ended by its PID."""

    def __init__(self, args, log_dir):
        self.args = args
        self.info = {}
        self.sim = None
        self.proc = None
        if args.simulator:
            from simproc import ServerProcess
            self.sim = ServerProcess("--profile", args.sim_profile, "--model-name", "repeat-sim")
            self.pid, self.url, self.model = self.sim.pid, self.sim.url, "repeat-sim"
            self.info = {"engine": "servelab simulator --profile %s" % args.sim_profile}
            return
        sys.path.insert(0, ENGINE_DIR)
        import run_transformers_serve as recipe   # the engine recipe's model build and command
        t0 = time.monotonic()
        self.info["model_build"] = recipe.build_model(args.model_dir, args.hidden, args.layers)
        self.info["model_build_s"] = round(time.monotonic() - t0, 1)
        os.makedirs(os.path.expanduser("~/.cache/huggingface/hub"), exist_ok=True)
        cmd = recipe.serve_command() + [args.model_dir, "--continuous-batching", "--host",
                                        "127.0.0.1", "--port", str(args.port)]
        self.info["command"] = " ".join(shlex.quote(c) for c in cmd)
        self.log_path = os.path.join(log_dir, "transformers-serve.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL,
                                     env=dict(os.environ, **NO_MULTICAST_ENV))
        self.pid = self.proc.pid
        self.url = "http://127.0.0.1:%d" % args.port
        self.model = args.model_dir
        try:
            self.info["ready_s"] = self._wait_ready(args.ready_timeout)
        except BaseException:
            self.stop()                  # never leave it running when the start failed
            raise

    def _wait_ready(self, timeout):
        body = json.dumps({"model": self.model, "max_tokens": 1,
                           "messages": [{"role": "user", "content": "Hello"}]}).encode()
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError("transformers serve exited with %s: %s" % (
                    self.proc.returncode, self.log_tail()))
            req = urllib.request.Request(self.url + "/v1/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as resp:
                    resp.read()
                    if resp.status == 200:
                        return round(time.monotonic() - t0, 1)
            except (urllib.error.URLError, OSError) as exc:
                last = exc
            time.sleep(0.5)
        raise RuntimeError("not ready after %.0f s (%s): %s" % (timeout, last, self.log_tail()))

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self):
        if self.sim is not None:
            self.sim.stop()
            return {"exit": self.sim.proc.returncode}
        if self.proc is None or self.proc.poll() is not None:
            return {"exit": None if self.proc is None else self.proc.returncode}
        kids = _descendants(self.pid)
        t0 = time.monotonic()
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in kids:              # anything it left behind, by PID
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        return {"exit": self.proc.returncode, "stop_s": round(time.monotonic() - t0, 2),
                "children_seen": len(kids)}


# --- the two clients ---------------------------------------------------------------------------

def run_servelab(engine, c, args, workload):
    cfg = LevelConfig(base_url=engine.url, model=engine.model, api="openai_chat", concurrency=c,
                      max_tokens=args.max_tokens, level_seconds=args.seconds,
                      level_timeout=max(300.0, args.seconds * 20), server_metrics=False,
                      per_chunk_usage=False, host_label="device", profile="transformers_serve",
                      processes=1, warmup_requests=1)
    t0 = time.monotonic_ns()
    res = run_level(cfg, workload)
    t1 = time.monotonic_ns()
    row = res.row
    ws = getattr(row, "window_start_ns", 0) or t0
    we = getattr(row, "window_end_ns", 0) or t1
    fig = {"output_tok_s": row.output_tok_s, "ttft_p50_ms": row.ttft_p50_ms,
           "client_limited": row.client_limited, "client_cpu_util": row.client_cpu_util,
           "requests": row.requests, "window_s": row.window_s,
           "errors": getattr(row, "errors", None), "tpot_p50_ms": getattr(row, "tpot_p50_ms", None),
           "loop_lag_p99_ms": getattr(row, "loop_lag_p99_ms", None),
           "tokens_source": getattr(row, "tokens_source", None),
           "stop_reason": getattr(row, "stop_reason", None),
           "window_complete": getattr(row, "window_complete", None),
           "warnings": res.warnings}
    return fig, ws, we, t0, t1


async def _aiohttp_closed(url, bodies, c, seconds, ramp_s=0.5, warm_timeout=300.0):
    results: List[dict] = []
    sem = asyncio.Semaphore(c)            # never the gate: exactly c coroutines
    state = {"ws": None, "stop": False, "cpu_ws": None}
    warm = set()
    pick = itertools.count()
    all_warm = asyncio.Event()

    async def worker(w):
        await asyncio.sleep(ramp_s * w / c)
        while not state["stop"]:
            body = bodies[next(pick) % len(bodies)]
            await client_baselines._naive_request(url, body, results, sem)
            rec = results[-1]          # appended last thing before it returned, no await after
            rec["worker"] = w
            if rec["error"] is not None:
                await asyncio.sleep(0.05)
            elif w not in warm:
                warm.add(w)
                if len(warm) == c and state["ws"] is None:
                    state["ws"] = time.perf_counter()
                    state["cpu_ws"] = time.process_time()
                    all_warm.set()
            if sum(1 for r in results if r["error"]) > 4 * c and len(warm) == 0:
                state["stop"] = True

    tasks = [asyncio.ensure_future(worker(w)) for w in range(c)]
    try:
        await asyncio.wait_for(all_warm.wait(), warm_timeout)
        await asyncio.sleep(max(0.0, state["ws"] + seconds - time.perf_counter()))
        state["we"] = time.perf_counter()
        state["cpu_we"] = time.process_time()
    finally:
        state["stop"] = True
        await asyncio.gather(*tasks, return_exceptions=True)
    state["t_drained"] = time.perf_counter()
    return results, state


def run_aiohttp(engine, c, args, bodies):
    url = engine.url + "/v1/chat/completions"
    # perf_counter and monotonic_ns are both CLOCK_MONOTONIC on Linux; the offset is kept anyway.
    offset_ns = time.monotonic_ns() - time.perf_counter_ns()
    t0 = time.monotonic_ns()
    results, st = asyncio.run(_aiohttp_closed(url, bodies, c, args.seconds))
    t1 = time.monotonic_ns()
    ws, we = st["ws"], st["we"]
    ok = [r for r in results if r["error"] is None and r["ttft"] is not None]
    chunks = tokens = in_window = 0
    for r in ok:
        t = r["t_start"] + r["ttft"]
        times = [t]
        for d in r["itl"]:
            t += d
            times.append(t)
        chunks += len(times)
        tokens += r["tokens"] or len(times)
        in_window += sum(1 for x in times if ws <= x < we)
    per_chunk = tokens / chunks if chunks else None
    sent = [r for r in ok if ws <= r["t_start"] < we]
    ttft = sorted(r["ttft"] for r in sent)
    span = max(r["t_end"] for r in ok) - min(r["t_start"] for r in ok) if ok else 0
    fig = {"output_tok_s": in_window * (per_chunk or 1) / (we - ws),
           "ttft_p50_ms": ttft[len(ttft) // 2] * 1e3 if ttft else None,
           "client_limited": None,
           "client_cpu_util": (st["cpu_we"] - st["cpu_ws"]) / (we - ws),
           "requests": len(sent), "window_s": we - ws,
           "errors": sum(1 for r in results if r["error"] is not None),
           "first_error": next((r["error"] for r in results if r["error"]), None),
           "tokens_per_chunk": per_chunk,
           "whole_run_tok_s": tokens / span if span else None,
           "whole_run_s": span, "drain_s": st["t_drained"] - we}
    return fig, int(ws * 1e9) + offset_ns, int(we * 1e9) + offset_ns, t0, t1


# --- summary and report ------------------------------------------------------------------------

def stats(values):
    v = [x for x in values if x is not None]
    if not v:
        return None
    mean = statistics.fmean(v)
    return {"n": len(v), "mean": mean, "min": min(v), "max": max(v),
            "spread_pct": 100 * (max(v) - min(v)) / mean if mean else None,
            "cv_pct": 100 * statistics.stdev(v) / mean if len(v) > 1 and mean else None}


def summarize(runs, levels):
    out = []
    for c in levels:
        for client in ("servelab", "aiohttp"):
            rs = [r for r in runs if r["c"] == c and r["client"] == client]
            if not rs:
                continue
            row = {"c": c, "client": client}
            for key, src in (("output_tok_s", "fig"), ("ttft_p50_ms", "fig"),
                             ("whole_run_tok_s", "fig"), ("engine_cpu_cores", "res"),
                             ("engine_busiest_thread", "res"), ("gpu_util_mean", "res"),
                             ("sm_active_mean", "res"), ("client_cpu_cores", "res"),
                             ("tok_per_engine_cpu_s", "res"), ("engine_busiest_runq_wait", "res"),
                             ("host_steal_cores", "res")):
                row[key] = stats([r[src].get(key) for r in rs])
            out.append(row)
    return out


def f(v, spec="%.1f"):
    return "-" if v is None else spec % v


def markdown(report):
    m = report["machine"]
    lines = ["# Repeatability on a real engine: servelab vs an aiohttp client", "",
             "- date: %s" % report["date"],
             "- machine: %s, driver %s, %s MiB; %s CPUs; %s" % (
                 m.get("gpu", "no GPU"), m.get("driver", "-"), m.get("gpu_memory_mib", "-"),
                 m["cpus"], m["platform"]),
             "- software: python %s, %s" % (m["python"], ", ".join(
                 "%s %s" % kv for kv in m["packages"].items())),
             "- command: `%s`" % report["command"],
             "- engine: `%s`" % report["engine"].get("command", report["engine"].get("engine")),
             "- model: %s (build %s s); ready after %s s" % (
                 report["engine"].get("model_build", "-"), report["engine"].get("model_build_s", "-"),
                 report["engine"].get("ready_s", "-")),
             "- per run: window %s s, max_tokens %s, the built-in prompts; order alternates "
             "per repeat" % (report["args"]["seconds"], report["args"]["max_tokens"]),
             "- samples every %s ms in a separate process%s" % (
                 report["args"]["sample_ms"],
                 "; " + "; ".join(m["notes"]) if m.get("notes") else ""),
             "", "## every run", "",
             "tok/s: output tokens per second over the client's window; tpot: servelab's TPOT p50; "
             "GPU util: NVML utilization.gpu (share of time a kernel ran), mean over the window; "
             "SM active: NVML GPM SM activity, mean; engine CPU: the server's process tree, "
             "cores; busiest: its busiest thread, share of one core; runq: how long that thread "
             "was runnable but waited for a CPU (schedstat), share of the window; tok/CPU-s: "
             "tok/s / engine CPU; client CPU: this process and its children (the load "
             "generator's), the engine not included, cores; client util: the client's own figure "
             "(servelab: its busiest process; aiohttp: process time / window); host busy / steal: "
             "the whole machine's busy and stolen CPU (/proc/stat), cores.", ""]
    cols = [("#", lambda r: r["order"]), ("C", lambda r: r["c"]), ("rep", lambda r: r["repeat"]),
            ("client", lambda r: r["client"]),
            ("tok/s", lambda r: f(r["fig"]["output_tok_s"])),
            ("ttft p50 ms", lambda r: f(r["fig"]["ttft_p50_ms"])),
            ("tpot p50 ms", lambda r: f(r["fig"].get("tpot_p50_ms"))),
            ("reqs", lambda r: r["fig"]["requests"]),
            ("window s", lambda r: f(r["fig"]["window_s"], "%.2f")),
            ("client limited", lambda r: "-" if r["fig"]["client_limited"] is None
             else r["fig"]["client_limited"]),
            ("GPU util %", lambda r: f(r["res"].get("gpu_util_mean"))),
            ("SM active %", lambda r: f(r["res"].get("sm_active_mean"), "%.2f")),
            ("GPU MiB", lambda r: f(r["res"].get("gpu_mem_mib_max"), "%.0f")),
            ("engine CPU", lambda r: f(r["res"].get("engine_cpu_cores"), "%.2f")),
            ("busiest thread", lambda r: f(r["res"].get("engine_busiest_thread"), "%.2f")),
            ("runq", lambda r: f(r["res"].get("engine_busiest_runq_wait"), "%.3f")),
            ("tok/CPU-s", lambda r: f(r["res"].get("tok_per_engine_cpu_s"), "%.0f")),
            ("client CPU", lambda r: f(r["res"].get("client_cpu_cores"), "%.3f")),
            ("client util", lambda r: f(r["fig"]["client_cpu_util"], "%.3f")),
            ("host busy", lambda r: f(r["res"].get("host_busy_cores"), "%.2f")),
            ("steal", lambda r: f(r["res"].get("host_steal_cores"), "%.3f")),
            ("whole-run tok/s", lambda r: f(r["fig"].get("whole_run_tok_s")))]
    lines.append(Table([c[0] for c in cols],
                       [[str(c[1](r)) for c in cols] for r in report["runs"]]).to_markdown())
    if report.get("skipped"):
        lines += ["", "Not run (--budget-s reached): %s" % ", ".join(report["skipped"])]
    lines += ["", "## spread per client per C", "",
              "spread = (max - min) / mean; CV = sample standard deviation / mean.", ""]
    table = Table(["C", "client", "figure", "n", "mean", "min", "max", "spread %", "CV %"], [])
    names = {"output_tok_s": "output tok/s (window)", "ttft_p50_ms": "TTFT p50 ms",
             "whole_run_tok_s": "whole-run tok/s", "engine_cpu_cores": "engine CPU cores",
             "engine_busiest_thread": "engine busiest thread", "gpu_util_mean": "GPU util %",
             "sm_active_mean": "SM active %", "client_cpu_cores": "client CPU cores",
             "tok_per_engine_cpu_s": "tokens per engine CPU-second",
             "engine_busiest_runq_wait": "busiest thread run-queue wait",
             "host_steal_cores": "host steal cores"}
    for row in report["summary"]:
        for key, name in names.items():
            s = row.get(key)
            if not s:
                continue
            table.rows.append([
                "%d" % row["c"], str(row["client"]), name, "%d" % s["n"], f(s["mean"], "%.2f"),
                f(s["min"], "%.2f"), f(s["max"], "%.2f"), f(s["spread_pct"]), f(s["cv_pct"]),
            ])
    lines.append(table.to_markdown())
    if report.get("error"):
        lines += ["", "## error", "", "```", report["error"], "```"]
    return "\n".join(lines) + "\n"


def machine_info(sampler):
    pk = {}
    for name in ("torch", "transformers", "aiohttp", "fastapi", "uvicorn", "nvidia-ml-py"):
        try:
            pk[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return dict(sampler.ask("info"), cpus=os.cpu_count(), platform=platform.platform(),
                python=platform.python_version(), packages=pk)


def write(report, path):
    report["summary"] = summarize(report["runs"], report["levels"])
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as fh:
        fh.write(markdown(report))
    os.replace(path + ".tmp", path)
    jpath = os.path.splitext(path)[0] + ".json"
    with open(jpath + ".tmp", "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    os.replace(jpath + ".tmp", jpath)


def main(argv=None):
    args = parse_args(argv)
    sampler = Sampler(args.sample_ms / 1e3)      # first: fork before anything else runs
    levels = [int(c) for c in args.levels.split(",") if c.strip()]
    report = {"date": datetime.date.today().isoformat(), "levels": levels, "args": vars(args),
              "command": " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], REPO)]
                                  + sys.argv[1:]),
              "engine": {}, "runs": [], "warmup": None, "skipped": [], "error": None}
    report["machine"] = machine_info(sampler)
    log_dir = args.log_dir or (os.path.dirname(os.path.abspath(args.write_md))
                               if args.write_md else "/tmp")
    os.makedirs(log_dir, exist_ok=True)
    t_start = time.monotonic()
    engine = None
    workload = builtin()
    try:
        engine = Engine(args, log_dir)
        report["engine"] = dict(engine.info)
        sampler.ask("engine", engine.pid)
        print("engine ready: %s" % report["engine"], flush=True)
        bodies = [json.loads(request_body("openai_chat", engine.model, p, args.max_tokens,
                                          False, None, False)) for p in workload.prompts]
        if args.warmup_s:
            w = argparse.Namespace(**dict(vars(args), seconds=args.warmup_s))
            fig = run_servelab(engine, max(levels), w, workload)[0]
            report["warmup"] = fig
            print("warm-up C=%d: %s tok/s" % (max(levels), f(fig["output_tok_s"])), flush=True)
        order = 0
        last_s: Dict[int, float] = {}
        for rep in range(args.repeats):
            for c in levels:
                pair = ("servelab", "aiohttp") if rep % 2 == 0 else ("aiohttp", "servelab")
                for client in pair:
                    label = "C=%d rep %d %s" % (c, rep, client)
                    elapsed = time.monotonic() - t_start
                    if args.budget_s and elapsed + last_s.get(c, 0) > args.budget_s:
                        report["skipped"].append(label)
                        continue
                    t0 = time.monotonic()
                    if client == "servelab":
                        fig, ws, we, r0, r1 = run_servelab(engine, c, args, workload)
                    else:
                        fig, ws, we, r0, r1 = run_aiohttp(engine, c, args, bodies)
                    last_s[c] = max(last_s.get(c, 0), time.monotonic() - t0)
                    res = sampler.ask("window", ws, we)
                    if fig["output_tok_s"] and res.get("engine_cpu_cores"):
                        res["tok_per_engine_cpu_s"] = fig["output_tok_s"] / res["engine_cpu_cores"]
                    order += 1
                    report["runs"].append({"order": order, "c": c, "repeat": rep,
                                           "client": client, "fig": fig, "res": res,
                                           "window_ns": [ws, we], "run_ns": [r0, r1],
                                           "run_s": round(time.monotonic() - t0, 2)})
                    print("%s: %s tok/s, ttft p50 %s ms, engine CPU %s cores, GPU util %s %%, "
                          "client CPU %s cores (%.1f s)" % (
                              label, f(fig["output_tok_s"]), f(fig["ttft_p50_ms"]),
                              f(res.get("engine_cpu_cores"), "%.2f"),
                              f(res.get("gpu_util_mean")), f(res.get("client_cpu_cores"), "%.2f"),
                              time.monotonic() - t0), flush=True)
                    write(report, args.write_md)
    except Exception as exc:  # noqa: BLE001 - recorded; the engine is stopped below
        report["error"] = "%s: %s" % (type(exc).__name__, exc)
        if engine is not None and engine.proc is not None:
            report["error"] += "\n" + engine.log_tail(1500)
        print("error: %s" % report["error"], flush=True)
    finally:
        if engine is not None:
            report["engine_stop"] = engine.stop()
        try:
            report["machine"]["notes"] = sampler.ask("info", timeout=10)["notes"]
        except (OSError, EOFError, RuntimeError):
            pass
        sampler.stop()
        report["seconds"] = round(time.monotonic() - t_start, 1)
        write(report, args.write_md)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
