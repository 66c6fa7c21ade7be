"""Can one Triton kernel do a drafter step's final norm + lm_head + the children's first top-k stage faster than
the three kernels it would replace? And how fast is a skinny Triton GEMM against cuBLAS on SmolLM2's shapes?

Why: in a dynamic 7/10/60 round (bench/RESULTS.md, session 17) every drafter step ends with kernels.rms_norm_weight
(~1.4 us), cuBLAS's lm_head GEMM (576 -> 12,000, ~4.9 us) and tree_kernels.children's two kernels (chunk top-k
~4 us, merge ~3.2 us): ~15 us with the gaps, 7 times a round. Session 8's fused Triton GEMMs lost to cuBLAS (64-wide
tiles, few programs, no split over K). Here the candidate is a GEMM tiled narrow over N (many programs, the whole K
per program, pipelined), with the RMSNorm in its prologue and, in its epilogue, the softmax statistics and the top-k
keys of its BLOCK_N columns in tree_kernels' chunk format, so that tree_kernels' merge kernel finishes the children.

GPU only (CUDA graphs of --reps calls, the median over --replays replays):
1. the projections of SmolLM2's steps (the target's qkv, o, gate_up, down and lm_head at 1 and 60 rows, the shipped
   drafter's qkv, o, gate_up, down, fc and lm_head at 1 and 10 rows): cuBLAS's F.linear and addmm_ (the residual in
   its epilogue) against target/skinny.py's linear with its shipped block sizes (and the residual), whether
   skinny.applies takes the shape, and with --sweep skinny.linear over 27 block sizes (its `tiles`);
2. with --head, the drafter head at M = 1 and 10 rows (K = 576, Vd = 12,000, top-10): today's norm + lm_head +
   tree_kernels.children against a fused norm + lm_head + chunk top-k kernel + the merge, over block sizes; parity:
   share of rows whose 10 children (ids, in order) equal today's. (Session 18: it lost, 14.7 vs 12.9 us.)
Session 18 also timed skinny with the RMSNorm / silu * up in its prologue (50e99b9's version of this script,
bench/results/h200_head_check_50e99b9.json): far slower than the pair of kernels, so that variant is gone.

    PYTHONPATH=src python bench/head_check.py [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gemm_check import graph_replay_ms  # bench/ is the script's own directory: on sys.path

from eaglespec.kernels import tree as T
from eaglespec.cli.bench import environment
from eaglespec.kernels import step as K

H, VD, TOPK, EPS = 576, 12000, 10, 1e-5


# -- the candidate kernels (plain functions; _kernels() jits them with triton's and the project's helpers) --
def _head_top_kernel(x_ptr, nw_ptr, w_ptr, key_ptr, stat_ptr, M, V, S, eps, sxm, swn, HID: tl.constexpr,
                     TOP: tl.constexpr, DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr):
    """Program (chunk s of BLOCK_N vocab columns, row block): logits = round(norm(x) @ w.T) of its columns, then
    tree_kernels._chunk_top_kernel's outputs for them: stat[row, s] = (max, sum exp(x - max)), key[row, s, :TOP]."""
    dtype = w_ptr.dtype.element_ty
    s = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = s * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < M
    col_in = cols < V
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * sxm
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * swn
    sum_sq = tl.full((BLOCK_M,), 0.0, tl.float32)
    for k0 in range(0, HID, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + ks[None, :], mask=row_in[:, None] & (ks < HID)[None, :], other=0.0).to(tl.float32)
        sum_sq += tl.reduce(x * x, 1, _add)
    r = tl.math.rsqrt(sum_sq / HID + eps)
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k0 in range(0, HID, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_in = ks < HID
        x = tl.load(x_rows + ks[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + ks, mask=k_in, other=0.0).to(tl.float32)
        a = _round(_round(x * r[:, None], dtype) * nw[None, :], dtype)
        wt = tl.load(w_cols + ks[:, None], mask=k_in[:, None] & col_in[None, :], other=0.0)  # [BK, BN]
        if DOT_FP32:  # the interpreter (its bf16 dot is wrong) and fp32 weights
            acc = tl.dot(a, wt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.to(dtype), wt, acc)
    logit = tl.where(col_in[None, :], _round(acc, dtype), float("-inf"))  # the bf16 logits' values
    m = tl.reduce(logit, 1, _max)  # [BM]
    total = tl.reduce(tl.where(col_in[None, :], tl.exp(logit - m[:, None]), 0.0), 1, _add)
    at = (rows.to(tl.int64) * S + s)
    tl.store(stat_ptr + at * 2, m, mask=row_in)
    tl.store(stat_ptr + at * 2 + 1, total, mask=row_in)
    empty = -9223372036854775807 - 1
    key = tl.where(col_in[None, :], _key(logit, cols[None, :]), empty)
    for j in tl.static_range(TOP):
        best = tl.reduce(key, 1, _max)
        tl.store(key_ptr + at * TOP + j, best, mask=row_in)
        key = tl.where(key == best[:, None], empty, key)


def _kernels():
    """Import triton, load the project's jitted helpers (kernels._round, tree_kernels' keys) into this module's
    namespace and jit the kernel above: (triton, head_top)."""
    global triton, tl, _round, _add, _max, _key
    import triton
    import triton.language as tl

    T._load()
    K._load()
    _round, _add, _max, _key = K._round, K._add, T._max, T._key
    g = globals()
    g["_head_top_kernel"] = triton.jit(g["_head_top_kernel"])
    return triton, g["_head_top_kernel"]


def timed(fn, reps: int, replays: int) -> float:
    """us per call: gemm_check's CUDA-graph timing (reps calls in one graph, the median replay)."""
    return 1e3 * statistics.median(graph_replay_ms(fn, reps, replays))


def head_row(triton, head_top, m: int, lm_w: torch.Tensor, nw: torch.Tensor, gen: torch.Generator, args) -> dict:
    """Today's norm + lm_head + children against the fused kernel + merge, at m rows, over the block sizes."""
    dev, reps, replays = lm_w.device, args.reps, args.replays
    x = torch.randn(m, H, generator=gen, device=dev).to(lm_w.dtype)

    def today():
        return T.children(F.linear(K.rms_norm_weight(x, nw, EPS), lm_w), TOPK, 1e-12)

    ref = today()[1]
    gemm = timed(lambda: F.linear(x, lm_w), reps, replays)
    row = {"rows": m, "today_us": timed(today, reps, replays),
           "norm_us": timed(lambda: K.rms_norm_weight(x, nw, EPS), reps, replays), "gemm_us": gemm,
           "children_us": timed(lambda: T.children(F.linear(x, lm_w), TOPK, 1e-12), reps, replays) - gemm,
           "fused": []}
    for bn, bk, warps, stages in itertools.product((32, 64, 128), (64, 128), (4, 8), (2, 3, 4)):
        cfg = {"bn": bn, "bk": bk, "warps": warps, "stages": stages}
        s = triton.cdiv(VD, bn)
        keys = torch.empty(m, s, TOPK, dtype=torch.long, device=dev)
        stats = torch.empty(m, s, 2, dtype=torch.float32, device=dev)
        conf = torch.empty(m, TOPK, dtype=torch.float32, device=dev)
        tok = torch.empty(m, TOPK, dtype=torch.long, device=dev)

        def fused(bn=bn, bk=bk, warps=warps, stages=stages, s=s, keys=keys, stats=stats, conf=conf, tok=tok):
            head_top[(s, 1)](x, nw, lm_w, keys, stats, m, VD, s, EPS, x.stride(0), lm_w.stride(0), HID=H, TOP=TOPK,
                             DOT_FP32=False, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                             num_stages=stages)
            T._merge_top_kernel[(m,)](keys, stats, conf, tok, conf, conf, s, 1e-12, K=TOPK, SP=K._pow2(s),
                                      BLOCK=K._pow2(s * TOPK), BASE=False, num_warps=4)
            return tok

        try:
            same = float((fused() == ref).all(dim=1).float().mean())
            cfg.update(us=timed(fused, reps, replays), same_rows=same)
        except Exception as exc:  # a block size the GPU cannot take (shared memory): skip it
            cfg["error"] = str(exc)[:120]
        row["fused"].append(cfg)
    row["best"] = min((f for f in row["fused"] if "us" in f), key=lambda f: f["us"])
    print(f"head M={m}: today {row['today_us']:.2f} us (norm {row['norm_us']:.2f}, gemm {row['gemm_us']:.2f}, "
          f"children {row['children_us']:.2f}); fused + merge best {row['best']}", flush=True)
    return row


def skinny_row(name: str, k: int, n: int, m: int, gen: torch.Generator, args) -> dict:
    """[m, k] @ [n, k].T: cuBLAS's F.linear and addmm (a residual in the epilogue) against target/skinny.py's linear
    (its shipped block sizes, with and without the residual) and, with --sweep, over other block sizes (tiles=)."""
    from eaglespec.kernels import skinny as S

    dev, dt, reps, replays = "cuda", torch.bfloat16, args.reps, args.replays
    w = (torch.randn(n, k, generator=gen, device=dev) * 0.05).to(dt)
    x = torch.randn(m, k, generator=gen, device=dev).to(dt)
    h = torch.randn(m, n, generator=gen, device=dev).to(dt)
    ref = F.linear(x, w).float()
    row = {"what": name, "k": k, "n": n, "rows": m, "cublas_us": timed(lambda: F.linear(x, w), reps, replays),
           "cublas_res_us": timed(lambda: h.addmm_(x, w.t()), reps, replays),
           "module_us": timed(lambda: S.linear(x, w), reps, replays),
           "module_res_us": timed(lambda: S.linear(x, w, residual=h, inplace=True), reps, replays),
           "module_blocks": S.blocks(n, k), "applies": S.applies(x, w), "triton": []}
    for bn, bk, stages in itertools.product((16, 32, 64), (64, 128, 256), (2, 3, 4)) if args.sweep else ():
        cfg = {"bn": bn, "bk": bk, "stages": stages}

        def run(tiles=(bn, bk, stages)):
            return S.linear(x, w, tiles=tiles)

        try:
            cfg.update(max_diff=float((run().float() - ref).abs().max()), us=timed(run, reps, replays))
        except Exception as exc:
            cfg["error"] = str(exc)[:120]
        row["triton"].append(cfg)
    if row["triton"]:
        row["best"] = min((f for f in row["triton"] if "us" in f), key=lambda f: f["us"])
    print(f"skinny {name} {k}->{n} M={m}: cuBLAS {row['cublas_us']:.2f} / addmm {row['cublas_res_us']:.2f} us, "
          f"skinny {row['module_us']:.2f} / +res {row['module_res_us']:.2f} us (applies {row['applies']})"
          + (f", sweep best {row['best']}" if "best" in row else ""), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--head", action="store_true", help="also the fused head kernel's sweep (slower: it lost)")
    ap.add_argument("--sweep", action="store_true", help="also sweep skinny.linear's block sizes per shape")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("head_check: needs CUDA")
    dev, dt = "cuda", torch.bfloat16
    triton, head_top = _kernels()
    gen = torch.Generator(device=dev).manual_seed(0)
    lm_w = (torch.randn(VD, H, generator=gen, device=dev) * 0.05).to(dt)
    nw = (1 + 0.1 * torch.randn(H, generator=gen, device=dev)).to(dt)
    report = {"environment": environment(torch.device(dev)), "head": [], "skinny": []}
    for m in (1, 10) if args.head else ():
        report["head"].append(head_row(triton, head_top, m, lm_w, nw, gen, args))
    target = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576),
              "lm_head": (576, 49152)}
    drafter = {"d_qkv": (1152, 960), "d_o": (576, 576), "d_gate_up": (576, 9216), "d_down": (4608, 576),
               "d_fc": (1728, 576), "d_head": (576, VD)}
    for (name, (k, n)), m in [*itertools.product(target.items(), (1, 60)), *itertools.product(drafter.items(), (1, 10))]:
        report["skinny"].append(skinny_row(name, k, n, m, gen, args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
