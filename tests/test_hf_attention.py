"""backends/hf_attention.py: grouped_sdpa equals transformers' SDPA over a 4-D mask, without repeating the KV."""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends.hf_attention import grouped_attention
from eaglespec.draft.layers import additive_mask

from conftest import tiny_target


def _ragged_mask(B: int, T: int, past: int) -> torch.Tensor:
    """[B, 1, T, T] additive: causal, and row b's last T - past query rows hide its first b keys (ragged rows)."""
    seen = torch.ones(T, T, dtype=torch.bool).tril().repeat(B, 1, 1)
    for b in range(B):
        seen[b, past:, :b] = False
    return additive_mask(seen, torch.float32)[:, None]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_grouped_attention_equals_sdpa_and_copies_no_kv(arch, monkeypatch):
    from transformers.integrations import sdpa_attention

    model = tiny_target(arch, seed=0)
    B, W, past = 3, 4, 6
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 90, (B, past + W), generator=gen)
    mask = _ragged_mask(B, past + W, past)
    pos = torch.arange(past + W).expand(B, -1)
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits

        def no_repeat(*a, **kw):
            raise AssertionError("repeat_kv copied the KV")

        monkeypatch.setattr(sdpa_attention, "repeat_kv", no_repeat)
        with grouped_attention(model):
            got = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits
    assert model.config._attn_implementation == "sdpa"  # restored
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_attention_leaves_other_implementations():
    model = tiny_target("llama", seed=0, attn="eager")
    with grouped_attention(model):
        assert model.config._attn_implementation == "eager"


def test_grouped_sdpa_reads_a_strided_attention_output(monkeypatch):
    """CUDA's SDPA kernels may return [B, Hkv, G * W, D] with strided rows; the heads must still come back in order."""
    import torch.nn.functional as F

    from eaglespec.backends import hf_attention

    sdpa = F.scaled_dot_product_attention
    B, H, Hkv, W, S, D = 2, 4, 2, 3, 5, 8
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, n, D, generator=gen) for h, n in ((H, W), (Hkv, S), (Hkv, S)))
    mask = torch.zeros(B, 1, W, S)
    want, _ = hf_attention.grouped_sdpa(torch.nn.Module(), q, k, v, mask)

    def strided(*a, **kw):  # the same values, laid out [B, G * W, Hkv, D] in memory
        return sdpa(*a, **kw).transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(F, "scaled_dot_product_attention", strided)
    got, _ = hf_attention.grouped_sdpa(torch.nn.Module(), q, k, v, mask)
    torch.testing.assert_close(got, want)
