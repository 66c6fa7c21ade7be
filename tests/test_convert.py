"""`eaglespec convert`: between layouts and from SafeAILab checkpoints, reading no more of the target than its
config and embedding.

Exported checkpoints reload to the same logits; the speculators output is also checked against the
`speculators` package's own classes when that package can be imported (skipped otherwise; the opt-in
`-m consumers` group installs it, tests/test_export_consumers.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglespec.checkpoint.convert import convert
from eaglespec.checkpoint.drafter import load_drafter, save_drafter
from eaglespec.cli.main import main
from eaglespec.errors import EagleSpecError
from test_checkpoint import (
    CONFIG_FIELDS,
    HIDDEN,
    TARGET_LAYERS,
    VOCAB,
    assert_same_logits,
    published_tensors,
    qwen35_9b_config,
    qwen35_reference,
    reference_drafter,
    target_embedding,
    write_checkpoint,
)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["convert", *argv])
    return code, capsys.readouterr().err


def fake_target(directory: Path, vocab: int = VOCAB, hidden: int = HIDDEN, layers: int = TARGET_LAYERS) -> Path:
    """A target checkpoint as convert reads it: config.json and model.safetensors holding model.embed_tokens.weight
    (test_checkpoint's target_embedding, so logits compare with assert_same_logits), lm_head and the final norm
    (what speculators reads from a verifier)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden, "vocab_size": vocab,
        "num_hidden_layers": layers, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}))
    emb = target_embedding(vocab, hidden).weight.detach().clone() if vocab == VOCAB else torch.randn(vocab, hidden)
    save_file({"model.embed_tokens.weight": emb, "lm_head.weight": torch.randn(vocab, hidden),
               "model.norm.weight": torch.ones(hidden)}, str(directory / "model.safetensors"))
    return directory


def safeailab_checkpoint(tmp_path: Path):
    """SafeAILab EAGLE-3: LlamaForCausalLM config, no aux ids, pytorch_model.bin with embed_tokens."""
    ref = reference_drafter(11, own_embedding=True, rms_norm_eps=1e-5, aux_layer_ids=(2, 16, 29))
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": HIDDEN,
           "intermediate_size": 128, "max_position_embeddings": 2048, "model_type": "llama",
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-05,
           "tie_word_embeddings": False, "torch_dtype": "float16", "vocab_size": VOCAB, "draft_vocab_size": 48}
    return ref, write_checkpoint(tmp_path / "safeailab", cfg, published_tensors(ref), fmt="bin")


@pytest.mark.parametrize("to", ["native", "speculators"])
def test_convert_qwen35_checkpoint_reloads_to_the_same_logits(tmp_path, capsys, to):
    ref = qwen35_reference()
    src = write_checkpoint(tmp_path / "src", qwen35_9b_config(), published_tensors(ref))
    target = fake_target(tmp_path / "target")
    code, err = run(capsys, str(src), str(tmp_path / "out"), "--to", to, "--target", str(target))
    assert code == 0, err
    assert "aux ids [2, 16, 29]" in err and "output-of-layer" in err and "embed_tokens the target's" in err
    out = load_drafter(tmp_path / "out", target_num_layers=32, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)
    assert out.cfg.layout == to and out.cfg.aux_layer_ids == (2, 16, 29) and out.cfg.rotary_dim == 64
    assert torch.equal(out.embed_tokens.weight, target_embedding().weight)
    assert_same_logits(ref, out)


def test_native_speculators_native_is_lossless(tmp_path):
    ref = reference_drafter(12, own_embedding=True, norm_before_residual=True, fc_norm=True, target_hidden_size=48)
    a = save_drafter(ref, tmp_path / "a", "native")
    convert(a, tmp_path / "b", "speculators", target=str(fake_target(tmp_path / "t", hidden=48)))
    convert(tmp_path / "b", tmp_path / "c", "native")  # own embedding: no target needed
    convert(tmp_path / "c", tmp_path / "d", "native")
    # the export is a fixed point: converting it again writes the same bytes
    for name in ("config.json", "model.safetensors"):
        assert (tmp_path / "c" / name).read_bytes() == (tmp_path / "d" / name).read_bytes(), name
    da, dc = load_drafter(a), load_drafter(tmp_path / "c")
    for f in CONFIG_FIELDS:
        assert getattr(da.cfg, f) == getattr(dc.cfg, f), f
    sa, sc = da.state_dict(), dc.state_dict()
    assert sa.keys() == sc.keys() and all(torch.equal(sa[k], sc[k]) for k in sa)
    assert_same_logits(ref, dc)


def test_convert_from_safeailab_needs_the_layer_count_only_without_ids(tmp_path, capsys):
    ref, src = safeailab_checkpoint(tmp_path)
    code, err = run(capsys, str(src), str(tmp_path / "out"), "--to", "native")
    assert code == 2 and err.count("\n") == 1 and "--target-layers" in err and "config.json" in err
    assert not (tmp_path / "out").exists()
    code, err = run(capsys, str(src), str(tmp_path / "out"), "--to", "native", "--target-layers", "32")
    assert code == 0, err
    assert "embed_tokens the drafter's own" in err and "target" not in err.split("embed_tokens")[1]
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29] and cfg["norm_before_residual"] is False
    assert cfg["rope_theta"] == 10000.0 and cfg["rms_norm_eps"] == 1e-05
    out = load_drafter(tmp_path / "out")
    assert out.embed_tokens is not None  # SafeAILab's embedding travels with the checkpoint
    assert_same_logits(ref, out)
    # the target's layer count resolves the ids as well
    code, err = run(capsys, str(src), str(tmp_path / "out2"), "--to", "native", "--target",
                    str(fake_target(tmp_path / "target")))
    assert code == 0, err
    assert json.loads((tmp_path / "out2" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29]


def test_aux_rule_for_reading(tmp_path, capsys):
    target = str(fake_target(tmp_path / "target"))
    src = write_checkpoint(tmp_path / "src", qwen35_9b_config(), published_tensors(qwen35_reference()))
    # read [1, 15, 28] as entering ids: they start below 2, so writing them would mislead SGLang: refused
    code, err = run(capsys, str(src), str(tmp_path / "a"), "--to", "native", "--aux-rule", "entering",
                    "--target", target)
    assert code == 2 and "start below 2" in err and not (tmp_path / "a").exists()
    cfg = qwen35_9b_config()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 16, 29]
    src2 = write_checkpoint(tmp_path / "src2", cfg, published_tensors(qwen35_reference()))
    code, err = run(capsys, str(src2), str(tmp_path / "b"), "--to", "native", "--aux-rule", "output",
                    "--target", target)
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [3, 17, 30]


def test_convert_refusals(tmp_path, capsys):
    ref = reference_drafter(13)
    src = save_drafter(ref, tmp_path / "src")
    target = str(fake_target(tmp_path / "target"))
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    code, err = run(capsys, str(src), str(dst), "--to", "speculators", "--target", target)
    assert code == 2 and "not empty" in err and (dst / "keep.txt").read_text() == "mine"
    code, err = run(capsys, str(src), str(dst), "--to", "speculators", "--overwrite", "--target", target)
    assert code == 0 and not (dst / "keep.txt").exists() and load_drafter(dst).cfg.layout == "speculators"
    code, err = run(capsys, str(src), str(tmp_path / "e1"), "--to", "eagle1")
    assert code == 2 and "eagle1 layout" in err and not (tmp_path / "e1").exists()
    code, err = run(capsys, str(src), str(src), "--to", "native", "--overwrite")
    assert code == 2 and "source" in err and load_drafter(src).cfg.layout == "native"
    code, err = run(capsys, str(tmp_path / "missing"), str(tmp_path / "x"), "--to", "native")
    assert code == 2 and "not found" in err and err.count("\n") == 1
    for size in ("0", "-5GB", "lots", "5XB"):
        code, err = run(capsys, str(src), str(tmp_path / "y"), "--to", "native", "--target", target,
                        f"--max-shard-size={size}")
        assert code == 2 and "--max-shard-size" in err and err.count("\n") == 1 and not (tmp_path / "y").exists()
    with pytest.raises(SystemExit):
        main(["convert", str(src), str(tmp_path / "y"), "--to", "gguf"])


def test_target_refusals(tmp_path, capsys):
    """A target that is not the drafter's, or has no embedding, is refused in one line before anything is written."""
    src = save_drafter(reference_drafter(13), tmp_path / "src")
    code, err = run(capsys, str(src), str(tmp_path / "a"), "--to", "native", "--target",
                    str(fake_target(tmp_path / "other", vocab=VOCAB + 8)))
    assert code == 2 and err.count("\n") == 1 and "vocab_size" in err and "--target" in err
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"hidden_size": HIDDEN, "vocab_size": VOCAB}))
    from safetensors.torch import save_file

    save_file({"lm_head.weight": torch.zeros(VOCAB, HIDDEN)}, str(bare / "model.safetensors"))
    code, err = run(capsys, str(src), str(tmp_path / "b"), "--to", "native", "--target", str(bare))
    assert code == 2 and err.count("\n") == 1 and "embed_tokens.weight" in err
    code, err = run(capsys, str(src), str(tmp_path / "c"), "--to", "native", "--target", str(tmp_path / "nowhere"))
    assert code == 2 and err.count("\n") == 1 and "--target" in err
    assert not any((tmp_path / n).exists() for n in ("a", "b", "c"))


def test_default_target_is_read_only_when_needed(tmp_path, monkeypatch):
    """Without --target: a drafter with its own embedding needs no target for the native layout; one without (or
    the speculators layout, which names the verifier) reads the default target, named by its hub id."""
    import eaglespec.backends.loading as loading

    default = fake_target(tmp_path / "default")
    calls = []
    monkeypatch.setattr(loading, "resolve_target", lambda name: calls.append(name) or str(default))
    own = save_drafter(reference_drafter(3, own_embedding=True), tmp_path / "own")
    assert convert(own, tmp_path / "a", "native").target is None and calls == []
    done = convert(own, tmp_path / "b", "speculators")
    assert calls == [None] and done.own_embedding
    verifier = json.loads((tmp_path / "b" / "config.json").read_text())["speculators_config"]["verifier"]
    assert verifier == {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct", "architectures": ["LlamaForCausalLM"]}
    bare = save_drafter(reference_drafter(3), tmp_path / "bare")
    done = convert(bare, tmp_path / "c", "native")
    assert not done.own_embedding and torch.equal(load_drafter(tmp_path / "c").embed_tokens.weight,
                                                  target_embedding().weight)


def test_convert_eagle1(tmp_path):
    eagle1 = pytest.importorskip("eaglespec.draft.eagle1")
    from eaglespec.checkpoint.config import DraftConfig

    cfg = DraftConfig(method="eagle1", hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, draft_vocab_size=VOCAB,
                      target_hidden_size=HIDDEN, aux_layer_ids=(32,), layout="eagle1")
    torch.manual_seed(14)
    src = save_drafter(eagle1.Eagle1Drafter(cfg).eval(), tmp_path / "src", "eagle1")
    convert(src, tmp_path / "out", "eagle1", target=str(fake_target(tmp_path / "target")))
    a, b = load_drafter(src), load_drafter(tmp_path / "out")
    assert a.cfg.method == b.cfg.method == "eagle1"
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sb) == set(sa) | {"embed_tokens.weight"} and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(sb["embed_tokens.weight"], target_embedding().weight)


def test_speculators_output_loads_with_the_speculators_package(tmp_path):
    """speculators' own Eagle3SpeculatorConfig reads our config, and its Eagle3DraftModel takes our tensors."""
    eagle3 = pytest.importorskip("speculators.models.eagle3")
    from safetensors.torch import load_file

    from eaglespec.checkpoint.convert import TargetInfo, export_drafter

    ref = reference_drafter(15, norm_before_residual=True)
    target = fake_target(tmp_path / "target")
    path = export_drafter(ref, tmp_path / "spec", "speculators",
                          target=TargetInfo("target", json.loads((target / "config.json").read_text()), target))
    cfg = eagle3.Eagle3SpeculatorConfig.from_pretrained(str(path))
    assert cfg.speculators_model_type == "eagle3" and cfg.speculators_config.algorithm == "eagle3"
    assert cfg.speculators_config.verifier.name_or_path == "target"
    assert cfg.draft_vocab_size == ref.cfg.draft_vocab_size and cfg.norm_before_residual is True
    assert cfg.eagle_aux_hidden_state_layer_ids == list(ref.cfg.aux_layer_ids)
    assert cfg.target_vocab_size == VOCAB and cfg.transformer_layer_config.hidden_size == HIDDEN
    assert cfg.transformer_layer_config.head_dim == ref.cfg.head_dim
    model = eagle3.Eagle3DraftModel(cfg)
    result = model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    assert result.unexpected_keys == []
    assert set(result.missing_keys) <= {"verifier_lm_head.weight", "verifier_norm.weight"}
    assert torch.equal(model.layers[0].self_attn.q_proj.weight, ref.midlayer.self_attn.q_proj.weight)
    assert torch.equal(model.embed_tokens.weight, target_embedding().weight)
    assert torch.equal(model.d2t, ref.d2t) and torch.equal(model.t2d, ref.t2d)


def test_convert_to_bf16_halves_the_weights_and_reloads_rounded(tmp_path, capsys):
    from safetensors import safe_open

    ref = reference_drafter(13, own_embedding=True)
    a = save_drafter(ref, tmp_path / "a", "native")
    code, err = run(capsys, str(a), str(tmp_path / "b"), "--to", "native", "--dtype", "bfloat16")
    assert code == 0, err
    assert "bfloat16" in err
    b = tmp_path / "b"
    assert json.loads((b / "config.json").read_text())["torch_dtype"] == "bfloat16"
    files = sorted(b.glob("*.safetensors"))
    assert [f.name for f in files] == ["model.safetensors"]
    with safe_open(str(files[0]), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys() if f.get_tensor(k).is_floating_point()} == {torch.bfloat16}  # noqa: SIM118 (safe_open is not iterable)
    size = sum(p.stat().st_size for p in files)
    assert size < 0.6 * sum(p.stat().st_size for p in a.glob("*.safetensors"))
    da, db = load_drafter(a), load_drafter(b)  # read back as fp32: each weight is its bf16 rounding
    sa, sb = da.state_dict(), db.state_dict()
    for k in sa:
        want = sa[k].to(torch.bfloat16).to(sa[k].dtype) if sa[k].is_floating_point() else sa[k]
        assert torch.equal(sb[k], want), k
    with pytest.raises(EagleSpecError, match="--dtype must be one of"):
        convert(a, tmp_path / "c", "native", dtype="int8")
    # the default dtype is the source's: bf16 in, bf16 out, bit for bit
    code, err = run(capsys, str(b), str(tmp_path / "c"), "--to", "speculators", "--target",
                    str(fake_target(tmp_path / "target")))
    assert code == 0, err
    assert json.loads((tmp_path / "c" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(b / "model.safetensors"), "pt") as fb, \
            safe_open(str(tmp_path / "c" / "model.safetensors"), "pt") as fc:
        for k in fb.keys():  # noqa: SIM118
            assert torch.equal(fb.get_tensor(k), fc.get_tensor(k.replace("midlayer.", "layers.0."))), k


def test_one_file_unless_above_the_shard_size(tmp_path, capsys):
    ref = reference_drafter(16, own_embedding=True)
    src = save_drafter(ref, tmp_path / "src")
    assert sorted(p.name for p in src.iterdir()) == ["config.json", "model.safetensors"]
    code, err = run(capsys, str(src), str(tmp_path / "sharded"), "--to", "native", "--max-shard-size", "40KB")
    assert code == 0, err
    out = tmp_path / "sharded"
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) > 2 and all(s.stat().st_size < 40_000 + 33_000 for s in shards)  # a tensor may overshoot
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    assert "model.safetensors.index.json" in err
    assert_same_logits(ref, load_drafter(out))
