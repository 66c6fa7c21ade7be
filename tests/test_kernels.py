"""The step kernels (eaglespec.kernels.step) under Triton's CPU interpreter (TRITON_INTERPRET=1, set by conftest).

Bitwise against their torch references where the interpreter can be: rope + KV write in fp32 and bf16; the
RMSNorm in fp32 and bf16 on inputs whose sum of squares is exact in any order (the interpreter sums in numpy's
order, torch's CPU sum vectorised: random fp32 inputs differ by several ulps, so they get a tolerance); silu * up bitwise
against the same arithmetic with numpy's exp (the interpreter's), and within 4 fp32 ulps / 1 bf16 ulp of F.silu
(torch's CPU silu is a SLEEF-vectorised expression, not x / (1 + exp(-x)) with any exp numpy has).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from eaglespec import kernels
from eaglespec.backends.fast import FastTarget, _rope_table, make_target
from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.errors import EagleSpecError
from eaglespec.kernels import step as K
from eaglespec.tree.core import TreeSpec, ancestry

from conftest import reference_greedy, tiny_drafter, tiny_target

DTYPES = [torch.float32, torch.bfloat16]


def count_calls(monkeypatch, *names: str, module=K, calls: dict[str, int] | None = None) -> dict[str, int]:
    """Wrap the named kernels of `module` (eaglespec.kernels.step by default) to count their calls into `calls` (a new
    dict unless given): {name: calls so far}."""
    calls = {} if calls is None else calls
    calls.update(dict.fromkeys(names, 0))
    for name in names:
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*args, **kw)

        monkeypatch.setattr(module, name, counted)
    return calls


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between a and b in units of the last place of their dtype."""
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    ai, bi = a.view(ints).long(), b.view(ints).long()
    ai = torch.where(ai < 0, -(ai & (2 ** (8 * a.element_size() - 1) - 1)), ai)  # sign-magnitude -> ordered
    bi = torch.where(bi < 0, -(bi & (2 ** (8 * b.element_size() - 1) - 1)), bi)
    return int((ai - bi).abs().max())


# -- the loader ---------------------------------------------------------------------------------------------
def test_the_loader_jits_once_per_interpreter_setting(monkeypatch):
    """kernels.jit jits a module's kernels on first use, keeps them while TRITON_INTERPRET stays as it is, and jits
    them again (from the plain functions) after it changed, the shared helpers with them."""
    K._load()
    kernel, helper = K._rms_norm_weight_kernel, K._round
    K._load()
    assert K._rms_norm_weight_kernel is kernel and K._round is helper
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    K._load()
    assert K._rms_norm_weight_kernel is not kernel and K._round is not helper
    assert type(K._rms_norm_weight_kernel).__name__ == "JITFunction"  # compiled mode (not run here: CPU)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    x, w = torch.randn(2, 40), torch.randn(40)
    assert torch.equal(K.rms_norm_weight(x, w, 1e-5), K.rms_norm_weight(x, w, 1e-5))  # interpreted again
    assert type(K._rms_norm_weight_kernel).__name__ == "InterpretedFunction"


# -- rms_norm_weight ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 32), (7, 100)])  # a power of two, and a row the block masks
def test_rms_norm_weight_bitwise_on_exact_sums(dtype, rows, n):
    """Inputs k/8 (|k| <= 64): every partial sum of squares is exact, so any summation order gives the same
    mean; the rest (rsqrt, the cast of the normalised x, the weight product rounded once) must be bitwise."""
    gen = torch.Generator().manual_seed(rows * 1000 + n)
    x = (torch.randint(-64, 65, (rows, n), generator=gen) / 8).to(dtype)
    w = torch.randn(n, generator=gen).to(dtype)
    out = K.rms_norm_weight(x, w, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, K.rms_norm_weight_ref(x, w, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_weight_random_inputs_within_a_few_ulps(dtype):
    """Random inputs: the summation order (the interpreter's tl.reduce is numpy's sum, torch's CPU sum is
    vectorised) moves the mean by a few ulps, which moves rsqrt, x * r and the product as much."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 3, 200, generator=gen) * 3).to(dtype)  # 3-d: rows flattened
    w = torch.randn(200, generator=gen).to(dtype)
    out, ref = K.rms_norm_weight(x, w, 1e-6), K.rms_norm_weight_ref(x, w, 1e-6)
    assert out.shape == ref.shape
    assert _ulps_apart(out, ref) <= (16 if dtype == torch.float32 else 1)
    if dtype == torch.bfloat16:  # a 1-ulp fp32 difference seldom moves a bf16 rounding
        assert (out == ref).float().mean() > 0.999


def test_rms_norm_weight_rounds_the_normalised_x_before_the_weight():
    """bf16: round(round(x * r) * w), not round(x * r * w) (HF's weight * hidden.to(dtype))."""
    x = torch.full((1, 4), 1.0, dtype=torch.bfloat16)
    x[0, 0] = 3.0  # r = 1/sqrt(3) -> x * r = 1.7320.. rounds to 1.734375 in bf16
    w = torch.full((4,), 1.0 + 2 ** -7, dtype=torch.bfloat16)
    out = K.rms_norm_weight(x, w, 0.0)
    assert torch.equal(out, K.rms_norm_weight_ref(x, w, 0.0))
    once = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True)) * w.float()).to(torch.bfloat16)
    assert not torch.equal(out, once)  # the inputs tell the two roundings apart


# -- eagle3_input -------------------------------------------------------------------------------------------
def _eagle3_input_case(dtype, rows, n, seed, emb_dtype=None, exact=True):
    gen = torch.Generator().manual_seed(seed)
    if exact:  # k/8: sums of squares exact in any order (as the RMSNorm tests above)
        table, state = (torch.randint(-64, 65, shape, generator=gen) / 8 for shape in ((50, n), (rows, n)))
    else:
        table, state = (torch.randn(shape, generator=gen) * 3 for shape in ((50, n), (rows, n)))
    in_norm, hidden_norm = (1 + 0.5 * torch.randn(n, generator=gen)).to(dtype), torch.randn(n, generator=gen).to(dtype)
    tokens = torch.randint(0, 50, (rows,), generator=gen)
    return tokens, table.to(emb_dtype or dtype), state.to(dtype), in_norm, hidden_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 32), (7, 100)])
def test_eagle3_input_bitwise_on_exact_sums(dtype, rows, n):
    tokens, table, state, in_norm, hidden_norm = _eagle3_input_case(dtype, rows, n, seed=rows * 1000 + n)
    x = K.eagle3_input(tokens, table, state, in_norm, hidden_norm, 1e-5)
    ref = K.eagle3_input_ref(tokens, table, state, in_norm, hidden_norm, 1e-5)
    assert x.shape == (rows, 2 * n) and x.dtype == dtype and x.is_contiguous()
    assert torch.equal(x, ref)
    # each half is the one kernel RMSNorm of its input (embedding first), and the comparison tells them apart:
    assert torch.equal(x[:, :n], K.rms_norm_weight(table[tokens], in_norm, 1e-5))
    assert torch.equal(x[:, n:], K.rms_norm_weight(state, hidden_norm, 1e-5))
    assert not torch.equal(x, torch.cat([ref[:, n:], ref[:, :n]], dim=-1))
    assert not torch.equal(x, K.eagle3_input_ref(tokens, table, state, hidden_norm, in_norm, 1e-5))
    assert not torch.equal(x, K.eagle3_input_ref(tokens.flip(0) if rows > 1 else tokens + 1, table, state,
                                                 in_norm, hidden_norm, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_eagle3_input_random_inputs_strided(dtype):
    """Random inputs (the summation order: a few ulps, as rms_norm_weight), a strided state and tokens view."""
    tokens, table, state, in_norm, hidden_norm = _eagle3_input_case(dtype, 8, 200, seed=1, exact=False)
    tokens, state = tokens[::2], state[::2, :]  # row strides 2 and 2 * 200
    x = K.eagle3_input(tokens, table, state, in_norm, hidden_norm, 1e-6)
    ref = K.eagle3_input_ref(tokens, table, state, in_norm, hidden_norm, 1e-6)
    assert x.shape == (4, 400)
    assert _ulps_apart(x, ref) <= (16 if dtype == torch.float32 else 1)
    if dtype == torch.bfloat16:
        assert (x == ref).float().mean() > 0.999


def test_eagle3_input_casts_the_embedding_like_torch():
    """An fp32 embedding (the target's) for a bf16 drafter: the rows are rounded to bf16 (nearest even, as .to)
    before the norm, not normalised in fp32."""
    tokens, table, state, in_norm, hidden_norm = _eagle3_input_case(torch.bfloat16, 7, 200, seed=2,
                                                                    emb_dtype=torch.float32, exact=False)
    x = K.eagle3_input(tokens, table, state, in_norm, hidden_norm, 1e-6)
    assert torch.equal(x, K.eagle3_input(tokens, table.to(torch.bfloat16), state, in_norm, hidden_norm, 1e-6))
    unrounded = (in_norm.float() * F.rms_norm(table[tokens], (200,), eps=1e-6)).to(torch.bfloat16)
    assert not torch.equal(x[:, :200], unrounded)
    assert _ulps_apart(x, K.eagle3_input_ref(tokens, table, state, in_norm, hidden_norm, 1e-6)) <= 1


# -- rope_qk_kv_write ----------------------------------------------------------------------------------------
def _rope_case(dtype, b, hq, hk, d, seed, contiguous_qk=False):
    gen = torch.Generator().manual_seed(seed)
    slots = 40
    angles = torch.arange(slots)[:, None] * torch.rand(d // 2, generator=gen)[None] * 3
    emb = torch.cat([angles, angles], dim=-1)
    table = _rope_table(emb.cos().to(dtype), emb.sin().to(dtype))  # [S, 2, 2, D/2], as fast.py builds it
    qkv = (torch.randn(b, (hq + 2 * hk) * d, generator=gen) * 2).to(dtype)
    qk, v = qkv.view(b, hq + 2 * hk, d).split([hq + hk, hk], dim=1)  # strided views, as in _step
    if contiguous_qk:  # Qwen3: qk comes out of the q/k norm as a new tensor
        qk = qk.contiguous()
    positions = torch.randint(0, slots, (b,), generator=gen)  # any order (tree depths)
    base = torch.tensor(5 + seed % 7)
    cache = torch.randn(2, hk, 24, d, generator=gen).to(dtype)
    return qk, v, table, positions, base, cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b,heads", [(1, (6, 2, 32)), (3, (4, 4, 16)), (5, (6, 1, 40))])  # GQA, MHA, MQA + D/2=20
def test_rope_qk_kv_write_bitwise(dtype, b, heads):
    hq, hk, d = heads
    for contiguous_qk in (False, True):
        qk, v, table, positions, base, cache = _rope_case(dtype, b, hq, hk, d, seed=b + d, contiguous_qk=contiguous_qk)
        ref_cache = cache.clone()
        q = K.rope_qk_kv_write(qk, v, table, positions, base, cache[0, :, :20], cache[1, :, :20])  # span views
        q_ref = K.rope_qk_kv_write_ref(qk, v, table, positions, base, ref_cache[0, :, :20], ref_cache[1, :, :20])
        assert q.shape == (b, hq // hk, hk, d) and q.is_contiguous()  # the grouped layout [B, G, Hkv, D]
        assert torch.equal(q, q_ref)
        assert torch.equal(cache, ref_cache)  # k, v at base..base+b-1, every other slot untouched
        assert not torch.equal(cache[0, :, int(base)], cache[1, :, int(base)])


@pytest.mark.parametrize("kernel", ["triton", "ref"])
def test_rope_writes_q_in_the_grouped_layout(kernel):
    """q[t, r, j] is HF head j*G + r of token t, rotated (each head checked on its own against _rope with that
    token's table row), G = 3 != Hkv = 2 so a swapped (r, j) or a head-major q shows."""
    from eaglespec.backends.fast import _rope

    b, hq, hk, d = 4, 6, 2, 32
    qk, v, table, positions, base, cache = _rope_case(torch.float32, b, hq, hk, d, seed=3)
    fn = K.rope_qk_kv_write if kernel == "triton" else K.rope_qk_kv_write_ref
    q = fn(qk, v, table, positions, base, cache[0], cache[1])
    g = hq // hk
    assert q.shape == (b, g, hk, d) and q.is_contiguous()
    for t in range(b):
        for h in range(hq):
            assert torch.equal(q[t, h % g, h // g], _rope(qk[t, h], table[positions[t]]))


def test_rope_kv_write_goes_to_the_slots_after_base():
    qk, v, table, positions, base, cache = _rope_case(torch.float32, 3, 4, 2, 32, seed=1)
    cache.zero_()
    K.rope_qk_kv_write(qk, v, table, positions, base, cache[0], cache[1])
    written = cache.abs().sum(dim=(0, 1, 3)) > 0  # [S]
    assert written.nonzero().flatten().tolist() == [int(base), int(base) + 1, int(base) + 2]
    assert torch.equal(cache[1, :, int(base):int(base) + 3], v.transpose(0, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,W,heads", [(1, 1, (6, 2, 32)), (3, 4, (6, 2, 32)), (2, 3, (4, 4, 16))])
def test_rope_qk_kv_write_rows_bitwise(dtype, B, W, heads):
    """The batched kernel equals its torch reference bitwise: q in the [B, Hkv, W*G, D] layout, each sequence's k
    and v at its own slots of its own cache row (distinct per row, not base + t), every other slot untouched."""
    hq, hk, d = heads
    qk, v, table, _, _, _ = _rope_case(dtype, B * W, hq, hk, d, seed=B + W)
    gen = torch.Generator().manual_seed(B * 10 + W)
    positions = torch.randint(0, table.shape[0], (B * W,), generator=gen)
    slots = torch.stack([torch.randperm(20, generator=gen)[:W] for _ in range(B)])  # [B, W]
    cache = torch.randn(2, B + 1, hk, 24, d, generator=gen).to(dtype)  # a spare row: a view of the first B
    ref = cache.clone()
    q = K.rope_qk_kv_write_rows(qk, v, table, positions, slots, cache[0, :B, :, :20], cache[1, :B, :, :20])
    q_ref = K.rope_qk_kv_write_rows_ref(qk, v, table, positions, slots, ref[0, :B, :, :20], ref[1, :B, :, :20])
    assert q.shape == (B, hk, W * (hq // hk), d) and q.is_contiguous()
    assert torch.equal(q, q_ref) and torch.equal(cache, ref)
    g = hq // hk
    for b in range(B):  # the layout: query row w*G + r of kv head j is HF head j*G + r of row w
        for w in range(W):
            t = b * W + w
            assert torch.equal(cache[1, b, :, int(slots[b, w])], v[t])
            for h in range(hq):
                assert torch.equal(q[b, h // g, w * g + h % g], K.rope_qk_kv_write_ref(
                    qk[t: t + 1], v[t: t + 1], table, positions[t: t + 1], torch.tensor(0),
                    torch.zeros(hk, 1, d, dtype=dtype), torch.zeros(hk, 1, d, dtype=dtype))[0, h % g, h // g])


# -- silu_mul ---------------------------------------------------------------------------------------------
def _silu_mul_numpy_exp(gate_up: torch.Tensor) -> torch.Tensor:
    """The kernel's arithmetic in torch, with the interpreter's exp (numpy's): round(round(g / (1 + e)) * up)."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    e = torch.from_numpy(np.exp(-gate.contiguous().numpy()))
    silu = (gate / (1 + e)).to(gate_up.dtype).float()
    return (silu * up).to(gate_up.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 100), (3, 1536)])  # 1536: two blocks of 1024, the second one half masked
def test_silu_mul(dtype, rows, n):
    gen = torch.Generator().manual_seed(rows * 7 + n)
    gate_up = (torch.randn(rows, 2 * n, generator=gen) * 4).to(dtype)
    out = K.silu_mul(gate_up)
    assert out.shape == (rows, n) and out.dtype == dtype
    assert torch.equal(out, _silu_mul_numpy_exp(gate_up))
    ref = K.silu_mul_ref(gate_up)
    assert _ulps_apart(out, ref) <= (4 if dtype == torch.float32 else 1)


def test_silu_mul_rounds_silu_before_the_product():
    """bf16: round(round(silu(g)) * up) (torch's act(gate) * up), not round(silu(g) * up)."""
    gen = torch.Generator().manual_seed(0)
    gate_up = (torch.randn(4, 256, generator=gen) * 4).to(torch.bfloat16)
    gate, up = gate_up.float().chunk(2, dim=-1)
    once = (gate * torch.sigmoid(gate) * up).to(torch.bfloat16)
    out = K.silu_mul(gate_up)
    assert not torch.equal(out, once)
    assert torch.equal(out, _silu_mul_numpy_exp(gate_up))


# -- FastTarget(fused_kernels=True) --------------------------------------------------------------------------
def _close(a, b, atol=1e-5) -> None:
    torch.testing.assert_close(a.logits, b.logits, atol=atol, rtol=0)
    torch.testing.assert_close(a.features, b.features, atol=atol, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # Qwen3: q/k norms (a contiguous qk), head_dim 8
def test_fused_target_matches_unfused_and_hf(arch):
    """Prefill (eager, beyond the buckets), a tree with a mask, a non-prefix commit, a causal step: fused ==
    unfused == HF in fp32 (to rounding: the fused RMSNorm sums in another order)."""
    model = tiny_target(arch, seed=5, layers=2)
    ids = (0, 1, 2)
    ref, plain = HFTarget(model, ids), FastTarget(model, ids, max_len=64, buckets=(1, 4, 8))
    fused = FastTarget(model, ids, max_len=64, buckets=(1, 4, 8), fused_kernels=True)
    backends = (ref, plain, fused)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 90, (11,), generator=gen)
    outs = [t.forward(prompt) for t in backends]
    _close(outs[0], outs[2])
    _close(outs[1], outs[2], atol=2e-6)
    for t in backends:
        t.commit(torch.arange(11))
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3])
    depths = torch.tensor([0, 1, 1, 2, 2, 2, 3])
    toks = torch.randint(3, 90, (7,), generator=gen)
    outs = [t.forward(toks, depths, ancestry(parents)) for t in backends]
    _close(outs[0], outs[2])
    _close(outs[1], outs[2], atol=2e-6)
    for t in backends:
        t.commit(torch.tensor([0, 2, 5]))  # a non-prefix path: the fused KV write must hold the right rows
    toks = torch.randint(3, 90, (1,), generator=gen)
    outs = [t.forward(toks) for t in backends]
    _close(outs[0], outs[2])
    _close(outs[1], outs[2], atol=2e-6)
    assert torch.allclose(fused.cache, plain.cache, atol=2e-6, rtol=0)


@pytest.mark.parametrize("b,base,span", [(1, 0, 1), (7, 11, 64), (5, 3, 2500)])  # 2500: three 1024-slot programs
def test_block_mask_is_the_steps_mask(b, base, span):
    """block_mask: the committed slots below base, then the [B, B] block, nothing after."""
    gen = torch.Generator().manual_seed(b + base)
    visible = torch.rand(b, b, generator=gen) > 0.5
    base_t, cols = torch.tensor(base), torch.arange(span)
    got = K.block_mask(visible, base_t, cols)
    ref = K.block_mask_ref(visible, base_t, cols)
    assert got.dtype == torch.bool and torch.equal(got, ref)
    assert bool(got[:, :base].all()) and not bool(got[:, base + b:].any())
    assert torch.equal(got[:, base:base + b], visible)


def test_fused_step_calls_each_kernel_once_per_layer(monkeypatch):
    """The fused path: 2L + 1 RMSNorms, L rope/KV writes, L silu * up and one block_mask per step; the masks it builds
    are block_mask_ref's (the same logits with the reference in its place)."""
    model = tiny_target("qwen3", seed=2, layers=2)
    fused = FastTarget(model, (0, 2), max_len=64, fused_kernels=True)
    calls = count_calls(monkeypatch, "rms_norm_weight", "rope_qk_kv_write", "silu_mul", "block_mask")
    out = fused.forward(torch.tensor([5, 6, 7]))
    layers = fused.num_layers
    assert calls == {"rms_norm_weight": 2 * layers + 1, "rope_qk_kv_write": layers, "silu_mul": layers,
                     "block_mask": 1}
    monkeypatch.setattr(K, "block_mask", K.block_mask_ref)
    again = FastTarget(model, (0, 2), max_len=64, fused_kernels=True).forward(torch.tensor([5, 6, 7]))
    assert torch.equal(out.logits, again.logits) and torch.equal(out.features, again.features)


def test_fused_gqa_head_order_tree_step_matches_hf():
    """The Triton rope's q layout, the mask rows and the permuted o_proj agree on one head order: a multi-row tree
    step of a model with G = 3 and Hkv = 2 equals HF's."""
    from test_fast_backend import _gqa_target

    model = _gqa_target(6, 2)
    ref, fused = HFTarget(model, (1, 3)), FastTarget(model, (1, 3), max_len=64, buckets=(8,), fused_kernels=True)
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randint(3, 90, (9,), generator=gen)
    _close(ref.forward(prompt), fused.forward(prompt))
    for t in (ref, fused):
        t.commit(torch.arange(9))
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 4])
    toks = torch.randint(3, 90, (7,), generator=gen)
    depths, vis = torch.tensor([0, 1, 1, 2, 2, 2, 3]), ancestry(parents)
    _close(ref.forward(toks, depths, vis), fused.forward(toks, depths, vis))


def test_fused_step_attends_with_the_attention_kernel(monkeypatch):
    """With the kernels the target's and the drafter's steps attend through attention.masked_attention, once per
    layer, and never call SDPA; without them SDPA (and the outputs agree)."""
    from eaglespec.draft.fast import StaticKV
    from eaglespec.draft.fused import FusedEagle3Step
    from eaglespec.kernels import attention as A

    model = tiny_target("llama", seed=2)
    sdpa = count_calls(monkeypatch, "scaled_dot_product_attention", module=torch.nn.functional)
    calls = count_calls(monkeypatch, "masked_attention", module=A)
    fused = FastTarget(model, max_len=64, fused_kernels=True)
    prompt = torch.tensor([5, 6, 7, 8])
    out = fused.forward(prompt).logits
    assert calls["masked_attention"] == fused.num_layers and sdpa["scaled_dot_product_attention"] == 0
    d = tiny_drafter(model, seed=3)
    size, span, slots, k, v, state, tokens, positions, visible = _draft_step_inputs(d, torch.float32)
    cache = [StaticKV(k.clone(), v.clone(), slots, span)]
    FusedEagle3Step(d, size, kernels=True)(state, tokens, positions, cache, visible)
    assert calls["masked_attention"] == fused.num_layers + 1 and sdpa["scaled_dot_product_attention"] == 0
    plain = FastTarget(model, max_len=64)
    assert plain._attn is None and FusedEagle3Step(d, size).attn is None
    torch.testing.assert_close(plain.forward(prompt).logits, out, rtol=1e-5, atol=1e-5)
    assert calls["masked_attention"] == fused.num_layers + 1 and sdpa["scaled_dot_product_attention"] > 0


def test_fused_target_keeps_other_activations_on_torch(monkeypatch):
    """silu_mul is SiLU only: a gelu Llama must still run its own activation (and match HF)."""
    import transformers as tf

    torch.manual_seed(3)
    cfg = tf.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, hidden_act="gelu", tie_word_embeddings=False)
    model = tf.LlamaForCausalLM(cfg).eval()
    monkeypatch.setattr(K, "silu_mul", lambda *a: pytest.fail("silu_mul on a gelu model"))
    ref, fused = HFTarget(model, (1,)), FastTarget(model, (1,), max_len=64, fused_kernels=True)
    prompt = torch.tensor([3, 9, 27, 81, 4])
    _close(ref.forward(prompt), fused.forward(prompt))


def test_fused_greedy_engine_matches_generate():
    model = tiny_target("llama", seed=7)
    engine = SpeculativeEngine(FastTarget(model, max_len=64, fused_kernels=True), tiny_drafter(model, seed=3),
                               TreeSpec("chain", depth=3))
    prompt = [5, 17, 33, 2 + 60, 8]
    out = engine.generate(prompt, max_new_tokens=8)
    assert out.token_ids == reference_greedy(model, prompt, 8)


def test_fused_bf16_target_close_to_unfused():
    """bf16 on CPU: the same GEMMs either way; only the RMSNorm's summation order and the exp differ."""
    model = tiny_target("llama", seed=4, layers=2).to(torch.bfloat16)
    plain = FastTarget(model, (2,), max_len=64)
    fused = FastTarget(model, (2,), max_len=64, fused_kernels=True)
    prompt = torch.randint(3, 90, (9,), generator=torch.Generator().manual_seed(2))
    a, b = plain.forward(prompt), fused.forward(prompt)
    assert (a.logits.float() - b.logits.float()).abs().max() < 0.1
    assert torch.equal(a.logits.argmax(-1), b.logits.argmax(-1))


def test_fused_kernels_refused_when_unavailable_or_compiled(monkeypatch):
    model = tiny_target("llama", seed=1, layers=2)
    with pytest.raises(EagleSpecError, match="compile"):
        FastTarget(model, max_len=64, fused_kernels=True, compile=True)
    monkeypatch.delenv("TRITON_INTERPRET")  # CPU without the interpreter
    assert not kernels.available("cpu")
    with pytest.raises(EagleSpecError, match="fused_kernels"):
        FastTarget(model, max_len=64, fused_kernels=True)


def test_the_kernels_are_on_by_default_on_cuda_only(monkeypatch):
    """Where a component is given no `kernels`: on for CUDA devices where triton imports and its interpreter is
    off, off elsewhere (the interpreter runs CPU tensors and is asked for explicitly); make_target's fused_kernels
    likewise, and off when compiling (torch.compile makes its own kernels). An explicit fused_kernels wins."""
    from eaglespec.backends.fast import fused_by_default

    assert kernels.available("cpu")  # the interpreter
    assert not kernels.on_by_default("cpu") and not kernels.on_by_default("cuda")
    monkeypatch.setattr(kernels, "_importable", lambda: True)
    with monkeypatch.context() as off:
        off.setattr(kernels, "interpreted", lambda: False)
        assert kernels.on_by_default("cuda") and fused_by_default(torch.device("cuda"))
        assert not fused_by_default(torch.device("cuda"), compile=True) and not fused_by_default(torch.device("cpu"))
    model = tiny_target("llama", seed=1, layers=2)
    assert make_target(model, "fast", max_len=64)._kernels is None
    assert make_target(model, "fast", max_len=64, fused_kernels=True)._kernels is K
    assert isinstance(make_target(model, "hf"), HFTarget)
    monkeypatch.setattr(kernels, "_importable", lambda: False)  # no triton: off, no error
    assert not kernels.available("cuda") and not kernels.on_by_default("cuda")


# -- the drafter's fused step (draft/fused.py) with the kernels --------------------------------------------
def _draft_step_inputs(d, dtype: torch.dtype) -> tuple:
    """A seeded 5-row step of EAGLE-3 drafter d: (KV size 48, span 32, slots 17..21, k and v [1, Hkv, 48, D],
    state [5, H], tokens, positions (tree rows share depths), visible [5, 32] with each row's own slot)."""
    at = d.midlayer.self_attn
    rows, size, span = 5, 48, 32
    torch.manual_seed(0)
    slots = torch.arange(17, 17 + rows)
    k = torch.randn(1, at.kv_heads, size, at.head_dim).to(dtype)
    v = torch.randn_like(k)
    state = torch.randn(rows, d.cfg.hidden_size).to(dtype)
    tokens, positions = torch.randint(0, d.cfg.vocab_size, (rows,)), torch.tensor([3, 9, 9, 12, 16])
    visible = torch.rand(rows, span) < 0.6
    visible[torch.arange(rows), slots] = True
    return size, span, slots, k, v, state, tokens, positions, visible


@pytest.mark.parametrize("dtype,norm_before_residual,embedding", [
    (torch.float32, False, "target"), (torch.bfloat16, True, "target"), (torch.bfloat16, False, "target-in-dtype"),
    (torch.float32, True, "own"), (torch.float32, False, "subclass")])
def test_fused_draft_step_kernels_match_its_torch_path(dtype, norm_before_residual, embedding, monkeypatch):
    """FusedEagle3Step(kernels=True) == (kernels=False): the rope + KV write bitwise (same rows, same slots),
    logits and states within the RMSNorm's summation order (fp32) / a few bf16 ulps. The input (embedding,
    its cast, both norms, the cat) is one eagle3_input kernel for a plain nn.Embedding (the fp32 target's one
    cast to a bf16 drafter's dtype in the kernel), the 4-kernel path for an Embedding subclass."""
    from eaglespec.draft.fast import StaticKV
    from eaglespec.draft.fused import FusedEagle3Step

    model = tiny_target("llama", seed=1)
    d = tiny_drafter(model, seed=4, norm_before_residual=norm_before_residual).to(dtype)
    with torch.no_grad():  # norm weights away from ones, and apart: a swapped or dropped one shows
        for n, p in d.named_parameters():
            if "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    target_embed = model.get_input_embeddings()
    if embedding == "target-in-dtype":
        d.set_target_embedding(torch.nn.Embedding.from_pretrained(target_embed.weight.detach().to(dtype)))
    elif embedding == "own":
        d.embed_tokens = torch.nn.Embedding.from_pretrained(target_embed.weight.detach().flip(0).to(dtype))
    elif embedding == "subclass":
        class Scaled(torch.nn.Embedding):
            def forward(self, ids):
                return super().forward(ids) * 2.0

        d.set_target_embedding(Scaled.from_pretrained(target_embed.weight.detach()))
    size, span, slots, k, v, state, tokens, positions, visible = _draft_step_inputs(d, dtype)
    state_before = state.clone()
    calls = count_calls(monkeypatch, "eagle3_input", "rms_norm_weight")
    outs, kvs = [], []
    for on in (False, True):
        cache = [StaticKV(k.clone(), v.clone(), slots, span)]
        with torch.no_grad():
            outs.append(FusedEagle3Step(d, size, kernels=on)(state, tokens, positions, cache, visible))
        kvs.append(cache[0])
    fused_input = embedding != "subclass"
    assert calls == ({"eagle3_input": 1, "rms_norm_weight": 2} if fused_input
                     else {"eagle3_input": 0, "rms_norm_weight": 4})
    # k rows are rope(x @ Wk): equal up to the RMSNorm's order in x; v rows likewise; untouched slots identical
    untouched = torch.ones(size, dtype=torch.bool)
    untouched[slots] = False
    assert torch.equal(kvs[0].k[:, :, untouched], kvs[1].k[:, :, untouched])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.05, atol=0.05)
    torch.testing.assert_close(kvs[1].k, kvs[0].k, **tol)
    torch.testing.assert_close(kvs[1].v, kvs[0].v, **tol)
    for a, b in zip(outs[0], outs[1]):
        torch.testing.assert_close(b.float(), a.float(), **tol)
    assert torch.equal(state, state_before)  # the caller's state is read, never written


@pytest.mark.parametrize("dtype,layers", [(torch.float32, 2), (torch.bfloat16, 1)])
def test_fused_eagle1_step_kernels_match_its_torch_path(dtype, layers, monkeypatch):
    """FusedEagle1Step(kernels=True) == (kernels=False): every layer's KV rows, the logits and the state within the
    RMSNorm's summation order (fp32) / a few bf16 ulps; one rope + KV write and one silu * up per layer, and
    2L - 1 RMSNorms (layer 0 has no input norm); the caller's state unchanged, every other KV slot untouched."""
    from eaglespec.draft.eagle1 import Eagle1Drafter
    from eaglespec.draft.fast import StaticKV
    from eaglespec.draft.fused import FusedEagle1Step

    from conftest import tiny_draft_config

    calls = count_calls(monkeypatch, "rms_norm_weight", "rope_qk_kv_write", "silu_mul")
    model = tiny_target("llama", seed=1)
    torch.manual_seed(4)
    d = Eagle1Drafter(tiny_draft_config(model, method="eagle1", aux_layer_ids=(), num_hidden_layers=layers)).eval()
    SpeculativeEngine(HFTarget(model), d)  # wiring: embedding, final norm + lm_head
    d = d.to(dtype)
    with torch.no_grad():
        for n, p in d.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(0.3 * torch.randn_like(p))
    rows, size, span = 5, 48, 32
    torch.manual_seed(0)
    slots = torch.arange(17, 17 + rows)
    ks = [torch.randn(1, layer.self_attn.kv_heads, size, layer.self_attn.head_dim).to(dtype) for layer in d.layers]
    vs = [torch.randn_like(k) for k in ks]
    state = torch.randn(rows, d.cfg.hidden_size).to(dtype)
    state_before = state.clone()
    tokens, positions = torch.randint(0, d.cfg.vocab_size, (rows,)), torch.tensor([3, 9, 9, 12, 16])
    visible = torch.rand(rows, span) < 0.6
    visible[torch.arange(rows), slots] = True
    outs, caches = [], []
    for on in (False, True):
        cache = [StaticKV(k.clone(), v.clone(), slots, span) for k, v in zip(ks, vs)]
        with torch.no_grad():
            outs.append(FusedEagle1Step(d, size, kernels=on)(state, tokens, positions, cache, visible))
        caches.append(cache)
    assert calls == {"rms_norm_weight": 2 * layers - 1, "rope_qk_kv_write": layers, "silu_mul": layers}
    assert torch.equal(state, state_before)  # the caller's state is read, never written
    untouched = torch.ones(size, dtype=torch.bool)
    untouched[slots] = False
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.05, atol=0.05)
    for a, b in zip(*caches):
        assert torch.equal(a.k[:, :, untouched], b.k[:, :, untouched])
        assert torch.equal(a.v[:, :, untouched], b.v[:, :, untouched])
        torch.testing.assert_close(b.k, a.k, **tol)
        torch.testing.assert_close(b.v, a.v, **tol)
    for a, b in zip(outs[0], outs[1]):
        torch.testing.assert_close(b.float(), a.float(), **tol)
