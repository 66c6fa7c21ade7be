"""Target fingerprints: a drafter (or a feature cache) records which target it was trained against.

fingerprint = config digest + weight digest + tokenizer digest. The weight digest is dtype-robust:
a strided sample of every parameter is rounded to bfloat16 before hashing, so the same target
loaded in fp32 on CPU or bf16 on GPU fingerprints the same, while a different target does not.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any

import torch

from eaglespec.errors import EagleSpecError

MANIFEST_VERSION = 1
_SAMPLES_PER_TENSOR = 4096


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


_ARCH_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "tie_word_embeddings",
              "hidden_act", "attention_bias", "mlp_bias")


def config_digest(model) -> str:
    """The architecture-defining fields plus the resolved rope: stable across transformers versions
    (4.x and 5.x serialize the rest of a config differently, e.g. rope_scaling vs rope_parameters)."""
    from eaglespec.checkpoint.rope import resolve_rope_theta, rope_parameters

    cfg = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)
    keep = {k: cfg.get(k) for k in _ARCH_KEYS}
    rope = {k: v for k, v in rope_parameters(cfg).items() if k not in ("rope_theta", "rope_type", "type")}
    keep["rope"] = {"theta": resolve_rope_theta(cfg), **rope}
    return _sha(json.dumps(keep, sort_keys=True, default=str).encode())


@torch.no_grad()
def weight_digest(model) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        if not torch.is_tensor(p) or not p.is_floating_point():
            continue
        flat = p.detach().reshape(-1)
        stride = max(1, flat.numel() // _SAMPLES_PER_TENSOR)
        sample = flat[::stride][:_SAMPLES_PER_TENSOR].to("cpu", torch.bfloat16).contiguous().view(torch.int16)
        h.update(f"{name}:{tuple(p.shape)}:".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:32]


def tokenizer_digest(tokenizer) -> str | None:
    """Vocabulary, chat template and special-token ids: stable across transformers versions (the
    serialized special-token map is not: 5.17 and 5.24 print it differently)."""
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab()
    special = {k: getattr(tokenizer, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")}
    payload = {"vocab": sorted(vocab.items(), key=lambda kv: kv[1]),
               "chat_template": getattr(tokenizer, "chat_template", None), "special_ids": special}
    return _sha(json.dumps(payload, default=str).encode())


def target_fingerprint(model, tokenizer=None) -> dict[str, Any]:
    cfg = model.config
    return {
        "name_or_path": getattr(cfg, "_name_or_path", None) or getattr(cfg, "name_or_path", None),
        "model_type": getattr(cfg, "model_type", None),
        "num_hidden_layers": getattr(cfg, "num_hidden_layers", None),
        "hidden_size": getattr(cfg, "hidden_size", None),
        "vocab_size": getattr(cfg, "vocab_size", None),
        "config_digest": config_digest(model),
        "weight_digest": weight_digest(model),
        "tokenizer_digest": tokenizer_digest(tokenizer),
    }


def build_manifest(model, tokenizer, *, method: str, feature_layer_ids, normalisation: str = "none",
                   dtype: str | None = None, hyperparameters: dict[str, Any] | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest stored next to a trained drafter or a feature cache."""
    return {
        "eaglespec_manifest": MANIFEST_VERSION,
        "method": method,
        "target": target_fingerprint(model, tokenizer),
        "feature_layer_ids": [int(i) for i in feature_layer_ids],
        "feature_normalisation": normalisation,
        "dtype": dtype,
        "hyperparameters": dict(hyperparameters or {}),
        **(extra or {}),
    }


def manifest_mismatches(manifest: dict[str, Any] | None, model, tokenizer=None) -> list[str]:
    """Fields of the recorded target fingerprint that differ from `model` / `tokenizer`."""
    if not manifest or not isinstance(manifest.get("target"), dict):
        return []
    rec = manifest["target"]
    now = target_fingerprint(model, tokenizer)
    out = []
    for key in ("model_type", "num_hidden_layers", "hidden_size", "vocab_size", "config_digest", "weight_digest",
                "tokenizer_digest"):
        if rec.get(key) is None or now.get(key) is None:
            continue  # not recorded (or no tokenizer given): nothing to compare
        if rec[key] != now[key]:
            out.append(f"{key} {rec[key]} != {now[key]}")
    return out


def check_manifest(drafter_manifest: dict[str, Any] | None, target_model, tokenizer=None,
                   strict: bool = False, where: str = "drafter") -> list[str]:
    """Warn (or, when strict, raise EagleSpecError) if `drafter_manifest` was made for another target."""
    bad = manifest_mismatches(drafter_manifest, target_model, tokenizer)
    if bad:
        trained = (drafter_manifest.get("target") or {}).get("name_or_path")
        msg = (f"{where} was trained against a different target ({trained}): {'; '.join(bad)}. A drafter is not "
               "portable merely because the hidden size matches; expect low acceptance")
        if strict:
            raise EagleSpecError(msg + " (refused under --strict)")
        warnings.warn(msg, stacklevel=2)
    return bad
