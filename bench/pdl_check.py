"""Does programmatic dependent launch (PDL, Hopper's griddepcontrol) shorten a CUDA graph of small dependent Triton
kernels, as a decoding step is? Written in session 18, not run yet (its device time was spent).

Why: a step's kernels are latency-bound and each waits for the one before it. On the H200 a dynamic round replays
397 kernels in ~1.42 ms, ~3.6 us each, while the same GEMMs called 100 times independently take 2.3-3.5 us
(bench/head_check.py), and target/skinny.py's GEMM, 0.7-1 us faster than cuBLAS per call in isolation, gained nothing
in the steps (bench/RESULTS.md, session 18): what a kernel costs in a chain is mostly its wait for the one before
it, its launch and its first loads. With PDL a kernel launched with `launch_pdl=True` may start before its
predecessor ends once that one calls gdc_launch_dependents(); it runs what does not read the predecessor's output
(loading its weights) and then gdc_wait()s for the predecessor to finish and flush.

The check: a chain of --kernels RMSNorm-times-weight kernels (the shape of kernels.rms_norm_weight: one program per
row, [rows, 576]) ping-ponging between two buffers in ONE CUDA graph, timed without PDL, with PDL (launch_dependents
at the start, wait before reading x), and with PDL plus the weight loaded before the wait; then the same for a chain
of few-row GEMMs (x [rows, 576] @ W [576, 576].T, skinny's tiling) whose weight tile is loaded before the wait.
Outputs are compared bitwise to the chain without PDL (a misplaced wait would race). Reports us per kernel.

    PYTHONPATH=src python bench/pdl_check.py [--kernels 200] [--rows 1,10,60] [--json OUT]

If it pays, the next step is USE_GDC in the project's kernels (kernels.py, attn_kernels.py, tree_kernels.py, ...),
each with its wait before its first read of a predecessor's output, behind a switch timed with bench/ab.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gemm_check import graph_replay_ms  # bench/ is the script's own directory: on sys.path

from eaglespec.cli.bench import environment

H = 576


def _norm_kernel(x_ptr, w_ptr, y_ptr, eps, N: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr,
                 PREFETCH: tl.constexpr):
    """One program per row: y = round(x * rsqrt(mean(x^2) + eps)) * w; with USE_GDC the dependents may launch at
    once and x is read after gdc_wait (w before it with PREFETCH)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < N
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if PREFETCH:
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    if not PREFETCH:
        w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + row * N + cols, mask=inside, other=0.0).to(tl.float32)
    r = tl.math.rsqrt(tl.sum(x * x, 0) / N + eps)
    y = (x * r).to(y_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), mask=inside)


def _gemm_kernel(x_ptr, w_ptr, y_ptr, M, N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, USE_GDC: tl.constexpr, PREFETCH: tl.constexpr):
    """Program (n block): y[:, cols] = x @ w[cols].T over all of K at once (K = 576 padded to 1024); with PREFETCH
    the weight tile is loaded before gdc_wait, x after it."""
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, 1024)
    k_in = ks < K
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()
    if PREFETCH:
        wt = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=k_in[:, None], other=0.0)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()
    if not PREFETCH:
        wt = tl.load(w_ptr + cols[None, :] * K + ks[:, None], mask=k_in[:, None], other=0.0)
    a = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=(rows < M)[:, None] & k_in[None, :], other=0.0)
    acc = tl.dot(a, wt)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=(rows < M)[:, None])


def _jit():
    global triton, tl
    import triton
    import triton.language as tl

    g = globals()
    for name in ("_norm_kernel", "_gemm_kernel"):
        g[name] = triton.jit(g[name])
    return g["_norm_kernel"], g["_gemm_kernel"]


def chain_time(step, n: int, replays: int) -> float:
    """us per kernel: step(0), step(1), ... (a counter: the chain ping-pongs) `n` times in one CUDA graph, timed as
    gemm_check times (warm-up calls outside the capture, the median of `replays` replays)."""
    calls = itertools.count()
    return 1e3 * statistics.median(graph_replay_ms(lambda: step(next(calls)), n, replays))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=200)
    ap.add_argument("--rows", default="1,10,60")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        raise SystemExit("pdl_check: needs a Hopper (sm90+) GPU")
    norm, gemm = _jit()
    dev, dt = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    w_norm = (1 + 0.1 * torch.randn(H, generator=gen, device=dev)).to(dt)
    w_gemm = (torch.randn(H, H, generator=gen, device=dev) / H ** 0.5).to(dt)
    report = {"environment": environment(torch.device(dev)), "kernels": args.kernels, "rows": []}
    modes = {"plain": (False, False), "pdl": (True, False), "pdl+prefetch": (True, True)}
    for m in (int(r) for r in args.rows.split(",")):
        row = {"rows": m}
        for what in ("norm", "gemm"):
            outs = {}
            for mode, (gdc, pre) in modes.items():
                x0 = torch.randn(m, H, generator=torch.Generator(device=dev).manual_seed(1), device=dev).to(dt)
                bufs = [x0.clone(), torch.empty_like(x0)]

                def step(i, gdc=gdc, pre=pre, bufs=bufs, what=what, m=m):
                    src, dst = bufs[i % 2], bufs[(i + 1) % 2]
                    if what == "norm":
                        norm[(m,)](src, w_norm, dst, 1e-5, N=H, BLOCK=1024, USE_GDC=gdc, PREFETCH=pre,
                                   launch_pdl=gdc)
                    else:
                        gemm[(H // 16,)](src, w_gemm, dst, m, N=H, K=H, BLOCK_M=max(16, 1 << (m - 1).bit_length()),
                                         BLOCK_N=16, USE_GDC=gdc, PREFETCH=pre, launch_pdl=gdc)

                try:
                    row[f"{what}_{mode}_us"] = chain_time(step, args.kernels, args.replays)
                    bufs[0].copy_(x0)
                    for i in range(args.kernels):  # the chain once more, eagerly, for its output
                        step(i)
                    torch.cuda.synchronize()
                    outs[mode] = bufs[args.kernels % 2].clone()
                except Exception as exc:  # e.g. a capture that refuses PDL launches
                    row[f"{what}_{mode}_error"] = str(exc)[:200]
            if "plain" in outs:
                row[f"{what}_same"] = {mode: bool(torch.equal(o, outs["plain"])) for mode, o in outs.items()}
        print(json.dumps(row), flush=True)
        report["rows"].append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
