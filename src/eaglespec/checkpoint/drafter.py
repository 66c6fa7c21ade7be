"""Load and save drafters in the published layouts.

native EAGLE-3 (SGLang / vLLM / SafeAILab): fc.weight, midlayer.*, norm.weight, lm_head.weight,
    d2t, t2d, optional embed_tokens.weight / input_norm.weight / fc_norm.{i}.weight
speculators (Eagle3Speculator): the same with layers.0.* in place of midlayer.*
EAGLE-1 (SafeAILab): fc.weight, fc.bias, layers.0.* (see draft/eagle1.py)
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eaglespec.checkpoint.config import (
    DraftConfig,
    Layout,
    default_aux_layer_ids,
    detect_layout,
    eagle1_config_dict,
    native_config_dict,
    parse_draft_config,
    read_json,
    speculators_config_dict,
)
from eaglespec.checkpoint.io import load_state_dict, save_state_dict, weights_file
from eaglespec.errors import CheckpointError, EagleSpecError

MANIFEST = "eaglespec_manifest.json"


def _rename(state: dict[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """Published tensor names -> eaglespec module names."""
    out = {}
    for name, t in state.items():
        if name.startswith("model."):
            name = name[len("model."):]
        if layout != "eagle1" and name.startswith("layers.0."):  # speculators / vLLM names for the midlayer
            name = "midlayer." + name[len("layers.0."):]
        out[name] = t
    return out


# Tensors some writers add that do not take part in drafting (speculators' training-only verifier head,
# rope caches of old checkpoints); anything else unexpected under the drafter's modules is an error.
IGNORED_TENSORS = ("verifier_lm_head.weight", "verifier_norm.weight")


def _published_names(state: dict[str, torch.Tensor], layout: Layout) -> dict[str, torch.Tensor]:
    """eaglespec module names -> the names `layout` writes."""
    if layout != "speculators":
        return dict(state)
    return {("layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k): v for k, v in state.items()}


def build_drafter(cfg: DraftConfig, own_embedding: bool = False) -> nn.Module:
    if cfg.method == "eagle1":
        from eaglespec.draft.eagle1 import Eagle1Drafter

        return Eagle1Drafter(cfg, own_embedding=own_embedding)
    from eaglespec.draft.eagle3 import Eagle3Drafter

    return Eagle3Drafter(cfg, own_embedding=own_embedding)


def _check_against_target(cfg: DraftConfig, path: Path, target_hidden: int | None, target_vocab: int | None) -> None:
    cfile = path / "config.json"
    if target_hidden is not None and cfg.target_hidden_size != target_hidden:
        raise CheckpointError(cfile, f"field 'target_hidden_size' ({cfg.target_hidden_size}) does not match the "
                                     f"target's hidden size {target_hidden}")
    if target_vocab is not None and cfg.vocab_size != target_vocab:
        raise CheckpointError(cfile, f"field 'vocab_size' ({cfg.vocab_size}) does not match the target's "
                                     f"vocabulary size {target_vocab}")


def check_draft_dir(draft: str | Path | None, flag: str = "--draft") -> None:
    """Before anything loads: a draft checkpoint directory must exist and hold a config.json object and a weights
    file (one-line errors naming `flag` and the path)."""
    if draft is None:
        return
    path = Path(draft)
    if not path.is_dir():
        raise EagleSpecError(f"{flag} {draft}: no such directory")
    read_json(path / "config.json")
    weights_file(path)


def load_drafter(
    path: str | Path,
    *,
    target_num_layers: int | None = None,
    target_hidden_size: int | None = None,
    target_vocab_size: int | None = None,
    aux_rule: str = "auto",
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """Read a draft checkpoint directory (any supported layout) into a drafter module.

    Every refusal is a one-line CheckpointError naming the file and the field or tensor at fault.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(path, "draft checkpoint directory not found")
    cfile = path / "config.json"
    raw = read_json(cfile)
    wfile = weights_file(path)
    loaded = load_state_dict(path)
    layout = None
    if detect_layout(raw) == "eagle1" and any(k.removeprefix("model.").startswith("midlayer.") for k in loaded):
        layout = "native"  # SafeAILab EAGLE-3 config without EAGLE-3 markers: the tensors decide
    cfg = parse_draft_config(raw, cfile, target_num_layers=target_num_layers, aux_rule=aux_rule, layout=layout)
    _check_against_target(cfg, path, target_hidden_size, target_vocab_size)
    state = _rename(loaded, cfg.layout)
    own_embedding = "embed_tokens.weight" in state
    if cfg.method == "eagle3" and "d2t" not in state and cfg.draft_vocab_size != cfg.vocab_size:
        raise CheckpointError(wfile, f"tensor 'd2t' is missing but draft_vocab_size {cfg.draft_vocab_size} "
                                     f"differs from vocab_size {cfg.vocab_size} in config.json")
    drafter = build_drafter(cfg, own_embedding=own_embedding)
    expected = drafter.state_dict()
    for name, ref in expected.items():
        if name not in state:
            if name in ("d2t", "t2d"):
                continue  # full vocabulary: identity map already in the buffers
            raise CheckpointError(wfile, f"tensor {name!r} is missing from the weights")
        got = state[name]
        if tuple(got.shape) != tuple(ref.shape):
            raise CheckpointError(wfile, f"tensor {name!r} has shape {tuple(got.shape)}, expected {tuple(ref.shape)} "
                                         "from config.json")
        if ref.is_floating_point() != got.is_floating_point() and name not in ("t2d",):
            raise CheckpointError(wfile, f"tensor {name!r} has dtype {got.dtype}, expected a "
                                         f"{'floating' if ref.is_floating_point() else 'integer'} tensor")
    unexpected = sorted(n for n in set(state) - set(expected)
                        if n not in IGNORED_TENSORS and not n.endswith("rotary_emb.inv_freq"))
    used_modules = {n.split(".", 1)[0] for n in expected}
    for name in unexpected:
        if name.split(".", 1)[0] in used_modules:  # e.g. fc.bias, midlayer.self_attn.q_norm.weight
            raise CheckpointError(wfile, f"tensor {name!r} is not supported by the {cfg.method} drafter "
                                         "(it would change the computation)")
    if unexpected:
        warnings.warn(f"{wfile}: ignoring tensors not used by the drafter: {', '.join(unexpected[:5])}", stacklevel=2)
    with torch.no_grad():
        for name, ref in expected.items():
            if name in state:
                ref.copy_(state[name].to(ref.dtype))
    if cfg.method == "eagle3":
        _check_vocab_maps(drafter, wfile, has_t2d="t2d" in state)
    drafter.to(dtype)
    drafter.checkpoint_path = str(path)
    manifest = path / MANIFEST
    drafter.manifest = read_json(manifest) if manifest.is_file() else None
    return drafter


def _check_vocab_maps(drafter: nn.Module, path: Path, has_t2d: bool) -> None:
    """d2t must map the draft ids one-to-one into the target vocab (contract 5); t2d must agree with it."""
    d2t = drafter.d2t
    target_ids = torch.arange(d2t.numel()) + d2t
    vocab = drafter.cfg.vocab_size
    if target_ids.numel() and (target_ids.min() < 0 or target_ids.max() >= vocab):
        bad = int(((target_ids < 0) | (target_ids >= vocab)).nonzero()[0, 0])
        raise CheckpointError(path, f"tensor 'd2t' maps draft id {bad} to target id {int(target_ids[bad])}, outside "
                                    f"the target vocabulary of {vocab} (d2t is an offset: target = draft + d2t[draft])")
    if target_ids.unique().numel() != target_ids.numel():
        raise CheckpointError(path, "tensor 'd2t' maps two draft ids to the same target id")
    if has_t2d:
        t2d = drafter.t2d
        if int(t2d.sum()) != target_ids.numel() or not bool(t2d[target_ids].all()):
            raise CheckpointError(path, f"tensor 't2d' ({int(t2d.sum())} ids set) does not mark exactly the "
                                        f"{target_ids.numel()} target ids that 'd2t' maps to")


def save_drafter(
    drafter: nn.Module,
    path: str | Path,
    layout: Layout | None = None,
    *,
    manifest: dict[str, Any] | None = None,
    overwrite: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write `drafter` in `layout` (default: native for EAGLE-3, eagle1 for EAGLE-1), its floating
    tensors in `dtype` (fp32 by default; bf16 halves the files)."""
    cfg: DraftConfig = drafter.cfg
    layout = layout or ("eagle1" if cfg.method == "eagle1" else "native")
    if (layout == "eagle1") != (cfg.method == "eagle1"):
        raise CheckpointError(path, f"cannot write a {cfg.method} drafter in the {layout} layout")
    if cfg.method == "eagle3" and not cfg.aux_layer_ids:
        raise CheckpointError(path, "the drafter's aux layer ids are unknown (its source named none): resolve "
                                    "them against the target's layer count before saving")
    if cfg.method == "eagle3" and cfg.aux_layer_ids[0] < 2:
        raise CheckpointError(path, f"aux layer ids {list(cfg.aux_layer_ids)} start below 2: readers would take "
                                    "them as output-of-layer ids; choose entering-layer ids >= 2")
    config = {"native": native_config_dict, "speculators": speculators_config_dict,
              "eagle1": eagle1_config_dict}[layout](cfg)
    tensors = drafter.export_state() if hasattr(drafter, "export_state") else drafter.state_dict()
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}
    if "torch_dtype" in config:
        config["torch_dtype"] = str(dtype).replace("torch.", "")
    extra = {MANIFEST: json.dumps(manifest, indent=2) + "\n"} if manifest else None
    return save_state_dict(_published_names(state, layout), Path(path), config, extra_files=extra,
                           overwrite=overwrite)


def random_drafter(model, seed: int = 0) -> torch.nn.Module:
    """An untrained EAGLE-3 drafter shaped for `model` (for plumbing and baselines only)."""
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = c.num_attention_heads
    cfg = DraftConfig(method="eagle3", hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_attention_heads=heads, num_key_value_heads=getattr(c, "num_key_value_heads", heads),
                      head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
                      vocab_size=model.get_output_embeddings().weight.shape[0],
                      draft_vocab_size=model.get_output_embeddings().weight.shape[0],
                      target_hidden_size=c.hidden_size,
                      aux_layer_ids=tuple(min(max(j, 0), c.num_hidden_layers)  # tiny models: keep ids in range
                                          for j in default_aux_layer_ids(c.num_hidden_layers)),
                      rms_norm_eps=getattr(c, "rms_norm_eps", 1e-6))
    torch.manual_seed(seed)
    return build_drafter(cfg)
