#!/usr/bin/env bash
# The fast-backend check and the benchmark on the GPU machine, logs and results under $OUT.
# Prerequisite (device call): bash .gpu/install.sh && export PYTHONPATH=$HOME/site:$PWD/src
#   plus the MT-bench / HumanEval wheels (.gpu/data or .gpu/benchdata) installed into $HOME/site.
# Usage: EAGLESPEC_COMMIT=<hash> [FAST_CHECK=0] bash bench/gpu_run.sh [LIMIT] [extra bench flags...]
# (HF generate runs at ~30 tok/s, ~8 s per 256-token prompt: with many prompts pass --hf-limit 10;
#  the fast methods take ~1-2 s per prompt each; --compile adds ~30 s per new row bucket per process)
# e.g. all 80 MT-bench questions at T=0 in one 10-minute call:
#   FAST_CHECK=0 bash bench/gpu_run.sh 80 --hf-limit 10 --draft-graphs --check-fp32 3
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
LIMIT=${1:-10}; shift || true
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -c "from eaglespec.backends.loading import default_target_dir as d; print(d())" 2>&1 | tail -1
if [ "${FAST_CHECK:-1}" != 0 ]; then  # FAST_CHECK=0 skips the backend check (~2 min)
  timeout 150 python3 bench/fast_check.py --json "$OUT/fast_check.json" > "$OUT/fast_check.log" 2>&1
  echo "fast_check rc=$?"; tail -c 2500 "$OUT/fast_check.log"
fi
timeout 400 python3 -m eaglespec.cli.main bench --dataset mtbench --limit "$LIMIT" --max-new-tokens 256 \
  --json "$OUT/bench_mtbench.json" --plot "$OUT/bench_mtbench.png" --results "$OUT/RESULTS_part.md" "$@" \
  2>&1 | tee "$OUT/bench.log" | grep -v "Loading weights"
