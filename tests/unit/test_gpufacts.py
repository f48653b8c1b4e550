"""gpu_facts against stand-ins: a fake nvidia-smi, fake CUDA toolkit dirs, a venv with fake
package metadata, and the real no-driver path of this machine."""
from __future__ import annotations

import json
import os
import stat
import sys
import venv

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_reap_helpers import run_playbook, task_results  # noqa: E402

from ansible_collections.servelab.serving.plugins.module_utils.gpu.facts import GpuFactsOptions, collect_gpu_facts  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.query import NvmlBackend, BackendUnavailable  # noqa: E402
from ansible_collections.servelab.serving.plugins.module_utils.gpu.venv import VenvError  # noqa: E402

GPUS = [
    {"index": "0", "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
     "uuid": "GPU-11111111-2222-3333-4444-555555555555", "memory.total": "97887",
     "memory.used": "1234", "compute_cap": "12.0", "driver_version": "580.82.07"},
    {"index": "1", "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
     "uuid": "GPU-66666666-7777-8888-9999-000000000000", "memory.total": "97887",
     "memory.used": "0", "compute_cap": "12.0", "driver_version": "580.82.07"},
]
APPS = [("GPU-11111111-2222-3333-4444-555555555555", 4242, "1200")]

# Answers the three invocations gpu_facts uses, honouring the requested field order; logs them.
FAKE_SMI = r'''#!%(python)s
import json, sys
spec = json.load(open(%(spec)r))
with open(%(log)r, "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + "\n")
if spec.get("fail"):
    print(spec["fail"]); sys.exit(9)
args = sys.argv[1:]
q = [a for a in args if a.startswith("--query-gpu=")]
apps = [a for a in args if a.startswith("--query-compute-apps=")]
if q:
    fields = q[0].split("=", 1)[1].split(",")
    for g in spec["gpus"]:
        if any(f not in g for f in fields):
            print("Field '%%s' is not a valid field to query." %% fields[-1]); sys.exit(2)
        print(", ".join(g[f] for f in fields))
elif apps:
    for uuid, pid, mem in spec["apps"]:
        print("%%s, %%d, %%s" %% (uuid, pid, mem))
else:
    print("| NVIDIA-SMI 580.82.07    Driver Version: 580.82.07    CUDA Version: 13.0     |")
'''

NVCC = """#!/bin/sh
echo "nvcc: NVIDIA (R) Cuda compiler driver"
echo "Cuda compilation tools, release %s, V%s"
"""


def fake_smi(tmp_path, gpus=None, apps=None, fail=None):
    spec = tmp_path / "smi.json"
    spec.write_text(json.dumps({"gpus": GPUS if gpus is None else gpus,
                                "apps": APPS if apps is None else apps, "fail": fail}))
    log = tmp_path / "smi.log"
    path = tmp_path / "nvidia-smi"
    path.write_text(FAKE_SMI % {"python": sys.executable, "spec": str(spec), "log": str(log)})
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def fake_cuda_root(tmp_path, versions=("12.8.1", "13.0.1"), selected="13.0"):
    root = tmp_path / "usr-local"
    for full in versions:
        short = ".".join(full.split(".")[:2])
        kit = root / ("cuda-" + short)
        (kit / "bin").mkdir(parents=True)
        (kit / "version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK",
                                                               "version": full}}))
        nvcc = kit / "bin" / "nvcc"
        nvcc.write_text(NVCC % (short, full + ".88"))
        nvcc.chmod(0o755)
    if selected:
        os.symlink(str(root / ("cuda-" + selected)), str(root / "cuda"))
    return str(root)


def no_nvml():
    try:
        NvmlBackend().close()
    except BackendUnavailable:
        return True
    return False


def test_gpus_and_driver_from_nvidia_smi(tmp_path):
    smi = fake_smi(tmp_path)
    f = collect_gpu_facts(GpuFactsOptions(nvidia_smi=smi, backend="nvidia-smi",
                                          cuda_root=str(tmp_path / "none")))
    assert f.source == "nvidia-smi" and f.reason is None
    assert [g.index for g in f.gpus] == [0, 1]
    g0 = f.gpus[0]
    assert g0.name == GPUS[0]["name"] and g0.uuid == GPUS[0]["uuid"]
    assert g0.compute_capability == "12.0"
    assert (g0.memory_total_mib, g0.memory_used_mib) == (97887, 1234)
    assert [(p.pid, p.used_mib) for p in g0.processes] == [(4242, 1200)]
    assert f.gpus[1].processes == []
    assert f.driver_version == "580.82.07" and f.cuda_driver_version == "13.0"


def test_old_nvidia_smi_without_compute_cap_still_answers(tmp_path):
    old = [{k: v for k, v in g.items() if k != "compute_cap"} for g in GPUS]
    f = collect_gpu_facts(GpuFactsOptions(nvidia_smi=fake_smi(tmp_path, gpus=old),
                                          backend="nvidia-smi"))
    assert len(f.gpus) == 2 and f.gpus[0].compute_capability is None
    assert f.gpus[0].name == GPUS[0]["name"]


@pytest.mark.skipif(not no_nvml(), reason="NVML works here: the fallback is not exercised")
def test_auto_falls_back_from_nvml_to_nvidia_smi(tmp_path):
    f = collect_gpu_facts(GpuFactsOptions(nvidia_smi=fake_smi(tmp_path)))
    assert f.source == "nvidia-smi" and len(f.gpus) == 2
    assert "NVML" in f.reason and "fell back to nvidia-smi" in f.reason


@pytest.mark.skipif(not no_nvml(), reason="a driver is present here")
def test_no_driver_gives_empty_gpus_and_the_reason(tmp_path):
    ver = tmp_path / "version"
    ver.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  "
                   "Release Build  (dvs-builder@U22-I3-AF03-09-1)  Thu Aug 21 2025\n"
                   "GCC version:  gcc version 12.3.0\n")
    f = collect_gpu_facts(GpuFactsOptions(nvidia_smi=str(tmp_path / "absent-nvidia-smi"),
                                          cuda_root=str(tmp_path), driver_version_file=str(ver)))
    assert f.gpus == [] and f.source == "none"
    assert "NVML" in f.reason and "absent-nvidia-smi" in f.reason
    # the kernel module is loaded (as the version file says) even though user space is missing
    assert f.kernel_module_version == "580.82.07" and f.driver_version == "580.82.07"
    assert f.cuda_driver_version is None


def test_nvidia_smi_that_cannot_reach_the_driver(tmp_path):
    smi = fake_smi(tmp_path, fail="NVIDIA-SMI has failed because it couldn't communicate with "
                                  "the NVIDIA driver.")
    f = collect_gpu_facts(GpuFactsOptions(nvidia_smi=smi, backend="nvidia-smi",
                                          driver_version_file=str(tmp_path / "none")))
    assert f.gpus == [] and f.source == "none"
    assert "couldn't communicate with the NVIDIA driver" in f.reason
    assert f.driver_version is None


def test_toolkits_and_the_selected_one(tmp_path):
    root = fake_cuda_root(tmp_path)
    f = collect_gpu_facts(GpuFactsOptions(cuda_root=root, nvidia_smi=fake_smi(tmp_path),
                                          backend="nvidia-smi"))
    assert [(k.version, k.full_version, k.nvcc_release) for k in f.toolkits] == [
        ("12.8", "12.8.1", "12.8"), ("13.0", "13.0.1", "13.0")]
    assert f.cuda_selected == "13.0" and f.nvcc_release == "13.0"
    assert f.nvcc_version == "13.0.1.88"
    # switch the link, as the alternatives system would
    os.remove(os.path.join(root, "cuda"))
    os.symlink(os.path.join(root, "cuda-12.8"), os.path.join(root, "cuda"))
    f = collect_gpu_facts(GpuFactsOptions(cuda_root=root, nvidia_smi=fake_smi(tmp_path),
                                          backend="nvidia-smi"))
    assert f.cuda_selected == "12.8" and f.nvcc_release == "12.8"


def test_no_toolkit_link(tmp_path):
    root = fake_cuda_root(tmp_path, versions=("12.8.1",), selected=None)
    f = collect_gpu_facts(GpuFactsOptions(cuda_root=root, nvidia_smi=fake_smi(tmp_path),
                                          backend="nvidia-smi"))
    assert [k.version for k in f.toolkits] == ["12.8"]
    assert f.cuda_selected is None and f.nvcc_release is None


def make_venv(tmp_path, packages, torch_cuda="13.0"):
    """A real venv (no pip) with package metadata written by hand: what importlib.metadata
    reads, without installing gigabytes of wheels."""
    path = tmp_path / "venv"
    venv.create(str(path), with_pip=False, symlinks=True)
    site = next(path.glob("lib/python*/site-packages"))
    for name, version in packages.items():
        dist = site / ("%s-%s.dist-info" % (name.replace("-", "_"), version))
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\n"
                                       % (name, version))
    if "torch" in packages:
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text("raise ImportError('do not import me')\n")
        (site / "torch" / "version.py").write_text(
            "from typing import Optional\n__version__ = '%s'\ncuda: Optional[str] = %r\n"
            % (packages["torch"], torch_cuda))
    return str(path)


def test_venv_versions(tmp_path):
    path = make_venv(tmp_path, {"torch": "2.11.0+cu130", "sglang": "0.5.23",
                                "flashinfer-python": "0.6.18", "flashinfer-cubin": "0.6.18",
                                "flashinfer-jit-cache": "0.6.18+cu130"})
    f = collect_gpu_facts(GpuFactsOptions(venv=path, nvidia_smi=fake_smi(tmp_path),
                                          backend="nvidia-smi"))
    v = f.venv
    assert v.python == "%d.%d.%d" % sys.version_info[:3]
    assert v.torch == "2.11.0+cu130" and v.torch_cuda == "13.0" and v.sglang == "0.5.23"
    assert v.flashinfer == {"flashinfer-python": "0.6.18", "flashinfer-cubin": "0.6.18",
                            "flashinfer-jit-cache": "0.6.18+cu130"}
    assert v.flashinfer_consistent is True


def test_venv_with_mismatched_flashinfer_and_cpu_torch(tmp_path):
    path = make_venv(tmp_path, {"torch": "2.11.0+cpu", "flashinfer-python": "0.6.18",
                                "flashinfer-jit-cache": "0.6.16+cu130"}, torch_cuda=None)
    f = collect_gpu_facts(GpuFactsOptions(venv=path, nvidia_smi=fake_smi(tmp_path),
                                          backend="nvidia-smi"))
    assert f.venv.torch_cuda is None and f.venv.sglang is None
    assert f.venv.flashinfer["flashinfer-cubin"] is None
    assert f.venv.flashinfer_consistent is False


def test_bad_venv_names_the_option(tmp_path):
    with pytest.raises(VenvError, match=r"venv: .*has no bin/python"):
        collect_gpu_facts(GpuFactsOptions(venv=str(tmp_path / "nope")))


def test_bad_backend_names_the_option():
    with pytest.raises(ValueError, match="backend: 'cuda' is not one of"):
        collect_gpu_facts(GpuFactsOptions(backend="cuda"))


PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: facts
      servelab.serving.gpu_facts:
        nvidia_smi: "{smi}"
        backend: nvidia-smi
        cuda_root: "{root}"
        venv: "{venv}"
      check_mode: true
    - name: no driver
      servelab.serving.gpu_facts:
        nvidia_smi: "{tmp}/absent-nvidia-smi"
        backend: nvidia-smi
        cuda_root: "{tmp}"
    - name: bad venv
      servelab.serving.gpu_facts:
        venv: "{tmp}/nope"
      ignore_errors: true
"""


def test_gpu_facts_through_ansible(tmp_path):
    path = make_venv(tmp_path, {"torch": "2.11.0+cu130", "sglang": "0.5.23"})
    root = fake_cuda_root(tmp_path)
    out = run_playbook(PLAY.format(smi=fake_smi(tmp_path), root=root, venv=path,
                                   tmp=str(tmp_path)), tmp_path)
    res = task_results(out)
    facts = res["facts"]["gpu_facts"]
    assert res["facts"]["changed"] is False
    assert len(facts["gpus"]) == 2 and facts["gpus"][0]["compute_capability"] == "12.0"
    assert facts["cuda_selected"] == "13.0" and facts["venv"]["torch_cuda"] == "13.0"
    nodrv = res["no driver"]
    assert "failed" not in nodrv and nodrv["gpu_facts"]["gpus"] == []
    assert nodrv["gpu_facts"]["source"] == "none" and nodrv["gpu_facts"]["reason"]
    assert res["bad venv"]["failed"] and "venv:" in res["bad venv"]["msg"]
