"""A Triton GEMM for the few-row projections of decoding (x [M <= 64, K] @ weight [N, K].T), faster than cuBLAS there.

Why: at batch 1 a decoding step's projections have 1 row (plain decoding), ~10 (a drafter step) or ~60 (a tree
verification), and cuBLAS's kernels for them are latency-bound. On the H200 (bench/head_check.py, session 18, bf16,
CUDA graphs of 100 calls, this module's block sizes) against cuBLAS's F.linear / addmm_:

    target, 1 row      qkv 576 -> 960 2.59 vs 3.51 us, o 576 -> 576 + residual 2.73 vs 3.14, gate_up 576 -> 3072
                       2.77 vs 3.19, down 1536 -> 576 + residual 3.98 vs 4.72, lm_head 576 -> 49,152 15.7 vs 15.9
    target, 60 rows    qkv 2.68 vs 3.22, o + residual 2.91 vs 3.08, gate_up 2.94 vs 3.36
    drafter, 10 rows   qkv 1152 -> 960 3.58 vs 3.81, o + residual 2.79 vs 3.12, gate_up 576 -> 9216 4.27 vs 4.45,
                       lm_head 576 -> 12,000 4.26 vs 4.45

It tiles N narrow (16 to 64 columns a program: tens to hundreds of programs at these widths, where cuBLAS's tiles
leave most of the GPU idle) and walks all of K in one program, BLOCK_K at a time with the loads pipelined
(num_stages): the weight is read once, by many programs at once. Without a split over K it loses where K is long
(the drafter's down 4608 -> 576: 9.9 vs 6.4 us; its fc 1728 -> 576: 5.1 vs 4.8) and where cuBLAS tiles many rows
better (1536 -> 576 and the 49,152-wide head at 60 rows): `applies` leaves K > 1536, and K >= 1536 or N > 4096 with
more than 16 rows, to cuBLAS.

    linear(x, weight, bias=None, residual=None, inplace=False)
        x [M, K] -> [M, N]: round(x @ weight.T + bias) in x's dtype, or with `residual` h [M, N] (no bias):
        round(h + x @ weight.T), h's add in the epilogue as torch.addmm (one rounding of the sum); `inplace`
        writes it into h (addmm_).

Rounding: products accumulated in fp32 by tl.dot (fp32 operands: input_precision="ieee", no TF32), the output
rounded once. What differs from cuBLAS is the accumulation order only: fp32 results agree to ~1e-7 relative, and a
bf16 result can differ by one last bit where the fp32 sums straddle a rounding boundary. Contract 1 allows that
(bf16 near-ties); `applies` keeps fp32 (the identity checks' dtype) on cuBLAS anyway. Under Triton's interpreter bf16
operands go through the dot as fp32 (the interpreter's bf16 dot is wrong; bf16 products are exact in fp32).

Used by target/fast.py's step and draft/fused.py's (through eaglespec.kernels.onednn.linear and fast._add_linear) where
`applies`: CUDA, bf16/fp16, no autograd, at most MAX_ROWS rows, and wanted() (with PDL unless
$EAGLESPEC_SKINNY_GEMM=0; =1 without PDL too). With PDL (kernels.pdl) a program loads its whole weight tile before it
waits for the kernel before it (prefetch_tiles): what made it pay (session 19). That takes at most 16 rows by
default (prefetch_rows(): x's rows 16 at a time beyond, which lost at a tree's ~60).
Tried on the H200 and not kept (bench/RESULTS.md):
- the RMSNorm or silu * up in the K-walking kernel's prologue (as target/gemm_kernels.py's; session 18,
  bench/head_check.py: norm + qkv at 60 rows 11.7 us against 4.2 for the norm kernel + this GEMM; silu * up + down
  151 us against 6.2);
- session 20 (bench/ab.py, MT-bench 20, one process): a split-K variant (each K slice's weight loaded before the
  wait, the partials summed by the last program of each column block; static 5/10/25 0.92x, dynamic 7/10/60
  0.84x); the RMSNorm in the prefetch kernel's prologue (0.71 and 0.24 us faster per call for qkv and gate_up at 1
  row when timed alone, yet plain decoding 0.97x; silu * up there was ~250x slower); one load per cache line of
  the weight tile before the wait in the K-walking kernel, with the verification's down projection taken from
  cuBLAS (down alone 5.30 -> 4.29 us, cuBLAS 4.44; dynamic 0.94x); and the verification's gate_up left to cuBLAS
  (3.34 us against this kernel's 5.33 alone; dynamic 0.90x). Kernels timed one at a time mislead here.
The launch allocates only the output, does not sync and branches on shapes only: fit for CUDA-graph capture once
compiled (the warm-up call before a capture compiles it).
"""

from __future__ import annotations

import functools
import os

import torch

from eaglespec.errors import EagleSpecError, env_switch
from eaglespec.kernels import step as kernels

SKINNY_ENV = "EAGLESPEC_SKINNY_GEMM"  # "1": this kernel where it applies; "0": cuBLAS; unset: with PDL (wanted())
MAX_ROWS = 64  # rows of x: one BLOCK_M tile (tl.dot's least is 16)


def wanted(pdl: bool) -> bool:
    """$EAGLESPEC_SKINNY_GEMM: "1" on (where `applies`), "0" off; unset: on where the kernels launch with PDL
    (`pdl`: kernels.pdl of the input). Its gain comes with PDL, which loads a program's weight tile before waiting for the kernel
    before it (prefetch_tiles). Without PDL it did not make the steps faster (session 18, H200, bench/ab.py,
    MT-bench 20: plain decoding 1057.7 tok/s with cuBLAS, 1047.4 with it); with PDL (session 19, MT-bench 80, one
    process): plain decoding 1032.3 -> 1240.8 tok/s (0.949 -> 0.783 ms a step), a dynamic 7/10/60 round's replay
    1.246 -> 1.180 ms, 2804.6 -> 2840.8 tok/s (other bf16 roundings, other texts: tau 4.39 -> 4.33)."""
    env = env_switch(SKINNY_ENV, "on with PDL")
    return pdl if env is None else env


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Would `linear` take this kernel for x [..., K] @ weight [N, K].T? CUDA tensors of one 16-bit dtype, a weight
    with unit column stride, no autograd, rows within MAX_ROWS and a shape it wins on (module docstring), switched
    on."""
    if not (x.is_cuda and weight.is_cuda and x.dtype == weight.dtype and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    if weight.dim() != 2 or weight.stride(1) != 1 or x.shape[-1] != weight.shape[1] or x.dim() < 1:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return False
    rows = x.numel() // max(1, x.shape[-1])
    n, k = weight.shape
    if not 1 <= rows <= MAX_ROWS or k > 1536 or (rows > 16 and (k >= 1536 or n > 4096)):
        return False
    return wanted(kernels.pdl(x)) and kernels.available(x.device)


def linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               residual: torch.Tensor | None = None, inplace: bool = False) -> torch.Tensor:
    """What `linear` computes, in torch: F.linear, or addmm / addmm_ with a residual."""
    if residual is None:
        return torch.nn.functional.linear(x, weight, bias)
    if bias is not None:
        raise ValueError("skinny.linear: a residual and a bias together are not one addmm")
    return residual.addmm_(x, weight.t()) if inplace else torch.addmm(residual, x, weight.t())


# -- the Triton kernel (a plain function here; _load() jits it on first use) -------------------------------
def _skinny_kernel(x_ptr, w_ptr, b_ptr, h_ptr, out_ptr, M, N, sxm, swn, shm, som, K: tl.constexpr,
                   HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_GDC: tl.constexpr = False,
                   PREFETCH: tl.constexpr = False):
    """Program (n block): out[:, cols] = round(x @ w[cols].T (+ bias) (+ h[:, cols])) over all of K. PREFETCH (with
    PDL, kernels.pdl; BLOCK_K >= K): the program's whole weight tile is loaded before the wait for the kernel
    before, then x's rows BLOCK_M at a time, each block against the tile in registers; else x's rows in one block
    and K walked BLOCK_K at a time."""
    _dependents(USE_GDC)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * swn
    if PREFETCH:
        ks = tl.arange(0, BLOCK_K)
        k_in = ks < K
        wt = tl.load(w_cols + ks[:, None], mask=k_in[:, None] & col_in[None, :], other=0.0)  # [BK, BN]: a weight
        _wait(USE_GDC)
        for m0 in range(0, M, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            a = tl.load(x_ptr + rows.to(tl.int64)[:, None] * sxm + ks[None, :],
                        mask=(rows < M)[:, None] & k_in[None, :], other=0.0)  # [BM, BK]
            acc = _dot(a, wt, tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32), DOT_FP32)
            _finish(acc, rows, cols, M, N, b_ptr, h_ptr, out_ptr, shm, som, HAS_BIAS, HAS_RES)
    else:
        _wait(USE_GDC)
        rows = tl.arange(0, BLOCK_M)
        x_rows = x_ptr + rows.to(tl.int64)[:, None] * sxm
        row_in = rows < M
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_in = ks < K
            a = tl.load(x_rows + ks[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)  # [BM, BK]
            wt = tl.load(w_cols + ks[:, None], mask=k_in[:, None] & col_in[None, :], other=0.0)  # [BK, BN]
            acc = _dot(a, wt, acc, DOT_FP32)
        _finish(acc, rows, cols, M, N, b_ptr, h_ptr, out_ptr, shm, som, HAS_BIAS, HAS_RES)


def _finish(acc, rows, cols, M, N, b_ptr, h_ptr, out_ptr, shm, som, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr):
    """The epilogue of the [rows, cols] tile: + bias, + h (the residual), rounded once to out's dtype, stored."""
    dtype = out_ptr.dtype.element_ty
    col_in = cols < N
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    tile = (rows < M)[:, None] & col_in[None, :]
    if HAS_RES:
        acc += tl.load(h_ptr + rows.to(tl.int64)[:, None] * shm + cols[None, :], mask=tile, other=0.0).to(tl.float32)
    out = _round(acc, dtype).to(dtype)  # round to nearest even (the interpreter's own cast truncates)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * som + cols[None, :], out, mask=tile)


def _dot(a, wt, acc, DOT_FP32: tl.constexpr):
    """acc + a @ wt, in fp32 (IEEE) when DOT_FP32."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), wt.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, wt, acc)


@functools.cache
def _load() -> None:
    """Import triton and jit the kernel (kernels._load's rules: the interpreter mode is fixed at the first call)."""
    global triton, tl, _round, _dependents, _wait
    kernels._load()
    import triton
    import triton.language as tl

    _round, _dependents, _wait = kernels._round, kernels._dependents, kernels._wait
    g = globals()
    for name in ("_dot", "_finish", "_skinny_kernel"):
        g[name] = triton.jit(g[name])


def blocks(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_stages) for N output columns over K: narrow tiles for narrow outputs (many programs),
    128-deep steps over long K. Within ~0.15 us of the best of a 27-point sweep at every measured shape (session 18,
    bench/head_check.py)."""
    bn = 16 if n <= 1024 else 32 if n <= 4096 else 64
    return bn, 128 if k >= 1024 else 64, 4 if bn < 64 else 3


PREFETCH_ROWS_ENV = "EAGLESPEC_SKINNY_PREFETCH_ROWS"  # the most rows of x the prefetch kernel takes (prefetch_rows())
PREFETCH_ROWS = 16  # its default: one block of rows
PREFETCH_TILE = 32768  # weight elements a program of the prefetch kernel holds (BLOCK_N x K padded): 64 KB in bf16
PREFETCH_BLOCK_M = 16  # rows of x a step of the prefetch kernel's row loop


def prefetch_rows() -> int:
    """$EAGLESPEC_SKINNY_PREFETCH_ROWS (0..MAX_ROWS; unset: PREFETCH_ROWS, one block of rows): calls with more rows
    of x walk K instead. More rows go through the row loop, which lost on the H200 (session 19, bench/ab.py, one
    process, MT-bench 20): a dynamic 7/10/60 round's replay 1.226 ms with 16, 2.001 with 64 (2746.6 -> 1780.5
    tok/s); plain decoding (one row) the same."""
    env = os.environ.get(PREFETCH_ROWS_ENV, "").strip()
    if not env:
        return PREFETCH_ROWS
    if not env.isdigit() or int(env) > MAX_ROWS:
        raise EagleSpecError(f"{PREFETCH_ROWS_ENV}={env!r}: expected a whole number from 0 to {MAX_ROWS}")
    return int(env)


def prefetch_tiles(m: int, n: int, k: int) -> tuple[int, int, int, int] | None:
    """(BLOCK_N, BLOCK_K, num_stages, num_warps) for the PDL kernel that loads its weight tile before the wait
    (PREFETCH): all of K (padded to a power of two) in one tile, BLOCK_N narrowed to blocks()' or less so that the
    tile holds at most PREFETCH_TILE elements, x's rows PREFETCH_BLOCK_M at a time; None where K is too long for a
    16-wide tile or the rows are past prefetch_rows()."""
    kp = kernels._pow2(k)
    bn = min(blocks(n, k)[0], PREFETCH_TILE // kp)
    if m > prefetch_rows() or bn < 16:
        return None
    return bn, kp, 1, 8 if bn * kp > PREFETCH_TILE // 2 else 4


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, inplace: bool = False, *,
           tiles: tuple[int, int, int] | None = None, prefetch: bool | None = None) -> torch.Tensor:
    """linear_ref in one kernel: x [..., K] (at most MAX_ROWS rows), weight [N, K] (unit column stride), bias [N] or
    None, residual [..., N] or None (then no bias) -> [..., N] in x's dtype (`inplace`: written into residual).
    tiles: (BLOCK_N, BLOCK_K, num_stages) in place of blocks(N, K)'s (bench/head_check.py --sweep). prefetch: the
    one-tile kernel of prefetch_tiles (None: when launched with PDL, where it fits; True: where it fits, PDL or not,
    for the tests)."""
    _load()
    k, n = x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.dim() != 2 or weight.shape[1] != k or weight.stride(1) != 1 or weight.dtype != x.dtype:
        raise ValueError(f"skinny.linear: weight {tuple(weight.shape)} {weight.dtype} (column stride "
                         f"{weight.stride(-1)}) for x {tuple(x.shape)} {x.dtype}")
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"skinny.linear: {m} rows (1 to {MAX_ROWS})")
    if bias is not None and (residual is not None or bias.numel() != n or not bias.is_contiguous()):
        raise ValueError(f"skinny.linear: bias {tuple(bias.shape)} for N = {n}" +
                         (" with a residual (not one addmm)" if residual is not None else ""))
    if residual is not None:
        h = residual.reshape(m, n)
        if h.stride(-1) != 1 or (inplace and h.data_ptr() != residual.data_ptr()):
            raise ValueError(f"skinny.linear: residual {tuple(residual.shape)} with strides {residual.stride()}")
        out = h if inplace else torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        h = None
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    gdc = kernels.pdl(x)
    pre = prefetch_tiles(m, n, k) if (gdc if prefetch is None else prefetch) and tiles is None else None
    bn, bk, stages, warps = pre or (*(tiles or blocks(n, k)), 4)
    _skinny_kernel[(triton.cdiv(n, bn),)](
        x2, weight, bias if bias is not None else weight, h if h is not None else out, out, m, n, x2.stride(0),
        weight.stride(0), h.stride(0) if h is not None else 0, out.stride(0), K=k, HAS_BIAS=bias is not None,
        HAS_RES=h is not None, DOT_FP32=x.dtype == torch.float32 or kernels._interpreted(),
        BLOCK_M=PREFETCH_BLOCK_M if pre else max(16, kernels._pow2(m)), BLOCK_N=bn, BLOCK_K=bk,
        PREFETCH=pre is not None, num_warps=warps, num_stages=stages, **kernels.pdl_kwargs(gdc))
    return residual if inplace else out.view(*x.shape[:-1], n)
