#!/usr/bin/env bash
# Two-GPU work on an nvidia-h200-x2 machine (issue 8 and the next shipped drafter), in stages that each fit one
# 10-minute device call. Run from the repository root there, after the wheel install (bench/gpu_ship.sh's header):
#   bash bench/gpu_x2.sh regen   # two regenerations at once, one per GPU: sampled answers (T=1) on GPU 1, two-turn
#                                # answers on GPU 0, each cut at REGEN_S seconds (resumable), joined into $W/all.jsonl
#   bash bench/gpu_x2.sh ddp     # A: 1 GPU, grad-accum 2, the first NA steps; B: 2 GPUs (torchrun, NCCL),
#                                # grad-accum 1, the same run paused at NB; C: B's checkpoint resumed on 1 GPU for
#                                # NC steps; then B resumed on 2 GPUs until DEADLINE seconds into the call
#   bash bench/gpu_x2.sh finish  # B resumed to its end on 2 GPUs, the comparison, the bf16 drafter packed into $OUT
#   bash bench/gpu_x2.sh bench   # with DRAFT (default $W/b-bf16): MT-bench 80 at T=0 on GPU 0 while HumanEval
#                                # (HE_LIMIT prompts) runs on GPU 1, then MT-bench 20 at T=1 on GPU 0 while
#                                # bench/prefill_shapes.py runs on GPU 1 (two processes at once: said in the results)
# (TWO_S: a time limit for a 2-GPU run, 0 = none.) All runs: the same data, seed and flags, --init from the shipped drafter, global batch 64 (32 x 2), STEPS steps.
# NVLink multicast stays off (the machine's docs require it): NCCL_NVLS_ENABLE=0 and friends are exported here too.
# Local dry run on CPU (gloo): DEVICE=cpu TARGET=<tiny model dir> DATA=<jsonl> STEPS=6 NA=3 NB=2 NC=2 BS=2 ...
set -uo pipefail
stage=${1:?stage}
W=${W:-$HOME/ship}; mkdir -p "$W"; OUT=${OUT:-$W/out}; mkdir -p "$OUT"
export PYTHONPATH=$HOME/site:$PWD/src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEVICE=${DEVICE:-cuda}
DATA=${DATA:-$W/all.jsonl}
STEPS=${STEPS:-1800}; NA=${NA:-100}; NB=${NB:-600}; NC=${NC:-40}; BS=${BS:-32}
common=(--data "$DATA" --method eagle3 --batch-size "$BS" --max-length "${MAXLEN:-2048}" --lr "${LR:-3e-4}"
        --steps "$STEPS" --save-every 100 --log-every 1 --device "$DEVICE" ${TARGET:+--target "$TARGET"})
INIT=${INIT-models/smollm2-135m-instruct-eagle3}  # INIT= (empty): a new drafter
init=(); [ -n "$INIT" ] && init=(--init "$INIT")
one() { python3 -m eaglespec.cli train "${common[@]}" --grad-accum 2 "$@" 2>&1 | tr '\r' '\n' | grep -v '^train eagle3:' \
          | grep -v '^\s*$' | tail -6; }
two() { timeout "${TWO_S:-0}" python3 -m torch.distributed.run --standalone --nproc_per_node 2 -m eaglespec.train "${common[@]}" \
          --grad-accum 1 "$@" 2>&1 | tr '\r' '\n' | grep -v '^train eagle3:' | grep -v '^\s*$' | tail -8; }
compare() {  # the three runs' logs into $OUT, and their comparison
  for r in a b c; do cp "$W/$r/train_log.jsonl" "$OUT/train_log_$r.jsonl"; done
  python3 bench/ddp_compare.py --one "$W/a/train_log.jsonl" --two "$W/b/train_log.jsonl" \
    --resumed "$W/c/train_log.jsonl" --paused-at "$NB" --json "$OUT/ddp_compare.json"
}
gpu0() { if [ "$DEVICE" = cuda ]; then CUDA_VISIBLE_DEVICES=0 "$@"; else "$@"; fi; }

case "$stage" in
  regen)
    s1=$W/regen_s1.jsonl; t2=$W/regen_t2.jsonl
    CUDA_VISIBLE_DEVICES=1 timeout "${REGEN_S:-300}" python3 -m eaglespec.cli regenerate \
      --data .gpu/train/prompts_s1.jsonl --out "$s1" --batch-size 512 --max-new-tokens 384 --temperature 1 \
      --max-turns 1 --device cuda --dtype bfloat16 > "$W/regen_s1.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=0 timeout "${REGEN_S:-300}" python3 -m eaglespec.cli regenerate \
      --data .gpu/train/prompts_t2.jsonl --out "$t2" --batch-size 512 --max-new-tokens 384 \
      --max-turns 2 --device cuda --dtype bfloat16 > "$W/regen_t2.log" 2>&1 &
    wait
    tail -n 2 "$W/regen_s1.log" "$W/regen_t2.log"
    wc -l "$W/regen.jsonl" "$W/regen_more.jsonl" "$s1" "$t2"
    cat "$W/regen.jsonl" "$W/regen_more.jsonl" "$s1" "$t2" > "$W/all.jsonl"
    wc -l "$W/all.jsonl"
    gzip -c "$s1" > "$OUT/regen_s1.jsonl.gz"; gzip -c "$t2" > "$OUT/regen_t2.jsonl.gz"
    ;;
  ddp)
    rm -rf "$W/a" "$W/b" "$W/c" "$W/.a".* "$W/.b".* "$W/.c".*
    echo "== A: 1 GPU, grad-accum 2, steps 1-$NA of $STEPS"; gpu0 one "${init[@]}" --out "$W/a" --stop-after "$NA"
    echo "== B: 2 GPUs, grad-accum 1, steps 1-$NB"; two "${init[@]}" --out "$W/b" --stop-after "$NB"
    cp -r "$W/b" "$W/c"
    echo "== C: B's checkpoint resumed on 1 GPU, steps $((NB + 1))-$((NB + NC))"
    gpu0 one --resume --out "$W/c" --stop-after "$NC"
    left=$(( ${DEADLINE:-540} - SECONDS ))
    if [ "$left" -gt 90 ]; then
      echo "== B resumed on 2 GPUs for up to $left s (checkpoints every 100 steps)"
      TWO_S=$left two --resume --out "$W/b"
    fi
    compare
    ;;
  finish)
    two --resume --out "$W/b"
    compare
    rm -rf "$W/b-bf16"
    python3 -m eaglespec.cli convert "$W/b" "$W/b-bf16" --to native --dtype bfloat16
    OUT=$OUT bash bench/gpu_ship.sh pack "$W/b-bf16"
    ;;
  bench)
    draft=${DRAFT:-$W/b-bf16}; c=${EAGLESPEC_COMMIT:-unknown}
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    b() { python3 -m eaglespec.cli bench --draft "$draft" --max-new-tokens 256 --results "$OUT/RESULTS_$1.md" \
            --json "$OUT/h200_$1_$c.json" --plot "$OUT/h200_$1_$c.png" "${@:2}" > "$OUT/$1.log" 2>&1; }
    CUDA_VISIBLE_DEVICES=0 timeout 330 bash -c "$(declare -f b); $(declare -p draft c OUT); \
      b mtbench80_t0 --dataset mtbench --limit 80 --hf-limit 5 --check-fp32 2" &
    CUDA_VISIBLE_DEVICES=1 timeout 330 bash -c "$(declare -f b); $(declare -p draft c OUT); \
      b humaneval${HE_LIMIT:-100}_t0 --dataset humaneval --limit ${HE_LIMIT:-100} --hf-limit 3" &
    wait
    CUDA_VISIBLE_DEVICES=0 timeout 150 bash -c "$(declare -f b); $(declare -p draft c OUT); \
      b mtbench20_t1 --dataset mtbench --limit 20 --hf-limit 2 --temperature 1" &
    CUDA_VISIBLE_DEVICES=1 timeout 150 python3 bench/prefill_shapes.py --device cuda > "$OUT/prefill_shapes.log" 2>&1 &
    wait
    for f in "$OUT"/*.log; do echo "== $f"; grep -v "Loading weights" "$f" | tail -25; done
    ;;
esac
