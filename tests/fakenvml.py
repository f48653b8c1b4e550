"""A stand-in for pynvml (two GPUs), for the GPU telemetry tests: loaded by path through
SERVELAB_GPU_TELEMETRY_NVML (the detached sampler, the module through ansible-playbook) or
imported as an object.

FAKE_NVML_MODE=nogpu makes nvmlInit fail as it does on a machine without a driver.
"""
import os
from types import SimpleNamespace

NVML_CLOCK_SM = 1
MIB = 1024 * 1024


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's own name
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


def nvmlInit():  # noqa: N802 - pynvml's names
    if os.environ.get("FAKE_NVML_MODE") == "nogpu":
        raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")


def nvmlShutdown():  # noqa: N802
    pass


def nvmlDeviceGetCount():  # noqa: N802
    return 2


def nvmlDeviceGetHandleByIndex(i):  # noqa: N802
    return ("handle", i)


def nvmlDeviceGetUtilizationRates(handle):  # noqa: N802
    return SimpleNamespace(gpu=50 + 10 * handle[1], memory=20)


def nvmlDeviceGetMemoryInfo(handle):  # noqa: N802
    return SimpleNamespace(total=80 * 1024 * MIB, used=(1000 + handle[1]) * MIB, free=0)


def nvmlDeviceGetPowerUsage(handle):  # noqa: N802
    return 300000 + 100000 * handle[1]           # mW: 300 W and 400 W


def nvmlDeviceGetClockInfo(handle, kind):  # noqa: N802
    assert kind == NVML_CLOCK_SM
    return 1980
