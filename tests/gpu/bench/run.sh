#!/usr/bin/env bash
# bench.yml itself on a GPU machine: a real engine (`transformers serve`, continuous batching, a
# random-weight Llama built here) launched, swept and stopped by the playbook, its GPUs sampled by
# gpu_telemetry. Two runs: the sampler through pynvml (the machine's nvidia-ml-py), then through
# servelab's ctypes binding of libnvidia-ml (SERVELAB_GPU_TELEMETRY_NVML=ctypes), as on a GPU
# server whose python has no nvidia-ml-py. Then the report is rebuilt by `servelab report`'s code.
#
# Run from the repository root on the GPU machine, with the wheels it lacks in .whl (ansible-core
# and its needs, jsonschema's, and transformers serve's: tests/gpu/engine/fetch-wheels.sh
# ansible-core==2.19.14 resolvelib cryptography cffi pycparser jsonschema
# jsonschema-specifications referencing rpds-py). Writes $OUT/gpu-bench.tar.gz (both runs'
# results directories) and $OUT/gpu-bench.log.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-bench-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-bench.log") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 ANSIBLE_FORCE_COLOR=0
python3 tools/collection_link.py collections || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.used,power.draw --format=csv
[ -f /tmp/model/config.json ] || python3 tests/gpu/engine/build_random_llm.py /tmp/model 2048 16 || exit 1
mkdir -p ~/.cache/huggingface/hub   # else transformers serve's /v1/models answers 500
if command -v transformers >/dev/null; then
  serve='["'"$(command -v transformers)"'", "serve"]'
else   # the console script may be missing where transformers was installed with --target
  serve='["python3", "-c", "import sys; from transformers.cli.transformers import main; sys.argv[0] = \"transformers\"; main()", "serve"]'
fi
echo "{\"gpu_bench_serve_command\": $serve}" > /tmp/gpu-bench-vars.json
export SERVELAB_RESULTS_ROOT=$PWD/results
rc=0
ansible-playbook bench.yml -i tests/gpu/bench/hosts.yml -e @/tmp/gpu-bench-vars.json \
  -e bench_run_id=h200-pynvml || rc=1
SERVELAB_GPU_TELEMETRY_NVML=ctypes ansible-playbook bench.yml -i tests/gpu/bench/hosts.yml \
  -e @/tmp/gpu-bench-vars.json -e bench_run_id=h200-ctypes -e '{"bench_concurrency": [8, 64]}' || rc=1
for run in h200-pynvml h200-ctypes; do
  echo "== $run: telemetry start line and levels.csv's GPU columns"
  head -c 600 results/$run/telemetry/*.jsonl | head -3
  python3 - "results/$run/levels.csv" <<'PY'
import csv, sys
cols = ["profile", "concurrency", "output_tok_s", "gpu_sm_util_mean", "gpu_mem_used_mib_max",
        "gpu_power_w_mean", "gpu_sm_clock_mhz_mean", "gpu_energy_j", "tokens_per_joule", "gpu_samples"]
rows = list(csv.DictReader(open(sys.argv[1])))
print(" | ".join(cols))
for r in rows:
    print(" | ".join(str(r.get(c, "")) for c in cols))
PY
done
nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
tar -czf "$OUT/gpu-bench.tar.gz" -C results h200-pynvml h200-ctypes
exit $rc
