"""A Triton GEMM for the few-row projections of decoding: x [M <= 64, K] @ weight [N, K].T.

At batch 1 a decoding step's projections have 1 row (plain decoding), ~10 (a drafter step) or ~60 (a tree
verification), where cuBLAS's kernels are latency-bound. This kernel tiles N narrow (16 to 64 columns a
program: tens to hundreds of programs at these widths) and walks all of K in one program, BLOCK_K at a time
with the loads pipelined, so the weight is read once, by many programs at once. With PDL
(eaglespec.kernels.pdl) a program loads its whole weight tile before it waits for the kernel before it
(prefetch_tiles), which is where it gains. `applies` takes it only with PDL and where it is faster than
cuBLAS: at most 16 rows at K up to 1536, more rows only at K < 1536 and N <= 4096.

    linear(x, weight, bias=None, residual=None, inplace=False)
        x [M, K] -> [M, N]: round(x @ weight.T + bias) in x's dtype, or with `residual` h [M, N] (no bias):
        round(h + x @ weight.T), h's add in the epilogue as torch.addmm (one rounding of the sum); `inplace`
        writes it into h (addmm_).

Rounding: products accumulated in fp32 by tl.dot (fp32 operands: input_precision="ieee", no TF32), the output
rounded once. What differs from cuBLAS is the accumulation order only: fp32 results agree to ~1e-7 relative,
and a bf16 result can differ by one last bit where the fp32 sums straddle a rounding boundary (contract 1's
bf16 near-ties); `applies` keeps fp32, the identity checks' dtype, on cuBLAS anyway. Under the interpreter
bf16 operands go through the dot as fp32 (its bf16 dot is wrong; bf16 products are exact in fp32). The launch
allocates only the output, does not sync and branches on shapes only: fit for CUDA-graph capture once
compiled.
"""

from __future__ import annotations

import torch

from eaglespec.kernels import interpreted, jit, pdl, pdl_kwargs, pow2

MAX_ROWS = 64  # rows of x: one BLOCK_M tile (tl.dot's least is 16)
PREFETCH_ROWS = 16  # the most rows of x the prefetch kernel takes (more rows walk K instead)
PREFETCH_TILE = 32768  # weight elements a program of the prefetch kernel holds (BLOCK_N x K padded): 64 KB in bf16
PREFETCH_BLOCK_M = 16  # rows of x a step of the prefetch kernel's row loop


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Would this kernel take x [..., K] @ weight [N, K].T? CUDA tensors of one 16-bit dtype launched with
    PDL, a weight with unit column stride, no autograd, rows within MAX_ROWS and a shape it wins on (module
    docstring)."""
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
    return pdl(x)


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
    """Program (n block): out[:, cols] = round(x @ w[cols].T (+ bias) (+ h[:, cols])) over all of K. PREFETCH
    (with PDL; BLOCK_K >= K): the program's whole weight tile is loaded before the wait for the kernel before,
    then x's rows BLOCK_M at a time, each block against the tile in registers; else x's rows in one block and
    K walked BLOCK_K at a time."""
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
    """The epilogue of the [rows, cols] tile: + bias, + h (the residual), rounded once to out's dtype,
    stored."""
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


_JITTED = ("_dot", "_finish", "_skinny_kernel")


def _load() -> None:
    """Jit the kernel above (eaglespec.kernels.jit also puts triton, tl and the shared helpers here)."""
    global triton, tl, _round, _dependents, _wait
    jit(globals(), _JITTED)


def blocks(n: int, k: int) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, num_stages) for N output columns over K: narrow tiles for narrow outputs (many
    programs), 128-deep steps over long K."""
    bn = 16 if n <= 1024 else 32 if n <= 4096 else 64
    return bn, 128 if k >= 1024 else 64, 4 if bn < 64 else 3


def prefetch_tiles(m: int, n: int, k: int) -> tuple[int, int, int, int] | None:
    """(BLOCK_N, BLOCK_K, num_stages, num_warps) for the PDL kernel that loads its weight tile before the wait
    (PREFETCH): all of K (padded to a power of two) in one tile, BLOCK_N narrowed to blocks()' or less so that
    the tile holds at most PREFETCH_TILE elements, x's rows PREFETCH_BLOCK_M at a time; None where K is too
    long for a 16-wide tile or there are more than PREFETCH_ROWS rows."""
    kp = pow2(k)
    bn = min(blocks(n, k)[0], PREFETCH_TILE // kp)
    if m > PREFETCH_ROWS or bn < 16:
        return None
    return bn, kp, 1, 8 if bn * kp > PREFETCH_TILE // 2 else 4


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None, inplace: bool = False, *,
           tiles: tuple[int, int, int] | None = None, prefetch: bool | None = None) -> torch.Tensor:
    """linear_ref in one kernel: x [..., K] (at most MAX_ROWS rows), weight [N, K] (unit column stride), bias
    [N] or None, residual [..., N] or None (then no bias) -> [..., N] in x's dtype (`inplace`: written into
    residual). tiles: (BLOCK_N, BLOCK_K, num_stages) in place of blocks(N, K)'s. prefetch: the one-tile kernel
    of prefetch_tiles (None: when launched with PDL, where it fits; True: where it fits, PDL or not)."""
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
    gdc = pdl(x)
    pre = prefetch_tiles(m, n, k) if (gdc if prefetch is None else prefetch) and tiles is None else None
    bn, bk, stages, warps = pre or (*(tiles or blocks(n, k)), 4)
    _skinny_kernel[(triton.cdiv(n, bn),)](
        x2, weight, bias if bias is not None else weight, h if h is not None else out, out, m, n, x2.stride(0),
        weight.stride(0), h.stride(0) if h is not None else 0, out.stride(0), K=k, HAS_BIAS=bias is not None,
        HAS_RES=h is not None, DOT_FP32=x.dtype == torch.float32 or interpreted(),
        BLOCK_M=PREFETCH_BLOCK_M if pre else max(16, pow2(m)), BLOCK_N=bn, BLOCK_K=bk,
        PREFETCH=pre is not None, num_warps=warps, num_stages=stages, **pdl_kwargs(gdc))
    return residual if inplace else out.view(*x.shape[:-1], n)
