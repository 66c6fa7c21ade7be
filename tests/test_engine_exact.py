"""Greedy exactness (contract 1, fp32): speculative output == HF generate(do_sample=False)."""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.tree.core import TreeSpec

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


# -- plain decoding (no drafter): the tree-less fast path ------------------------------------------

def _plain_engines(model):
    from eaglespec.backends.fast import FastTarget

    return [SpeculativeEngine(HFTarget(model), None), SpeculativeEngine(FastTarget(model, max_len=64), None)]


def test_plain_fast_path_matches_generate_and_builds_no_tree(arch, monkeypatch):
    import eaglespec.engine.loop as engine_mod

    def no_tree(*_):
        raise AssertionError("plain decoding must not build or verify a tree")

    for name in ("flatten", "greedy_accept", "sample_accept"):
        monkeypatch.setattr(engine_mod, name, no_tree)
    model = tiny_target(arch, seed=4)
    gen = torch.Generator().manual_seed(2)
    for engine in _plain_engines(model):
        for _ in range(2):
            prompt = torch.randint(3, 90, (int(torch.randint(1, 10, (1,), generator=gen)),), generator=gen).tolist()
            out = engine.generate(prompt, max_new_tokens=20)
            assert out.token_ids == reference_greedy(model, prompt, 20)
            assert len(out.rounds) == 19 and all(r.drafted == r.accepted == 0 and r.emitted == 1 for r in out.rounds)
            det = out.rounds[-1].detail  # telemetry as before: a one-node tree, row 0 accepted
            assert det["parents"].tolist() == [-1] and det["rows"].tolist() == [0]
            assert det["tokens"].tolist() == out.token_ids[-2:-1]


@pytest.mark.parametrize("max_new", [1, 2])
def test_plain_max_new_tokens_and_eos(max_new):
    model = tiny_target("llama", seed=5)
    prompt = [7, 21, 33, 40]
    free = reference_greedy(model, prompt, 12)
    for engine in _plain_engines(model):
        out = engine.generate(prompt, max_new_tokens=max_new)
        assert out.token_ids == free[:max_new] and out.finish_reason == "length"
        assert len(out.rounds) == max_new - 1
        for cut in (0, 1, 6):  # EOS as the prefill's token, the first round's, later
            eos = free[cut]
            out = engine.generate(prompt, max_new_tokens=12, eos_token_ids=[eos])
            assert out.token_ids == reference_greedy(model, prompt, 12, eos=eos)
            assert out.token_ids[-1] == eos and out.finish_reason == "stop"
            assert list(engine.stream(prompt, 12, [eos])) == [[t] for t in out.token_ids]


def test_plain_sampling_draws_from_the_target_with_the_engine_generator():
    """Plain sampling = one draw per token from the processed target distribution, in order, from
    the stream's seeded generator (a reference loop with the same seed gives the same tokens)."""
    from eaglespec.sampling import SamplingConfig, SamplingParams, process_logits, sample

    model = tiny_target("qwen2", seed=6)
    cfg = SamplingConfig(SamplingParams(temperature=0.9, top_k=20), seed=11)
    prompt = [5, 17, 29]
    gen, ids = cfg.generator(), list(prompt)
    with torch.no_grad():
        for _ in range(15):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(sample(process_logits(logits, cfg.target), gen)))
    for engine in _plain_engines(model):
        assert engine.generate(prompt, 15, sampling=cfg).token_ids == ids[len(prompt):]


def _cached_forward(target, rows: int) -> None:
    """Replace the fast target's step by cached random outputs: only the ops around the forward are left."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, target.vocab_size, generator=gen).to(target.device, target.dtype)
    feats = torch.randn(rows, len(target.feature_layer_ids) * target.hidden_size, generator=gen)
    feats = feats.to(target.device, target.dtype)

    def step(tokens, positions, visible, base, cols):
        return logits[:tokens.shape[0]], feats[:tokens.shape[0]]

    target.step = step
    target._step_fn = step


def test_plain_round_has_one_host_sync_and_no_host_to_device_copy():
    """Per plain round with the fast backend: ONE device->host read (the token), no tensor made from
    host data (an H2D copy on CUDA), and a handful of ops around the forward (here replaced by cached
    outputs)."""
    from _hostcount import HostCounter
    from eaglespec.backends.fast import FastTarget

    model = tiny_target("llama", seed=1)
    target = FastTarget(model, max_len=64)
    _cached_forward(target, 16)
    engine = SpeculativeEngine(target, None)
    engine.overlap = False  # one step at a time (overlap adds the token's copy)
    st = engine.stream([4, 5, 6], max_new_tokens=13)
    next(st), next(st)  # the prefill, then a round that allocates the 1-row bucket
    count = HostCounter()
    with count:
        for _ in range(10):
            next(st)
    assert count.syncs == 10 and count.h2d == 0, count.names
    assert count.ops <= 10 * 8, count.ops
