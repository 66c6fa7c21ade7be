"""Helpers for the training tests (tiny sharp targets, self-generated data); no downloads."""

from __future__ import annotations

import torch

from eaglespec.train.data import Sample

from conftest import tiny_target


def sharp_target(seed: int = 3, layers: int = 4):
    """conftest's tiny target with a sharper head (mean top-1 prob ~0.5 instead of ~0.2)."""
    model = tiny_target("llama", seed=seed, layers=layers)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@torch.no_grad()
def greedy_samples(model, n: int, prompt_len: int = 4, new: int = 28, seed: int = 0) -> list[Sample]:
    """n sequences = random prompt + the target's own greedy continuation (loss mask on the continuation)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.vocab_size - 1, (n, prompt_len), generator=g)
    for _ in range(new):
        nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
    mask = torch.zeros(ids.shape[1], dtype=torch.bool)
    mask[prompt_len - 1:] = True
    return [Sample(row.clone(), mask.clone()) for row in ids]
