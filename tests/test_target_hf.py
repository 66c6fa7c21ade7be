"""The generic HF target backend: aux features (contract 3), tree verification, commit (contract 7)."""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends.hf import HFTarget

from conftest import tiny_target


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_feature_id_j_is_the_state_entering_layer_j(arch):
    model = tiny_target(arch)
    layers = model.config.num_hidden_layers
    ids = torch.tensor([5, 6, 7, 8, 9])
    ref = model(ids[None], output_hidden_states=True).hidden_states  # [0] = embeddings
    target = HFTarget(model, tuple(range(layers + 1)))
    feats = target.forward(ids).features.view(5, layers + 1, -1)
    for j in range(layers):
        torch.testing.assert_close(feats[:, j], ref[j][0], rtol=0, atol=0)
    # id L = the last layer's output BEFORE the final norm (HF's hidden_states[L] is after it)
    torch.testing.assert_close(model.model.norm(feats[:, layers]), ref[layers][0])
    assert not torch.allclose(feats[:, layers], ref[layers][0])


def _path_logits(model, prefix: list[int], path: list[int]) -> torch.Tensor:
    return model(torch.tensor([prefix + path])).logits[0, len(prefix):]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral"])
def test_tree_forward_matches_per_path_forwards(arch, attn):
    model = tiny_target(arch, attn=attn)
    target = HFTarget(model)
    prefix = [3, 14, 15, 9, 26]
    target.forward(torch.tensor(prefix))
    target.commit(torch.arange(len(prefix)))
    # root r=5, children a=7, b=7 (same token twice), grandchild c=8 under b
    tokens = torch.tensor([5, 7, 7, 8])
    parents = torch.tensor([-1, 0, 0, 2])
    depths = torch.tensor([0, 1, 1, 2])
    visible = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    out = target.forward(tokens, depths, visible)
    ref_a = _path_logits(model, prefix, [5, 7])
    ref_bc = _path_logits(model, prefix, [5, 7, 8])
    torch.testing.assert_close(out.logits[0], ref_a[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits[1], ref_a[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits[3], ref_bc[2], atol=1e-5, rtol=1e-5)
    assert parents.shape == tokens.shape


@pytest.mark.parametrize(("keep", "accepted"), [([0, 3], [5, 9]), ([0, 1, 2], [5, 7, 9])])
def test_commit_gathers_rows_by_index_not_by_token(keep, accepted):
    """Token 9 sits at two nodes (depth 2 under 7, and depth 1): the accepted one must be published."""
    model = tiny_target("llama")
    prefix = [3, 14, 15, 9]
    target = HFTarget(model)
    target.forward(torch.tensor(prefix))
    target.commit(torch.arange(len(prefix)))
    tokens = torch.tensor([5, 7, 9, 9])
    depths = torch.tensor([0, 1, 2, 1])
    visible = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    target.forward(tokens, depths, visible)
    target.commit(torch.tensor(keep))
    assert target.committed_len == len(prefix) + len(accepted)
    plain = HFTarget(model)
    plain.forward(torch.tensor(prefix + accepted))
    plain.commit(torch.arange(len(prefix) + len(accepted)))
    for got, ref in zip(target.cache.layers, plain.cache.layers):
        torch.testing.assert_close(got.keys, ref.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values, ref.values, atol=1e-5, rtol=1e-5)
    # and the next forward continues exactly like plain decoding
    nxt = target.forward(torch.tensor([11])).logits[-1]
    ref_next = model(torch.tensor([prefix + accepted + [11]])).logits[0, -1]
    torch.testing.assert_close(nxt, ref_next, atol=1e-5, rtol=1e-5)


def test_rejected_rows_are_dropped_before_the_next_forward():
    model = tiny_target("qwen2")
    target = HFTarget(model)
    target.forward(torch.tensor([4, 5, 6]))
    target.commit(torch.arange(3))
    target.forward(torch.tensor([7, 8, 9]))  # pending rows never committed
    out = target.forward(torch.tensor([10]))
    ref = model(torch.tensor([[4, 5, 6, 10]])).logits[0, -1]
    torch.testing.assert_close(out.logits[-1], ref, atol=1e-5, rtol=1e-5)


def _sliding_target(kind: str, window: int = 6):
    import transformers as tf

    torch.manual_seed(0)
    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, sliding_window=window, max_position_embeddings=512, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2)
    if kind == "gemma3":  # sliding and full layers mixed: the model takes a per-layer-type mask dict
        types = ["sliding_attention", "full_attention"] * 2
        cfg, cls = tf.Gemma3TextConfig(head_dim=8, layer_types=types, **common), tf.Gemma3ForCausalLM
    else:  # every layer sliding
        cfg, cls = tf.MistralConfig(**common), tf.MistralForCausalLM
    cfg._attn_implementation = "sdpa"
    model = cls(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


@pytest.mark.parametrize("kind", ["gemma3", "mistral"])
def test_sliding_window_targets_stay_exact_past_the_window(kind):
    """Tree rows under a sliding window: keys outside the window are masked per layer type."""
    from eaglespec.engine.loop import SpeculativeEngine
    from eaglespec.tree.core import TreeSpec

    from conftest import reference_greedy, tiny_drafter

    model = _sliding_target(kind)
    target = HFTarget(model)
    assert target.window == 6 and target.mixed_layers == (kind == "gemma3")
    for spec in (TreeSpec("chain", depth=3), TreeSpec("dynamic", depth=3, top_k=3, budget=8)):
        engine = SpeculativeEngine(target, tiny_drafter(model), spec)
        for prompt in ([5, 6, 7], [9, 10, 11, 12, 13, 14, 15, 16]):  # generation runs far past the window
            assert engine.generate(prompt, 24).token_ids == reference_greedy(model, prompt, 24)


@pytest.mark.parametrize("kind", ["gemma3", "mistral"])
def test_sliding_window_logits_match_a_plain_forward(kind):
    """Logits of rows far past the window equal HF's own (windowed) forward; unwindowed they do not."""
    model = _sliding_target(kind)
    ids = torch.arange(3, 23)  # 20 tokens, window 6
    ref = model(ids[None]).logits[0, -4:]
    for windowed in (True, False):
        target = HFTarget(model)
        if not windowed:
            target.window = None  # negative control: one full mask for every layer
        target.forward(ids[:-4])
        target.commit(torch.arange(16))
        got = target.forward(ids[-4:]).logits
        assert torch.allclose(got, ref, atol=1e-4) == windowed
