"""servelab CUDA smoke test of an SGLang venv: prints one JSON object (the last line of stdout).

Run it with the venv's python (role sglang does: <venv>/bin/python smoke.py ...) or on its own:

    python3 smoke.py                                  # whatever this python has
    python3 smoke.py --nvcc /usr/local/cuda/bin/nvcc --cuda-release 13.0 --arch 12.0

What it checks, each part reported even when another fails:
- torch: version and the CUDA it was built for;
- devices: on every GPU torch sees, a 1024x1024 matmul checked against a CPU reference, timed;
  without a GPU it says so (gpu: false, reason) and skips the GPU parts;
- jit: FlashInfer's JIT builds (and loads) one small kernel, timed, when --nvcc is given, that nvcc
  reports --cuda-release, FlashInfer imports and a GPU is there; otherwise the reason it did not run;
- kernel: the SGLang kernel distribution (sglang-kernel, or sgl-kernel before 0.4.0), its version,
  the CUDA runtime its libraries link (libcudart.so.<major>), and whether sgl_kernel imports
  (only with a GPU: it loads CUDA code);
- fusion: FlashInfer's allreduce fusion entry points import (flashinfer.comm) and the CUDA majors
  its fusion module is built for (gen_trtllm_comm_module's supported_major_versions in
  flashinfer/jit/comm.py), against the architectures of --arch (or of the GPUs torch sees).

Exit status 0 unless a part that ran failed (a matmul, the JIT build). Standard library and torch
only; flashinfer and sglang are optional.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

FUSION_ENTRY_POINTS = ("trtllm_allreduce_fusion", "trtllm_create_ipc_workspace_for_all_reduce_fusion")
KERNEL_DISTRIBUTIONS = ("sglang-kernel", "sgl-kernel")
CUDART = re.compile(rb"libcudart\.so\.(\d+)")
JIT_SOURCE = r"""
#include <cuda_runtime.h>
__global__ void servelab_smoke_add(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
"""


def _error(exc) -> str:
    return ("%s: %s" % (type(exc).__name__, exc))[-600:]


def torch_part():
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the report
        return None, {"version": None, "cuda": None, "error": _error(exc)}
    return torch, {"version": getattr(torch, "__version__", None),
                   "cuda": getattr(getattr(torch, "version", None), "cuda", None)}


def devices_part(torch):
    """(gpu?, reason, [per GPU: index, name, capability, ok, ms, error])."""
    if torch is None:
        return False, "torch does not import", []
    try:
        if not torch.cuda.is_available():
            return False, "no GPU: torch.cuda.is_available() is False (torch CUDA %s)" % torch.version.cuda, []
        count = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001
        return False, "no GPU: %s" % _error(exc), []
    devices = []
    for index in range(count):
        entry = {"index": index, "name": None, "capability": None, "ok": False, "ms": None}
        try:
            entry["name"] = torch.cuda.get_device_name(index)
            entry["capability"] = "%d.%d" % torch.cuda.get_device_capability(index)
            gen = torch.Generator().manual_seed(index)
            a = torch.randn(1024, 1024, generator=gen)
            b = torch.randn(1024, 1024, generator=gen)
            expected = a @ b
            device = torch.device("cuda", index)
            ga, gb = a.to(device), b.to(device)
            (ga @ gb).sum().item()                      # warm-up: context, cuBLAS handle
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            result = ga @ gb
            torch.cuda.synchronize(device)
            entry["ms"] = round((time.perf_counter() - start) * 1000, 3)
            diff = (result.cpu() - expected).abs().max().item()
            entry["max_abs_diff"] = diff
            # TF32 may be on: allow its error on a K=1024 sum of N(0,1) products.
            entry["ok"] = diff < 0.5
            if not entry["ok"]:
                entry["error"] = "matmul differs from the CPU result by %g" % diff
        except Exception as exc:  # noqa: BLE001
            entry["error"] = _error(exc)
        devices.append(entry)
    return True, None, devices


def nvcc_release(nvcc):
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, _error(exc)
    match = re.search(r"release (\d+\.\d+)", out.stdout)
    return (match.group(1) if match else None), (None if out.returncode == 0 else out.stderr.strip()[-300:])


def jit_part(nvcc, cuda_release, gpu):
    report = {"ran": False, "ok": None, "nvcc": nvcc, "nvcc_release": None}
    if not nvcc:
        report["reason"] = "no --nvcc given"
        return report
    report["nvcc_release"], error = nvcc_release(nvcc)
    if error or not report["nvcc_release"]:
        report["reason"] = "nvcc does not run: %s" % (error or "no release in its output")
        return report
    if cuda_release and report["nvcc_release"] != cuda_release:
        report["reason"] = "nvcc is release %s, not the selected toolkit's %s" % (report["nvcc_release"], cuda_release)
        return report
    if not gpu:
        report["reason"] = "no GPU"
        return report
    try:
        from flashinfer import jit as fi_jit
    except Exception as exc:  # noqa: BLE001
        report["reason"] = "flashinfer does not import: %s" % _error(exc)
        return report
    if not hasattr(fi_jit, "gen_jit_spec"):
        report["reason"] = "this FlashInfer has no flashinfer.jit.gen_jit_spec"
        return report
    report["ran"] = True
    # FlashInfer's JIT finds nvcc through CUDA_HOME / PATH: make them the given toolkit's.
    os.environ["CUDA_HOME"] = os.path.dirname(os.path.dirname(os.path.abspath(nvcc)))
    os.environ["PATH"] = os.path.dirname(os.path.abspath(nvcc)) + os.pathsep + os.environ.get("PATH", "")
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="servelab-smoke-") as tmp:
            source = os.path.join(tmp, "servelab_smoke.cu")
            with open(source, "w", encoding="utf-8") as handle:
                handle.write(JIT_SOURCE)
            spec = fi_jit.gen_jit_spec("servelab_smoke_%d" % os.getpid(), [source])
            spec.build_and_load()
        report["ok"] = True
    except Exception as exc:  # noqa: BLE001
        report["ok"] = False
        report["error"] = _error(exc)
    report["seconds"] = round(time.perf_counter() - start, 3)
    return report


def kernel_part(gpu):
    try:
        from importlib import metadata
    except ImportError:
        return {"package": None, "version": None, "error": "no importlib.metadata"}
    for name in KERNEL_DISTRIBUTIONS:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        report = {"package": name, "version": dist.version, "cudart": [], "libraries": []}
        for file in dist.files or []:
            if not re.search(r"\.so(\.|$)", str(file)):
                continue
            report["libraries"].append(str(file))
            try:
                with open(str(dist.locate_file(file)), "rb") as handle:
                    report["cudart"] += sorted({m.decode() for m in CUDART.findall(handle.read())})
            except OSError:
                pass
        report["cudart"] = sorted(set(report["cudart"]))
        if gpu:
            try:
                import sgl_kernel  # noqa: F401 - loads the CUDA libraries
                report["import_ok"] = True
            except Exception as exc:  # noqa: BLE001
                report["import_ok"] = False
                report["error"] = _error(exc)
        return report
    return {"package": None, "version": None, "cudart": [], "libraries": []}


def fusion_part(archs):
    report = {"entry_points": {}, "supported_majors": None, "archs": {}}
    try:
        import importlib.util
        spec = importlib.util.find_spec("flashinfer")
    except Exception as exc:  # noqa: BLE001
        spec, report["error"] = None, "flashinfer is not found: %s" % _error(exc)
    if spec is None or not spec.origin:
        report.setdefault("error", "flashinfer is not installed")
        report["archs"] = {arch: False for arch in archs}
        report["available"] = False
        return report
    comm_source = os.path.join(os.path.dirname(spec.origin), "jit", "comm.py")
    try:
        with open(comm_source, encoding="utf-8") as handle:
            text = handle.read()
        body = re.search(r"def gen_trtllm_comm_module\b.*?(?=\ndef |\Z)", text, re.S)
        match = re.search(r"supported_major_versions\s*=\s*\[([\d,\s]*)\]", body.group(0) if body else "")
        if match:
            report["supported_majors"] = [int(v) for v in match.group(1).replace(",", " ").split()]
        else:
            report["error"] = "%s: gen_trtllm_comm_module names no supported_major_versions" % comm_source
    except OSError as exc:
        report["error"] = "cannot read %s: %s" % (comm_source, exc)
    try:
        from flashinfer import comm
        report["entry_points"] = {name: callable(getattr(comm, name, None)) for name in FUSION_ENTRY_POINTS}
    except Exception as exc:  # noqa: BLE001
        report["entry_points"] = {name: False for name in FUSION_ENTRY_POINTS}
        report["error"] = "import flashinfer.comm failed: %s" % _error(exc)
    majors = report["supported_majors"] or []
    report["archs"] = {arch: int(arch.split(".")[0]) in majors for arch in archs}
    report["available"] = (not report.get("error") and all(report["entry_points"].values())
                           and all(report["archs"].values()))
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nvcc", help="nvcc of the selected toolkit "
                                       "(e.g. /usr/local/cuda/bin/nvcc): runs the JIT part")
    parser.add_argument("--cuda-release", help="X.Y the nvcc must report (the selected toolkit's release)")
    parser.add_argument("--arch", action="append", default=[],
                        help="compute capability X.Y to check fusion for (repeat; default: the GPUs torch sees)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    torch, torch_info = torch_part()
    gpu, reason, devices = devices_part(torch)
    archs = sorted(set(args.arch) | {d["capability"] for d in devices if d.get("capability")})
    out = {"smoke": 1, "python": sys.version.split()[0], "torch": torch_info, "gpu": gpu, "reason": reason,
           "devices": devices, "kernel": kernel_part(gpu), "fusion": fusion_part(archs),
           "jit": jit_part(args.nvcc, args.cuda_release, gpu)}
    out["seconds"] = round(time.perf_counter() - start, 3)
    out["ok"] = all(d.get("ok") for d in devices) and out["jit"].get("ok") is not False
    print(json.dumps(out, sort_keys=True))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
