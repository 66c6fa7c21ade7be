"""Fused Triton GEMMs for the fast target's step: a GEMM with its neighbouring elementwise kernel in its prologue
(and the residual in its epilogue), one kernel where the torch code launches two.

    rms_norm_linear    F.linear(HF RMSNorm(x), weight, bias): the norm in the GEMM's prologue (kernels.
                       rms_norm_weight + F.linear: 2 kernels). For the qkv projection, gate_up, final norm + lm_head.
    silu_mul_linear_   h += (silu(gate) * up) @ weight.T in place: silu * up in the prologue, the residual in the
                       epilogue (kernels.silu_mul + addmm_: 2 kernels). The MLP's down projection.

Rounding (as kernels.py: fp32 arithmetic, every value the torch code stores in the model's dtype rounded to it by
kernels._round): rms_norm_linear's operand is round(round(x * rsqrt(mean(x^2) + eps)) * w), the RMS statistics
in fp32 (each program recomputes its rows' statistics: K is small); silu_mul_linear_'s operand is
round(round(g / (1 + exp(-g))) * up), as kernels._silu_mul_kernel. The products are accumulated in fp32 by
tl.dot (fp32 operands: input_precision="ieee", no TF32), and the output is rounded once: round(acc + bias), and
round(h + acc) for the residual (torch's addmm: one rounding of the sum, the GEMM's epilogue).

What cannot be bitwise: the accumulation order of the dot products (cuBLAS's and Triton's differ, and both differ
from torch's CPU GEMM), so fp32 outputs differ by accumulation order and bf16/fp16 outputs by a last-bit flip
where the fp32 sums straddle a rounding boundary; the RMSNorm's sum of squares (chunked over BLOCK_K here) and
rsqrt's last bit, as in kernels.rms_norm_weight. Under Triton's interpreter (TRITON_INTERPRET=1) bf16 operands
go through the dot as their exact fp32 values (the interpreter's dot multiplies bf16's uint16 storage as
integers); bf16 * bf16 products are exact in fp32, so that changes nothing but the accumulation order.

The launches allocate only the output (rms_norm_linear; none for silu_mul_linear_), do not sync, and branch on
shapes only: fit for CUDA-graph capture once compiled (call each shape once before capturing). The grid is
(N / BLOCK_N, M / BLOCK_M), no split over K (the residual is accumulated in place). Block sizes are keyword
arguments (no autotuning: nothing is timed at capture); tl.dot needs tiles of at least 16, rows past M are masked.
Triton is imported lazily (kernels._load's rules apply: the interpreter mode is fixed at the first call).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from eaglespec.errors import env_switch
from eaglespec.kernels import step as kernels

GEMM_KERNELS_ENV = "EAGLESPEC_GEMM_KERNELS"  # "1" on, "0" off; unset: off (slower on the H200, see wanted())


def wanted() -> bool:
    """Whether a fused fast step (kernels.py's kernels on) also takes these GEMMs: $EAGLESPEC_GEMM_KERNELS=1. Off by
    default: measured on an H200 (bench/gemm_check.py, bf16, session 8, 81f43fa) they lose. In a CUDA graph the pair
    they replace costs ~4.5 us (two kernels back to back); rms_norm_linear takes 5.5 us at 1 row and 8.7-13 us at
    32-64 rows (cuBLAS's GEMM alone: 3.1 us); silu_mul_linear_ (K = 1536 in one program per tile, no split over K)
    50-136 us. A static-tree round graph with them: 423 device activities instead of 529, but 7.2 ms of GPU time
    instead of 1.5. Kept as an opt-in for other GPUs and block sizes (--sweep)."""
    return env_switch(GEMM_KERNELS_ENV, "off") is True


# -- plain-torch references (the code of fast.py each kernel replaces) ---------------------------------------
def rms_norm_linear_ref(x: torch.Tensor, norm_w: torch.Tensor, eps: float, weight: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """fast._step's F.linear(norm(h, norm_w, eps), weight, bias)."""
    return F.linear(kernels.rms_norm_weight_ref(x, norm_w, eps), weight, bias)


def silu_mul_linear_ref_(h: torch.Tensor, gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fast._step's silu_mul then _add_linear(h, act, down_w, None, inplace=True): h.addmm_(act, weight.T)."""
    return h.addmm_(kernels.silu_mul_ref(gate_up), weight.t())


# -- the Triton kernels (plain functions here; _load() jits them on first use) --------------------------------
def _rms_norm_linear_kernel(x_ptr, nw_ptr, w_ptr, b_ptr, out_ptr, M, N, eps,
                            sxm, sxk, swn, swk, som, K: tl.constexpr, HAS_BIAS: tl.constexpr,
                            DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr):
    """Program (n block, m block): out = round(normed(x) @ weight.T (+ bias)), normed as kernels._rms_weight."""
    dtype = out_ptr.dtype.element_ty
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < M
    col_in = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * sxm
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * swn
    # the rows' RMS statistics (fp32), over K in chunks
    sum_sq = tl.full((BLOCK_M,), 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + ks[None, :] * sxk, mask=row_in[:, None] & (ks < K)[None, :], other=0.0)
        x = x.to(tl.float32)
        sum_sq += tl.reduce(x * x, 1, _add)
    r = tl.math.rsqrt(sum_sq / K + eps)
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_in = ks < K
        x = tl.load(x_rows + ks[None, :] * sxk, mask=row_in[:, None] & k_in[None, :], other=0.0).to(tl.float32)
        nw = tl.load(nw_ptr + ks, mask=k_in, other=0.0).to(tl.float32)
        a = _round(_round(x * r[:, None], dtype) * nw[None, :], dtype)  # F.rms_norm's cast, then the weight's
        wt = tl.load(w_cols + ks[:, None] * swk, mask=k_in[:, None] & col_in[None, :], other=0.0)  # [BK, BN]
        if DOT_FP32:
            acc = tl.dot(a, wt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.to(dtype), wt, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_in, other=0.0).to(tl.float32)[None, :]
    out = _round(acc, dtype).to(dtype)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * som + cols[None, :], out, mask=row_in[:, None] & col_in[None, :])


def _silu_mul_linear_kernel(h_ptr, gu_ptr, w_ptr, M, N, shm, shn, sgm, sgk, swn, swk, INTER: tl.constexpr,
                            PRECISE_EXP: tl.constexpr, DOT_FP32: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (n block, m block): h = round(h + act @ weight.T), act = round(round(silu(gate)) * up) as
    kernels._silu_mul_kernel (gate = gate_up[:, :INTER], up = gate_up[:, INTER:])."""
    dtype = h_ptr.dtype.element_ty
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < M
    col_in = cols < N
    g_rows = gu_ptr + rows.to(tl.int64)[:, None] * sgm
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * swn
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_in = ks < INTER
        inside = row_in[:, None] & k_in[None, :]
        g = tl.load(g_rows + ks[None, :] * sgk, mask=inside, other=0.0).to(tl.float32)
        up = tl.load(g_rows + (INTER + ks)[None, :] * sgk, mask=inside, other=0.0).to(tl.float32)
        if PRECISE_EXP:  # CUDA's expf, as torch's silu kernel
            e = libdevice.exp(-g)
        else:  # the interpreter has no libdevice: numpy's exp
            e = tl.exp(-g)
        silu = _round(tl.math.div_rn(g, 1.0 + e), dtype)
        a = _round(silu * up, dtype)
        wt = tl.load(w_cols + ks[:, None] * swk, mask=k_in[:, None] & col_in[None, :], other=0.0)  # [BK, BN]
        if DOT_FP32:
            acc = tl.dot(a, wt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.to(dtype), wt, acc)
    h_tile = h_ptr + rows.to(tl.int64)[:, None] * shm + cols[None, :] * shn
    tile_in = row_in[:, None] & col_in[None, :]
    h = tl.load(h_tile, mask=tile_in, other=0.0).to(tl.float32)
    tl.store(h_tile, _round(h + acc, dtype).to(dtype), mask=tile_in)  # addmm_: one rounding of the sum


_JITTED = ("_rms_norm_linear_kernel", "_silu_mul_linear_kernel")


@functools.cache
def _load() -> None:
    """kernels._load() (triton, and its jitted _round / _add, which the kernels here call), then jit the kernels
    above into this module's namespace. As there, the kernels call triton's builtins only (tl.full, not the
    jitted tl.zeros: see kernels._load)."""
    global triton, tl, libdevice, _round, _add
    kernels._load()
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    _round, _add = kernels._round, kernels._add
    g = globals()
    for name in _JITTED:
        g[name] = triton.jit(g[name])


def _block_m(m: int) -> int:
    """The default BLOCK_M: M's power of two, 16 (tl.dot's least) to 64."""
    return min(64, max(16, kernels._pow2(m)))


def _dot_fp32(dtype: torch.dtype) -> bool:
    """fp32 operands for the dot: fp32 models, and bf16 in the interpreter (see the module docstring)."""
    if dtype == torch.float32:
        return True
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"fused GEMMs take fp32, bf16 or fp16, not {dtype}")
    return dtype == torch.bfloat16 and kernels._interpreted()


def _check_weight(weight: torch.Tensor, k: int, dtype: torch.dtype) -> None:
    if weight.dim() != 2 or weight.shape[1] != k or weight.dtype != dtype:
        raise ValueError(f"weight {tuple(weight.shape)} {weight.dtype} for inputs of {k} columns in {dtype}")


# -- the launchers -----------------------------------------------------------------------------------------
def rms_norm_linear(x: torch.Tensor, norm_w: torch.Tensor, eps: float, weight: torch.Tensor,
                    bias: torch.Tensor | None = None, *, block_m: int | None = None, block_n: int = 64,
                    block_k: int = 64, num_warps: int = 4) -> torch.Tensor:
    """x [M, K], norm_w [K], weight [N, K], bias [N] or None (any strides; norm_w and bias contiguous) -> [M, N]
    in x's dtype: rms_norm_linear_ref in one kernel. block_m defaults to _block_m(M)."""
    _load()
    if x.dim() != 2:
        raise ValueError(f"rms_norm_linear takes x [M, K], not {tuple(x.shape)}")
    m, k = x.shape
    n = weight.shape[0]
    _check_weight(weight, k, x.dtype)
    if not (norm_w.is_contiguous() and norm_w.numel() == k):
        raise ValueError(f"norm weight {tuple(norm_w.shape)} (contiguous: {norm_w.is_contiguous()}) for K = {k}")
    if bias is not None and not (bias.is_contiguous() and bias.numel() == n):
        raise ValueError(f"bias {tuple(bias.shape)} (contiguous: {bias.is_contiguous()}) for N = {n}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    bm = block_m or _block_m(m)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, bm))
    _rms_norm_linear_kernel[grid](x, norm_w, weight, out if bias is None else bias, out, m, n, eps,
                                  x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), out.stride(0),
                                  K=k, HAS_BIAS=bias is not None, DOT_FP32=_dot_fp32(x.dtype), BLOCK_M=bm,
                                  BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, enable_fp_fusion=False)
    return out


def silu_mul_linear_(h: torch.Tensor, gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     *, block_m: int | None = None, block_n: int = 64, block_k: int = 64,
                     num_warps: int = 4) -> torch.Tensor:
    """h [M, N], gate_up [M, 2I] ([gate | up]), weight [N, I] (any strides) -> h, with h += (silu(gate) * up) @
    weight.T in place: silu_mul_linear_ref_ in one kernel. No bias (fast.py's addmm_ path has none): raises.
    h must not overlap gate_up or weight. block_m defaults to _block_m(M)."""
    _load()
    if bias is not None:
        raise ValueError("silu_mul_linear_ takes no bias (h + act @ weight.T + bias is not one addmm_)")
    if h.dim() != 2 or gate_up.dim() != 2 or gate_up.shape[0] != h.shape[0] or gate_up.shape[1] % 2:
        raise ValueError(f"h {tuple(h.shape)} and gate_up {tuple(gate_up.shape)}: expected [M, N] and [M, 2I]")
    m, n = h.shape
    i = gate_up.shape[1] // 2
    if weight.shape[0] != n or gate_up.dtype != h.dtype:
        raise ValueError(f"weight {tuple(weight.shape)} for h {tuple(h.shape)}; gate_up {gate_up.dtype}, h {h.dtype}")
    _check_weight(weight, i, h.dtype)
    if m == 0 or n == 0:
        return h
    bm = block_m or _block_m(m)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, bm))
    _silu_mul_linear_kernel[grid](h, gate_up, weight, m, n, h.stride(0), h.stride(1), gate_up.stride(0),
                                  gate_up.stride(1), weight.stride(0), weight.stride(1), INTER=i,
                                  PRECISE_EXP=not kernels._interpreted(), DOT_FP32=_dot_fp32(h.dtype), BLOCK_M=bm,
                                  BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, enable_fp_fusion=False)
    return h
