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
# results directories), $OUT/gpu-tune.log and $OUT/gpu-tune.md (the trials, best.yml, the checks).
# Bounded to stay under the device's 10 minutes a command: the tune's own budget is 4 minutes of
# trials (a trial started in time runs to its end), the play 420 s, bench.yml with best.yml 100 s.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-tune-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-tune.log") 2>&1
started=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 ANSIBLE_FORCE_COLOR=0
python3 tools/collection_link.py collections || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
[ -f /tmp/model/config.json ] || python3 tests/gpu/engine/build_random_llm.py /tmp/model 2048 16 || exit 1
mkdir -p ~/.cache/huggingface/hub   # else transformers serve's /v1/models answers 500
if command -v transformers >/dev/null; then
  serve='["'"$(command -v transformers)"'", "serve"]'
else   # the console script may be missing where transformers was installed with --target
  serve='["python3", "-c", "import sys; from transformers.cli.transformers import main; sys.argv[0] = \"transformers\"; main()", "serve"]'
fi
echo "{\"gpu_tune_serve_command\": $serve}" > /tmp/gpu-tune-vars.json
export SERVELAB_RESULTS_ROOT=$PWD/results
rc=0
timeout 420 ansible-playbook tune.yml -i tests/gpu/tune/hosts.yml -e @/tmp/gpu-tune-vars.json \
  -e bench_run_id=h200-tune || rc=1
best=results/h200-tune/tune/best.yml
if [ -f "$best" ]; then
  timeout 100 ansible-playbook bench.yml -i tests/gpu/tune/hosts.yml -e @/tmp/gpu-tune-vars.json \
    -e @"$best" -e bench_run_id=h200-best -e bench_level_seconds=8 || rc=1
else
  echo "no best.yml: no trial met the SLO"; rc=1
fi
{
  echo "# tune.yml on the device ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  echo
  echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); $(( $(date +%s) - started )) s in all; rc $rc"
  echo
  echo '## trials.csv'
  echo
  echo '```'
  cat results/h200-tune/tune/trials.csv 2>/dev/null
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
  sed -n '/^## Tune$/,/^## Time scale/p' results/h200-tune/summary.md 2>/dev/null
  echo
  echo '## bench.yml with best.yml: levels.csv'
  echo
  echo '```'
  cut -d, -f1-12 results/h200-best/levels.csv 2>/dev/null
  echo '```'
  echo
  echo '## left running after both plays (nvidia-smi --query-compute-apps)'
  echo
  nvidia-smi --query-compute-apps=pid,name,used_memory --format=csv
  echo
  echo '## processes matching transformers serve'
  pgrep -af "transformers.*serve" || echo none
} > "$OUT/gpu-tune.md"
tar -czf "$OUT/gpu-tune.tar.gz" -C results h200-tune h200-best 2>/dev/null
exit $rc
