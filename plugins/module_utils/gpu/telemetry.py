"""GPU telemetry on the GPU server through a profile's sweep: a detached NVML sampler.

`start(paths, ...)` forks a sampler process, detached (double fork, its own session, stdin from
/dev/null, stdout and stderr to `sampler.log`, every other descriptor closed, so Ansible's pipes
see EOF and the module returns). It writes its identity (pid + start time from /proc, the
identity proc/table.py defines) to `sampler.pid`, opens NVML, and appends one JSON line per
`interval` to `telemetry.jsonl`:

    {"kind": "start", "t_ns": ..., "pid": ..., "interval": 0.5, "source": "nvml", "gpus": 8, ...}
    {"kind": "sample", "t_ns": <time.time_ns()>, "gpus": [{"index": 0, "sm_util_pct": 97,
      "mem_used_mib": 131072, "power_w": 612.3, "sm_clock_mhz": 1980}, ...]}
    {"kind": "end", "t_ns": ..., "reason": "stopped" | "max_seconds"}

Where NVML cannot be used (no driver, no GPU) it writes one line
`{"kind": "unavailable", "reason": ...}` and exits: that is an answer, not an error.

Choices, kept to what is robust:
- NVML only: one read is microseconds per GPU; an nvidia-smi run per sample costs tens of
  milliseconds of CPU on the machine being measured. Through pynvml (nvidia-ml-py) when the
  python importable there has it, else through servelab's ctypes binding of the driver's own
  libnvidia-ml (gpu/nvml_ctypes.py): the python Ansible uses on a GPU server rarely has
  nvidia-ml-py, the driver always has NVML. No driver: the telemetry is absent, with its reason.
- Wall clock (time.time_ns): the samples are joined on the controller to each level's window,
  which the bench client records on its own wall clock (window_start_unix_ns); the two machines
  agree to NTP's few milliseconds, far below the 0.5 s interval.
- A sample's time is the midpoint of its reads. NVML's utilisation is the driver's own average
  over its sample period (1/6 s to 1 s by GPU), and power on recent GPUs a 1 s average: a sample
  describes the second around it, not an instant.
- Each figure is read on its own: a GPU that does not report power (some vGPU or MIG setups)
  gives `power_w: null` and keeps its other figures.
- The sampler ends itself after `max_seconds`, so a sampler the stop never reached (the playbook
  was killed) cannot outlive the run by more than that bound. `stop` ends it by pid, only if
  the pid still is that process (its start time matches), through proc/terminate.py.

Tests put a stand-in for pynvml in place with SERVELAB_GPU_TELEMETRY_NVML=<path of a .py file>
(or pass `nvml=` to the functions). Standard library only (pynvml is optional).
"""
from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from ansible_collections.servelab.serving.plugins.module_utils.gpu import nvml_ctypes
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import (
    read_process, read_stat,
)
from ansible_collections.servelab.serving.plugins.module_utils.proc.terminate import (
    TerminationPlan, terminate,
)

ENV_NVML = "SERVELAB_GPU_TELEMETRY_NVML"   # path of a python file that stands in for pynvml
NVML_CTYPES = "ctypes"     # that variable's value that picks servelab's own binding (nvml_ctypes)
MIB = 1024 * 1024
DEFAULT_INTERVAL = 0.5
DEFAULT_MAX_SECONDS = 6 * 3600.0
STARTUP_TIMEOUT = 30.0         # NVML's init on a large machine takes up to a few seconds

KIND_START = "start"
KIND_SAMPLE = "sample"
KIND_UNAVAILABLE = "unavailable"
KIND_END = "end"
END_STOPPED = "stopped"
END_MAX_SECONDS = "max_seconds"

SAMPLES_FILE = "telemetry.jsonl"
PID_FILE = "sampler.pid"
LOG_FILE = "sampler.log"


class TelemetryError(Exception):
    """The sampler could not be started or stopped (not a missing GPU: that is a reason)."""


class Unavailable(Exception):
    """NVML cannot be used here; the message says why."""


@dataclass(frozen=True)
class Paths:
    directory: str

    @property
    def samples(self) -> str:
        return os.path.join(self.directory, SAMPLES_FILE)

    @property
    def pid(self) -> str:
        return os.path.join(self.directory, PID_FILE)

    @property
    def log(self) -> str:
        return os.path.join(self.directory, LOG_FILE)


def paths_for(state_dir: str, name: str) -> Paths:
    """<state_dir>/telemetry-<name>/: beside llm_server's own directories, never inside one."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return Paths(os.path.abspath(os.path.join(os.path.expanduser(state_dir), "telemetry-" + safe)))


# --------------------------------------------------------------------------------------------
# NVML


def load_nvml():
    """(pynvml-like module or None, reason): the stand-in named by SERVELAB_GPU_TELEMETRY_NVML
    (`ctypes` there picks servelab's own binding), else pynvml, else servelab's ctypes binding of
    libnvidia-ml (gpu/nvml_ctypes.py), so a GPU server's system python3 without nvidia-ml-py
    still samples wherever the driver is installed."""
    path = os.environ.get(ENV_NVML)
    if path == NVML_CTYPES:
        return _load_ctypes("")
    if path:
        try:
            spec = importlib.util.spec_from_file_location("servelab_nvml_standin", path)
            if spec is None or spec.loader is None:
                return None, "%s=%s is not a python file" % (ENV_NVML, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module, ""
        except Exception as exc:   # noqa: BLE001 - a broken stand-in is a reason, not a crash
            return None, "%s=%s: %s: %s" % (ENV_NVML, path, type(exc).__name__, exc)
    try:
        import pynvml  # nvidia-ml-py
    except ImportError as exc:
        return _load_ctypes("pynvml (nvidia-ml-py) not importable by %s: %s" % (
            os.path.realpath(sys.executable), exc))
    return pynvml, ""


def _load_ctypes(why_not_pynvml: str):
    try:
        return nvml_ctypes.load(), ""
    except nvml_ctypes.NvmlError as exc:
        reasons = [r for r in (why_not_pynvml, str(exc)) if r]
        return None, "; ".join(reasons)


def binding_name(nv) -> str:
    """Which NVML binding a sampler reads through, for the start line."""
    if isinstance(nv, nvml_ctypes.Nvml):
        return NVML_CTYPES
    return getattr(nv, "__name__", type(nv).__name__)


def _call(fn: Callable, *args):
    try:
        return fn(*args)
    except Exception:   # noqa: BLE001 - NVMLError_NotSupported and friends: figure unknown
        return None


class NvmlSampler:
    """NVML opened once; `sample()` reads every GPU's four figures."""

    def __init__(self, nv) -> None:
        self.nv = nv
        try:
            nv.nvmlInit()
        except Exception as exc:   # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded
            raise Unavailable("NVML: %s (%s)" % (exc, type(exc).__name__)) from exc
        try:
            count = int(nv.nvmlDeviceGetCount())
            self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:   # noqa: BLE001
            self.close()
            raise Unavailable("NVML: %s (%s)" % (exc, type(exc).__name__)) from exc
        if not self.handles:
            self.close()
            raise Unavailable("NVML: no GPU on this machine")
        self.clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)

    def close(self) -> None:
        _call(self.nv.nvmlShutdown)

    def _gpu(self, index: int, handle) -> dict:
        nv = self.nv
        util = _call(nv.nvmlDeviceGetUtilizationRates, handle)
        memory = _call(nv.nvmlDeviceGetMemoryInfo, handle)
        power_mw = _call(nv.nvmlDeviceGetPowerUsage, handle)
        clock = _call(nv.nvmlDeviceGetClockInfo, handle, self.clock_sm)
        return {
            "index": index,
            "sm_util_pct": None if util is None else float(util.gpu),
            "mem_used_mib": None if memory is None else round(int(memory.used) / MIB, 1),
            "power_w": None if power_mw is None else round(int(power_mw) / 1000.0, 3),
            "sm_clock_mhz": None if clock is None else float(clock),
        }

    def sample(self) -> dict:
        before = time.time_ns()
        gpus = [self._gpu(i, h) for i, h in enumerate(self.handles)]
        after = time.time_ns()
        return {"kind": KIND_SAMPLE, "t_ns": (before + after) // 2, "gpus": gpus}


def open_sampler(nv=None) -> Tuple[Optional[NvmlSampler], str]:
    """(sampler or None, reason)."""
    if nv is None:
        nv, reason = load_nvml()
        if nv is None:
            return None, reason
    try:
        return NvmlSampler(nv), ""
    except Unavailable as exc:
        return None, str(exc)


# --------------------------------------------------------------------------------------------
# The sampler loop (in the detached process; callable in-process by tests)


def _line(fh, record: dict) -> None:
    fh.write(json.dumps(record, sort_keys=True) + "\n")
    fh.flush()


def run_sampler(out_path: str, interval: float = DEFAULT_INTERVAL,
                max_seconds: float = DEFAULT_MAX_SECONDS, labels: Optional[Dict] = None,
                nv=None, should_stop: Callable[[], bool] = lambda: False,
                ready: Optional[Callable[[str], None]] = None,
                sleep: Callable[[float], None] = time.sleep) -> str:
    """Sample into `out_path` (truncated) until should_stop() or max_seconds; returns the end
    reason ('stopped', 'max_seconds', or 'unavailable'). `ready(reason)` is called once NVML was
    opened ('' ) or found unusable (the reason)."""
    sampler, reason = open_sampler(nv)
    with open(out_path, "w", encoding="utf-8") as fh:
        head = dict(labels or {}, t_ns=time.time_ns(), pid=os.getpid())
        if sampler is None:
            _line(fh, dict(head, kind=KIND_UNAVAILABLE, reason=reason))
            if ready:
                ready(reason or "unavailable")
            return KIND_UNAVAILABLE
        try:
            _line(fh, dict(head, kind=KIND_START, interval=interval, max_seconds=max_seconds,
                           source="nvml", binding=binding_name(sampler.nv),
                           gpus=len(sampler.handles)))
            if ready:
                ready("")
            started = time.monotonic()
            tick = 0
            end = END_STOPPED
            while not should_stop():
                if time.monotonic() - started >= max_seconds:
                    end = END_MAX_SECONDS
                    break
                _line(fh, sampler.sample())
                tick += 1
                # On a fixed schedule (no drift); a late sample does not shorten the next gap
                # below zero.
                delay = started + tick * interval - time.monotonic()
                if delay < 0:
                    tick = int((time.monotonic() - started) / interval) + 1
                    delay = started + tick * interval - time.monotonic()
                if not should_stop():
                    sleep(max(delay, 0.0))
            _line(fh, {"kind": KIND_END, "t_ns": time.time_ns(), "reason": end})
            return end
        finally:
            sampler.close()


# --------------------------------------------------------------------------------------------
# Start and stop (in the module)


@dataclass
class Identity:
    pid: int
    start_time: int


def read_identity(paths: Paths) -> Optional[Identity]:
    try:
        with open(paths.pid, encoding="utf-8") as fh:
            data = json.load(fh)
        return Identity(int(data["pid"]), int(data["start_time"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running(paths: Paths) -> Optional[Identity]:
    """The recorded sampler, if that very process (pid + start time) still runs."""
    ident = read_identity(paths)
    if ident is None:
        return None
    info = read_process(ident.pid, stat_only=True)
    if info is None or info.gone or info.start_time != ident.start_time:
        return None
    return ident


def _write_pid_file(paths: Paths) -> None:
    stat = read_stat(os.getpid())
    tmp = paths.pid + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"pid": os.getpid(), "start_time": stat.start_time if stat else None}, fh)
    os.replace(tmp, paths.pid)


def _detached_child(paths: Paths, ready_fd: int, interval: float, max_seconds: float,
                    labels: Dict, nv) -> None:
    """The sampler process's body (after the second fork); never returns."""
    code = 0
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        log = os.open(paths.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.chdir("/")        # not the module's temporary directory, which Ansible removes
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        limit = min(os.sysconf("SC_OPEN_MAX"), 65536)
        os.closerange(3, ready_fd)
        os.closerange(ready_fd + 1, limit)
        stop = {"asked": False}

        def on_term(_signum, _frame):
            stop["asked"] = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        _write_pid_file(paths)

        def ready(reason: str) -> None:
            try:
                os.write(ready_fd, (reason or "ok").encode("utf-8", "replace")[:4000])
            finally:
                os.close(ready_fd)

        run_sampler(paths.samples, interval, max_seconds, labels, nv,
                    should_stop=lambda: stop["asked"], ready=ready)
    except BaseException:   # noqa: BLE001 - the log says why; the process must end here
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


@dataclass
class StartResult:
    pid: Optional[int]
    available: bool
    reason: str
    path: str
    started_unix_ns: int
    replaced: List[int] = field(default_factory=list)


def start(paths: Paths, interval: float = DEFAULT_INTERVAL,
          max_seconds: float = DEFAULT_MAX_SECONDS, labels: Optional[Dict] = None, nv=None,
          timeout: float = STARTUP_TIMEOUT) -> StartResult:
    """Fork the detached sampler and wait until it opened NVML or said why it cannot. A
    sampler of the same name still running (a profile that failed before its stop) is stopped
    first."""
    if interval <= 0 or max_seconds <= 0:
        raise TelemetryError("interval and max_seconds must be > 0")
    os.makedirs(paths.directory, exist_ok=True)
    replaced = []
    old = running(paths)
    if old is not None:
        stop(paths)
        replaced.append(old.pid)
    for stale in (paths.pid, paths.samples):
        try:
            os.unlink(stale)
        except FileNotFoundError:
            pass
    started_unix_ns = time.time_ns()
    read_fd, write_fd = os.pipe()
    first = os.fork()
    if first == 0:                       # the first child: a new session, then fork again
        try:
            os.close(read_fd)
            os.setsid()
            if os.fork() == 0:
                _detached_child(paths, write_fd, interval, max_seconds, dict(labels or {}), nv)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(first, 0)
    message = b""
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TelemetryError("the GPU telemetry sampler did not start within %.0f s; "
                                     "see %s" % (timeout, paths.log))
            readable, _w, _x = select.select([read_fd], [], [], left)
            if not readable:
                continue
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            message += chunk
    finally:
        os.close(read_fd)
    text = message.decode("utf-8", "replace")
    if not text:
        raise TelemetryError("the GPU telemetry sampler exited before it started; see %s"
                             % paths.log)
    ident = read_identity(paths)
    available = text == "ok"
    return StartResult(pid=ident.pid if ident else None, available=available,
                       reason="" if available else text, path=paths.samples,
                       started_unix_ns=started_unix_ns, replaced=replaced)


@dataclass
class StopResult:
    stopped: Optional[int]               # the pid ended by this call; None: none was running
    survivors: List[int]
    path: str
    exists: bool
    available: bool
    reason: str
    samples: int
    gpus: Optional[int]
    started_unix_ns: Optional[int]
    records: Optional[List[dict]] = None


def read_samples(path: str) -> Tuple[List[dict], List[str]]:
    """The lines of a telemetry file as records (a torn last line skipped), and problems."""
    records: List[dict] = []
    problems: List[str] = []
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    problems.append("%s:%d: not JSON, skipped" % (path, number))
                    continue
                if isinstance(record, dict):
                    records.append(record)
    except FileNotFoundError:
        problems.append("%s: no such file" % path)
    return records, problems


def stop(paths: Paths, grace: float = 5.0, with_records: bool = False) -> StopResult:
    """End the recorded sampler by pid (only if it is still that process), then read what it
    wrote."""
    ident = running(paths)
    stopped = None
    survivors: List[int] = []
    if ident is not None:
        info = read_process(ident.pid)
        if info is not None and info.start_time == ident.start_time:
            outcome = terminate(TerminationPlan(targets=[info], grace=grace, kill_timeout=5.0))
            survivors = [o.pid for o in outcome.survivors]
            stopped = ident.pid
    if not survivors:
        try:
            os.unlink(paths.pid)
        except FileNotFoundError:
            pass
    records, _problems = read_samples(paths.samples)
    head = next((r for r in records if r.get("kind") in (KIND_START, KIND_UNAVAILABLE)), {})
    samples = sum(1 for r in records if r.get("kind") == KIND_SAMPLE)
    reason = str(head.get("reason") or "") if head.get("kind") == KIND_UNAVAILABLE else ""
    if not head:
        reason = "no telemetry recorded at %s" % paths.samples
    return StopResult(stopped=stopped, survivors=survivors, path=paths.samples,
                      exists=os.path.isfile(paths.samples),
                      available=head.get("kind") == KIND_START, reason=reason, samples=samples,
                      gpus=head.get("gpus"), started_unix_ns=head.get("t_ns"),
                      records=records if with_records else None)
