"""eaglespec.kernels.skinny (the few-row Triton GEMM) under Triton's CPU interpreter (TRITON_INTERPRET=1): F.linear's and
addmm's values (fp32 to accumulation order; bf16 to one rounding of the same fp32 sum), bias and residual in the
epilogue, in place and not, shapes that are not multiples of the tiles; where `applies` routes a projection; and the
fused target and drafter steps with every projection routed through it (forced on CPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from eaglespec.kernels import skinny


def _case(seed: int, m: int, k: int, n: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) * 0.1).to(dtype)
    return x, w, torch.randn(n, generator=g).to(dtype), torch.randn(m, n, generator=g).to(dtype)


def _exact(x, w, b=None, h=None) -> torch.Tensor:
    """The fp32 (double-accumulated) value before the one rounding to x's dtype."""
    y = x.double() @ w.double().t()
    if b is not None:
        y = y + b.double()
    if h is not None:
        y = y + h.double()
    return y


@pytest.mark.parametrize("m, k, n", [(5, 70, 33), (60, 64, 100)])
def test_linear_is_f_linear_in_fp32(m, k, n):
    x, w, b, h = _case(m + k + n, m, k, n, torch.float32)
    torch.testing.assert_close(skinny.linear(x, w), torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(skinny.linear(x, w, b), torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(skinny.linear(x, w, residual=h), torch.addmm(h, x, w.t()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m, k, n", [(1, 96, 40), (33, 64, 48)])
def test_bf16_rounds_the_fp32_sum_once(m, k, n):
    """Every output is the exact sum rounded to bf16, give or take one ulp where the fp32 accumulation's own
    rounding straddles a bf16 boundary: never the twice-rounded projection-then-add (bias and residual in the
    epilogue)."""
    x, w, b, h = _case(7 * m + n, m, k, n, torch.bfloat16)
    for kwargs in ({}, {"bias": b}, {"residual": h.clone()}):
        got = skinny.linear(x, w, **kwargs).double()
        want = _exact(x, w, kwargs.get("bias"), kwargs.get("residual"))
        ulp = want.abs().clamp(min=1e-3) * 2.0 ** -7
        assert ((got - want).abs() <= ulp).all()
        assert ((got - want.to(torch.bfloat16).double()) == 0).float().mean() > 0.95


def test_residual_in_place_and_not():
    x, w, _, h = _case(3, 6, 50, 20, torch.float32)
    h0 = h.clone()
    out = skinny.linear(x, w, residual=h)
    assert out.data_ptr() != h.data_ptr() and torch.equal(h, h0)  # out of place: h untouched
    back = skinny.linear(x, w, residual=h, inplace=True)
    assert back is h and torch.equal(h, out)  # in place: the same values, written into h
    view = torch.zeros(6, 40)[:, 10:30]  # a row-strided residual (a view into a wider buffer)
    skinny.linear(x, w, residual=view, inplace=True)
    torch.testing.assert_close(view, x @ w.t(), rtol=1e-5, atol=1e-5)


def test_other_tiles_give_the_same_values():
    """tiles= (the sweep's block sizes): the same products, another tiling of N and K."""
    x, w, _, h = _case(8, 5, 200, 70, torch.float32)
    want = torch.addmm(h, x, w.t())
    for tiles in ((16, 64, 2), (32, 128, 3), (64, 256, 4)):
        torch.testing.assert_close(skinny.linear(x, w, residual=h, tiles=tiles), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m, k, n", [(7, 200, 70), (61, 96, 40)])
def test_prefetch_kernel_gives_the_same_values(monkeypatch, m, k, n):
    """The PDL kernel's one-tile variant (the weight tile loaded before the wait; run here without PDL, which the
    interpreter cannot do): all of K in one padded tile, x's rows 16 at a time (a short last block at 61 rows,
    allowed past PREFETCH_ROWS here), bias and residual as the looped kernel's."""
    monkeypatch.setattr(skinny, "PREFETCH_ROWS", 64)
    assert skinny.prefetch_tiles(m, n, k) is not None
    x, w, b, h = _case(11 * m + k, m, k, n, torch.float32)
    torch.testing.assert_close(skinny.linear(x, w, b, prefetch=True), torch.nn.functional.linear(x, w, b),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(skinny.linear(x, w, residual=h, prefetch=True), torch.addmm(h, x, w.t()),
                               rtol=1e-5, atol=1e-5)
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    got, want = skinny.linear(xb, wb, prefetch=True).double(), _exact(xb, wb)
    assert ((got - want).abs() <= want.abs().clamp(min=1e-3) * 2.0 ** -7).all()  # the fp32 sum rounded once


def test_prefetch_tiles_fit_the_tile_budget():
    """The tile narrows to stay within PREFETCH_TILE elements; too many rows or too long a K: the looped kernel."""
    for m, n, k in ((1, 960, 576), (1, 3072, 576), (1, 576, 1536), (10, 12000, 576), (16, 960, 1152)):
        bn, bk, stages, warps = skinny.prefetch_tiles(m, n, k)
        assert bk >= k and bk & (bk - 1) == 0 and bn * bk <= skinny.PREFETCH_TILE and bn >= 16 and stages == 1
        assert bn <= skinny.blocks(n, k)[0] and warps in (4, 8)
    assert skinny.prefetch_tiles(17, 960, 576) is None  # past PREFETCH_ROWS by default: K walked instead
    assert skinny.prefetch_tiles(1, 576, 4096) is None  # a 16-wide tile of K = 4096 is past the budget


def test_linear_keeps_leading_dims():
    x, w, _, _ = _case(4, 6, 32, 24, torch.float32)
    got = skinny.linear(x.view(2, 3, 32), w)
    assert got.shape == (2, 3, 24)
    torch.testing.assert_close(got.view(6, 24), x @ w.t(), rtol=1e-5, atol=1e-5)


def test_bad_inputs_are_refused_in_one_line():
    x, w, b, h = _case(5, 4, 32, 16, torch.float32)
    with pytest.raises(ValueError, match="rows"):
        skinny.linear(torch.zeros(65, 32), w)
    with pytest.raises(ValueError, match="weight"):
        skinny.linear(x, w[:, :16])
    with pytest.raises(ValueError, match="not one addmm"):
        skinny.linear(x, w, b, residual=h)


def test_applies_only_to_cuda_16_bit_inference_with_pdl(monkeypatch):
    """CPU tensors (the interpreter's device) never route to it; it takes CUDA tensors launched with PDL only; the row
    and shape limits are read from the tensors' metadata alone (CPU tensors made to look like CUDA ones)."""
    x, w, _, _ = _case(6, 4, 32, 16, torch.bfloat16)
    assert not skinny.applies(x, w)  # CPU
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert not skinny.applies(x, w)  # without PDL (the interpreter has none): cuBLAS
    monkeypatch.setattr(skinny, "pdl", lambda t: True)
    assert skinny.applies(x, w)
    assert not skinny.applies(x.float(), w.float())  # fp32: cuBLAS (the identity checks' dtype)
    assert not skinny.applies(torch.zeros(65, 32, dtype=torch.bfloat16), w)  # past MAX_ROWS
    assert skinny.applies(torch.zeros(64, 576, dtype=torch.bfloat16), torch.zeros(960, 576, dtype=torch.bfloat16))
    assert not skinny.applies(torch.zeros(60, 1536, dtype=torch.bfloat16),  # 1536 -> 576 at 60 rows: cuBLAS wins
                              torch.zeros(576, 1536, dtype=torch.bfloat16))
    assert skinny.applies(torch.zeros(10, 1536, dtype=torch.bfloat16), torch.zeros(576, 1536, dtype=torch.bfloat16))
    assert not skinny.applies(torch.zeros(1, 4608, dtype=torch.bfloat16),  # a long K (no split over it): cuBLAS
                              torch.zeros(576, 4608, dtype=torch.bfloat16))
    assert not skinny.applies(x, w.t().contiguous().t())  # a transposed weight
    wg = w.clone().requires_grad_()
    assert not skinny.applies(x, wg)  # autograd: training stays on cuBLAS
    with torch.no_grad():
        assert skinny.applies(x, wg)


def _force_skinny(monkeypatch) -> dict[str, int]:
    """Route the fused steps' projections to skinny on CPU (the interpreter) wherever its row, length and shape
    limits allow, counting the calls by kind: what `applies` does on CUDA, minus the device and dtype checks. CPU's
    oneDNN path (which comes first, and packs FastTarget's weights) is turned off."""
    from eaglespec.kernels import onednn

    monkeypatch.setattr(onednn, "applies", lambda *args, **kw: False)
    monkeypatch.setattr(onednn, "packing_available", lambda: False)
    calls = {"plain": 0, "residual": 0}
    real_linear = skinny.linear

    def applies(x, weight):
        rows = x.numel() // max(1, x.shape[-1])
        return x.shape[-1] == weight.shape[1] and rows <= skinny.MAX_ROWS and weight.shape[1] <= 1536

    def linear(x, weight, bias=None, residual=None, inplace=False):
        calls["residual" if residual is not None else "plain"] += 1
        return real_linear(x, weight, bias, residual, inplace)

    monkeypatch.setattr(skinny, "applies", applies)
    monkeypatch.setattr(skinny, "linear", linear)
    return calls


def test_fused_target_step_through_skinny(monkeypatch):
    """FastTarget's fused step with every projection in skinny (qkv, o + residual, gate_up, down + residual,
    lm_head; Qwen2's qkv bias) gives the step without it (fp32, to accumulation order): a prefill, a tree step with
    a mask, a non-prefix commit, a causal step; the same KV."""
    from eaglespec.backends.fast import FastTarget
    from eaglespec.tree.core import ancestry

    from conftest import tiny_target

    model = tiny_target("qwen2", seed=5, layers=2)
    gen = torch.Generator().manual_seed(0)
    prompt, toks = torch.randint(3, 90, (6,), generator=gen), torch.randint(3, 90, (7,), generator=gen)
    parents, depths = torch.tensor([-1, 0, 0, 1, 1, 2, 3]), torch.tensor([0, 1, 1, 2, 2, 2, 3])

    def run() -> tuple[list[torch.Tensor], torch.Tensor]:
        t = FastTarget(model, (0, 2), max_len=64, buckets=(1, 8), fused_kernels=True)
        out = [t.forward(prompt)]
        t.commit(torch.arange(6))
        out.append(t.forward(toks, depths, ancestry(parents)))
        t.commit(torch.tensor([0, 2, 5]))
        out.append(t.forward(toks[:1]))
        return [x for o in out for x in (o.logits, o.features)], t.cache

    ref, ref_cache = run()
    calls = _force_skinny(monkeypatch)
    got, got_cache = run()
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    torch.testing.assert_close(got_cache, ref_cache, rtol=0, atol=1e-5)
    layers = model.config.num_hidden_layers
    steps = 2  # the tree step and the causal step (the 6-row prefill is within the buckets: 3 forwards)
    assert calls["plain"] >= steps * (2 * layers + 1) and calls["residual"] >= steps * 2 * layers


def test_fused_drafter_step_through_skinny(monkeypatch):
    """FusedEagle3Step(kernels=True) with skinny's projections (qkv, o + residual, gate_up, down + residual,
    lm_head) gives the step without it, logits and next state (fp32); the drafter's long-K fc runs outside this
    step, through eaglespec.kernels.onednn."""
    from eaglespec.draft.fast import StaticKV
    from eaglespec.draft.fused import FusedEagle3Step

    from conftest import tiny_drafter, tiny_target

    model = tiny_target("llama", seed=1)
    d = tiny_drafter(model, seed=4)
    size, rows = 48, 5
    torch.manual_seed(0)
    at = d.midlayer.self_attn
    k = torch.randn(1, at.kv_heads, size, at.head_dim)
    v = torch.randn_like(k)
    slots = torch.arange(17, 17 + rows)
    state, tokens = torch.randn(rows, d.cfg.hidden_size), torch.randint(0, d.cfg.vocab_size, (rows,))
    positions, visible = torch.tensor([3, 9, 9, 12, 16]), torch.rand(rows, 32) < 0.6
    visible[torch.arange(rows), slots] = True
    with torch.no_grad():
        ref = FusedEagle3Step(d, size, kernels=True)(state, tokens, positions,
                                                     [StaticKV(k.clone(), v.clone(), slots, 32)], visible)
        calls = _force_skinny(monkeypatch)
        got = FusedEagle3Step(d, size, kernels=True)(state, tokens, positions,
                                                     [StaticKV(k.clone(), v.clone(), slots, 32)], visible)
    torch.testing.assert_close(got[0], ref[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=1e-5)
    assert calls == {"plain": 3, "residual": 2}
