"""Attention for a stock HF model's forward over a 4-D float mask without copying the KV per query head.

transformers' SDPA path repeats every key and value head for the query heads that share it (repeat_kv) whenever a
mask is given: for a batched verify that is a copy of the whole cache per layer and step, [B, H, S, D] twice, which
dominates the step at real scale (8B, B = 64: gigabytes per layer). grouped_sdpa folds the G query heads of each
KV head into the query length instead, q [B, Hkv, G * W, D] against k, v [B, Hkv, S, D] as they are, with the mask
repeated G times along the query rows ([B, 1, G * W, S], small): the same softmax attention, each row over the same
keys.

    with grouped_attention(model):   # the model's SDPA layers run grouped_sdpa for this forward
        model(input_ids=..., attention_mask=mask_4d, ...)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from eaglespec.draft.layers import gqa_attention

NAME = "eaglespec_grouped_sdpa"
_registered = False


def grouped_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                 **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: query [B, H, W, D], key / value [B, Hkv, S, D], attention_mask
    [B, 1, W, S] additive -> ([B, W, H, D], None). Anything else (no mask, no shared heads, softcap, dropout) goes to
    transformers' own SDPA function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plain = (attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
             or key.shape[1] == query.shape[1] or dropout or kwargs.get("softcap") is not None or kwargs.get("position_bias") is not None)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = gqa_attention(query, key, value, attention_mask[:, :, :, : key.shape[2]], scaling)  # [B, H, W, D]
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, grouped_sdpa)
        _registered = True


@contextmanager
def grouped_attention(model: nn.Module) -> Iterator[None]:
    """Within the block, a model whose attention is transformers' "sdpa" runs grouped_sdpa (other attention
    implementations, and models with sub-configs, are left as they are); the model's setting is restored
    afterwards."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa" or getattr(config, "sub_configs", None):
        yield
        return
    _register()
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"
