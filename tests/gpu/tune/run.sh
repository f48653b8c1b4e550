#!/usr/bin/env bash
# tune.yml itself on a GPU machine: a real engine (`transformers serve --continuous-batching`, a
# random-weight Llama built here) tuned over a real server knob (--cb-max-batch-tokens) with the
# reaper and readiness in the loop: each trial reaped, launched by llm_server, readied by a real
# generation, its capacity found by bisection over the request rate, stopped and reaped. Then the
# tuned profile (tune/best.yml) runs unchanged in bench.yml. Modelled on tests/gpu/bench/run.sh.
#
# Run from the repository root on the GPU machine, with the wheels it lacks in .whl (ansible-core
# and its needs, jsonschema's, and transformers serve's: tests/gpu/engine/fetch-wheels.sh
# ansible-core==2.19.14 resolvelib cryptography cffi pycparser jsonschema
# jsonschema-specifications referencing rpds-py pyyaml). Writes $OUT/gpu-tune.tar.gz (both runs'
# results directories), $OUT/gpu-tune.log and $OUT/gpu-tune.md (the trials, their levels,
# best.yml, the tune section, bench.yml's levels, what was left running, each step's seconds).
#
# The whole script ends within DEADLINE (295 s): ~40 s to install the wheels and build the model
# (20 s on the H100), the tune ~190 s (the arithmetic in hosts.yml), bench.yml with best.yml
# ~55 s (start, a ready generation, one 5 s level, stop, reap, report). The tune gets what is left
# less BENCH_RESERVE (70 s) and the tail (10 s); bench.yml what is left less the tail, at most
# 90 s. A step cut off by its timeout fails the script and the md says which.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-tune-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-tune.log") 2>&1
started=$(date +%s)
DEADLINE=${DEADLINE:-295} BENCH_RESERVE=70 TAIL=10
left() { echo $(( DEADLINE - ( $(date +%s) - started ) - $1 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 ANSIBLE_FORCE_COLOR=0
python3 tools/collection_link.py collections || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
[ -f "${GPU_TUNE_MODEL:-/tmp/model}/config.json" ] ||
  python3 tests/gpu/engine/build_random_llm.py "${GPU_TUNE_MODEL:-/tmp/model}" 2048 16 || exit 1
mkdir -p ~/.cache/huggingface/hub   # else transformers serve's /v1/models answers 500
if command -v transformers >/dev/null; then
  serve='["'"$(command -v transformers)"'", "serve"]'
else   # the console script may be missing where transformers was installed with --target
  serve='["python3", "-c", "import sys; from transformers.cli.transformers import main; sys.argv[0] = \"transformers\"; main()", "serve"]'
fi
serve=${GPU_TUNE_SERVE_COMMAND:-$serve}   # the CPU rehearsal passes its own venv's
echo "{\"gpu_tune_serve_command\": $serve}" > /tmp/gpu-tune-vars.json
export SERVELAB_RESULTS_ROOT=$PWD/results
rc=0
tune_limit=$(left $(( BENCH_RESERVE + TAIL )))
echo "run.sh: $(( $(date +%s) - started )) s before the tune; the tune gets ${tune_limit} s"
t0=$(date +%s)
timeout "$tune_limit" ansible-playbook tune.yml -i tests/gpu/tune/hosts.yml \
  -e @/tmp/gpu-tune-vars.json -e bench_run_id=gpu-tune "$@"
tune_rc=$?; tune_s=$(( $(date +%s) - t0 )); [ $tune_rc -eq 0 ] || rc=1
best=results/gpu-tune/tune/best.yml
bench_rc=-; bench_s=0
if [ -f "$best" ]; then
  bench_limit=$(left $TAIL); [ "$bench_limit" -gt 90 ] && bench_limit=90
  echo "run.sh: bench.yml with best.yml gets ${bench_limit} s"
  t0=$(date +%s)
  timeout "$bench_limit" ansible-playbook bench.yml -i tests/gpu/tune/hosts.yml \
    -e @/tmp/gpu-tune-vars.json -e @"$best" -e bench_run_id=gpu-best -e bench_level_seconds=5 "$@"
  bench_rc=$?; bench_s=$(( $(date +%s) - t0 )); [ $bench_rc -eq 0 ] || rc=1
else
  echo "no best.yml: no trial has a score (tune.yml's last lines say what the levels showed)"
  rc=1
fi
{
  echo "# tune.yml on the device ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  echo
  echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(( $(date +%s) - started )) s in all; rc $rc"
  echo
  echo "tune.yml: rc $tune_rc in ${tune_s} s (limit ${tune_limit} s; 124: cut off); bench.yml with best.yml: rc $bench_rc in ${bench_s} s"
  echo
  echo '## trials.csv'
  echo
  echo '```'
  cat results/gpu-tune/tune/trials.csv 2>/dev/null
  echo '```'
  echo
  echo "## the trials' levels (tune levels.csv)"
  echo
  echo '```'
  cut -d, -f1-12 results/gpu-tune/levels.csv 2>/dev/null
  echo '```'
  echo
  echo "## tune.yml's last words"
  echo
  echo '```'
  grep -E "servelab tune: best|No trial of the tune|tune: trial t0|capacity search" "$OUT/gpu-tune.log" | cut -c1-400 | tail -12
  echo '```'
  echo
  echo '## best.yml'
  echo
  echo '```yaml'
  cat "$best" 2>/dev/null
  echo '```'
  echo
  echo '## the tune section of summary.md'
  echo
  sed -n '/^## Tune$/,/^## Time scale/p' results/gpu-tune/summary.md 2>/dev/null
  echo
  echo '## bench.yml with best.yml: levels.csv'
  echo
  echo '```'
  cut -d, -f1-12 results/gpu-best/levels.csv 2>/dev/null
  echo '```'
  echo
  echo '## left running after both plays (nvidia-smi --query-compute-apps)'
  echo
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
  echo
  echo '## processes matching transformers serve'
  pgrep -af "transformers.*serve" || echo none
} > "$OUT/gpu-tune.md"
tar -czf "$OUT/gpu-tune.tar.gz" -C results gpu-tune gpu-best 2>/dev/null
exit $rc
