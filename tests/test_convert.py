"""`eaglespec convert`: between layouts and from SafeAILab checkpoints, without the target model.

Exported checkpoints reload to the same logits; the speculators output is also checked against the
`speculators` package's own classes when that package can be imported (skipped otherwise).
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
    VOCAB,
    assert_same_logits,
    published_tensors,
    qwen35_9b_config,
    qwen35_reference,
    reference_drafter,
    write_checkpoint,
)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["convert", *argv])
    return code, capsys.readouterr().err


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
    code, err = run(capsys, str(src), str(tmp_path / "out"), "--to", to)
    assert code == 0, err
    assert "aux ids [2, 16, 29]" in err and "output-of-layer" in err
    out = load_drafter(tmp_path / "out", target_num_layers=32, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)
    assert out.cfg.layout == to and out.cfg.aux_layer_ids == (2, 16, 29) and out.cfg.rotary_dim == 64
    assert_same_logits(ref, out)


def test_native_speculators_native_is_lossless(tmp_path):
    ref = reference_drafter(12, own_embedding=True, norm_before_residual=True, fc_norm=True, target_hidden_size=48)
    a = save_drafter(ref, tmp_path / "a", "native")
    convert(a, tmp_path / "b", "speculators")
    convert(tmp_path / "b", tmp_path / "c", "native")
    assert json.loads((a / "config.json").read_text()) == json.loads((tmp_path / "c" / "config.json").read_text())
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
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 16, 29] and cfg["norm_before_residual"] is False
    assert cfg["rope_theta"] == 10000.0 and cfg["rms_norm_eps"] == 1e-05
    out = load_drafter(tmp_path / "out")
    assert out.embed_tokens is not None  # SafeAILab's embedding travels with the checkpoint
    assert_same_logits(ref, out)


def test_aux_rule_for_reading(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "src", qwen35_9b_config(), published_tensors(qwen35_reference()))
    # read [1, 15, 28] as entering ids: they start below 2, so writing them would mislead SGLang: refused
    code, err = run(capsys, str(src), str(tmp_path / "a"), "--to", "native", "--aux-rule", "entering")
    assert code == 2 and "start below 2" in err and not (tmp_path / "a").exists()
    cfg = qwen35_9b_config()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 16, 29]
    src2 = write_checkpoint(tmp_path / "src2", cfg, published_tensors(qwen35_reference()))
    code, err = run(capsys, str(src2), str(tmp_path / "b"), "--to", "native", "--aux-rule", "output")
    assert code == 0, err
    assert json.loads((tmp_path / "b" / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [3, 17, 30]


def test_convert_refusals(tmp_path, capsys):
    ref = reference_drafter(13)
    src = save_drafter(ref, tmp_path / "src")
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    code, err = run(capsys, str(src), str(dst), "--to", "speculators")
    assert code == 2 and "not empty" in err and (dst / "keep.txt").read_text() == "mine"
    code, err = run(capsys, str(src), str(dst), "--to", "speculators", "--overwrite")
    assert code == 0 and not (dst / "keep.txt").exists() and load_drafter(dst).cfg.layout == "speculators"
    code, err = run(capsys, str(src), str(tmp_path / "e1"), "--to", "eagle1")
    assert code == 2 and "eagle1 layout" in err and not (tmp_path / "e1").exists()
    code, err = run(capsys, str(src), str(src), "--to", "native", "--overwrite")
    assert code == 2 and "source" in err and load_drafter(src).cfg.layout == "native"
    code, err = run(capsys, str(tmp_path / "missing"), str(tmp_path / "x"), "--to", "native")
    assert code == 2 and "not found" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["convert", str(src), str(tmp_path / "y"), "--to", "gguf"])


def test_convert_eagle1(tmp_path):
    eagle1 = pytest.importorskip("eaglespec.draft.eagle1")
    from eaglespec.checkpoint.config import DraftConfig

    cfg = DraftConfig(method="eagle1", hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=VOCAB, draft_vocab_size=VOCAB,
                      target_hidden_size=HIDDEN, aux_layer_ids=(32,), layout="eagle1")
    torch.manual_seed(14)
    src = save_drafter(eagle1.Eagle1Drafter(cfg).eval(), tmp_path / "src", "eagle1")
    convert(src, tmp_path / "out", "eagle1")
    a, b = load_drafter(src), load_drafter(tmp_path / "out")
    assert a.cfg.method == b.cfg.method == "eagle1"
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_speculators_output_loads_with_the_speculators_package(tmp_path):
    """speculators' own Eagle3SpeculatorConfig reads our config, and its Eagle3DraftModel takes our tensors."""
    eagle3 = pytest.importorskip("speculators.models.eagle3")
    from safetensors.torch import load_file

    ref = reference_drafter(15, norm_before_residual=True)
    path = save_drafter(ref, tmp_path / "spec", "speculators")
    cfg = eagle3.Eagle3SpeculatorConfig.from_pretrained(str(path))
    assert cfg.speculators_model_type == "eagle3" and cfg.speculators_config.algorithm == "eagle3"
    assert cfg.draft_vocab_size == ref.cfg.draft_vocab_size and cfg.norm_before_residual is True
    assert cfg.eagle_aux_hidden_state_layer_ids == list(ref.cfg.aux_layer_ids)
    assert cfg.target_vocab_size == VOCAB and cfg.transformer_layer_config.hidden_size == HIDDEN
    assert cfg.transformer_layer_config.head_dim == ref.cfg.head_dim
    model = eagle3.Eagle3DraftModel(cfg)
    result = model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    assert result.unexpected_keys == []
    assert set(result.missing_keys) <= {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight"}
    assert torch.equal(model.layers[0].self_attn.q_proj.weight, ref.midlayer.self_attn.q_proj.weight)
    assert torch.equal(model.d2t, ref.d2t) and torch.equal(model.t2d, ref.t2d)


def test_convert_to_bf16_halves_the_weights_and_reloads_rounded(tmp_path, capsys):
    from safetensors import safe_open

    ref = reference_drafter(13, own_embedding=True)
    a = save_drafter(ref, tmp_path / "a", "native")
    code, err = run(capsys, str(a), str(tmp_path / "b"), "--to", "native", "--dtype", "bfloat16")
    assert code == 0, err
    b = tmp_path / "b"
    assert json.loads((b / "config.json").read_text())["torch_dtype"] == "bfloat16"
    files = sorted(b.glob("*.safetensors"))
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
