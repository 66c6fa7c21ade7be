"""Target fingerprints: a drafter (or a feature cache) records which target it was trained against.

fingerprint = config digest + weight digest + tokenizer digest. The weight digest is dtype-robust:
a strided sample of every parameter is rounded to bfloat16 before hashing, so the same target
loaded in fp32 on CPU or bf16 on GPU fingerprints the same, while a different target does not.
"""

from __future__ import annotations

import hashlib
import itertools
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


# -- the acceptance profile (trees sized by measurement: tree/auto.py) ------------------------------------------
PROFILE_TEMPERATURES = ("t0", "t1")  # greedy requests; requests sampled at temperature 1
_MASS_EPS = 1e-6


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _accept_table(value: Any, name: str) -> list[list[float]]:
    """accept [D][K]: probabilities in [0, 1], rows of one length, each summing to <= 1."""
    shape = f"{name} must be a non-empty [depth][rank] table of probabilities in [0, 1] with rows of one length"
    if not isinstance(value, list) or not value or not all(isinstance(r, list) and r for r in value):
        raise EagleSpecError(shape)
    if any(len(r) != len(value[0]) for r in value):
        raise EagleSpecError(shape)
    for d, row in enumerate(value):
        if not all(_is_number(x) and 0.0 <= x <= 1.0 for x in row) or sum(row) > 1 + _MASS_EPS:
            raise EagleSpecError(f"{name}[{d}] must hold probabilities in [0, 1] summing to <= 1, got {row}")
    return [[float(x) for x in r] for r in value]


def _increasing_ints(value: Any, name: str) -> list[int]:
    ints = isinstance(value, list) and value and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    if not ints or value[0] < 1 or any(b <= a for a, b in itertools.pairwise(value)):
        raise EagleSpecError(f"{name} must be a non-empty increasing list of integers >= 1, got {value!r}")
    return list(value)


def _dynamic_table(value: Any, name: str) -> dict[str, Any]:
    """{"top_k": [K...], "budgets": [B...], "tau": [K][D][B] numbers >= 1}: measured tau of dynamic trees."""
    if not isinstance(value, dict):
        raise EagleSpecError(f"{name} must be an object with top_k, budgets and tau")
    top_k = _increasing_ints(value.get("top_k"), f"{name}.top_k")
    budgets = _increasing_ints(value.get("budgets"), f"{name}.budgets")
    tau = value.get("tau")
    shape = (f"{name}.tau must be a [top_k][depth][budget] table ({len(top_k)} x depth x {len(budgets)}) of numbers "
             ">= 1, every top_k with the same depths")
    if not isinstance(tau, list) or len(tau) != len(top_k) or not all(isinstance(t, list) and t for t in tau):
        raise EagleSpecError(shape)
    if any(len(t) != len(tau[0]) for t in tau):
        raise EagleSpecError(shape)
    for t in tau:
        for row in t:
            if not isinstance(row, list) or len(row) != len(budgets) or not all(_is_number(x) and x >= 1 for x in row):
                raise EagleSpecError(shape)
    return {"top_k": top_k, "budgets": budgets, "tau": [[[float(x) for x in row] for row in t] for t in tau]}


def read_acceptance_profile(manifest: dict[str, Any] | None, where: str = "drafter") -> dict[str, Any] | None:
    """The manifest's `acceptance_profile`, validated (None when it has none):

        {"t0": {"accept": [D][K], "dynamic": {...}}, "t1": {"accept": [D][K]}, "measured": "provenance"}

    t0: greedy requests, t1: requests sampled at temperature 1 (at least one of them). accept[d][r] = P(the accepted
    child at depth d+1 is the parent's rank-r child | the parent was accepted): at t0 the r-th most likely draft
    token, at t1 the (r+1)-th draw without replacement. dynamic (optional): {"top_k": [K], "budgets": [B], "tau":
    [K][D][B]}, the measured tokens per round of EAGLE-2 dynamic trees of each width, depth and budget. Other keys
    (provenance) are kept as they are. A malformed field is a one-line EagleSpecError naming it."""
    value = (manifest or {}).get("acceptance_profile")
    if value is None:
        return None
    field = f"{where}: eaglespec_manifest.json field acceptance_profile"
    if not isinstance(value, dict):
        raise EagleSpecError(f"{field} must be an object with t0 (greedy) and/or t1 (sampled) acceptance")
    out: dict[str, Any] = {k: v for k, v in value.items() if k not in PROFILE_TEMPERATURES}
    for key in PROFILE_TEMPERATURES:
        part = value.get(key)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise EagleSpecError(f"{field}.{key} must be an object with accept (and optionally dynamic)")
        out[key] = {**part, "accept": _accept_table(part.get("accept"), f"{field}.{key}.accept")}
        if part.get("dynamic") is not None:
            out[key]["dynamic"] = _dynamic_table(part["dynamic"], f"{field}.{key}.dynamic")
    if not any(key in out for key in PROFILE_TEMPERATURES):
        raise EagleSpecError(f"{field} must hold t0 (greedy) and/or t1 (sampled) acceptance")
    return out


def with_acceptance_profile(manifest: dict[str, Any], profile: dict[str, Any], where: str = "drafter"
                            ) -> dict[str, Any]:
    """A copy of a drafter manifest holding `profile` as its acceptance_profile (validated first)."""
    read_acceptance_profile({"acceptance_profile": profile}, where)
    return {**manifest, "acceptance_profile": profile}
