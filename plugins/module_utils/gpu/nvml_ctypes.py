"""The few NVML calls the telemetry sampler needs, through ctypes: no nvidia-ml-py required.

The sampler runs in the Python that Ansible uses on the GPU server, which is often the system's
python3 without nvidia-ml-py. NVML itself (libnvidia-ml.so.1) ships with the NVIDIA driver, so
every GPU server that can serve has it: binding the handful of functions we call directly means
telemetry works wherever the driver does.

`load()` returns a `Nvml` object with pynvml's names and shapes for exactly those calls
(`nvmlInit`, `nvmlShutdown`, `nvmlDeviceGetCount`, `nvmlDeviceGetHandleByIndex`,
`nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetMemoryInfo`, `nvmlDeviceGetPowerUsage`,
`nvmlDeviceGetClockInfo`, `nvmlDeviceGetName`, `NVML_CLOCK_SM`), so telemetry.py treats it like
pynvml. A failing call raises `NvmlError` with NVML's own code and text (`nvmlErrorString`).

The C signatures are NVML's public API (nvml.h): every call returns an `nvmlReturn_t` (0 is
NVML_SUCCESS); the `_v2` entry points are the ones current drivers export under the plain names'
meaning (`nvmlInit_v2` initialises without touching GPUs that are not attached, the `_v2` count
and handle calls skip GPUs the caller may not see).

`SERVELAB_NVML_LIBRARY` names another library file (the tests build a stand-in with a C compiler).
Standard library only.
"""
from __future__ import annotations

import ctypes
import os
from typing import Optional

ENV_LIBRARY = "SERVELAB_NVML_LIBRARY"
LIBRARY = "libnvidia-ml.so.1"

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_CLOCK_SM = 1
NVML_DEVICE_NAME_BUFFER_SIZE = 96   # NVML_DEVICE_NAME_V2_BUFFER_SIZE in nvml.h


class NvmlError(Exception):
    """An NVML call did not succeed; `code` is its nvmlReturn_t."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__("%s (NVML error %d)" % (text, code))
        self.code = code


class LibraryNotFound(NvmlError):
    """libnvidia-ml could not be loaded (no driver on this machine)."""


class Utilization(ctypes.Structure):
    """nvmlUtilization_t: percent of the last sample period the GPU / memory was busy."""
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Memory(ctypes.Structure):
    """nvmlMemory_t (version 1): bytes."""
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


Device = ctypes.c_void_p   # nvmlDevice_t is an opaque pointer


class Nvml:
    """pynvml's names for the calls the sampler makes, over one loaded library."""

    NVML_CLOCK_SM = NVML_CLOCK_SM

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        error_string = getattr(library, "nvmlErrorString", None)
        if error_string is not None:
            error_string.restype = ctypes.c_char_p
            error_string.argtypes = [ctypes.c_int]
        self._error_string = error_string

    def _fn(self, *names: str):
        """The first of `names` the library exports (the `_v2` entry point before the plain one)."""
        for name in names:
            fn = getattr(self._lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_int
                return fn
        raise NvmlError(-1, "this NVML exports none of %s" % ", ".join(names))

    def _check(self, code: int) -> None:
        if code == NVML_SUCCESS:
            return
        text = "NVML error"
        if self._error_string is not None:
            raw = self._error_string(code)
            text = raw.decode("utf-8", "replace") if raw else text
        raise NvmlError(code, text)

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._check(self._fn("nvmlInit_v2", "nvmlInit")())

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._check(self._fn("nvmlShutdown")())

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        count = ctypes.c_uint(0)
        self._check(self._fn("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount")(ctypes.byref(count)))
        return count.value

    def nvmlDeviceGetHandleByIndex(self, index: int):  # noqa: N802
        handle = Device()
        self._check(self._fn("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex")(
            ctypes.c_uint(index), ctypes.byref(handle)))
        return handle

    def nvmlDeviceGetUtilizationRates(self, handle) -> Utilization:  # noqa: N802
        util = Utilization()
        self._check(self._fn("nvmlDeviceGetUtilizationRates")(handle, ctypes.byref(util)))
        return util

    def nvmlDeviceGetMemoryInfo(self, handle) -> Memory:  # noqa: N802
        memory = Memory()
        self._check(self._fn("nvmlDeviceGetMemoryInfo")(handle, ctypes.byref(memory)))
        return memory

    def nvmlDeviceGetPowerUsage(self, handle) -> int:  # noqa: N802
        """Milliwatts."""
        milliwatts = ctypes.c_uint(0)
        self._check(self._fn("nvmlDeviceGetPowerUsage")(handle, ctypes.byref(milliwatts)))
        return milliwatts.value

    def nvmlDeviceGetClockInfo(self, handle, clock_type: int) -> int:  # noqa: N802
        """MHz."""
        mhz = ctypes.c_uint(0)
        self._check(self._fn("nvmlDeviceGetClockInfo")(handle, ctypes.c_int(clock_type),
                                                       ctypes.byref(mhz)))
        return mhz.value

    def nvmlDeviceGetName(self, handle) -> str:  # noqa: N802
        buf = ctypes.create_string_buffer(NVML_DEVICE_NAME_BUFFER_SIZE)
        self._check(self._fn("nvmlDeviceGetName")(handle, buf, ctypes.c_uint(len(buf))))
        return buf.value.decode("utf-8", "replace")


def load(path: Optional[str] = None) -> Nvml:
    """Load NVML (`path`, else $SERVELAB_NVML_LIBRARY, else libnvidia-ml.so.1 from the loader's
    search path); raises LibraryNotFound when it cannot be loaded."""
    name = path or os.environ.get(ENV_LIBRARY) or LIBRARY
    try:
        return Nvml(ctypes.CDLL(name))
    except OSError as exc:
        raise LibraryNotFound(-1, "%s not loadable: %s" % (name, exc)) from exc
