"""Greedy exactness (contract 1, fp32): speculative output == HF generate(do_sample=False)."""

from __future__ import annotations

import pytest
import torch

from eaglespec.engine import SpeculativeEngine
from eaglespec.target.hf import HFTarget
from eaglespec.tree import TreeSpec

from conftest import reference_greedy, tiny_drafter, tiny_target


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


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_stops_at_eos_exactly_like_generate(arch, k):
    model = tiny_target(arch, seed=5)
    engine = SpeculativeEngine(HFTarget(model), tiny_drafter(model), TreeSpec("chain", depth=k))
    prompt = [7, 21, 33, 40]
    free = reference_greedy(model, prompt, 20)
    for cut in (0, 3, 9):  # EOS as the very first token, mid-way, later
        eos = free[cut]
        ref = reference_greedy(model, prompt, 20, eos=eos)
        out = engine.generate(prompt, max_new_tokens=20, eos_token_ids=[eos])
        assert out.token_ids == ref
        assert out.token_ids[-1] == eos and eos not in out.token_ids[:-1]
        assert out.finish_reason == "stop"


@pytest.mark.parametrize("max_new", [1, 2, 3, 7])
def test_max_new_tokens_edges(max_new):
    model = tiny_target("qwen2", seed=2)
    engine = SpeculativeEngine(HFTarget(model), tiny_drafter(model), TreeSpec("chain", depth=5))
    out = engine.generate([9], max_new_tokens=max_new)  # a one-token prompt
    assert out.token_ids == reference_greedy(model, [9], max_new)
    assert len(out.token_ids) == max_new and out.finish_reason == "length"


def test_zero_new_tokens_and_empty_prompt():
    model = tiny_target("llama")
    engine = SpeculativeEngine(HFTarget(model), None)
    assert engine.generate([4, 5], max_new_tokens=0).token_ids == []
    with pytest.raises(ValueError, match="empty"):
        engine.generate([], max_new_tokens=3)
