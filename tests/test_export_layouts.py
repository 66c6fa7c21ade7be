"""Exports checked against the facts of the loaders that read them (no consumer package needed), and the import
side: published checkpoints that carry embed_tokens load and decode exactly.

The facts, from each loader's own code:
- SafeAILab EAGLE (eagle/model/ea_model.py) reads pytorch_model.bin, else model.safetensors (never an index), into
  cnets.Model (EAGLE-3) or cnets1.Model (EAGLE-1). cnets.Model: embed_tokens, lm_head [draft_vocab, H], midlayer
  with hidden_norm / input_layernorm / post_attention_layernorm and q/k/v over 2H inputs (head_dim = H // heads),
  fc [H, 3 * target_hidden_size], norm, d2t, t2d; it deletes d2t / t2d when draft_vocab_size == vocab_size, and
  takes the target's embedding only when the config names no target_hidden_size. cnets1.Model: embed_tokens,
  fc with bias (config `bias`, default true), layers.{i} with input_layernorm from layer 1 on, q/k/v bias only
  when the config names qkv_bias.
- speculators (0.9.0) Eagle3DraftModel: embed_tokens, lm_head, fc [H, n_aux * H], layers.0.* (hidden_norm,
  input_layernorm, post_attention_layernorm, self_attn, mlp), norm, d2t / t2d for a reduced draft vocabulary only,
  verifier_lm_head / verifier_norm read from speculators_config.verifier.name_or_path (never saved).
- SpecForge writes a LlamaConfig (architectures LlamaForCausalLMEagle3, model_type llama, draft_vocab_size,
  eagle_config ids in the output-of-layer convention, torch_dtype, use_cache, ...) and embed_tokens in the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglespec.backends.hf import HFTarget
from eaglespec.checkpoint.config import DraftConfig
from eaglespec.checkpoint.convert import TargetInfo, export_drafter
from eaglespec.checkpoint.drafter import load_drafter
from eaglespec.draft.eagle1 import Eagle1Drafter
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.engine.state import GenerationResult, RoundStats
from eaglespec.tree.core import TreeSpec
from test_checkpoint import VOCAB, assert_same_logits, reference_drafter, target_embedding
from test_convert import fake_target

from conftest import reference_greedy, tiny_draft_config, tiny_target


def target_info(tmp_path: Path, **kw) -> TargetInfo:
    path = fake_target(tmp_path / "target", **kw)
    return TargetInfo(str(path), json.loads((path / "config.json").read_text()), path)


def file_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """The weights as SafeAILab reads them: model.safetensors alone, no index."""
    from safetensors.torch import load_file

    assert sorted(p.name for p in directory.glob("*.safetensors")) == ["model.safetensors"]
    assert not (directory / "model.safetensors.index.json").exists()
    return load_file(str(directory / "model.safetensors"))


def safeailab_eagle3_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of SafeAILab's cnets.Model for config `c` (strict loading must find exactly these)."""
    h, heads, kv, inter = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    hd, th = h // heads, c.get("target_hidden_size", h)
    shapes = {"embed_tokens.weight": (c["vocab_size"], h), "lm_head.weight": (c["draft_vocab_size"], h),
              "fc.weight": (h, 3 * th), "norm.weight": (h,),
              "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
              "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * h),
              "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * h),
              "midlayer.self_attn.o_proj.weight": (h, heads * hd),
              "midlayer.mlp.gate_proj.weight": (inter, h), "midlayer.mlp.up_proj.weight": (inter, h),
              "midlayer.mlp.down_proj.weight": (h, inter)}
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        shapes[f"midlayer.{norm}.weight"] = (h,)
    if c["draft_vocab_size"] != c["vocab_size"]:
        shapes.update({"d2t": (c["draft_vocab_size"],), "t2d": (c["vocab_size"],)})
    return shapes


def speculators_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of speculators' Eagle3DraftModel for config `c`, less the two it reads from the verifier."""
    layer = c["transformer_layer_config"]
    native = {**layer, "draft_vocab_size": c["draft_vocab_size"]}
    shapes = {k.replace("midlayer.", "layers.0."): v for k, v in safeailab_eagle3_shapes(native).items()}
    n_aux = len(c["eagle_aux_hidden_state_layer_ids"])
    shapes["fc.weight"] = (layer["hidden_size"], n_aux * layer["hidden_size"])
    if c["norm_before_fc"]:
        shapes["input_norm.weight"] = (n_aux * layer["hidden_size"],)
    for i in range(n_aux if c["fc_norm"] else 0):
        shapes[f"fc_norm.{i}.weight"] = (layer["hidden_size"],)
    return shapes


def safeailab_eagle1_shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of SafeAILab's cnets1.Model (EAGLE-1) for config `c`."""
    h, heads, kv, inter = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    hd = h // heads
    shapes = {"embed_tokens.weight": (c["vocab_size"], h), "fc.weight": (h, 2 * h)}
    if c.get("bias", True):
        shapes["fc.bias"] = (h,)
    for i in range(c["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
                       p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter), p + "post_attention_layernorm.weight": (h,)})
        if c.get("qkv_bias"):
            shapes.update({p + f"self_attn.{x}_proj.bias": (n * hd,) for x, n in (("q", heads), ("k", kv), ("v", kv))})
        if i:
            shapes[p + "input_layernorm.weight"] = (h,)
    return shapes


def shapes_of(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.mark.parametrize("draft_vocab", [48, VOCAB])
def test_native_export_is_what_safeailab_and_specforge_load(tmp_path, draft_vocab):
    ref = reference_drafter(21, draft_vocab_size=draft_vocab)
    out = export_drafter(ref, tmp_path / "native", "native", target=target_info(tmp_path))
    c = json.loads((out / "config.json").read_text())
    tensors = file_tensors(out)
    assert shapes_of(tensors) == safeailab_eagle3_shapes(c)  # strict: no key missing, none unexpected
    assert torch.equal(tensors["embed_tokens.weight"], target_embedding().weight)
    # the fields SpecForge's LlamaConfig carries, and the target's special ids
    assert c["architectures"] == ["LlamaForCausalLMEagle3"] and c["model_type"] == "llama"
    assert c["eagle_config"] == {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    assert c["draft_vocab_size"] == draft_vocab and c["vocab_size"] == VOCAB and c["num_hidden_layers"] == 1
    assert (c["torch_dtype"], c["use_cache"], c["tie_word_embeddings"], c["hidden_act"]) == ("float32", True, False,
                                                                                             "silu")
    assert (c["bos_token_id"], c["eos_token_id"], c["pad_token_id"]) == (1, 2, 0)
    assert c["rope_theta"] == 10000.0 and c["rope_scaling"] is None and "transformers_version" in c
    assert c["head_dim"] * c["num_attention_heads"] == c["hidden_size"]  # SafeAILab derives head_dim so


def test_rope_scaling_carries_the_legacy_type_key(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    ref = reference_drafter(22, extra={"rope_scaling": scaling})
    c = json.loads((export_drafter(ref, tmp_path / "n", target=target_info(tmp_path)) / "config.json").read_text())
    assert c["rope_scaling"] == {**scaling, "type": "llama3"}
    assert load_drafter(tmp_path / "n").cfg.extra["rope_scaling"]["rope_type"] == "llama3"


@pytest.mark.parametrize("flags", [{}, {"norm_before_residual": True, "fc_norm": True}, {"norm_before_fc": True}])
def test_speculators_export_is_what_speculators_loads(tmp_path, flags):
    ref = reference_drafter(23, **flags)
    info = target_info(tmp_path)
    out = export_drafter(ref, tmp_path / "spec", "speculators", target=info)
    c = json.loads((out / "config.json").read_text())
    tensors = file_tensors(out)
    assert shapes_of(tensors) == speculators_shapes(c)  # with the verifier's two, every weight of the model
    assert torch.equal(tensors["embed_tokens.weight"], target_embedding().weight)
    assert c["speculators_config"]["verifier"] == {"name_or_path": info.name, "architectures": ["LlamaForCausalLM"]}
    assert c["speculators_model_type"] == "eagle3" and c["architectures"] == ["Eagle3Speculator"]
    layer = c["transformer_layer_config"]
    assert (layer["model_type"], layer["torch_dtype"], layer["pad_token_id"]) == ("llama", "float32", 0)
    for k, v in flags.items():
        assert c[k] is v


@pytest.mark.parametrize("layers", [1, 2])
def test_eagle1_export_is_what_safeailab_eagle1_loads(tmp_path, layers):
    model = tiny_target("llama", seed=4)
    cfg = tiny_draft_config(model, method="eagle1", aux_layer_ids=(4,), num_hidden_layers=layers, layout="eagle1")
    torch.manual_seed(5)
    drafter = Eagle1Drafter(cfg).eval()
    out = export_drafter(drafter, tmp_path / "e1", target=TargetInfo.from_model(model, "tiny-llama"))
    c = json.loads((out / "config.json").read_text())
    assert (c["bias"], c["qkv_bias"], c["architectures"], c["num_hidden_layers"]) == (True, False,
                                                                                      ["LlamaForCausalLM"], layers)
    tensors = file_tensors(out)
    assert shapes_of(tensors) == safeailab_eagle1_shapes(c)
    assert torch.equal(tensors["embed_tokens.weight"], model.get_input_embeddings().weight)
    back = load_drafter(out, target_num_layers=4)
    state = drafter.state_dict()
    assert all(torch.equal(back.state_dict()[k], v) for k, v in state.items())


@pytest.mark.parametrize("layout", ["native", "speculators"])
def test_export_then_load_is_the_same_drafter(tmp_path, layout):
    ref = reference_drafter(24, norm_before_residual=True)
    info = target_info(tmp_path)
    a = export_drafter(ref, tmp_path / "a", layout, target=info)
    back = load_drafter(a)
    want = dict(ref.state_dict(), **{"embed_tokens.weight": target_embedding().weight})
    got = back.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert_same_logits(ref, back)
    b = export_drafter(back, tmp_path / "b", layout, target=info)  # a loaded export writes the same bytes
    for name in ("config.json", "model.safetensors"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _decode(model, drafter, prompts, spec) -> list[tuple[list[int], list[tuple]]]:
    """Per prompt: the tokens, and per round the accepted count, the drafted tree's tokens and their draft
    log-probabilities (bit for bit)."""
    engine = SpeculativeEngine(HFTarget(model), drafter, spec)
    out = []
    for p in prompts:
        res = engine.generate(p, max_new_tokens=20)
        out.append((res.token_ids, [(r.accepted, r.detail["tokens"].tolist(), r.detail["logq"].tolist())
                                    for r in res.rounds]))
    return out


def test_specforge_and_safeailab_checkpoints_decode_exactly(tmp_path):
    """Checkpoints carrying embed_tokens (the target's, as SpecForge and SafeAILab write them) load and decode with
    the same tokens, draft trees, draft probabilities and accepted counts, round by round, as the drafter running
    on the target's embedding; so does eaglespec's own export."""
    from safetensors.torch import save_file

    model = tiny_target("llama", seed=7, layers=6)
    torch.manual_seed(8)
    cfg: DraftConfig = tiny_draft_config(model, draft_vocab_size=64)
    ref = reference_drafter(9, **{k: getattr(cfg, k) for k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
        "vocab_size", "draft_vocab_size", "target_hidden_size", "aux_layer_ids")})
    spec = TreeSpec("dynamic", depth=3, top_k=3, budget=8)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 90, (n,), generator=gen).tolist() for n in (5, 9, 13)]
    wired = _decode(model, ref, prompts, spec)
    for (tokens, _), p in zip(wired, prompts):
        assert tokens == reference_greedy(model, p, 20)

    emb = model.get_input_embeddings().weight.detach().clone()
    state = {k: v.clone() for k, v in ref.state_dict().items()}
    state["embed_tokens.weight"] = emb
    common = {"hidden_act": "silu", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
              "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
              "vocab_size": VOCAB, "draft_vocab_size": 64, "bos_token_id": 1, "eos_token_id": 2}
    specforge = tmp_path / "specforge"
    specforge.mkdir()
    (specforge / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], **common, "pad_token_id": 0, "head_dim": cfg.head_dim,
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "rope_theta": 10000.0,
        "rope_scaling": None, "torch_dtype": "float32", "transformers_version": "4.51.0", "use_cache": True,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in cfg.aux_layer_ids],
                         "use_aux_hidden_state": True}}))
    save_file(state, str(specforge / "model.safetensors"))
    safeailab = tmp_path / "safeailab"  # no aux ids: the default (2, L//2, L-3) for the 6-layer target
    safeailab.mkdir()
    (safeailab / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **common,
                                                       "torch_dtype": "float16"}))
    torch.save(state, str(safeailab / "pytorch_model.bin"))
    ours = export_drafter(ref, tmp_path / "ours", target=TargetInfo.from_model(model, "tiny"))
    for path in (specforge, safeailab, ours):
        loaded = load_drafter(path, target_num_layers=6)
        assert loaded.cfg.aux_layer_ids == cfg.aux_layer_ids, path.name
        assert torch.equal(loaded.embed_tokens.weight, emb), path.name
        assert _decode(model, loaded, prompts, spec) == wired, path.name


def test_tau_is_the_mean_acceptance_length():
    """tau = 1 + accepted / rounds (vLLM's and SGLang's mean acceptance length), counted before the cut at
    max_new_tokens: a last round accepting 3 of which one token is emitted still counts 3."""
    rounds = [RoundStats(drafted=3, accepted=2, emitted=3), RoundStats(drafted=3, accepted=0, emitted=1),
              RoundStats(drafted=0, accepted=0, emitted=1), RoundStats(drafted=3, accepted=3, emitted=1)]
    res = GenerationResult([1, 2], list(range(7)), rounds=rounds, seconds=1.0)
    assert res.tau == 1 + 5 / 4
    s = res.stats()
    assert list(s) == ["tau", "rounds", "drafted", "accepted", "new_tokens", "seconds", "tokens_per_second", "backend"]
    assert (s["tau"], s["rounds"], s["drafted"], s["accepted"], s["new_tokens"]) == (2.25, 4, 9, 5, 7)
    assert GenerationResult([1], [5]).tau == 0.0  # the prefill's token only: no round
    assert GenerationResult([1], [5, 6], rounds=[RoundStats(0, 0, 1)]).tau == 1.0  # plain decoding
