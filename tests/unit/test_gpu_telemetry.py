"""The GPU telemetry sampler (module_utils/gpu/telemetry.py) with a fake NVML: the figures per
GPU, the file it writes, the no-NVML answer, and the detached process started and ended by PID."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.gpu import telemetry as tm
from ansible_collections.servelab.serving.plugins.module_utils.proc.table import still_running

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(os.path.dirname(HERE), "fakenvml.py")


class FakeNvml:
    """pynvml-like: two GPUs; GPU 1 does not report power when asked."""
    NVML_CLOCK_SM = 1

    def __init__(self, count=2, power_gpu1=True, init_error=None):
        self.count, self.power_gpu1, self.init_error = count, power_gpu1, init_error
        self.shutdowns = 0

    def nvmlInit(self):  # noqa: N802
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):  # noqa: N802
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):  # noqa: N802
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return SimpleNamespace(gpu=[90, 70][h])

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(used=[2048, 1024][h] * tm.MIB)

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802
        if h == 1 and not self.power_gpu1:
            raise RuntimeError("NVMLError_NotSupported")
        return [650000, 600500][h]

    def nvmlDeviceGetClockInfo(self, h, kind):  # noqa: N802
        assert kind == self.NVML_CLOCK_SM
        return [1980, 1755][h]


def test_a_sample_has_the_four_figures_of_every_gpu():
    sampler = tm.NvmlSampler(FakeNvml())
    before = time.time_ns()
    sample = sampler.sample()
    assert sample["kind"] == tm.KIND_SAMPLE and before <= sample["t_ns"] <= time.time_ns()
    assert sample["gpus"] == [
        {"index": 0, "sm_util_pct": 90.0, "mem_used_mib": 2048.0, "power_w": 650.0,
         "sm_clock_mhz": 1980.0},
        {"index": 1, "sm_util_pct": 70.0, "mem_used_mib": 1024.0, "power_w": 600.5,
         "sm_clock_mhz": 1755.0},
    ]


def test_a_figure_the_gpu_does_not_report_is_null_and_the_rest_stay():
    gpus = tm.NvmlSampler(FakeNvml(power_gpu1=False)).sample()["gpus"]
    assert gpus[1]["power_w"] is None and gpus[1]["sm_util_pct"] == 70.0
    assert gpus[0]["power_w"] == 650.0


def test_run_sampler_writes_start_samples_and_end(tmp_path):
    out = tmp_path / "t.jsonl"
    nv = FakeNvml()
    ticks = {"n": 0}

    def should_stop():
        ticks["n"] += 1
        return ticks["n"] > 7

    ready = []
    end = tm.run_sampler(str(out), 0.01, 60, {"host_label": "gpu1", "profile": "p"}, nv,
                         should_stop=should_stop, ready=ready.append, sleep=lambda s: None)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert end == tm.END_STOPPED and ready == [""]
    assert records[0]["kind"] == tm.KIND_START and records[0]["gpus"] == 2
    assert records[0]["host_label"] == "gpu1" and records[0]["source"] == "nvml"
    samples = [r for r in records if r["kind"] == tm.KIND_SAMPLE]
    assert len(samples) >= 3 and all(len(s["gpus"]) == 2 for s in samples)
    assert records[-1] == {"kind": tm.KIND_END, "t_ns": records[-1]["t_ns"],
                           "reason": tm.END_STOPPED}
    assert nv.shutdowns == 1


def test_run_sampler_stops_itself_after_max_seconds(tmp_path):
    out = tmp_path / "t.jsonl"
    end = tm.run_sampler(str(out), 0.01, 0.05, None, FakeNvml())
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert end == tm.END_MAX_SECONDS and records[-1]["reason"] == tm.END_MAX_SECONDS
    assert sum(r["kind"] == tm.KIND_SAMPLE for r in records) >= 2


@pytest.mark.parametrize("nv, words", [
    (FakeNvml(init_error=RuntimeError("NVML Shared Library Not Found")), "Library Not Found"),
    (FakeNvml(count=0), "no GPU"),
])
def test_no_nvml_or_no_gpu_is_one_line_saying_why(tmp_path, nv, words):
    out = tmp_path / "t.jsonl"
    ready = []
    assert tm.run_sampler(str(out), 0.01, 5, None, nv, ready=ready.append) == tm.KIND_UNAVAILABLE
    [line] = out.read_text().splitlines()
    record = json.loads(line)
    assert record["kind"] == tm.KIND_UNAVAILABLE and words in record["reason"]
    assert ready == [record["reason"]]


def test_load_nvml_takes_the_stand_in_named_by_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(tm.ENV_NVML, FAKE)
    nv, reason = tm.load_nvml()
    assert reason == "" and nv.nvmlDeviceGetCount() == 2
    broken = tmp_path / "broken.py"
    broken.write_text("raise ImportError('no such library')\n")
    monkeypatch.setenv(tm.ENV_NVML, str(broken))
    nv, reason = tm.load_nvml()
    assert nv is None and "no such library" in reason


def test_without_pynvml_the_reason_names_the_interpreter(monkeypatch):
    monkeypatch.delenv(tm.ENV_NVML, raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)     # import pynvml -> ImportError
    nv, reason = tm.load_nvml()
    assert nv is None and "pynvml (nvidia-ml-py) not importable" in reason


@pytest.fixture
def fake_env(monkeypatch):
    monkeypatch.setenv(tm.ENV_NVML, FAKE)
    monkeypatch.delenv("FAKE_NVML_MODE", raising=False)
    return monkeypatch


def _gone(pid, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not still_running(pid, None):
            return True
        time.sleep(0.02)
    return False


def test_start_detaches_a_sampler_and_stop_ends_it_by_pid(tmp_path, fake_env):
    paths = tm.paths_for(str(tmp_path), "servelab-p")
    started = tm.start(paths, interval=0.02, max_seconds=60,
                       labels={"host_label": "h", "profile": "p"})
    try:
        assert started.available and started.reason == "" and started.pid != os.getpid()
        assert still_running(started.pid, None)
        # Detached: its own session, not our child's group.
        with open("/proc/%d/stat" % started.pid) as fh:
            sid = int(fh.read().rsplit(")", 1)[1].split()[3])
        assert sid != os.getsid(0)
        time.sleep(0.2)
        stopped = tm.stop(paths, with_records=True)
    finally:
        ident = tm.read_identity(paths)
        if ident and still_running(ident.pid, ident.start_time):
            os.kill(ident.pid, 9)
    assert stopped.stopped == started.pid and stopped.survivors == []
    assert _gone(started.pid)
    assert stopped.available and stopped.samples >= 3 and stopped.gpus == 2
    assert stopped.records[-1]["kind"] == tm.KIND_END
    assert not os.path.exists(paths.pid)
    again = tm.stop(paths)
    assert again.stopped is None and again.samples == stopped.samples


def test_a_start_replaces_a_sampler_of_the_same_name(tmp_path, fake_env):
    paths = tm.paths_for(str(tmp_path), "x")
    first = tm.start(paths, interval=0.05, max_seconds=60)
    second = None
    try:
        second = tm.start(paths, interval=0.05, max_seconds=60)
        assert second.replaced == [first.pid] and _gone(first.pid)
    finally:
        tm.stop(paths)
    assert second is not None and _gone(second.pid)


def test_no_gpu_start_answers_with_the_reason_and_leaves_nothing_running(tmp_path, fake_env):
    fake_env.setenv("FAKE_NVML_MODE", "nogpu")
    paths = tm.paths_for(str(tmp_path), "x")
    started = tm.start(paths, interval=0.05, max_seconds=60)
    assert not started.available and "Library Not Found" in started.reason
    assert started.pid is None or _gone(started.pid)
    stopped = tm.stop(paths)
    assert stopped.stopped is None and not stopped.available
    assert "Library Not Found" in stopped.reason and stopped.samples == 0


def test_the_detached_sampler_ends_itself_after_max_seconds(tmp_path, fake_env):
    paths = tm.paths_for(str(tmp_path), "x")
    started = tm.start(paths, interval=0.02, max_seconds=0.3)
    assert _gone(started.pid, 5.0)
    result = tm.stop(paths, with_records=True)
    assert result.stopped is None and result.records[-1]["reason"] == tm.END_MAX_SECONDS


def test_stop_never_signals_a_pid_that_is_another_process_now(tmp_path):
    """The pid file names a pid whose start time differs (the pid was reused): left alone."""
    paths = tm.paths_for(str(tmp_path), "x")
    os.makedirs(paths.directory)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with open(paths.pid, "w") as fh:
            json.dump({"pid": other.pid, "start_time": 1}, fh)
        result = tm.stop(paths)
        assert result.stopped is None and other.poll() is None
    finally:
        other.kill()
        other.wait()
