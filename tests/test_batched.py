"""backends/batched.py: static-cache batched generation is HF generate's greedy output row for row (left padding,
grouped-query heads, finished rows compacted away, prefill in row chunks), and samples the processed distribution."""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends import batched
from eaglespec.backends.batched import BatchedDecoder
from eaglespec.sampling import SamplingParams, process_logits

from conftest import reference_greedy, tiny_target

PROMPTS = [[5, 17, 9, 40, 33, 12, 7, 81, 3], [8], [60, 61, 62], [11, 90, 4, 4, 4, 27], [70, 3], [44] * 7]


def _stop_token(model) -> int:
    """A token that greedy continuations of PROMPTS emit early: rows end at different steps, so the batch shrinks."""
    counts = torch.zeros(model.config.vocab_size, dtype=torch.long)
    for p in PROMPTS:
        counts[sorted(set(reference_greedy(model, p, 6)))] += 1  # rows, not occurrences
    return int(counts.argmax())


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("compact_at", [0.25, 2.0])  # compacted after the first quarter ends / never
def test_greedy_rows_equal_hf_generate(arch, compact_at, monkeypatch):
    monkeypatch.setattr(batched, "COMPACT_AT", compact_at)
    model = tiny_target(arch, seed=4)
    stop = _stop_token(model)
    refs = [reference_greedy(model, p, 14, eos=stop) for p in PROMPTS]
    assert sum(stop in r for r in refs) >= 2 and any(stop not in r for r in refs)  # some rows end early, some not
    got = BatchedDecoder(model).generate(PROMPTS, 14, SamplingParams(temperature=0.0), [stop], pad_id=0)
    assert got == refs


def test_prefill_in_row_chunks_is_the_same(monkeypatch):
    model = tiny_target("qwen3", seed=5)
    params = SamplingParams(temperature=0.0)
    whole = BatchedDecoder(model).generate(PROMPTS, 8, params, [2], pad_id=0)
    monkeypatch.setattr(batched, "PREFILL_ELEMENTS", 1)  # one prompt a chunk
    assert BatchedDecoder(model).generate(PROMPTS, 8, params, [2], pad_id=0) == whole
    assert whole == [reference_greedy(model, p, 8, eos=2) for p in PROMPTS]


def _tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * (counts / counts.sum() - probs).abs().sum().item()


def test_sampling_follows_the_processed_distribution():
    """Many copies of one prompt, two sampled tokens: the first token's frequencies match the target's processed
    probabilities, and so do the second's after the most frequent first token (the step's cache and position)."""
    model = tiny_target("llama", seed=6)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # ~23 tokens left by top-p, the likeliest ~0.3
    prompt, n = [9, 31, 4, 77], 6000
    params = SamplingParams(temperature=0.8, top_p=0.9)
    gen = torch.Generator().manual_seed(0)
    rows = BatchedDecoder(model).generate([prompt] * n, 2, params, [], pad_id=0, generator=gen)
    assert all(len(r) == 2 for r in rows)
    v = model.config.vocab_size
    with torch.no_grad():
        p1 = process_logits(model(torch.tensor([prompt])).logits[0, -1], params)
    first = torch.bincount(torch.tensor([r[0] for r in rows]), minlength=v).float()
    assert (p1 > 0).sum() > 10 and first[p1 == 0].sum() == 0  # top-p cut tokens are never drawn
    assert _tv(first, p1) < 0.04
    top = int(first.argmax())
    with torch.no_grad():
        p2 = process_logits(model(torch.tensor([[*prompt, top]])).logits[0, -1], params)
    second = torch.bincount(torch.tensor([r[1] for r in rows if r[0] == top]), minlength=v).float()
    assert second.sum() > 300 and _tv(second, p2) < 0.12
    def draws(seed: int) -> list[list[int]]:
        return BatchedDecoder(model).generate([prompt] * 50, 3, params, [], pad_id=0,
                                              generator=torch.Generator().manual_seed(seed))

    assert draws(1) == draws(1) != draws(2)  # the generator decides the draws


def test_unsupported_model_is_refused():
    import transformers as tf

    cfg = tf.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    with pytest.raises(ValueError, match="gpt2"):
        BatchedDecoder(tf.GPT2LMHeadModel(cfg).eval())
