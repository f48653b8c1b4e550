"""GPU telemetry joined to the level rows: the GPU server's samples inside each level's window.

The bench role's gpu_telemetry task samples the GPUs of the GPU server through each profile's
sweep and brings the file to `<run_dir>/telemetry/<host>__<profile>__<start>.jsonl` (one JSON
line per sample, module_utils/gpu/telemetry.py). A level row carries its window on the bench
client's wall clock (`window_start_unix_ns`, `window_end_unix_ns`); the samples of the row's host
inside that window give its figures (results/levels.py defines each):

- gpu_sm_util_mean, gpu_sm_clock_mhz_mean: mean over the GPUs and the samples;
- gpu_mem_used_mib_max: memory summed over the GPUs, the highest sample;
- gpu_power_w_mean: power summed over the GPUs, mean over the samples (a sample in which a GPU
  did not report power has no total and is left out);
- gpu_energy_j: the summed power integrated over the window by the trapezoid rule over its
  samples, the first sample's power held back to the window's start and the last one's on to its
  end (only samples inside the window are used; none with fewer than two);
- tokens_per_joule: output tokens inside the window (output_tok_s * window_s) / gpu_energy_j;
- gpu_samples: how many samples fell inside the window.

The host is the key, not the profile: a host serves one profile at a time, so windows of
different profiles never overlap in time, and a profile measured again (a resume) has its own
file. No file, or files that say NVML was unavailable: the columns stay empty and the report
says so in one note ("no GPU telemetry: <reason>").

Controller only; standard library.
"""
from __future__ import annotations

import bisect
import glob
import json
import math
import os
from dataclasses import dataclass, field

TELEMETRY_DIR = "telemetry"
COLUMNS = ("gpu_sm_util_mean", "gpu_mem_used_mib_max", "gpu_power_w_mean",
           "gpu_sm_clock_mhz_mean", "gpu_energy_j", "tokens_per_joule", "gpu_samples")
NS_PER_S = 1_000_000_000


@dataclass
class HostSamples:
    times: list = field(default_factory=list)       # t_ns, sorted
    gpus: list = field(default_factory=list)        # per sample: the list of per-GPU dicts


@dataclass
class Telemetry:
    hosts: dict = field(default_factory=dict)       # host -> HostSamples
    unavailable: dict = field(default_factory=dict)  # host -> reason NVML gave
    files: int = 0
    problems: list = field(default_factory=list)


def read_run_telemetry(run_dir: str) -> Telemetry:
    """Every telemetry file of the run, by the host its first line names (else the file name's
    first part)."""
    out = Telemetry()
    collected: dict = {}
    for path in sorted(glob.glob(os.path.join(run_dir, TELEMETRY_DIR, "*.jsonl"))):
        out.files += 1
        host = os.path.basename(path).split("__", 1)[0]
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.readlines()
        except OSError as exc:
            out.problems.append(f"{path}: {exc}")
            continue
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue            # a torn last line of a sampler that was killed
            if not isinstance(record, dict):
                continue
            kind = record.get("kind")
            if kind in ("start", "unavailable"):
                host = str(record.get("host_label") or host)
                if kind == "unavailable":
                    out.unavailable.setdefault(host, str(record.get("reason") or "unavailable"))
            elif kind == "sample" and isinstance(record.get("t_ns"), int):
                gpus = [g for g in record.get("gpus") or [] if isinstance(g, dict)]
                if gpus:
                    collected.setdefault(host, []).append((record["t_ns"], gpus))
    for host, samples in collected.items():
        samples.sort(key=lambda s: s[0])
        out.hosts[host] = HostSamples([t for t, _g in samples], [g for _t, g in samples])
        out.unavailable.pop(host, None)
    return out


def _numbers(gpus: list, name: str) -> list:
    return [float(g[name]) for g in gpus if isinstance(g.get(name), (int, float))]


def _total(gpus: list, name: str):
    """The sum over the GPUs, or None where a GPU did not report the figure."""
    values = _numbers(gpus, name)
    return sum(values) if values and len(values) == len(gpus) else None


def _mean(values: list):
    return sum(values) / len(values) if values else None


def energy_j(times: list, power: list, start_ns: int, end_ns: int):
    """Joules over [start_ns, end_ns] from (time, W) points inside it: the trapezoid between
    them, the first held back to the start and the last on to the end. None with < 2 points."""
    if len(times) < 2:
        return None
    joules = power[0] * (times[0] - start_ns) + power[-1] * (end_ns - times[-1])
    for i in range(1, len(times)):
        joules += (power[i - 1] + power[i]) / 2.0 * (times[i] - times[i - 1])
    return joules / NS_PER_S


def summarise(samples: HostSamples, start_ns: int, end_ns: int, output_tokens=None) -> dict:
    """The level figures (COLUMNS) of the samples inside [start_ns, end_ns]."""
    lo = bisect.bisect_left(samples.times, start_ns)
    hi = bisect.bisect_right(samples.times, end_ns)
    times, gpus = samples.times[lo:hi], samples.gpus[lo:hi]
    figures = dict.fromkeys(COLUMNS)
    figures["gpu_samples"] = len(times)
    if not times:
        return figures
    figures["gpu_sm_util_mean"] = _mean([v for g in gpus for v in _numbers(g, "sm_util_pct")])
    figures["gpu_sm_clock_mhz_mean"] = _mean(
        [v for g in gpus for v in _numbers(g, "sm_clock_mhz")])
    memory = [m for m in (_total(g, "mem_used_mib") for g in gpus) if m is not None]
    figures["gpu_mem_used_mib_max"] = max(memory) if memory else None
    powered = [(t, p) for t, p in zip(times, (_total(g, "power_w") for g in gpus), strict=True)
               if p is not None]
    figures["gpu_power_w_mean"] = _mean([p for _t, p in powered])
    energy = energy_j([t for t, _p in powered], [p for _t, p in powered], start_ns, end_ns)
    figures["gpu_energy_j"] = energy
    if energy and output_tokens is not None:
        figures["tokens_per_joule"] = output_tokens / energy
    for name in ("gpu_sm_util_mean", "gpu_sm_clock_mhz_mean", "gpu_power_w_mean", "gpu_energy_j",
                 "gpu_mem_used_mib_max"):
        if figures[name] is not None:
            figures[name] = round(figures[name], 3)
    if figures["tokens_per_joule"] is not None:
        figures["tokens_per_joule"] = round(figures["tokens_per_joule"], 6)
    return figures


def _int(value):
    try:
        return None if value in (None, "") or math.isnan(float(value)) else int(value)
    except (TypeError, ValueError):
        return None


def _output_tokens(row: dict):
    try:
        tok_s, window = float(row.get("output_tok_s")), float(row.get("window_s"))
    except (TypeError, ValueError):
        return None
    if math.isnan(tok_s) or math.isnan(window):
        return None
    return tok_s * window


def level_figures(row: dict, telemetry: Telemetry) -> dict:
    """The COLUMNS of one level row (all None where its host has no samples or the row no
    wall-clock window)."""
    start, end = _int(row.get("window_start_unix_ns")), _int(row.get("window_end_unix_ns"))
    samples = telemetry.hosts.get(str(row.get("host")))
    if samples is None or not start or not end or end <= start:
        return dict.fromkeys(COLUMNS)
    return summarise(samples, start, end, _output_tokens(row))


def note(telemetry: Telemetry, rows: list) -> str | None:
    """The one sentence the report says where levels have no telemetry; None where all have."""
    hosts = sorted({str(r.get("host")) for r in rows})
    missing = [h for h in hosts if h not in telemetry.hosts]
    if not missing:
        unjoined = [r for r in rows if not level_figures(r, telemetry)["gpu_samples"]]
        if unjoined:
            return ("GPU telemetry: %d level(s) had no sample inside their window (levels "
                    "measured before the wall-clock window was recorded, or clocks apart)"
                    % len(unjoined))
        return None
    if not telemetry.files:
        return ("no GPU telemetry: none recorded in this run (bench_gpu_telemetry off, "
                "external endpoints only, or a run from before it)")
    reasons = []
    for host in missing:
        reason = telemetry.unavailable.get(host, "no samples recorded")
        reasons.append(reason if len(hosts) == 1 else f"{host}: {reason}")
    return "no GPU telemetry: " + "; ".join(reasons)
