"""Loading draft checkpoints written in each published layout, and writing them back (round trip).

Fixture checkpoints are written in tmp_path with config text in the published shapes:
- native EAGLE-3 as SGLang / SpecForge write it (LlamaForCausalLMEagle3, midlayer.*, eagle_config ids),
  e.g. the eagle3 draft of a Qwen3.5-9B target (head_dim 256, partial_rotary_factor 0.25 at top level and
  under rope_parameters, aux ids [1, 15, 28] in the output-of-layer convention);
- SafeAILab EAGLE-3 (architectures ["LlamaForCausalLM"], draft_vocab_size, no ids, no rope_theta,
  pytorch_model.bin with embed_tokens);
- speculators (Eagle3Speculator, transformer_layer_config, layers.0.*, top-level Eagle-3 fields).
Every loaded drafter must compute the same logits as the module its tensors were taken from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from eaglespec.checkpoint.config import DraftConfig, normalize_aux_layer_ids, parse_draft_config
from eaglespec.checkpoint.drafter import load_drafter, save_drafter
from eaglespec.draft.eagle3 import Eagle3Drafter
from eaglespec.errors import EagleSpecError

VOCAB, DRAFT_VOCAB, HIDDEN, TARGET_LAYERS = 96, 48, 64, 32


# --------------------------------------------------------------------------------------------------
# helpers (also used by test_checkpoint_errors.py and test_convert.py)
# --------------------------------------------------------------------------------------------------
def reference_drafter(seed: int = 0, own_embedding: bool = False, **overrides) -> Eagle3Drafter:
    """A random EAGLE-3 drafter with non-trivial norms and a reduced draft vocabulary (d2t offsets)."""
    fields = dict(method="eagle3", hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB,
                  target_hidden_size=HIDDEN, aux_layer_ids=(2, 16, 29), rope_theta=10000.0)
    fields.update(overrides)
    cfg = DraftConfig(**fields)
    torch.manual_seed(seed)
    d = Eagle3Drafter(cfg, own_embedding=own_embedding).eval()
    with torch.no_grad():
        for name, p in d.named_parameters():
            if name.endswith("norm.weight") or ".fc_norm." in name or name.startswith("input_norm"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
        if cfg.draft_vocab_size < cfg.vocab_size:
            ids = torch.randperm(cfg.vocab_size)[: cfg.draft_vocab_size].sort().values
            d.d2t.copy_(ids - torch.arange(cfg.draft_vocab_size))
            d.t2d.zero_()
            d.t2d[ids] = True
    return d


def target_embedding(vocab: int = VOCAB, hidden: int = HIDDEN) -> nn.Embedding:
    torch.manual_seed(123)
    return nn.Embedding(vocab, hidden)


@torch.no_grad()
def draft_logits(drafter: Eagle3Drafter, emb: nn.Module | None = None, steps: int = 2) -> torch.Tensor:
    """Logits of a prefill of 5 rows then `steps - 1` recurrent steps, mapped to target ids (d2t)."""
    if emb is not None and drafter.embed_tokens is None:
        drafter.set_target_embedding(emb)
    g = torch.Generator().manual_seed(7)
    n_aux = len(drafter.cfg.aux_layer_ids)
    feats = torch.randn(5, n_aux * drafter.cfg.target_hidden_size, generator=g)
    tokens = torch.randint(0, drafter.cfg.vocab_size, (5,), generator=g)
    cache = drafter.new_cache()
    logits, state = drafter(drafter.project(feats), tokens, torch.arange(5) + 3, cache)
    out = [logits]
    for s in range(1, steps):
        nxt = drafter.to_target_ids(logits[-1:].argmax(-1))
        logits, state = drafter(state[-1:], nxt, torch.tensor([7 + s]), cache)
        out.append(logits)
    full = torch.full((sum(x.shape[0] for x in out), drafter.cfg.vocab_size), float("-inf"))
    target_ids = drafter.to_target_ids(torch.arange(drafter.cfg.draft_vocab_size))
    full[:, target_ids] = torch.cat(out)
    return full


def published_tensors(drafter: Eagle3Drafter, midlayer: str = "midlayer.", prefix: str = "") -> dict:
    """The drafter's tensors under published names (midlayer.* native, layers.0.* speculators)."""
    out = {}
    for name, t in drafter.state_dict().items():
        if name.startswith("midlayer."):
            name = midlayer + name[len("midlayer."):]
        out[prefix + name] = t.clone()
    return out


def write_checkpoint(directory: Path, config: dict | str, tensors: dict, fmt: str = "safetensors") -> Path:
    """config.json (dict or raw text) + model.safetensors or pytorch_model.bin."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config, indent=2)
    (directory / "config.json").write_text(text)
    if fmt == "safetensors":
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model.safetensors"))
    else:
        torch.save(tensors, str(directory / "pytorch_model.bin"))
    return directory


def qwen35_9b_config(**overrides) -> dict:
    """The eagle3 draft config of a Qwen3.5-9B target as SpecForge/SGLang publish it (dims shrunk)."""
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "attention_bias": False,
        "bos_token_id": 248044,
        "eos_token_id": 248044,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "max_position_embeddings": 262144,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "num_key_value_heads": 2,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": VOCAB,
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28], "use_aux_hidden_state": True},
    }
    cfg.update(overrides)
    return cfg


def qwen35_reference(seed: int = 0) -> Eagle3Drafter:
    return reference_drafter(seed, head_dim=256, rotary_dim=64, rope_theta=1e7, aux_layer_ids=(2, 16, 29))


def speculators_config(**top) -> dict:
    """A config.json as speculators' Eagle3SpeculatorConfig writes it (to_diff_dict of the layer config)."""
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": DRAFT_VOCAB,
        "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
        "embed_requires_grad": False,
        "norm_before_residual": True,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"accept_tolerance": 0.0, "proposal_type": "greedy", "speculative_tokens": 3,
                                  "verifier_accept_k": 1}],
            "verifier": {"architectures": ["Qwen3ForCausalLM"], "name_or_path": "Qwen/Qwen3-8B"},
        },
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "target_hidden_size": None,
        "transformer_layer_config": {
            "head_dim": 16,
            "hidden_size": HIDDEN,
            "intermediate_size": 128,
            "max_position_embeddings": 40960,
            "model_type": "llama",
            "num_attention_heads": 4,
            "num_hidden_layers": 1,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"},
            "vocab_size": VOCAB,
        },
        "transformers_version": "5.19.0",
    }
    cfg.update(top)
    return cfg


def assert_same_logits(a: Eagle3Drafter, b: Eagle3Drafter) -> None:
    emb = target_embedding()
    la, lb = draft_logits(a, emb), draft_logits(b, emb)
    assert torch.equal(la.isinf(), lb.isinf())
    torch.testing.assert_close(la, lb, rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------------
# published layouts
# --------------------------------------------------------------------------------------------------
def test_qwen35_9b_shaped_native_checkpoint(tmp_path):
    ref = qwen35_reference()
    path = write_checkpoint(tmp_path / "qwen35", qwen35_9b_config(), published_tensors(ref))
    d = load_drafter(path, target_num_layers=TARGET_LAYERS, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)
    c = d.cfg
    assert (c.head_dim, c.rotary_dim, c.rope_theta) == (256, 64, 1e7)
    assert c.aux_layer_ids == (2, 16, 29)
    assert "output-of-layer" in c.aux_rule and "+1" in c.aux_rule
    assert (c.layout, c.method, c.draft_vocab_size, c.norm_before_residual) == ("native", "eagle3", DRAFT_VOCAB, False)
    assert d.embed_tokens is None  # no embed_tokens.weight: the target's embedding is used
    assert_same_logits(ref, d)


def test_qwen35_rope_width_matters(tmp_path):
    """Negative control: the same tensors read with a full-width rope give different logits."""
    ref = qwen35_reference()
    cfg = qwen35_9b_config(partial_rotary_factor=None)
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000000}
    d = load_drafter(write_checkpoint(tmp_path / "full", cfg, published_tensors(ref)), target_num_layers=TARGET_LAYERS)
    assert d.cfg.rotary_dim == 256
    emb = target_embedding()
    assert (draft_logits(ref, emb) - draft_logits(d, emb)).nan_to_num(0, 0, 0).abs().max() > 1e-3


def test_specforge_shaped_config_with_prefixed_names_and_own_embedding(tmp_path):
    """SpecForge qwen3-4b-eagle3.json shape (rope_scaling null, rope_theta top level) + model.* names."""
    ref = reference_drafter(1, own_embedding=True, rope_theta=1e6, aux_layer_ids=(2, 16, 29))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "attention_bias": False, "attention_dropout": 0.0,
           "head_dim": 16, "hidden_act": "silu", "hidden_size": HIDDEN, "intermediate_size": 128,
           "max_position_embeddings": 40960, "model_type": "llama", "num_attention_heads": 4,
           "num_hidden_layers": 1, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None,
           "rope_theta": 1000000, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}}
    tensors = published_tensors(ref, prefix="model.")
    tensors["lm_head.weight"] = tensors.pop("model.lm_head.weight")
    d = load_drafter(write_checkpoint(tmp_path / "sf", cfg, tensors), target_num_layers=TARGET_LAYERS)
    assert d.embed_tokens is not None and d.cfg.aux_layer_ids == (2, 16, 29)
    assert "entering" in d.cfg.aux_rule
    assert_same_logits(ref, d)


@pytest.mark.parametrize("declared", [True, False])
def test_safeailab_eagle3_checkpoint(tmp_path, declared):
    """SafeAILab EAGLE-3: a LlamaForCausalLM config with draft_vocab_size (or, when even that is absent,
    recognised by its midlayer.* tensors), no aux ids and no rope_theta; pytorch_model.bin with embed_tokens."""
    ref = reference_drafter(2, own_embedding=True, rms_norm_eps=1e-05,
                            draft_vocab_size=DRAFT_VOCAB if declared else VOCAB)
    cfg = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000, "eos_token_id": 128001,
           "hidden_act": "silu", "hidden_size": HIDDEN, "initializer_range": 0.02, "intermediate_size": 128,
           "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
           "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.28.1",
           "use_cache": True, "vocab_size": VOCAB, "draft_vocab_size": DRAFT_VOCAB}
    if not declared:
        del cfg["draft_vocab_size"]
    path = write_checkpoint(tmp_path / "safeailab", cfg, published_tensors(ref), fmt="bin")
    d = load_drafter(path, target_num_layers=TARGET_LAYERS, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)
    assert (d.cfg.method, d.cfg.layout) == ("eagle3", "native")
    assert d.cfg.aux_layer_ids == (2, 16, 29) and d.cfg.aux_rule == "default (2, L//2, L-3)"
    assert d.cfg.rope_theta == 10000.0
    assert_same_logits(ref, d)


def test_speculators_checkpoint(tmp_path):
    ref = reference_drafter(3, own_embedding=True, norm_before_residual=True, rope_theta=1e6)
    path = write_checkpoint(tmp_path / "spec", speculators_config(), published_tensors(ref, "layers.0."))
    d = load_drafter(path, target_num_layers=TARGET_LAYERS, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)
    c = d.cfg
    assert (c.layout, c.norm_before_residual, c.rope_theta, c.target_hidden_size) == ("speculators", True, 1e6, HIDDEN)
    assert c.aux_layer_ids == (2, 16, 29)
    assert_same_logits(ref, d)


def test_norm_before_residual_changes_the_math(tmp_path):
    """Negative control: the speculators tensors read with norm_before_residual false differ."""
    ref = reference_drafter(3, own_embedding=True, norm_before_residual=True, rope_theta=1e6)
    path = write_checkpoint(tmp_path / "spec", speculators_config(norm_before_residual=False),
                            published_tensors(ref, "layers.0."))
    d = load_drafter(path)
    assert (draft_logits(ref) - draft_logits(d)).nan_to_num(0, 0, 0).abs().max() > 1e-3


@pytest.mark.parametrize(("flag", "extra_tensor"), [("norm_before_fc", "input_norm.weight"),
                                                   ("fc_norm", "fc_norm.0.weight"),
                                                   ("norm_output", None)])
def test_optional_norm_flags(tmp_path, flag, extra_tensor):
    """norm_before_fc (input_norm over the concatenation), fc_norm (fc_norm.{i} per aux state), norm_output."""
    ref = reference_drafter(4, **{flag: True})
    tensors = published_tensors(ref)
    if extra_tensor:
        assert extra_tensor in tensors
    cfg = qwen35_9b_config(head_dim=16, partial_rotary_factor=1.0, rope_parameters=None, rope_theta=10000.0,
                           **{flag: True})
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 16, 29]
    d = load_drafter(write_checkpoint(tmp_path / flag, cfg, tensors), target_num_layers=TARGET_LAYERS)
    assert getattr(d.cfg, flag) is True
    assert_same_logits(ref, d)


def test_sharded_safetensors_checkpoint(tmp_path):
    ref = reference_drafter(5)
    from eaglespec.checkpoint.config import native_config_dict
    from eaglespec.checkpoint.io import save_state_dict

    path = save_state_dict(published_tensors(ref), tmp_path / "sharded", native_config_dict(ref.cfg),
                           max_shard_bytes=40_000)
    assert (path / "model.safetensors.index.json").is_file() and len(list(path.glob("*.safetensors"))) > 2
    assert_same_logits(ref, load_drafter(path))


def test_full_vocab_checkpoint_without_vocab_maps(tmp_path):
    """A missing d2t means the draft vocabulary is the target vocabulary (identity map)."""
    ref = reference_drafter(6, draft_vocab_size=VOCAB)
    tensors = {k: v for k, v in published_tensors(ref).items() if k not in ("d2t", "t2d")}
    cfg = qwen35_9b_config(head_dim=16, partial_rotary_factor=1.0, rope_parameters=None, rope_theta=10000.0)
    del cfg["draft_vocab_size"]
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 16, 29]
    d = load_drafter(write_checkpoint(tmp_path / "full", cfg, tensors))
    assert d.cfg.draft_vocab_size == VOCAB and torch.equal(d.to_target_ids(torch.arange(VOCAB)), torch.arange(VOCAB))
    assert_same_logits(ref, d)


# --------------------------------------------------------------------------------------------------
# aux-id rule (contract 3)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ids", "rule", "expected", "says"),
    [
        ([1, 15, 28], "auto", (2, 16, 29), "output-of-layer"),  # first id 1: +1 (SGLang PR #25454)
        ([2, 16, 29], "auto", (2, 16, 29), "entering"),  # first id 2: as written
        ([3, 16, 29], "auto", (3, 16, 29), "entering"),
        ([1, 15, 28], "entering", (1, 15, 28), "entering"),  # user override
        ([2, 16, 29], "output", (3, 17, 30), "output-of-layer"),  # user override
    ],
)
def test_aux_id_rule(ids, rule, expected, says):
    got, rule_used = normalize_aux_layer_ids(ids, rule)
    assert got == expected and says in rule_used


@pytest.mark.parametrize("where", ["top", "eagle_config", "speculators"])
def test_aux_ids_found_where_each_writer_puts_them(where):
    base = speculators_config() if where == "speculators" else qwen35_9b_config()
    base.pop("eagle_aux_hidden_state_layer_ids", None)
    base.pop("eagle_config", None)
    if where == "eagle_config":
        base["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}
    else:
        base["eagle_aux_hidden_state_layer_ids"] = [1, 15, 28]
    cfg = parse_draft_config(base, Path("config.json"), target_num_layers=TARGET_LAYERS)
    assert cfg.aux_layer_ids == (2, 16, 29)
    cfg = parse_draft_config(base, Path("config.json"), target_num_layers=TARGET_LAYERS, aux_rule="entering")
    assert cfg.aux_layer_ids == (1, 15, 28)


def test_aux_defaults_and_bad_rule():
    cfg = qwen35_9b_config()
    del cfg["eagle_config"]
    assert parse_draft_config(cfg, Path("c"), target_num_layers=30).aux_layer_ids == (2, 15, 27)
    assert parse_draft_config(cfg, Path("c")).aux_layer_ids == ()  # resolved later against the target
    with pytest.raises(EagleSpecError, match="aux-id rule"):
        parse_draft_config(cfg, Path("c"), aux_rule="sideways")


def test_load_with_aux_rule_override(tmp_path):
    ref = qwen35_reference()
    path = write_checkpoint(tmp_path / "q", qwen35_9b_config(), published_tensors(ref))
    assert load_drafter(path, aux_rule="entering").cfg.aux_layer_ids == (1, 15, 28)
    assert load_drafter(path, aux_rule="output").cfg.aux_layer_ids == (2, 16, 29)


# --------------------------------------------------------------------------------------------------
# round trip: write -> read gives identical tensors and config fields
# --------------------------------------------------------------------------------------------------
CONFIG_FIELDS = ("method", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "vocab_size", "draft_vocab_size", "target_hidden_size", "aux_layer_ids",
                 "rms_norm_eps", "rope_theta", "rotary_dim", "max_position_embeddings", "num_hidden_layers",
                 "attention_bias", "mlp_bias", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def assert_same_drafter(a, b) -> None:
    for f in CONFIG_FIELDS:
        assert getattr(a.cfg, f) == getattr(b.cfg, f), f
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("layout", ["native", "speculators"])
@pytest.mark.parametrize("variant", [
    dict(),
    dict(own_embedding=True, norm_before_residual=True, target_hidden_size=48, attention_bias=True),
    dict(head_dim=256, rotary_dim=64, rope_theta=1e7, fc_norm=True, rms_norm_eps=1e-5),
    dict(norm_before_fc=True, norm_output=True, aux_layer_ids=(2, 8, 16, 29), mlp_bias=True),
])
def test_round_trip(tmp_path, layout, variant):
    ref = reference_drafter(8, **variant)
    path = save_drafter(ref, tmp_path / layout, layout)
    cfg = json.loads((path / "config.json").read_text())
    d = load_drafter(path, target_num_layers=TARGET_LAYERS)
    assert d.cfg.layout == layout
    assert_same_drafter(ref, d)
    assert_same_logits(ref, d)
    # every field explicit; ids in the entering convention with a first id >= 2 (read the same by SGLang/vLLM)
    for key in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "draft_vocab_size",
                "target_hidden_size", "eagle_aux_hidden_state_layer_ids"):
        assert key in cfg, key  # top level in both layouts
    assert cfg["eagle_aux_hidden_state_layer_ids"] == list(ref.cfg.aux_layer_ids)
    assert cfg["eagle_aux_hidden_state_layer_ids"][0] >= 2
    layer = cfg if layout == "native" else cfg["transformer_layer_config"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "vocab_size", "rms_norm_eps", "rope_theta", "partial_rotary_factor", "rope_parameters",
                "max_position_embeddings", "attention_bias", "mlp_bias", "num_hidden_layers"):
        assert key in layer, key
    if layout == "native":
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
        assert cfg["eagle_config"] == {"use_aux_hidden_state": True,
                                       "eagle_aux_hidden_state_layer_ids": list(ref.cfg.aux_layer_ids)}
        assert any(k.startswith("midlayer.") for k in _tensor_names(path))
    else:
        assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
        assert cfg["speculators_config"]["algorithm"] == "eagle3"
        assert "name_or_path" in cfg["speculators_config"]["verifier"]  # vLLM requires the key
        names = _tensor_names(path)
        assert any(k.startswith("layers.0.") for k in names) and not any(k.startswith("midlayer.") for k in names)


def _tensor_names(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def test_round_trip_from_output_convention_writes_entering_ids(tmp_path):
    ref = qwen35_reference()
    src = write_checkpoint(tmp_path / "src", qwen35_9b_config(), published_tensors(ref))
    d = load_drafter(src)
    out = save_drafter(d, tmp_path / "out")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]
    assert cfg["partial_rotary_factor"] == 0.25 and cfg["rope_parameters"]["partial_rotary_factor"] == 0.25
    again = load_drafter(out)
    assert again.cfg.aux_layer_ids == (2, 16, 29) and "entering" in again.cfg.aux_rule
    assert_same_drafter(d, again)


def test_refuses_to_write_ids_that_readers_would_shift(tmp_path):
    ref = reference_drafter(9, aux_layer_ids=(1, 15, 28))
    with pytest.raises(EagleSpecError, match="start below 2"):
        save_drafter(ref, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_eagle1_round_trip(tmp_path):
    eagle1 = pytest.importorskip("eaglespec.draft.eagle1")
    cfg = DraftConfig(method="eagle1", hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, draft_vocab_size=VOCAB,
                      target_hidden_size=HIDDEN, aux_layer_ids=(TARGET_LAYERS,), layout="eagle1")
    torch.manual_seed(10)
    ref = eagle1.Eagle1Drafter(cfg).eval()
    path = save_drafter(ref, tmp_path / "e1", "eagle1")
    d = load_drafter(path, target_num_layers=TARGET_LAYERS)
    assert d.cfg.method == "eagle1" and d.cfg.layout == "eagle1"
    for f in CONFIG_FIELDS:
        if f not in ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "norm_before_fc",
                     "fc_norm", "norm_output"):
            assert getattr(d.cfg, f) == getattr(ref.cfg, f), f
    sa, sb = ref.state_dict(), d.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_to_target_ids_follows_d2t_writes_and_loads():
    """to_target_ids gathers from a cached arange + d2t table: a d2t written in place or loaded afterwards must
    show (a stale table maps draft ids to the old target ids)."""
    d = reference_drafter()
    ids = torch.arange(DRAFT_VOCAB)
    assert torch.equal(d.to_target_ids(ids), ids + d.d2t)
    with torch.no_grad():
        d.d2t.copy_(torch.flip(d.d2t, [0]))  # in place: a new _version
    assert torch.equal(d.to_target_ids(ids), ids + d.d2t)
    other = reference_drafter(seed=1)
    d.load_state_dict(other.state_dict())
    assert torch.equal(d.to_target_ids(ids[3:7]), ids[3:7] + other.d2t[3:7])
