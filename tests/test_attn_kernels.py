"""The masked GQA attention kernel (eaglespec.kernels.attention) under Triton's CPU interpreter (TRITON_INTERPRET=1,
set by conftest), fp32, against the SDPA call it replaces (masked_attention_ref: the grouped additive mask):
one-row decoding, a tree after a prefix as the fast target's step builds `allowed`, spans that are no multiple of
the tile, kv_len (columns past it masked and never read: NaN there changes nothing), cache views, G = 1 and 3,
several row blocks, the flash-decoding split. bf16 only on CUDA (the interpreter cannot do bf16 arithmetic)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

from eaglespec.kernels import attention as A
from eaglespec.tree.core import ancestry

D = 64
SCALE = D ** -0.5


def _qkv(b: int, g: int, hk: int, span: int, seed: int, cache_len: int | None = None, dtype=torch.float32,
         device: str = "cpu", d: int = D) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [1, Hkv, B*G, D] as the step's transposed view of [B, G, Hkv, D]; k, v [1, Hkv, span, D]: narrowed
    views of a [2, Hkv, cache_len, D] cache when cache_len is given, else contiguous."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, g, hk, d, generator=gen).to(device, dtype).reshape(1, b * g, hk, d).transpose(1, 2)
    if cache_len is None:
        k, v = (torch.randn(1, hk, span, d, generator=gen).to(device, dtype) for _ in range(2))
    else:
        cache = torch.randn(2, hk, cache_len, d, generator=gen).to(device, dtype)
        k, v = cache[0].narrow(1, 0, span)[None], cache[1].narrow(1, 0, span)[None]
    return q, k, v


def _tree_allowed(b: int, base: int, span: int, seed: int) -> torch.Tensor:
    """fast._step's allowed [B, span]: the prefix slots 0..base-1, then a random tree's ancestry block."""
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, b)])
    visible = ancestry(parents)
    rel = torch.arange(span) - base
    return (visible[:, rel.clamp(0, b - 1)] & (rel < b)) | (rel < 0)


def _check(q, k, v, allowed, kv_len=None, **kw) -> torch.Tensor:
    out = A.masked_attention(q, k, v, allowed, SCALE, kv_len, **kw)
    ref = A.masked_attention_ref(q, k, v, allowed, SCALE, kv_len)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    return out


@pytest.mark.parametrize("g", [1, 3])
def test_one_row_decode(g):
    """B = 1: all columns below n allowed, as a mask and as kv_len (then the mask is all True)."""
    span, n = 256, 201
    q, k, v = _qkv(1, g, 3, span, seed=g)
    cols = torch.arange(span)
    _check(q, k, v, (cols < n)[None])
    _check(q, k, v, torch.ones(1, span, dtype=torch.bool), torch.tensor([n]))


@pytest.mark.parametrize("g", [1, 3])
def test_tree_after_a_prefix(g):
    """A 7-row tree after 150 committed slots; kv_len = base + B as well (the same allowed columns)."""
    b, base, span = 7, 150, 256
    q, k, v = _qkv(b, g, 3, span, seed=10 + g)
    allowed = _tree_allowed(b, base, span, seed=g)
    _check(q, k, v, allowed)
    _check(q, k, v, allowed, torch.tensor(base + b))


@pytest.mark.parametrize("span", [77, 200])
def test_span_not_a_multiple_of_the_tile(span):
    b = 3
    q, k, v = _qkv(b, 3, 2, span, seed=span)
    _check(q, k, v, _tree_allowed(b, span - 10, span, seed=span))
    _check(q, k, v, _tree_allowed(b, span - 10, span, seed=span), block_n=16)


def test_kv_len_masks_and_skips_the_columns_past_it():
    """Columns >= kv_len are masked though allowed, and NaN / inf written there changes nothing (never read)."""
    b, span, kv_len = 4, 256, 130
    q, k, v = _qkv(b, 3, 3, span, seed=3, cache_len=300)
    allowed = torch.ones(b, span, dtype=torch.bool)
    kv = torch.tensor([kv_len])
    clean = _check(q, k, v, allowed, kv)
    k[..., kv_len:, :] = float("nan")
    v[..., kv_len:, :] = float("inf")
    for splits in (1, 4):
        out = A.masked_attention(q, k, v, allowed, SCALE, kv, splits=splits)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, clean, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("g", [1, 3])
def test_cache_views_and_the_output_layout(g):
    """k, v narrowed from a bigger cache (strided), q the transposed [B, G, Hkv, D] view; the output is the
    transposed view of BMHK memory, as SDPA's CUDA kernels return it (fast._grouped_output: a view)."""
    b, span = 5, 200
    q, k, v = _qkv(b, g, 3, span, seed=20 + g, cache_len=513)
    assert not k.is_contiguous() and not q.is_contiguous()
    out = _check(q, k, v, _tree_allowed(b, 180, span, seed=4))
    assert out.transpose(1, 2).is_contiguous()


def test_several_row_blocks():
    """B*G = 45 rows in blocks of 16 (the last one partial) and of 32."""
    b, span = 15, 256
    q, k, v = _qkv(b, 3, 3, span, seed=7)
    allowed = _tree_allowed(b, 100, span, seed=7)
    _check(q, k, v, allowed, block_m=16)
    _check(q, k, v, allowed, torch.tensor([100 + b]), block_m=32)


@pytest.mark.parametrize("splits", [3, 8])
def test_flash_decoding_split(splits):
    """The span in shares combined by the second kernel; with kv_len some shares are empty (nothing allowed)."""
    b, span = 2, 512
    q, k, v = _qkv(b, 3, 3, span, seed=30 + splits)
    allowed = _tree_allowed(b, 300, span, seed=splits)
    _check(q, k, v, allowed, splits=splits)
    _check(q, k, v, allowed, torch.tensor([300 + b]), splits=splits)


@pytest.mark.parametrize("splits", [1, 2])
def test_a_row_with_no_allowed_column_gives_zeros(splits):
    b, span = 2, 128
    q, k, v = _qkv(b, 3, 3, span, seed=5)
    allowed = torch.ones(b, span, dtype=torch.bool)
    allowed[1] = False
    out = A.masked_attention(q, k, v, allowed, SCALE, splits=splits)
    assert torch.equal(out[:, :, 3:], torch.zeros_like(out[:, :, 3:]))
    torch.testing.assert_close(out[:, :, :3], A.masked_attention_ref(q, k, v, allowed, SCALE)[:, :, :3],
                               rtol=1e-5, atol=1e-5)


def test_default_scale_and_bad_shapes():
    b, span = 2, 64
    q, k, v = _qkv(b, 3, 3, span, seed=6)
    allowed = torch.ones(b, span, dtype=torch.bool)
    torch.testing.assert_close(A.masked_attention(q, k, v, allowed), A.masked_attention_ref(q, k, v, allowed),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError):
        A.masked_attention(q, k, v, torch.ones(4, span, dtype=torch.bool))  # 6 rows for 4 tokens
    with pytest.raises(ValueError):
        A.masked_attention(q, k[..., :32], v[..., :32], allowed)  # q's head dim is not k's


@pytest.mark.parametrize("d", [8, 48])
def test_head_dims_padded_in_the_tiles(d):
    """Head dims that are not a power of two >= 16 (tiny test models: 8; 48, 80, 96 in real ones) are padded in the
    tiles: the padding must not leak into the scores or the output."""
    b, span = 3, 96
    q, k, v = _qkv(b, 2, 3, span, seed=7, d=d)
    allowed = torch.rand(b, span, generator=torch.Generator().manual_seed(8)) < 0.7
    allowed[:, 0] = True
    for splits in (1, 2):
        torch.testing.assert_close(A.masked_attention(q, k, v, allowed, SCALE, splits=splits),
                                   A.masked_attention_ref(q, k, v, allowed, SCALE), rtol=1e-5, atol=1e-5)


_COMPILED = """
import torch
from eaglespec.kernels import attention as A
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
gen = torch.Generator().manual_seed(8)
b, g, hk, d, span, base = 9, 3, 3, 64, 512, 300
rel = torch.arange(span) - base
allowed = ((torch.rand(b, b, generator=gen) < 0.5).tril() | torch.eye(b, dtype=torch.bool))[:, rel.clamp(0, b - 1)]
allowed = ((allowed & (rel < b)) | (rel < 0)).cuda()
q = torch.randn(b, g, hk, d, generator=gen).reshape(1, b * g, hk, d).transpose(1, 2).cuda()
cache = torch.randn(2, hk, 600, d, generator=gen).cuda()
k, v = cache[0, None, :, :span], cache[1, None, :, :span]
kv_len = torch.tensor([base + b], device="cuda")
ref = A.masked_attention_ref(q, k, v, allowed, 0.125)
for splits in (1, 4):
    out = A.masked_attention(q, k, v, allowed, 0.125, kv_len, splits=splits)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    out = A.masked_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), allowed, 0.125, kv_len, splits=splits)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
print("ok")
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels and bf16 need a GPU")
def test_compiled_fp32_and_bf16_on_cuda():
    """The compiled kernels (a subprocess without the interpreter, which has no bf16 arithmetic): fp32 (TF32
    off) as tight as above, bf16 within bf16 rounding of the fp32 reference."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", _COMPILED], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


@pytest.mark.parametrize("splits", [1, 4])
def test_sequences_attend_to_their_own_kv(splits):
    """N sequences at once (the batched target): each over its own cache rows, mask and kv_len. Sequence n's output
    equals its one-sequence call, and changing another sequence's KV changes nothing in it (a kernel indexing the
    KV, the mask or kv_len of the wrong sequence fails both)."""
    n, b, g, hk, span = 3, 2, 2, 2, 200
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(n, b, g, hk, D, generator=gen).reshape(n, b * g, hk, D).transpose(1, 2)  # [N, Hkv, M, D]
    cache = torch.randn(2, n + 1, hk, span + 8, D, generator=gen)  # a spare row, slots past the span
    k, v = cache[0, :n, :, :span], cache[1, :n, :, :span]
    allowed = torch.stack([_tree_allowed(b, base, span, seed=i) for i, base in enumerate((40, 120, 150))])
    kv_len = torch.tensor([42, 122, 152])
    out = _check(q, k, v, allowed, kv_len, splits=splits)
    for i in range(n):
        alone = A.masked_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], allowed[i], SCALE, kv_len[i:i + 1],
                                   splits=splits)
        torch.testing.assert_close(out[i:i + 1], alone, rtol=1e-6, atol=1e-6)
    cache[:, 1] += 1.0  # sequence 1's KV
    again = A.masked_attention(q, k, v, allowed, SCALE, kv_len, splits=splits)
    torch.testing.assert_close(again[[0, 2]], out[[0, 2]], rtol=0, atol=0)
    assert not torch.allclose(again[1], out[1])
