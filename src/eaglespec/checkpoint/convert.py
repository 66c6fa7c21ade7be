"""Export a drafter for the engines and trainers that read it, and convert checkpoints between layouts
(`eaglespec convert SRC DST --to native|speculators|eagle1`).

    native       LlamaForCausalLMEagle3, read by vLLM, SGLang, SpecForge and SafeAILab's EAGLE-3 loader.
                 config.json: a Llama config as SpecForge writes it, plus draft_vocab_size, target_hidden_size,
                 the norm flags and the aux ids (top level and under eagle_config). Tensors: embed_tokens.weight,
                 fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t, t2d (+ fc_norm.{i} / input_norm).
    speculators  Eagle3Speculator (vLLM, speculators): the same tensors with layers.0.* for midlayer.*; the
                 Eagle-3 fields at top level, the decoder layer under transformer_layer_config, and
                 speculators_config.verifier naming the target (speculators reads its lm_head and norm from it).
    eagle1       SafeAILab EAGLE-1: a Llama config with `bias`; embed_tokens.weight, fc.weight, fc.bias, layers.{i}.*.

Every export carries embed_tokens.weight: the drafter's own when it has one, else the target's, read as one
tensor from the target's checkpoint. Without it SafeAILab's EAGLE-3 loader (which takes the target's embedding
only when the config names no target_hidden_size) and speculators (which fills it from the verifier only while
it is still NaN) would run the drafter on an uninitialised embedding. d2t / t2d are written for a reduced draft
vocabulary only (SafeAILab and speculators have no such buffers for a full one). The weights are one
model.safetensors up to `max_shard_size` (SafeAILab reads no index), in the source's dtype unless told otherwise.
Aux ids are written in the entering-layer convention (first id >= 2); the target's layer count resolves them when
the source names none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from eaglespec.checkpoint.config import (
    DraftConfig,
    Layout,
    eagle1_config_dict,
    native_config_dict,
    read_json,
    speculators_config_dict,
)
from eaglespec.checkpoint.io import (
    DEFAULT_MAX_SHARD_BYTES,
    floating_dtype,
    parse_size,
    read_tensor,
    save_state_dict,
    weight_map,
)
from eaglespec.errors import CheckpointError, EagleSpecError

LAYOUTS = ("native", "speculators", "eagle1")
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_SHARD_SIZE = "5GB"
MANIFEST = "eaglespec_manifest.json"
# LlamaConfig fields SpecForge's exports carry that the DraftConfig does not decide
LLAMA_DEFAULTS = {"attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True}


@dataclass
class TargetInfo:
    """What an export takes from the target: the name a consumer loads it by, its config.json, and its token
    embedding [vocab, hidden] (read from `path` on first use when not given)."""

    name: str
    config: dict[str, Any]
    path: Path | None = None
    embedding: torch.Tensor | None = None

    @property
    def text_config(self) -> dict[str, Any]:
        """The language model's fields (multimodal configs nest them under text_config)."""
        inner = self.config.get("text_config")
        return inner if isinstance(inner, dict) else self.config

    @property
    def architectures(self) -> list[str]:
        return list(self.config.get("architectures") or [])

    @property
    def num_layers(self) -> int | None:
        n = self.text_config.get("num_hidden_layers")
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None

    def embedding_weight(self) -> torch.Tensor:
        """The target's token embedding weight, read once from its checkpoint (model.embed_tokens.weight, or the
        one tensor whose name ends in embed_tokens.weight)."""
        if self.embedding is None:
            if self.path is None:
                raise EagleSpecError(f"target {self.name}: no embedding and no checkpoint directory to read it from")
            names = weight_map(self.path)
            key = "model.embed_tokens.weight"
            if key not in names:
                found = sorted(n for n in names if n.endswith("embed_tokens.weight"))
                if len(found) != 1:
                    raise CheckpointError(self.path, f"no single embed_tokens.weight among the target's tensors "
                                                     f"(found {found or 'none'})")
                key = found[0]
            self.embedding = read_tensor(self.path, key)
        return self.embedding

    @classmethod
    def from_model(cls, model: nn.Module, name: str | None = None) -> TargetInfo:
        """A loaded HF causal LM: its config and input embedding (no file is read)."""
        config = model.config.to_dict()
        name = name or config.get("_name_or_path") or config.get("name_or_path") or ""
        return cls(name=str(name), config=config, embedding=model.get_input_embeddings().weight.detach())


def read_target(target: str | None) -> TargetInfo:
    """The target named by `target` (a local HF directory, a hub id in the local cache, or None: the default
    SmolLM2-135M-Instruct); only its config.json is read here."""
    from eaglespec.backends.loading import DEFAULT_TARGET, resolve_target

    name = target or f"HuggingFaceTB/{DEFAULT_TARGET}"
    path = Path(resolve_target(target))
    if not path.is_dir():
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(str(target), allow_patterns=["*.json", "*.safetensors"]))
        except Exception as exc:  # hub errors come in many types
            raise EagleSpecError(f"--target {target}: not a directory, and not found as a hub id "
                                 f"({type(exc).__name__})") from None
    return TargetInfo(name=name, config=read_json(path / "config.json"), path=path)


def check_target(cfg: DraftConfig, target: TargetInfo, manifest: dict[str, Any] | None = None) -> None:
    """The target must be the drafter's: same vocabulary and hidden size (and, where the drafter's manifest
    recorded them, the same layer count and model type)."""
    tc = target.text_config
    want = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.target_hidden_size}
    recorded = (manifest or {}).get("target") if isinstance(manifest, dict) else None
    if isinstance(recorded, dict):
        want.update({k: recorded[k] for k in ("num_hidden_layers", "model_type") if recorded.get(k) is not None})
    for key, value in want.items():
        if tc.get(key) is not None and tc.get(key) != value:
            raise EagleSpecError(f"--target {target.name}: its {key} is {tc.get(key)}, the drafter's target has "
                                 f"{value}; pass the target the drafter was trained for")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _legacy_rope_scaling(config: dict[str, Any]) -> None:
    """rope_scaling also under the legacy key `type` (transformers 4.x and SafeAILab read that one)."""
    scaling = config.get("rope_scaling")
    if isinstance(scaling, dict) and "type" not in scaling and scaling.get("rope_type"):
        config["rope_scaling"] = {**scaling, "type": scaling["rope_type"]}


def export_config(cfg: DraftConfig, layout: Layout, dtype: torch.dtype, target: TargetInfo | None = None
                  ) -> dict[str, Any]:
    """config.json of `layout`, every field explicit, with the Llama fields SpecForge writes (the target's
    bos / eos / pad ids where it has them) and, for speculators, the verifier filled from `target`."""
    import transformers

    config = {"native": native_config_dict, "speculators": speculators_config_dict,
              "eagle1": eagle1_config_dict}[layout](cfg)
    llama: dict[str, Any] = dict(LLAMA_DEFAULTS)
    if target is not None:
        llama.update({k: target.text_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")
                      if target.text_config.get(k) is not None})
    llama.update(torch_dtype=_dtype_name(dtype), transformers_version=transformers.__version__)
    layer = config["transformer_layer_config"] if layout == "speculators" else config
    layer.update(llama)
    _legacy_rope_scaling(layer)
    if layout == "speculators":
        config["torch_dtype"] = _dtype_name(dtype)
        config["speculators_config"]["verifier"] = {
            "name_or_path": target.name if target is not None else None,
            "architectures": target.architectures if target is not None else []}
    if layout == "eagle1":  # SafeAILab's EAGLE-1 reads fc's bias from `bias` (default true), q/k/v's from qkv_bias
        config.update(bias=True, qkv_bias=cfg.attention_bias)
    return config


def export_state(drafter: nn.Module, layout: Layout, dtype: torch.dtype, embedding: torch.Tensor | None
                 ) -> dict[str, torch.Tensor]:
    """The tensors `layout` holds, under its names, floating ones in `dtype`: the drafter's own, embed_tokens.weight
    (its own, else `embedding`), d2t / t2d only for a reduced draft vocabulary."""
    cfg: DraftConfig = drafter.cfg
    state = dict(drafter.state_dict())
    if "embed_tokens.weight" not in state:
        if embedding is None:
            raise EagleSpecError(f"the {cfg.method} drafter has no embedding of its own: give the target's "
                                 "(--target T) so the export carries embed_tokens.weight")
        if tuple(embedding.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise EagleSpecError(f"the target's embedding has shape {tuple(embedding.shape)}, the drafter needs "
                                 f"({cfg.vocab_size}, {cfg.hidden_size}); pass the target the drafter was trained for")
        state["embed_tokens.weight"] = embedding
    if cfg.method == "eagle3" and cfg.draft_vocab_size == cfg.vocab_size:
        state.pop("d2t", None)
        state.pop("t2d", None)
    out = {}
    for name, t in state.items():
        if layout == "speculators" and name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        out[name] = t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().to("cpu")
    return out


def export_drafter(
    drafter: nn.Module,
    dst: str | Path,
    layout: Layout | None = None,
    *,
    target: TargetInfo | None = None,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
    manifest: dict[str, Any] | None = None,
) -> Path:
    """Write `drafter` in `layout` (default: native for EAGLE-3, eagle1 for EAGLE-1) at `dst`, as every consumer
    of that layout loads it (see the module docstring). `target` gives the embedding when the drafter has none and
    speculators' verifier; `dtype` defaults to the drafter's own."""
    cfg: DraftConfig = drafter.cfg
    layout = layout or ("eagle1" if cfg.method == "eagle1" else "native")
    if layout not in LAYOUTS:
        raise EagleSpecError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if (layout == "eagle1") != (cfg.method == "eagle1"):
        raise CheckpointError(Path(dst), f"cannot write a {cfg.method} drafter in the {layout} layout")
    if cfg.method == "eagle3" and not cfg.aux_layer_ids:
        raise CheckpointError(Path(dst), "the drafter's aux layer ids are unknown (its source named none): resolve "
                                         "them against the target's layer count before saving")
    if cfg.method == "eagle3" and cfg.aux_layer_ids[0] < 2:
        raise CheckpointError(Path(dst), f"aux layer ids {list(cfg.aux_layer_ids)} start below 2: readers would "
                                         "take them as output-of-layer ids; choose entering-layer ids >= 2")
    if target is not None:
        check_target(cfg, target, manifest)
    dtype = dtype or next(p.dtype for p in drafter.parameters() if p.is_floating_point())
    needs_embedding = getattr(drafter, "embed_tokens", None) is None
    state = export_state(drafter, layout, dtype, target.embedding_weight() if needs_embedding and target else None)
    config = export_config(cfg, layout, dtype, target)
    extra = {MANIFEST: json.dumps(manifest, indent=2) + "\n"} if manifest else None
    return save_state_dict(state, Path(dst), config, max_shard_bytes=max_shard_bytes, extra_files=extra,
                           overwrite=overwrite)


@dataclass
class Converted:
    """What convert() wrote: the drafter's config, the target read (None: none was needed), and whether the
    embedding written is the drafter's own (else the target's)."""

    cfg: DraftConfig
    target: TargetInfo | None
    own_embedding: bool


def convert(
    src: str | Path,
    dst: str | Path,
    to: str,
    *,
    target: str | None = None,
    target_layers: int | None = None,
    aux_rule: str = "auto",
    overwrite: bool = False,
    dtype: str | None = None,
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
) -> Converted:
    """Convert the checkpoint at `src` into layout `to` at `dst` (see the module docstring).

    target: the target model (HF directory or hub id; None = the default SmolLM2, read only when needed).
    dtype: float32 / bfloat16 / float16; None = the source's.
    """
    from eaglespec.checkpoint.drafter import load_drafter

    if dtype is not None and dtype not in DTYPES:
        raise EagleSpecError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if to not in LAYOUTS:
        raise EagleSpecError(f"--to must be one of {', '.join(LAYOUTS)}, got {to!r}")
    if target_layers is not None and target_layers <= 0:
        raise EagleSpecError(f"--target-layers must be a positive integer, got {target_layers}")
    max_shard_bytes = parse_size(max_shard_size)
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise EagleSpecError(f"{dst}: the destination is the source checkpoint; write to a new directory")
    info = read_target(target) if target is not None else None
    layers = target_layers or (info.num_layers if info is not None else None)
    drafter = load_drafter(src, target_num_layers=layers, aux_rule=aux_rule)
    cfg: DraftConfig = drafter.cfg
    if cfg.method == "eagle3" and not cfg.aux_layer_ids:
        raise EagleSpecError(f"{src / 'config.json'}: names no eagle_aux_hidden_state_layer_ids; pass "
                             "--target T or --target-layers N (the target's layer count) to write the default "
                             "(2, N//2, N-3)")
    if (to == "eagle1") != (cfg.method == "eagle1"):
        raise CheckpointError(dst, f"cannot write a {cfg.method} drafter in the {to} layout")
    own_embedding = drafter.embed_tokens is not None
    if info is None and (not own_embedding or to == "speculators"):
        info = read_target(None)
    source_dtype = floating_dtype(src) or torch.float32
    export_drafter(drafter, dst, to, target=info, dtype=getattr(torch, dtype) if dtype else source_dtype,
                   max_shard_bytes=max_shard_bytes, overwrite=overwrite, manifest=getattr(drafter, "manifest", None))
    return Converted(cfg, info, own_embedding)
