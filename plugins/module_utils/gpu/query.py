"""Read GPU state: NVML through nvidia-ml-py (`pynvml`) when importable, else `nvidia-smi`.

Standard library only; pynvml is an optional accelerator (one NVML call is microseconds, one
nvidia-smi run is tens to hundreds of milliseconds, which matters when polling memory).
Both backends return the same dataclasses. Where neither works (no driver, as on a CI machine:
pynvml raises NVMLError_LibraryNotFound), `open_backend` returns None with the reasons.

Note for containers: the process PIDs NVML and nvidia-smi report are host PIDs (the driver
does not know pid namespaces); they are reported as such. The reaper matches one to a local
process only where that pid is a local process holding a CUDA context (same pid namespace: a
bare host, or the Proxmox host reaping a container); inside a container they match nothing.
"""
from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

MIB = 1024 * 1024
BACKENDS = ("auto", "nvml", "nvidia-smi")
SMI_TIMEOUT = 30.0


@dataclass
class GpuProcess:
    pid: int                       # host pid (see module docstring)
    used_mib: Optional[int]


@dataclass
class GpuInfo:
    index: int
    name: str
    uuid: str
    compute_capability: Optional[str]
    memory_total_mib: int
    memory_used_mib: int
    processes: List[GpuProcess] = field(default_factory=list)


@dataclass
class GpuMemory:
    """What the reaper polls: per GPU, memory used, and the compute processes that hold it
    with their own memory (NVML's nvmlDeviceGetComputeRunningProcesses, or nvidia-smi
    --query-compute-apps): the reaper leaves out of its check what the processes it spared
    hold."""
    index: int
    uuid: str
    used_mib: int
    total_mib: int
    processes: Optional[int]       # None where the backend could not list them
    # per compute process (host pids, see the module doc); None where the backend could not
    # list them; a used_mib of None where the driver does not say (no privilege, some vGPU/MIG)
    process_memory: Optional[List[GpuProcess]] = None


@dataclass
class DriverInfo:
    driver_version: Optional[str]
    cuda_driver_version: Optional[str]


class BackendUnavailable(Exception):
    pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_version_from_int(v: int) -> str:
    """NVML encodes the CUDA driver API version as 1000*major + 10*minor (13000 -> "13.0")."""
    return "%d.%d" % (v // 1000, (v % 1000) // 10)


class NvmlBackend:
    source = "nvml"
    poll_cap = 0.02            # a read costs well under a millisecond per GPU: poll closely

    def __init__(self) -> None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError as exc:
            raise BackendUnavailable("pynvml (nvidia-ml-py) not importable: %s" % exc) from exc
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except Exception as exc:      # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            raise BackendUnavailable("NVML: %s (%s)" % (exc, type(exc).__name__)) from exc
        try:
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            self.close()
            raise BackendUnavailable("NVML: %s (%s)" % (exc, type(exc).__name__)) from exc

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass

    def _memory(self, handle) -> Tuple[int, int]:
        nv = self.nv
        # v2 reports "used" without the driver's reservation, like nvidia-smi does
        if hasattr(nv, "nvmlMemory_v2"):
            try:
                info = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
                return info.total // MIB, info.used // MIB
            except Exception:
                pass
        info = nv.nvmlDeviceGetMemoryInfo(handle)
        return info.total // MIB, info.used // MIB

    def _processes(self, handle) -> Optional[List[GpuProcess]]:
        try:
            procs = self.nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return None
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append(GpuProcess(pid=int(p.pid),
                                  used_mib=None if used in (None, 0xFFFFFFFFFFFFFFFF)
                                  else int(used) // MIB))
        return out

    def memory(self) -> List[GpuMemory]:
        out = []
        for i, h in enumerate(self.handles):
            total, used = self._memory(h)
            procs = self._processes(h)
            out.append(GpuMemory(index=i, uuid=_text(self.nv.nvmlDeviceGetUUID(h)), used_mib=used,
                                 total_mib=total,
                                 processes=None if procs is None else len(procs),
                                 process_memory=procs))
        return out

    def gpus(self) -> List[GpuInfo]:
        nv = self.nv
        out = []
        for i, h in enumerate(self.handles):
            total, used = self._memory(h)
            try:
                major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
                cc = "%d.%d" % (major, minor)
            except Exception:
                cc = None
            out.append(GpuInfo(index=i, name=_text(nv.nvmlDeviceGetName(h)),
                               uuid=_text(nv.nvmlDeviceGetUUID(h)), compute_capability=cc,
                               memory_total_mib=total, memory_used_mib=used,
                               processes=self._processes(h) or []))
        return out

    def driver(self) -> DriverInfo:
        nv = self.nv
        try:
            drv = _text(nv.nvmlSystemGetDriverVersion())
        except Exception:
            drv = None
        cuda = None
        for fn in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
            if hasattr(nv, fn):
                try:
                    cuda = cuda_version_from_int(int(getattr(nv, fn)()))
                    break
                except Exception:
                    continue
        return DriverInfo(driver_version=drv, cuda_driver_version=cuda)


def _int_or_none(value: str) -> Optional[int]:
    value = value.strip()
    try:
        return int(float(value))
    except ValueError:             # "[N/A]", "[Not Supported]"
        return None


def _field_or_none(value: Optional[str]) -> Optional[str]:
    return value if value and not value.startswith("[") else None    # "[N/A]"


class SmiBackend:
    source = "nvidia-smi"
    poll_cap = None            # a read is a process start: back off to the caller's interval

    def __init__(self, nvidia_smi: str = "nvidia-smi") -> None:
        path = nvidia_smi if os.sep in nvidia_smi else shutil.which(nvidia_smi)
        if not path or not os.access(path, os.X_OK):
            raise BackendUnavailable("nvidia-smi: %s not found or not executable" % nvidia_smi)
        self.path = path
        self._have_compute_cap = True
        # one cheap call up front: an installed nvidia-smi without a driver fails here
        self._query_gpu(["index", "uuid"])

    def close(self) -> None:
        pass

    def _run(self, args: List[str]) -> str:
        try:
            proc = subprocess.run([self.path] + args, capture_output=True, text=True,
                                  timeout=SMI_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendUnavailable("nvidia-smi %s: %s" % (" ".join(args[:1]), exc)) from exc
        if proc.returncode != 0:
            msg = (proc.stdout + proc.stderr).strip().splitlines()
            raise BackendUnavailable("nvidia-smi %s: exit %d: %s" % (
                " ".join(args[:1]), proc.returncode, msg[-1] if msg else ""))
        return proc.stdout

    def _query_gpu(self, fields: List[str]) -> List[Dict[str, str]]:
        text = self._run(["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"])
        rows = []
        for rec in csv.reader(io.StringIO(text)):
            if not rec or not rec[0].strip():
                continue
            if len(rec) != len(fields):
                raise BackendUnavailable("nvidia-smi: unexpected --query-gpu line %r" % rec)
            rows.append({f: v.strip() for f, v in zip(fields, rec)})
        return rows

    def _apps(self) -> Optional[Dict[str, List[GpuProcess]]]:
        try:
            text = self._run(["--query-compute-apps=gpu_uuid,pid,used_memory",
                              "--format=csv,noheader,nounits"])
        except BackendUnavailable:
            return None
        apps: Dict[str, List[GpuProcess]] = {}
        for rec in csv.reader(io.StringIO(text)):
            if len(rec) < 3 or not rec[1].strip().isdigit():
                continue
            apps.setdefault(rec[0].strip(), []).append(
                GpuProcess(pid=int(rec[1].strip()), used_mib=_int_or_none(rec[2])))
        return apps

    def memory(self) -> List[GpuMemory]:
        rows = self._query_gpu(["index", "uuid", "memory.used", "memory.total"])
        apps = self._apps()
        return [GpuMemory(index=int(r["index"]), uuid=r["uuid"],
                          used_mib=_int_or_none(r["memory.used"]) or 0,
                          total_mib=_int_or_none(r["memory.total"]) or 0,
                          processes=None if apps is None else len(apps.get(r["uuid"], [])),
                          process_memory=None if apps is None else apps.get(r["uuid"], []))
                for r in rows]

    def gpus(self) -> List[GpuInfo]:
        base = ["index", "name", "uuid", "memory.total", "memory.used"]
        rows = None
        if self._have_compute_cap:
            try:
                rows = self._query_gpu(base + ["compute_cap"])
            except BackendUnavailable:
                self._have_compute_cap = False      # drivers before ~510 lack the field
        if rows is None:
            rows = self._query_gpu(base)
        apps = self._apps() or {}
        return [GpuInfo(index=int(r["index"]), name=r["name"], uuid=r["uuid"],
                        compute_capability=_field_or_none(r.get("compute_cap")),
                        memory_total_mib=_int_or_none(r["memory.total"]) or 0,
                        memory_used_mib=_int_or_none(r["memory.used"]) or 0,
                        processes=apps.get(r["uuid"], []))
                for r in rows]

    def driver(self) -> DriverInfo:
        drv = None
        try:
            rows = self._query_gpu(["driver_version"])
            drv = rows[0]["driver_version"] if rows else None
        except BackendUnavailable:
            pass
        cuda = None
        try:
            m = re.search(r"CUDA (?:Driver )?Version\s*:\s*([0-9]+\.[0-9]+)", self._run([]))
            cuda = m.group(1) if m else None
        except BackendUnavailable:
            pass
        return DriverInfo(driver_version=drv, cuda_driver_version=cuda)


def open_backend(backend: str = "auto", nvidia_smi: str = "nvidia-smi"):
    """(backend or None, reasons): the first of NVML / nvidia-smi that works, as asked."""
    if backend not in BACKENDS:
        raise ValueError("backend: %r is not one of %s" % (backend, ", ".join(BACKENDS)))
    reasons: List[str] = []
    order = {"auto": ("nvml", "nvidia-smi"), "nvml": ("nvml",),
             "nvidia-smi": ("nvidia-smi",)}[backend]
    for name in order:
        try:
            return (NvmlBackend() if name == "nvml" else SmiBackend(nvidia_smi)), reasons
        except BackendUnavailable as exc:
            reasons.append(str(exc))
    return None, reasons
