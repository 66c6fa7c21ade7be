#!/usr/bin/env bash
# The fast-backend check and the benchmark on the GPU machine, logs and results under $OUT.
# Prerequisite (device call): bash .gpu/install.sh && export PYTHONPATH=$HOME/site:$PWD/src
#   plus the MT-bench / HumanEval wheels (.gpu/data or .gpu/benchdata) installed into $HOME/site.
# Usage: EAGLESPEC_COMMIT=<hash> bash bench/gpu_run.sh [LIMIT] [extra bench flags...]
# (HF generate runs at ~27-37 tok/s: LIMIT 20 x 256 tokens keeps the whole call near 5 minutes)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
LIMIT=${1:-10}; shift || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -c "from eaglespec.target.loading import default_target_dir as d; print(d())" 2>&1 | tail -1
timeout 150 python3 bench/fast_check.py --json "$OUT/fast_check.json" > "$OUT/fast_check.log" 2>&1
echo "fast_check rc=$?"; tail -c 2500 "$OUT/fast_check.log"
timeout 400 python3 -m eaglespec.cli bench --dataset mtbench --limit "$LIMIT" --max-new-tokens 256 \
  --json "$OUT/bench_mtbench.json" --plot "$OUT/bench_mtbench.png" --results "$OUT/RESULTS_part.md" "$@" \
  2>&1 | tee "$OUT/bench.log" | grep -v "Loading weights"
