"""Bad draft checkpoints are refused with a one-line CheckpointError naming the file and field/tensor;
saving never destroys what the user had (atomic write, non-empty destination refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglespec.checkpoint.drafter import load_drafter, save_drafter
from eaglespec.checkpoint.io import save_state_dict
from eaglespec.errors import CheckpointError
from test_checkpoint import (
    DRAFT_VOCAB,
    HIDDEN,
    TARGET_LAYERS,
    VOCAB,
    published_tensors,
    qwen35_9b_config,
    qwen35_reference,
    reference_drafter,
    write_checkpoint,
)

TARGET = dict(target_num_layers=TARGET_LAYERS, target_hidden_size=HIDDEN, target_vocab_size=VOCAB)


def good(tmp_path: Path, config=None, tensors=None, name: str = "ckpt") -> Path:
    ref = qwen35_reference()
    return write_checkpoint(tmp_path / name, qwen35_9b_config() if config is None else config,
                            published_tensors(ref) if tensors is None else tensors)


def refused(path: Path, *needles: str, **kwargs) -> str:
    """Load `path`, expect a CheckpointError whose one line contains every needle."""
    with pytest.raises(CheckpointError) as info:
        load_drafter(path, **{**TARGET, **kwargs})
    msg = str(info.value)
    assert "\n" not in msg
    for needle in needles:
        assert needle in msg, (needle, msg)
    return msg


def test_the_good_fixture_loads(tmp_path):
    assert load_drafter(good(tmp_path), **TARGET).cfg.aux_layer_ids == (2, 16, 29)


def test_missing_tensor(tmp_path):
    t = published_tensors(qwen35_reference())
    del t["midlayer.mlp.up_proj.weight"]
    refused(good(tmp_path, tensors=t), "model.safetensors", "'midlayer.mlp.up_proj.weight'", "missing")


def test_wrong_shape(tmp_path):
    t = published_tensors(qwen35_reference())
    t["fc.weight"] = torch.zeros(HIDDEN, 2 * HIDDEN)
    refused(good(tmp_path, tensors=t), "model.safetensors", "'fc.weight'", f"({HIDDEN}, {2 * HIDDEN})",
            f"({HIDDEN}, {3 * HIDDEN})")


def test_hidden_size_does_not_match_target(tmp_path):
    refused(good(tmp_path), "config.json", "'target_hidden_size'", "48", target_hidden_size=48)


def test_vocab_does_not_match_target(tmp_path):
    refused(good(tmp_path), "config.json", "'vocab_size'", "128", target_vocab_size=128)


def test_aux_id_out_of_range(tmp_path):
    cfg = qwen35_9b_config()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 15, 40]
    refused(good(tmp_path, config=cfg), "config.json", "'eagle_aux_hidden_state_layer_ids'", "41", "32-layer")


@pytest.mark.parametrize("ids", [[], "1,15,28", [1, None, 3], [-3, 4, 5], [True, 2, 3]])
def test_malformed_aux_ids(tmp_path, ids):
    cfg = qwen35_9b_config()
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    refused(good(tmp_path, config=cfg), "config.json", "'eagle_aux_hidden_state_layer_ids'")


def test_malformed_json(tmp_path):
    text = json.dumps(qwen35_9b_config(), indent=2)[:-40]
    refused(good(tmp_path, config=text), "config.json", "malformed JSON", "line")


def test_json_not_an_object(tmp_path):
    refused(good(tmp_path, config="[1, 2, 3]"), "config.json", "JSON object")


@pytest.mark.parametrize(("field", "value"), [("hidden_size", "64"), ("vocab_size", 0), ("num_attention_heads", None),
                                             ("head_dim", -2), ("norm_before_residual", "yes"),
                                             ("draft_vocab_size", 1000), ("num_key_value_heads", 3),
                                             ("target_hidden_size", 1.5)])
def test_bad_config_fields(tmp_path, field, value):
    refused(good(tmp_path, config=qwen35_9b_config(**{field: value})), "config.json", field)


def test_unsupported_config(tmp_path):
    refused(good(tmp_path, config=qwen35_9b_config(num_hidden_layers=2), name="a"), "config.json", "'num_hidden_layers'")
    refused(good(tmp_path, config=qwen35_9b_config(norm_before_fc=True, fc_norm=True), name="b"),
            "config.json", "'norm_before_fc'", "'fc_norm'")
    llama3 = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}
    refused(good(tmp_path, config=qwen35_9b_config(rope_parameters=llama3), name="c"), "config.json", "llama3")
    spec = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3"}
    refused(good(tmp_path, config=spec, name="d"), "config.json", "'transformer_layer_config'")


def test_truncated_safetensors(tmp_path):
    path = good(tmp_path)
    f = path / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    refused(path, "model.safetensors", "truncated")


def test_garbage_safetensors_header(tmp_path):
    path = good(tmp_path)
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    refused(path, "model.safetensors")


def test_no_weights(tmp_path):
    path = good(tmp_path)
    (path / "model.safetensors").unlink()
    refused(path, "no weights found")
    refused(tmp_path / "nowhere", "not found")


def test_missing_config(tmp_path):
    path = good(tmp_path)
    (path / "config.json").unlink()
    refused(path, "config.json", "not found")


def _sharded(tmp_path: Path) -> Path:
    ref = qwen35_reference()
    path = save_state_dict(published_tensors(ref), tmp_path / "sharded", qwen35_9b_config(), max_shard_bytes=200_000)
    assert len(list(path.glob("model-*.safetensors"))) >= 2
    return path


def _edit_index(path: Path, edit) -> None:
    f = path / "model.safetensors.index.json"
    index = json.loads(f.read_text())
    edit(index)
    f.write_text(json.dumps(index))


def test_sharded_loads(tmp_path):
    assert load_drafter(_sharded(tmp_path), **TARGET).cfg.aux_layer_ids == (2, 16, 29)


def test_bad_shard_index_no_weight_map(tmp_path):
    path = _sharded(tmp_path)
    _edit_index(path, lambda ix: ix.pop("weight_map"))
    refused(path, "model.safetensors.index.json", "'weight_map'")


def test_bad_shard_index_missing_shard(tmp_path):
    path = _sharded(tmp_path)
    shard = sorted(path.glob("model-*.safetensors"))[0]
    shard.unlink()
    refused(path, shard.name, "missing")


def test_bad_shard_index_tensor_in_no_shard(tmp_path):
    path = _sharded(tmp_path)
    _edit_index(path, lambda ix: ix["weight_map"].update({"midlayer.extra.weight": next(iter(ix["weight_map"].values()))}))
    refused(path, "model.safetensors.index.json", "'midlayer.extra.weight'")


def test_bad_shard_index_path_outside_directory(tmp_path):
    path = _sharded(tmp_path)
    _edit_index(path, lambda ix: ix["weight_map"].update({"fc.weight": "../elsewhere.safetensors"}))
    refused(path, "model.safetensors.index.json", "'fc.weight'", "../elsewhere.safetensors")


def test_bad_shard_index_malformed_json(tmp_path):
    path = _sharded(tmp_path)
    (path / "model.safetensors.index.json").write_text("{\"weight_map\": {")
    refused(path, "model.safetensors.index.json", "malformed JSON")


def test_d2t_outside_the_vocab(tmp_path):
    t = published_tensors(qwen35_reference())
    t["d2t"] = t["d2t"].clone()
    t["d2t"][-1] = VOCAB  # draft id DRAFT_VOCAB-1 -> target id >= VOCAB
    refused(good(tmp_path, tensors=t), "model.safetensors", "'d2t'", f"draft id {DRAFT_VOCAB - 1}", "outside")


def test_d2t_stored_as_absolute_ids_is_caught(tmp_path):
    """The classic mix-up: a d2t holding target ids instead of offsets maps past the vocabulary."""
    t = published_tensors(qwen35_reference())
    t["d2t"] = t["d2t"] + torch.arange(DRAFT_VOCAB)
    refused(good(tmp_path, tensors=t), "'d2t'", "offset")


def test_d2t_not_one_to_one(tmp_path):
    t = published_tensors(qwen35_reference())
    target = torch.arange(DRAFT_VOCAB) + t["d2t"]
    t["d2t"] = t["d2t"].clone()
    t["d2t"][1] = target[0] - 1  # draft ids 0 and 1 -> the same target id
    refused(good(tmp_path, tensors=t), "'d2t'", "same target id")


def test_t2d_disagrees_with_d2t(tmp_path):
    t = published_tensors(qwen35_reference())
    t["t2d"] = torch.zeros(VOCAB, dtype=torch.bool)
    t["t2d"][:DRAFT_VOCAB] = True
    refused(good(tmp_path, tensors=t), "'t2d'")


def test_missing_d2t_with_reduced_vocab(tmp_path):
    t = published_tensors(qwen35_reference())
    del t["d2t"]
    refused(good(tmp_path, tensors=t), "'d2t'", "draft_vocab_size")


def test_tensor_that_would_change_the_math(tmp_path):
    t = published_tensors(qwen35_reference())
    t["fc.bias"] = torch.zeros(HIDDEN)
    refused(good(tmp_path, tensors=t, name="a"), "'fc.bias'", "not supported")
    t = published_tensors(qwen35_reference())
    t["midlayer.self_attn.q_norm.weight"] = torch.ones(256)
    refused(good(tmp_path, tensors=t, name="b"), "'midlayer.self_attn.q_norm.weight'")


def test_training_only_tensors_are_ignored_with_a_warning(tmp_path):
    t = published_tensors(qwen35_reference())
    t["verifier_lm_head.weight"] = torch.zeros(DRAFT_VOCAB, HIDDEN)  # speculators' training head: ignored
    t["some_optimizer_state"] = torch.zeros(3)
    with pytest.warns(UserWarning, match="some_optimizer_state"):
        load_drafter(good(tmp_path, tensors=t), **TARGET)


def test_bin_weights_are_never_unpickled(tmp_path):
    """pytorch_model.bin is read with weights_only=True: a pickle carrying code is refused."""
    path = good(tmp_path)
    (path / "model.safetensors").unlink()
    torch.save({"fc.weight": torch.zeros(1), "payload": Path("x")}, str(path / "pytorch_model.bin"))
    refused(path, "pytorch_model.bin", "weights-only")


# --------------------------------------------------------------------------------------------------
# saving never destroys what the user had
# --------------------------------------------------------------------------------------------------
def _snapshot(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_refuses_a_non_empty_destination(tmp_path):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not empty"):
        save_drafter(reference_drafter(), dst)
    assert _snapshot(dst) == {"notes.txt": b"mine"}


def test_refuses_a_file_destination(tmp_path):
    dst = tmp_path / "file"
    dst.write_text("mine")
    with pytest.raises(CheckpointError, match="not a directory"):
        save_drafter(reference_drafter(), dst, overwrite=True)
    assert dst.read_text() == "mine"


def test_empty_destination_is_fine(tmp_path):
    (tmp_path / "empty").mkdir()
    save_drafter(reference_drafter(), tmp_path / "empty")
    assert load_drafter(tmp_path / "empty").cfg.draft_vocab_size == DRAFT_VOCAB


def test_failed_save_leaves_the_old_checkpoint_and_no_debris(tmp_path, monkeypatch):
    dst = save_drafter(reference_drafter(1), tmp_path / "dst")
    before = _snapshot(dst)
    import safetensors.torch

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        save_drafter(reference_drafter(2), dst, overwrite=True)
    assert _snapshot(dst) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]  # no temporary directories left


def test_overwrite_replaces_atomically(tmp_path):
    dst = save_drafter(reference_drafter(1), tmp_path / "dst")
    (dst / "stale.txt").write_text("old")
    save_drafter(reference_drafter(2), dst, overwrite=True)
    assert not (dst / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]
    again = load_drafter(dst)
    assert torch.equal(again.fc.weight, reference_drafter(2).fc.weight)
