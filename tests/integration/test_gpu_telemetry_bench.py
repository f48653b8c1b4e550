"""bench.yml on the embedded default with a fake NVML on the "GPU server" (this machine): the
role starts the sampler before each sweep and stops it after, the samples come to
<run_dir>/telemetry/, and the report joins them to every level (levels.csv, levels.json,
plots/gpu.png). The samplers are gone afterwards, by their pids.

The fake (tests/fakenvml.py) reaches the module through the
environment (SERVELAB_GPU_TELEMETRY_NVML); the embedded default run without it (no GPU here)
is tests/integration/test_bench_playbook.py, which must report the note instead.
"""
from __future__ import annotations

import csv
import glob
import json
import os

import ansible_runner
import pytest

from ansible_collections.servelab.serving.plugins.module_utils.proc.table import still_running
from testports import free_port as _free_port  # tests/testports.py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
FAKE = os.path.join(REPO, "tests", "fakenvml.py")

pytestmark = pytest.mark.slow


def _bench(tmp_path, **more):
    env = {
        "PATH": VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
        "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
        "SERVELAB_RESULTS_ROOT": str(tmp_path / "results"),
        "SERVELAB_GPU_TELEMETRY_NVML": FAKE,
    }
    extravars = {
        "bench_profiles": [{"name": "baseline",
                            "simulator": {"profile": "baseline", "time_scale": 10}}],
        "bench_concurrency": [1, 2],
        "bench_level_seconds": 2,
        "bench_warmup_requests": 1,
        "bench_server_port": _free_port(),
        "bench_state_dir": str(tmp_path / "servers"),
        "bench_workload": {"kind": "synthetic", "input_tokens": 128, "output_tokens": 64},
        "bench_max_tokens": 64,
    }
    extravars.update(more)
    (tmp_path / "runner").mkdir()
    r = ansible_runner.run(private_data_dir=str(tmp_path / "runner"), project_dir=REPO,
                           playbook=os.path.join(REPO, "bench.yml"),
                           inventory=os.path.join(REPO, "inventory", "local"),
                           extravars=extravars, envvars=env, quiet=True, timeout=600)
    assert r.rc == 0, r.stdout.read()[-4000:]
    [run_dir] = [d for d in glob.glob(str(tmp_path / "results" / "*"))
                 if os.path.isdir(d) and not os.path.islink(d)]
    return run_dir


def test_bench_playbook_records_gpu_telemetry_per_level(tmp_path):
    run_dir = _bench(tmp_path)
    [telemetry] = glob.glob(os.path.join(run_dir, "telemetry", "localhost__baseline__*.jsonl"))
    lines = [json.loads(line) for line in open(telemetry, encoding="utf-8")]
    assert lines[0]["kind"] == "start" and lines[0]["profile"] == "baseline"
    assert lines[-1]["kind"] == "end" and lines[-1]["reason"] == "stopped"
    assert not still_running(lines[0]["pid"], None)
    with open(os.path.join(run_dir, "levels.csv"), newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["concurrency"]) for r in rows] == [1, 2]
    for row in rows:
        assert int(row["gpu_samples"]) >= 3
        assert float(row["gpu_power_w_mean"]) == pytest.approx(700.0)   # 300 W + 400 W
        assert float(row["gpu_sm_util_mean"]) == pytest.approx(55.0)    # 50 % and 60 %
        assert float(row["tokens_per_joule"]) > 0
        assert int(row["window_end_unix_ns"]) > int(row["window_start_unix_ns"]) > 0
    document = json.load(open(os.path.join(run_dir, "levels.json"), encoding="utf-8"))
    assert all(level["gpu_energy_j"] > 0 for level in document["levels"])
    assert os.path.isfile(os.path.join(run_dir, "plots", "gpu.png"))
    summary = open(os.path.join(run_dir, "summary.md"), encoding="utf-8").read()
    assert "no GPU telemetry" not in summary


def test_bench_gpu_telemetry_false_starts_no_sampler(tmp_path):
    run_dir = _bench(tmp_path, bench_gpu_telemetry=False, bench_concurrency=[1])
    assert not os.path.exists(os.path.join(run_dir, "telemetry"))
    assert not glob.glob(str(tmp_path / "servers" / "telemetry-*"))
    summary = open(os.path.join(run_dir, "summary.md"), encoding="utf-8").read()
    assert "no GPU telemetry: none recorded in this run" in summary
    assert not os.path.exists(os.path.join(run_dir, "plots", "gpu.png"))
