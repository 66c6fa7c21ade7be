"""The fused Triton GEMMs (target/gemm_kernels.py) under Triton's CPU interpreter (TRITON_INTERPRET=1).

Bitwise where the GEMM is exact: with an identity weight every output is one product by 1 (plus the bias or the
residual), so the prologue's rounding (the normalised x, the norm weight's product; silu, its product with up)
and the epilogue's single rounding are checked bit for bit, in fp32, bf16 and fp16. With random weights the
accumulation order differs (the interpreter's per-chunk numpy matmul, torch's CPU GEMM): outputs are checked
against an fp64 product of the same operands within an fp32-accumulation bound plus half an output ulp, and
against the torch references within twice that. The RMSNorm's inputs are k/8 (|k| <= 64) so that its sum of
squares is exact in any order (see tests/test_kernels.py). bf16 runs here with fp32 dot operands (the
interpreter cannot multiply bf16): the GPU's bf16 tl.dot is checked by bench/gemm_check.py only; fp16 runs the
GPU's code path (fp16 operands).
"""

from __future__ import annotations

import os

# Triton's interpreter: set before the kernels are jitted (on their first use), and stays set for the session.
os.environ["TRITON_INTERPRET"] = "1"

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from eaglespec.kernels import gemm as G
from eaglespec.kernels import step as K

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
HALF_ULP = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
EPS = 1e-5


def _exact_sum_x(m: int, k: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return (torch.randint(-64, 65, (m, k), generator=gen) / 8).to(dtype)


def _silu_mul_numpy_exp(gate_up: torch.Tensor) -> torch.Tensor:
    """kernels._silu_mul_kernel's arithmetic with the interpreter's exp (numpy's): round(round(g / (1 + e)) * up)."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    e = torch.from_numpy(np.exp(-gate.contiguous().numpy()))
    silu = (gate / (1 + e)).to(gate_up.dtype).float()
    return (silu * up).to(gate_up.dtype)


def _check_gemm(out: torch.Tensor, a: torch.Tensor, w: torch.Tensor, add: torch.Tensor | None,
                ref: torch.Tensor) -> None:
    """out = round(a @ w.T + add) up to fp32 accumulation order: within |a| @ |w|.T * K * 2^-24 plus half an ulp
    of out's dtype of the fp64 value; and within twice that of the torch reference `ref`."""
    exact = a.double() @ w.double().T + (0 if add is None else add.double())
    accum = (a.double().abs() @ w.double().abs().T) * a.shape[1] * 2.0 ** -24
    bound = 2 * accum + 2 * HALF_ULP[out.dtype] * exact.abs() + 2.0 ** -24
    assert bool(((out.double() - exact).abs() <= bound).all()), (out.double() - exact).abs().max()
    assert bool(((out.double() - ref.double()).abs() <= 2 * bound).all()), (out.double() - ref.double()).abs().max()


# -- rms_norm_linear ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 5, 16, 37])
@pytest.mark.parametrize("bias", [False, True])
def test_rms_norm_linear_against_the_reference(dtype, m, bias):
    gen = torch.Generator().manual_seed(m * 10 + bias)
    k, n = 72, 100
    x = _exact_sum_x(m, k, dtype, gen)
    nw = torch.randn(k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / 8).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    out = G.rms_norm_linear(x, nw, EPS, w, b)
    assert out.shape == (m, n) and out.dtype == dtype and out.is_contiguous()
    _check_gemm(out, K.rms_norm_weight_ref(x, nw, EPS), w, b, G.rms_norm_linear_ref(x, nw, EPS, w, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocks", [{}, {"block_m": 32, "block_n": 16, "block_k": 16}])
def test_rms_norm_linear_identity_weight_is_the_rms_norm_bitwise(dtype, blocks):
    """weight = I (N = K): each output is round(a * 1 + bias) with a the normalised, weighted x: bitwise
    kernels.rms_norm_weight_ref's rounding (normalised x rounded, times the norm weight, rounded) and one
    rounding of the bias sum. Mutations caught: no norm weight, no rounding of the normalised x, the bias
    rounded twice or dropped."""
    gen = torch.Generator().manual_seed(1)
    k = 72
    x = _exact_sum_x(37, k, dtype, gen)
    nw = torch.randn(k, generator=gen).to(dtype)
    eye = torch.eye(k).to(dtype)
    a = K.rms_norm_weight_ref(x, nw, EPS)
    assert torch.equal(G.rms_norm_linear(x, nw, EPS, eye, **blocks), a)
    b = torch.randn(k, generator=gen).to(dtype)
    assert torch.equal(G.rms_norm_linear(x, nw, EPS, eye, b, **blocks), (a.float() + b.float()).to(dtype))


def test_rms_norm_linear_rounds_the_normalised_x_before_the_weight():
    """bf16: the identity-weight output is not round(x * r * w) (the normalised x left unrounded)."""
    gen = torch.Generator().manual_seed(2)
    x = _exact_sum_x(16, 64, torch.bfloat16, gen)
    nw = torch.randn(64, generator=gen).to(torch.bfloat16)
    xf = x.float()
    once = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * nw.float()).to(torch.bfloat16)
    out = G.rms_norm_linear(x, nw, EPS, torch.eye(64).to(torch.bfloat16))
    assert not torch.equal(out, once)
    assert torch.equal(out, K.rms_norm_weight_ref(x, nw, EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_linear_model_shapes(dtype):
    """SmolLM2-135M's qkv projection (K = 576, N = 960) for a 5-row step: rows' statistics over 9 K chunks."""
    gen = torch.Generator().manual_seed(3)
    x = _exact_sum_x(5, 576, dtype, gen)
    nw = (1 + torch.randn(576, generator=gen) / 4).to(dtype)
    w = (torch.randn(960, 576, generator=gen) / 24).to(dtype)
    out = G.rms_norm_linear(x, nw, EPS, w)
    _check_gemm(out, K.rms_norm_weight_ref(x, nw, EPS), w, None, G.rms_norm_linear_ref(x, nw, EPS, w))


def test_rms_norm_linear_strided_inputs():
    """Strided rows of x (a column slice), a transposed weight: handled (strides passed to the kernel), the same
    values as contiguous inputs; M = 128 (two row blocks of 64)."""
    gen = torch.Generator().manual_seed(4)
    k, n = 72, 100
    wide = _exact_sum_x(128, 2 * k, torch.bfloat16, gen)
    x = wide[:, k:]
    wt = (torch.randn(k, n, generator=gen) / 8).to(torch.bfloat16)
    nw = torch.randn(k, generator=gen).to(torch.bfloat16)
    assert x.stride(0) != k and wt.t().stride(1) != 1
    out = G.rms_norm_linear(x, nw, EPS, wt.t())
    assert torch.equal(out, G.rms_norm_linear(x.contiguous(), nw, EPS, wt.t().contiguous()))
    _check_gemm(out, K.rms_norm_weight_ref(x, nw, EPS), wt.t(), None, G.rms_norm_linear_ref(x, nw, EPS, wt.t()))


def test_rms_norm_linear_rejects_bad_arguments():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError):
        G.rms_norm_linear(x[None], torch.ones(8), EPS, torch.randn(4, 8))  # 3-d x
    with pytest.raises(ValueError):
        G.rms_norm_linear(x, torch.ones(8), EPS, torch.randn(4, 7))  # K mismatch
    with pytest.raises(ValueError):
        G.rms_norm_linear(x, torch.ones(8), EPS, torch.randn(4, 8).to(torch.bfloat16))  # dtype mismatch
    with pytest.raises(ValueError):
        G.rms_norm_linear(x, torch.ones(8), EPS, torch.randn(4, 8), torch.ones(5))  # bias size


# -- silu_mul_linear_ ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 5, 16, 37])
def test_silu_mul_linear_against_the_reference(dtype, m):
    gen = torch.Generator().manual_seed(m)
    i, n = 72, 100
    gate_up = (torch.randn(m, 2 * i, generator=gen) * 3).to(dtype)
    w = (torch.randn(n, i, generator=gen) / 8).to(dtype)
    h = torch.randn(m, n, generator=gen).to(dtype)
    h0 = h.clone()
    out = G.silu_mul_linear_(h, gate_up, w)
    assert out is h  # in place
    ref = G.silu_mul_linear_ref_(h0.clone(), gate_up, w)
    _check_gemm(out, _silu_mul_numpy_exp(gate_up), w, h0, ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocks", [{}, {"block_m": 32, "block_n": 16, "block_k": 16}])
def test_silu_mul_linear_identity_weight_bitwise(dtype, blocks):
    """weight = I (N = I): h becomes round(h + act) exactly, act rounded as kernels.silu_mul (numpy's exp here).
    Mutations caught: the residual skipped, silu or its product unrounded (bf16, fp16)."""
    gen = torch.Generator().manual_seed(5)
    i = 72
    gate_up = (torch.randn(37, 2 * i, generator=gen) * 3).to(dtype)
    h = torch.randn(37, i, generator=gen).to(dtype)
    want = (h.float() + _silu_mul_numpy_exp(gate_up).float()).to(dtype)
    assert torch.equal(G.silu_mul_linear_(h, gate_up, torch.eye(i).to(dtype), **blocks), want)


def test_silu_mul_linear_rounds_silu_before_the_product():
    """bf16, h = 0: round(round(silu(g)) * up) (torch's act(gate) * up), not round(silu(g) * up)."""
    gen = torch.Generator().manual_seed(6)
    gate_up = (torch.randn(16, 256, generator=gen) * 4).to(torch.bfloat16)
    gate, up = gate_up.float().chunk(2, dim=-1)
    once = (gate * torch.sigmoid(gate) * up).to(torch.bfloat16)
    out = G.silu_mul_linear_(torch.zeros(16, 128, dtype=torch.bfloat16), gate_up, torch.eye(128).bfloat16())
    assert not torch.equal(out, once)
    assert torch.equal(out, _silu_mul_numpy_exp(gate_up))


def test_silu_mul_linear_model_shapes_strided():
    """SmolLM2-135M's down projection (I = 1536, N = 576), 5 rows; h a column slice of a wider tensor (written
    in place, the rest untouched), gate_up with strided rows: handled."""
    gen = torch.Generator().manual_seed(7)
    dtype = torch.bfloat16
    big = torch.randn(5, 2 * 1536 + 8, generator=gen).to(dtype)
    gate_up = big[:, 8:]
    w = (torch.randn(576, 1536, generator=gen) / 40).to(dtype)
    wide = torch.randn(5, 600, generator=gen).to(dtype)
    before = wide.clone()
    h = wide[:, 24:]
    out = G.silu_mul_linear_(h, gate_up, w)
    assert out is h and torch.equal(wide[:, :24], before[:, :24])
    ref = G.silu_mul_linear_ref_(before[:, 24:].clone(), gate_up, w)
    _check_gemm(wide[:, 24:], _silu_mul_numpy_exp(gate_up), w, before[:, 24:], ref)


def test_silu_mul_linear_rejects_bad_arguments():
    h, gate_up, w = torch.zeros(3, 4), torch.randn(3, 16), torch.randn(4, 8)
    with pytest.raises(ValueError):
        G.silu_mul_linear_(h, gate_up, w, torch.zeros(4))  # a bias
    with pytest.raises(ValueError):
        G.silu_mul_linear_(h, gate_up[:, :15], w)  # odd gate_up
    with pytest.raises(ValueError):
        G.silu_mul_linear_(h, gate_up, torch.randn(4, 7))  # I mismatch
    with pytest.raises(ValueError):
        G.silu_mul_linear_(h.bfloat16(), gate_up, w)  # dtype mismatch
