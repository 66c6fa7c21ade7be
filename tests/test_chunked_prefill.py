"""Chunked prefill (engine.prefill, EngineConfig.chunked_prefill): a prompt past a FastTarget's largest bucket,
prefilled in chunks of that bucket, equals the one-pass prefill (fp32, CPU) and keeps greedy output exact."""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends.fast import FastTarget
from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine, prefill
from eaglespec.tree.core import TreeSpec

from conftest import reference_greedy, tiny_drafter, tiny_target

ATOL = 1e-5
BUCKETS = (1, 2, 4, 8)
FEATURE_IDS = (0, 2, 4)  # 4 = the last layer's output (tiny targets have 4 layers)


def _prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 90, (n,), generator=torch.Generator().manual_seed(seed))


def _forward_sizes(target) -> list[int]:
    """Record the row count of every forward of `target` (an instance-level wrapper)."""
    sizes: list[int] = []
    inner = target.forward

    def forward(tokens, *args, **kwargs):
        sizes.append(tokens.shape[0])
        return inner(tokens, *args, **kwargs)

    target.forward = forward
    return sizes


@pytest.mark.parametrize(("n", "sizes"), [(5, [5]), (8, [8]), (16, [8, 8]), (17, [8, 8, 1]),
                                          (27, [8, 8, 8, 3]), (70, [8] * 8 + [6])])
@pytest.mark.parametrize("span_step", [256, 16])
def test_chunked_prefill_equals_one_pass(arch, n, sizes, span_step):
    """Logits of the last row, features of every row and the committed KV equal the one-pass prefill's; 70 rows
    grow the cache (64 slots) in the middle of the chunks; span_step=16 makes the chunks cross span boundaries."""
    model = tiny_target(arch, seed=5)
    one = FastTarget(model, FEATURE_IDS, max_len=16, buckets=BUCKETS, span_step=span_step)
    chunked = FastTarget(model, FEATURE_IDS, max_len=16, buckets=BUCKETS, span_step=span_step)
    seen = _forward_sizes(chunked)
    prompt = _prompt(n, seed=n)
    a = prefill(one, prompt, chunked=False)
    b = prefill(chunked, prompt, chunked=True)
    assert seen == sizes
    assert a.logits.shape == b.logits.shape == (1, model.config.vocab_size)
    assert a.features.shape == b.features.shape == (n, 3 * model.config.hidden_size)
    torch.testing.assert_close(b.logits, a.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(b.features, a.features, atol=ATOL, rtol=0)
    assert one.committed_len == chunked.committed_len == n
    torch.testing.assert_close(chunked.cache[..., :n, :], one.cache[..., :n, :], atol=ATOL, rtol=0)
    # and against the HF reference backend (its prefill: one pass over a DynamicCache)
    ref = prefill(HFTarget(model, FEATURE_IDS), prompt, chunked=True)
    torch.testing.assert_close(b.logits, ref.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(b.features, ref.features, atol=ATOL, rtol=0)
    # the next step over the chunk-built cache equals the one over the one-pass cache
    nxt = _prompt(3, seed=99)
    torch.testing.assert_close(chunked.forward(nxt).logits, one.forward(nxt).logits, atol=ATOL, rtol=0)


def test_targets_without_buckets_prefill_in_one_pass():
    model = tiny_target("llama", seed=5)
    hf = HFTarget(model, FEATURE_IDS)
    seen = _forward_sizes(hf)
    out = prefill(hf, _prompt(27), chunked=True)
    assert seen == [27] and hf.committed_len == 27 and out.features.shape[0] == 27




SPECS = {"plain": TreeSpec("chain", depth=0), "chain": TreeSpec("chain", depth=3),
         "dynamic": TreeSpec("dynamic", depth=3, top_k=3, budget=6)}


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_generation_with_chunked_prefill_matches_generate(arch, spec):
    """Contract 1 with the switch on: HF generate's tokens, and the unchunked engine's, for prompts past the
    largest bucket (a multiple of it, and not) and within it."""
    model = tiny_target(arch, seed=7)

    def engine(chunked: bool) -> SpeculativeEngine:
        target = FastTarget(model, max_len=64, buckets=BUCKETS)
        return SpeculativeEngine(target, tiny_drafter(model, seed=3), SPECS[spec], chunked_prefill=chunked)

    on, off = engine(True), engine(False)
    assert on.chunked_prefill and not off.chunked_prefill
    seen = _forward_sizes(on.target)
    for n in (27, 16, 5):
        prompt = _prompt(n, seed=n).tolist()
        seen.clear()
        out = on.generate(prompt, max_new_tokens=20)
        assert seen[: -(-n // 8)] == [min(8, n - i) for i in range(0, n, 8)]  # the prefill's chunks
        assert out.token_ids == reference_greedy(model, prompt, 20)
        assert out.token_ids == off.generate(prompt, max_new_tokens=20).token_ids
