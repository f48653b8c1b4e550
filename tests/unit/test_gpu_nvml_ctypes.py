"""servelab's ctypes binding of NVML (module_utils/gpu/nvml_ctypes.py), against a stand-in
libnvidia-ml built here from C with the machine's compiler: the same C calls, structs and return
codes as nvml.h, so the binding's signatures, struct layouts and error path are exercised for
real. The telemetry sampler reads through it where pynvml is missing."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ansible_collections.servelab.serving.plugins.module_utils.gpu import nvml_ctypes
from ansible_collections.servelab.serving.plugins.module_utils.gpu import telemetry as tm

FAKE_NVML_C = r"""
#include <stdlib.h>
#include <string.h>
typedef struct { unsigned int gpu, memory; } util_t;
typedef struct { unsigned long long total, free, used; } mem_t;
static int inited = 0;
static const char *fail(void) { return getenv("FAKE_NVML_INIT"); }
int nvmlInit_v2(void) { if (fail()) return atoi(fail()); inited = 1; return 0; }
int nvmlShutdown(void) { inited = 0; return 0; }
const char *nvmlErrorString(int code) {
  switch (code) { case 3: return "Not Supported"; case 9: return "Driver Not Loaded";
                  case 1: return "Uninitialized"; default: return "Unknown Error"; } }
int nvmlDeviceGetCount_v2(unsigned int *n) { if (!inited) return 1; *n = 2; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
  if (i > 1) return 2; *h = (void *)(unsigned long)(0x1000 + i); return 0; }
static int idx(void *h) { return (int)((unsigned long)h - 0x1000); }
int nvmlDeviceGetUtilizationRates(void *h, util_t *u) {
  u->gpu = idx(h) ? 70 : 90; u->memory = 5; return 0; }
int nvmlDeviceGetMemoryInfo(void *h, mem_t *m) {
  m->total = 143771ULL << 20; m->used = (idx(h) ? 1024ULL : 2048ULL) << 20;
  m->free = m->total - m->used; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) {
  if (idx(h)) return 3; *mw = 650000; return 0; }
int nvmlDeviceGetClockInfo(void *h, int type, unsigned int *mhz) {
  if (type != 1) return 2; *mhz = idx(h) ? 1755 : 1980; return 0; }
int nvmlDeviceGetName(void *h, char *name, unsigned int len) {
  strncpy(name, idx(h) ? "Fake H200 B" : "Fake H200 A", len); return 0; }
"""


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in libnvidia-ml")
    work = tmp_path_factory.mktemp("fakenvml")
    source = work / "fakenvml.c"
    source.write_text(FAKE_NVML_C)
    library = work / "libfakenvml.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


def test_the_four_figures_and_names_read_through_ctypes(fake_library):
    nv = nvml_ctypes.load(fake_library)
    sampler = tm.NvmlSampler(nv)
    sample = sampler.sample()
    sampler.close()
    assert sample["gpus"] == [
        {"index": 0, "sm_util_pct": 90.0, "mem_used_mib": 2048.0, "power_w": 650.0,
         "sm_clock_mhz": 1980.0},
        # GPU 1 answers NVML_ERROR_NOT_SUPPORTED for power: that figure alone is unknown.
        {"index": 1, "sm_util_pct": 70.0, "mem_used_mib": 1024.0, "power_w": None,
         "sm_clock_mhz": 1755.0},
    ]
    nv.nvmlInit()
    assert nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(1)) == "Fake H200 B"


def test_an_nvml_error_carries_its_code_and_nvmls_own_text(fake_library, monkeypatch):
    nv = nvml_ctypes.load(fake_library)
    nv.nvmlInit()
    with pytest.raises(nvml_ctypes.NvmlError) as err:
        nv.nvmlDeviceGetPowerUsage(nv.nvmlDeviceGetHandleByIndex(1))
    assert err.value.code == nvml_ctypes.NVML_ERROR_NOT_SUPPORTED
    assert "Not Supported" in str(err.value)
    monkeypatch.setenv("FAKE_NVML_INIT", "9")
    sampler, reason = tm.open_sampler(nvml_ctypes.load(fake_library))
    assert sampler is None and "Driver Not Loaded" in reason


def test_a_missing_library_is_library_not_found(tmp_path):
    with pytest.raises(nvml_ctypes.LibraryNotFound) as err:
        nvml_ctypes.load(str(tmp_path / "libnvidia-ml.so.1"))
    assert "not loadable" in str(err.value)


def test_without_pynvml_the_sampler_falls_back_to_ctypes(fake_library, monkeypatch):
    monkeypatch.delenv(tm.ENV_NVML, raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml -> ImportError
    monkeypatch.setenv(nvml_ctypes.ENV_LIBRARY, fake_library)
    nv, reason = tm.load_nvml()
    assert reason == "" and isinstance(nv, nvml_ctypes.Nvml)
    assert tm.binding_name(nv) == "ctypes"


def test_without_pynvml_or_a_driver_the_reason_names_both(tmp_path, monkeypatch):
    monkeypatch.delenv(tm.ENV_NVML, raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv(nvml_ctypes.ENV_LIBRARY, str(tmp_path / "absent.so"))
    nv, reason = tm.load_nvml()
    assert nv is None
    assert "pynvml (nvidia-ml-py) not importable" in reason and "absent.so not loadable" in reason


def test_the_sampler_file_says_which_binding_read_it(fake_library, tmp_path, monkeypatch):
    monkeypatch.setenv(tm.ENV_NVML, tm.NVML_CTYPES)   # ctypes even where pynvml is importable
    monkeypatch.setenv(nvml_ctypes.ENV_LIBRARY, fake_library)
    out = tmp_path / "telemetry.jsonl"
    calls = []
    end = tm.run_sampler(str(out), interval=0.01, max_seconds=60,
                         should_stop=lambda: len(calls) >= 2, sleep=calls.append)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert end == tm.END_STOPPED
    assert lines[0]["kind"] == "start" and lines[0]["binding"] == "ctypes" and lines[0]["gpus"] == 2
    samples = [line for line in lines if line["kind"] == "sample"]
    assert len(samples) == 2 and samples[0]["gpus"][0]["power_w"] == 650.0
    assert os.path.getsize(out) > 0
