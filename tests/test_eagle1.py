"""The EAGLE-1 drafter: SafeAILab layout (fc over cat[embedding, feature] with bias, layers.0 without
input_layernorm, the target's lm_head on the post-norm state) and its checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from eaglespec.backends.hf import HFTarget
from eaglespec.checkpoint.drafter import load_drafter, save_drafter
from eaglespec.draft.eagle1 import Eagle1Drafter, target_head
from eaglespec.engine.loop import SpeculativeEngine

from conftest import tiny_draft_config, tiny_target


def make(model, layers: int = 1, seed: int = 0) -> Eagle1Drafter:
    torch.manual_seed(seed)
    cfg = tiny_draft_config(model, method="eagle1", aux_layer_ids=(), num_hidden_layers=layers, layout="eagle1")
    d = Eagle1Drafter(cfg).eval()
    SpeculativeEngine(HFTarget(model), d)  # wiring: embedding, final norm + lm_head, feature layer
    return d


def test_tensor_layout():
    model = tiny_target("llama")
    names = set(make(model).state_dict())
    assert {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight",
            "layers.0.post_attention_layernorm.weight"} <= names
    assert not any("input_layernorm" in n or "lm_head" in n or n.startswith("norm") for n in names)
    assert make(model).fc.weight.shape == (32, 64)
    assert "layers.1.input_layernorm.weight" in make(model, layers=2).state_dict()


def test_wiring_feature_head_and_embedding():
    model = tiny_target("qwen3")
    d = make(model)
    assert d.feature_layer_ids == (model.config.num_hidden_layers,)  # last layer output, pre final norm
    norm, lm_head = target_head(HFTarget(model))
    assert norm is model.model.norm and lm_head is model.lm_head
    h = torch.randn(5, 32)
    torch.testing.assert_close(d.project(h), model.model.norm(h))  # the post-norm feature SafeAILab uses


def test_fc_input_is_embedding_first():
    model = tiny_target("llama")
    d = make(model)
    tokens, state = torch.tensor([5, 9, 40]), torch.randn(3, 32)
    seen = []
    d.fc.register_forward_hook(lambda _m, _i, out: seen.append(out))
    with torch.no_grad():
        d.fc.bias.zero_()
        d.fc.weight.copy_(torch.cat([torch.eye(32), torch.zeros(32, 32)], dim=1))
        d(state, tokens, torch.arange(3), d.new_cache())
        d.fc.weight.copy_(torch.cat([torch.zeros(32, 32), torch.eye(32)], dim=1))
        d(state, tokens, torch.arange(3), d.new_cache())
    torch.testing.assert_close(seen[0], model.get_input_embeddings()(tokens))
    torch.testing.assert_close(seen[1], state)


def test_matches_hf_decoder_layer_without_input_norm():
    """One step equals fc -> HF LlamaDecoderLayer(input_layernorm = Identity) -> target lm_head (cnets.py)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    model = tiny_target("llama", seed=1)
    d = make(model, seed=3)
    with torch.no_grad():
        for p in d.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # non-trivial norms and bias
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, rms_norm_eps=d.cfg.rms_norm_eps, rope_theta=d.cfg.rope_theta,
                      max_position_embeddings=512, vocab_size=96)
    cfg._attn_implementation = "eager"
    layer = LlamaDecoderLayer(cfg, layer_idx=0).eval()
    layer.input_layernorm = nn.Identity()
    missing, unexpected = layer.load_state_dict(
        {k[len("layers.0."):]: v for k, v in d.state_dict().items() if k.startswith("layers.0.")}, strict=False)
    assert not missing and not unexpected
    rotary = LlamaRotaryEmbedding(cfg)

    t = 6
    tokens, feats = torch.randint(3, 96, (t,)), torch.randn(t, 32)
    positions = torch.arange(4, 4 + t)
    with torch.no_grad():
        logits, state = d(d.project(feats), tokens, positions, d.new_cache())
        x = d.fc(torch.cat([model.get_input_embeddings()(tokens), model.model.norm(feats)], dim=-1))[None]
        mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
        cos_sin = rotary(x, positions[None])
        out = layer(x, attention_mask=mask, position_ids=positions[None], position_embeddings=cos_sin)
        out = (out[0] if isinstance(out, tuple) else out)[0]
    torch.testing.assert_close(state, out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, model.lm_head(out), atol=1e-5, rtol=1e-5)  # no norm before the head


def test_save_load_roundtrip(tmp_path):
    model = tiny_target("qwen2")
    d = make(model, seed=2)
    save_drafter(d, tmp_path / "e1")
    cfg = json.loads((tmp_path / "e1" / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 1
    loaded = load_drafter(tmp_path / "e1", target_num_layers=4, target_hidden_size=32, target_vocab_size=96)
    assert isinstance(loaded, Eagle1Drafter) and loaded.feature_layer_ids == (4,)
    assert loaded.embed_tokens is not None  # SafeAILab writes embed_tokens.weight (its loader is strict)
    torch.testing.assert_close(loaded.embed_tokens.weight, model.get_input_embeddings().weight)
    SpeculativeEngine(HFTarget(model), loaded)
    tokens, state = torch.tensor([3, 4, 5]), torch.randn(3, 32)
    with torch.no_grad():
        a = d(state, tokens, torch.arange(3), d.new_cache())
        b = loaded(state, tokens, torch.arange(3), loaded.new_cache())
    torch.testing.assert_close(a, b)


def test_loads_safeailab_checkpoint(tmp_path):
    """A SafeAILab EAGLE-1 directory: a plain Llama config.json + pytorch_model.bin (fc, layers.0, embed)."""
    model = tiny_target("llama", seed=4)
    d = make(model, seed=5)
    state = {k: v.clone() for k, v in d.state_dict().items()}
    state["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    out = tmp_path / "safeailab"
    out.mkdir()
    torch.save(state, out / "pytorch_model.bin")
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": True, "hidden_act": "silu",
        "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "vocab_size": 96, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
        "rope_theta": 10000.0, "torch_dtype": "float16"}))
    loaded = load_drafter(out, target_num_layers=4)
    assert isinstance(loaded, Eagle1Drafter)
    for name, tensor in d.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)


def test_needs_the_target_head():
    model = tiny_target("llama")
    torch.manual_seed(0)
    d = Eagle1Drafter(tiny_draft_config(model, method="eagle1", aux_layer_ids=()))
    d.set_target_embedding(model.get_input_embeddings())
    with pytest.raises(RuntimeError, match="set_target_head"):
        d.project(torch.randn(2, 32))
