"""Greedy exactness (contract 1, fp32): speculative output == HF generate(do_sample=False)."""

from __future__ import annotations

import pytest
import torch
from conftest import reference_greedy, tiny_drafter, tiny_target

from eaglespec.engine import SpeculativeEngine
from eaglespec.target.hf import HFTarget
from eaglespec.tree import TreeSpec


@pytest.mark.parametrize("k", [0, 1, 2, 3, 5, 8])
def test_chain_random_drafter_matches_generate(arch, k):
    model = tiny_target(arch, seed=3)
    engine = SpeculativeEngine(HFTarget(model), tiny_drafter(model, seed=k), TreeSpec("chain", depth=k))
    gen = torch.Generator().manual_seed(k)
    for _ in range(3):
        prompt = torch.randint(3, 90, (int(torch.randint(1, 12, (1,), generator=gen)),), generator=gen).tolist()
        out = engine.generate(prompt, max_new_tokens=24)
        assert out.token_ids == reference_greedy(model, prompt, 24)
        assert len(out.token_ids) == 24
