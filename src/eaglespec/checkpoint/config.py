"""Parse draft-checkpoint configs (native EAGLE-3, speculators, SafeAILab EAGLE-1) into DraftConfig.

Aux-layer ids follow contract 3 (docs/contracts.md): inside eaglespec id j is the hidden state ENTERING
decoder layer j (= HF ``hidden_states[j]``). Published files use two conventions; we read them as
SGLang does (add 1 to every id when the first id is 1) and always write entering-layer ids >= 2.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from eaglespec.checkpoint.rope import resolve_rope_theta, resolve_rotary_dim, rope_parameters
from eaglespec.errors import CheckpointError, EagleSpecError

Method = Literal["eagle3", "eagle1"]
Layout = Literal["native", "speculators", "eagle1"]

# SGLang / SpecForge write LlamaForCausalLMEagle3; vLLM registers Eagle3LlamaForCausalLM (and maps the SGLang
# name to it); any architecture name containing "Eagle3" is taken as EAGLE-3. SafeAILab's own EAGLE-3 configs
# say "LlamaForCausalLM" and are recognised by their `draft_vocab_size` (or, in load_drafter, by midlayer.*
# tensors). "LlamaForCausalLMEagle" (no 3) is SGLang's EAGLE-1/2 architecture, not EAGLE-3.
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM")
# speculators' Eagle3SpeculatorConfig defaults to "Eagle3Speculator"; newer exports say "Eagle3DraftModel".
SPECULATORS_ARCHITECTURES = ("Eagle3Speculator", "Eagle3DraftModel")
AUX_RULES = ("auto", "output", "entering")


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """vLLM's default: the states entering layers 2, L//2 and L-3."""
    return (2, num_layers // 2, num_layers - 3)


def normalize_aux_layer_ids(ids: list[int], rule: str = "auto") -> tuple[tuple[int, ...], str]:
    """Map published ids to entering-layer ids. Returns (ids, which rule applied).

    rule: "auto" (SGLang's rule, PR #25454: +1 to every id when the first id is 1),
    "output" (the file uses output-of-layer ids: always +1), "entering" (take as they are).
    """
    if rule == "auto":
        rule = "output" if ids and ids[0] == 1 else "entering"
    if rule == "output":
        return tuple(i + 1 for i in ids), "output-of-layer ids (+1)"
    if rule == "entering":
        return tuple(ids), "entering-layer ids (as written)"
    raise EagleSpecError(f"unknown aux-id rule {rule!r}: use auto, output or entering")


@dataclass
class DraftConfig:
    """Everything the drafter modules need, in eaglespec's own conventions."""

    method: Method
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the TARGET vocabulary (embedding rows, t2d length)
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]  # entering-layer convention (contract 3)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rotary_dim: int | None = None  # resolved width; None = head_dim
    max_position_embeddings: int = 8192
    num_hidden_layers: int = 1
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    aux_rule: str = "entering-layer ids (as written)"
    layout: Layout = "native"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rotary_dim is None:
            self.rotary_dim = self.head_dim

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["aux_layer_ids"] = list(self.aux_layer_ids)
        return d


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object from `path`, refusing malformed files with a one-line error."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CheckpointError(path, "file not found") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CheckpointError(path, f"malformed JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise CheckpointError(path, "expected a JSON object at top level")
    return data


def _int(cfg: dict[str, Any], key: str, path: Path, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CheckpointError(path, f"field {key!r} must be a positive integer, got {value!r}")
    return value


def detect_layout(cfg: dict[str, Any]) -> Layout:
    archs = cfg.get("architectures") or []
    if cfg.get("speculators_model_type") == "eagle3" or any(a in SPECULATORS_ARCHITECTURES for a in archs):
        return "speculators"
    if cfg.get("eaglespec_method") == "eagle1" or (
        "eagle_config" not in cfg
        and "draft_vocab_size" not in cfg
        and not any(a in EAGLE3_ARCHITECTURES or "Eagle3" in str(a) for a in archs)
        and cfg.get("model_type") != "eagle3"
    ):
        return "eagle1"
    return "native"


def _flag(cfg: dict[str, Any], layer_cfg: dict[str, Any], key: str, path: Path, *aliases: str) -> bool:
    """A boolean config flag at top level (else in the layer config); absent = False."""
    for source in (cfg, layer_cfg):
        for k in (key, *aliases):
            if k in source and source[k] is not None:
                value = source[k]
                if not isinstance(value, bool):
                    raise CheckpointError(path, f"field {k!r} must be true or false, got {value!r}")
                return value
    return False


def _raw_aux_ids(cfg: dict[str, Any], layer_cfg: dict[str, Any]) -> Any:
    """eagle_aux_hidden_state_layer_ids at top level, under eagle_config, or in the layer config."""
    for source in (cfg, cfg.get("eagle_config"), layer_cfg):
        if isinstance(source, dict) and source.get("eagle_aux_hidden_state_layer_ids") is not None:
            return source["eagle_aux_hidden_state_layer_ids"]
    return None


def _scaling(cfg: DraftConfig) -> dict[str, Any]:
    """The rope scaling parameters of `cfg` to write ({"rope_type": "default"} when unscaled)."""
    params = {k: v for k, v in (cfg.extra.get("rope_scaling") or {}).items()
              if k not in ("rope_theta", "partial_rotary_factor")}
    kind = params.pop("rope_type", params.pop("type", None)) or "default"
    return {"rope_type": kind, **params} if kind != "default" else {"rope_type": "default"}


def _check_rope_type(layer_cfg: dict[str, Any], path: Path) -> None:
    """The drafters implement plain, linear and llama3 rope; refuse other types rather than rotate wrongly."""
    params = rope_parameters(layer_cfg)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None, "linear", "llama3"):
        raise CheckpointError(path, f"field 'rope_scaling'/'rope_parameters' rope_type {kind!r} is not supported "
                                    "(rope types: default, linear, llama3)")
    needed = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                                 "original_max_position_embeddings")}.get(kind, ())
    for key in needed:
        if not isinstance(params.get(key), int | float) or isinstance(params.get(key), bool):
            raise CheckpointError(path, f"field 'rope_scaling.{key}' must be a number for rope_type {kind!r}")


def parse_draft_config(
    cfg: dict[str, Any],
    path: Path,
    *,
    target_num_layers: int | None = None,
    aux_rule: str = "auto",
    layout: Layout | None = None,
) -> DraftConfig:
    """Turn a config.json dict of any supported layout into a DraftConfig.

    `layout` overrides detection (load_drafter uses it when the tensor names prove a layout, e.g. a
    SafeAILab EAGLE-3 config that says only "LlamaForCausalLM"). Aux ids (contract 3) come from the
    top level, `eagle_config` or the layer config; `aux_rule` (auto|output|entering) says how to read them.
    """
    if aux_rule not in AUX_RULES:
        raise EagleSpecError(f"unknown aux-id rule {aux_rule!r}: use auto, output or entering")
    layout = layout or detect_layout(cfg)
    layer_cfg = cfg
    if layout == "speculators":
        layer_cfg = cfg.get("transformer_layer_config")
        if not isinstance(layer_cfg, dict):
            raise CheckpointError(path, "speculators config lacks the object 'transformer_layer_config'")
    hidden = _int(layer_cfg, "hidden_size", path)
    heads = _int(layer_cfg, "num_attention_heads", path)
    kv_heads = _int(layer_cfg, "num_key_value_heads", path, heads)
    head_dim = layer_cfg.get("head_dim") or hidden // heads
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise CheckpointError(path, f"field 'head_dim' must be a positive integer, got {head_dim!r}")
    if heads % kv_heads:
        raise CheckpointError(path, f"field 'num_attention_heads' ({heads}) is not a multiple of "
                                    f"'num_key_value_heads' ({kv_heads})")
    vocab = _int(layer_cfg, "vocab_size", path)
    # draft_vocab_size (absent = the target vocab, as vLLM/SGLang); nebius-style drafts say truncated_vocab_size
    draft_key = "draft_vocab_size" if cfg.get("draft_vocab_size") is not None else "truncated_vocab_size"
    draft_vocab = _int(cfg, draft_key, path) if cfg.get(draft_key) is not None else vocab
    if draft_vocab > vocab:
        raise CheckpointError(path, f"field {draft_key!r} ({draft_vocab}) exceeds 'vocab_size' ({vocab})")
    target_hidden = cfg.get("target_hidden_size") or layer_cfg.get("target_hidden_size") or hidden
    if isinstance(target_hidden, bool) or not isinstance(target_hidden, int) or target_hidden <= 0:
        raise CheckpointError(path, f"field 'target_hidden_size' must be a positive integer, got {target_hidden!r}")
    num_layers = _int(layer_cfg, "num_hidden_layers", path, 1)
    _check_rope_type(layer_cfg, path)

    if layout == "eagle1":
        method: Method = "eagle1"
        aux_ids: tuple[int, ...] = (target_num_layers,) if target_num_layers else ()
        rule_used = "EAGLE-1: the last layer's output (pre final norm)"
    else:
        method = "eagle3"
        if num_layers != 1:
            raise CheckpointError(path, f"field 'num_hidden_layers' is {num_layers}: only 1-layer EAGLE-3 drafters "
                                        "are supported")
        raw_ids = _raw_aux_ids(cfg, layer_cfg)
        if raw_ids is None:
            if target_num_layers is None:
                aux_ids, rule_used = (), "default (2, L//2, L-3), resolved against the target"
            else:
                aux_ids = default_aux_layer_ids(target_num_layers)
                rule_used = "default (2, L//2, L-3)"
        else:
            if (not isinstance(raw_ids, list) or not raw_ids
                    or not all(isinstance(i, int) and not isinstance(i, bool) for i in raw_ids)):
                raise CheckpointError(path, "field 'eagle_aux_hidden_state_layer_ids' must be a non-empty list of "
                                            f"integers, got {raw_ids!r}")
            aux_ids, rule_used = normalize_aux_layer_ids(raw_ids, aux_rule)
            if min(aux_ids) < 0:
                raise CheckpointError(path, f"field 'eagle_aux_hidden_state_layer_ids' {raw_ids} holds a negative "
                                            "layer id")
        if target_num_layers is not None:
            check_aux_ids(aux_ids, target_num_layers, path, rule_used)

    norm_flags = {k: _flag(cfg, layer_cfg, k, path) for k in ("norm_before_residual", "norm_before_fc", "norm_output")}
    norm_flags["fc_norm"] = _flag(cfg, layer_cfg, "fc_norm", path, "use_aux_norm")  # SGLang's legacy alias
    if norm_flags["fc_norm"] and norm_flags["norm_before_fc"]:
        raise CheckpointError(path, "fields 'norm_before_fc' and 'fc_norm' are both true: they are mutually "
                                    "exclusive (one RMSNorm over the concatenation, or one per aux state)")
    return DraftConfig(
        method=method,
        hidden_size=hidden,
        intermediate_size=_int(layer_cfg, "intermediate_size", path),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=int(target_hidden),
        aux_layer_ids=aux_ids,
        rms_norm_eps=float(layer_cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=resolve_rope_theta(layer_cfg),
        rotary_dim=resolve_rotary_dim(layer_cfg, head_dim),
        max_position_embeddings=int(layer_cfg.get("max_position_embeddings") or 8192),
        num_hidden_layers=int(num_layers),
        attention_bias=bool(layer_cfg.get("attention_bias", False)),
        mlp_bias=bool(layer_cfg.get("mlp_bias", False)),
        aux_rule=rule_used,
        layout=layout,
        extra={"rope_scaling": dict(rope_parameters(layer_cfg))},
        **norm_flags,
    )


def check_aux_ids(aux_ids: tuple[int, ...], target_num_layers: int, path: object, rule: str = "") -> None:
    """Entering-layer ids must name a state that exists: 0 <= j <= L (j = L: the last layer's output)."""
    for j in aux_ids:
        if not 0 <= j <= target_num_layers:
            read_as = f", read as {rule}" if rule else ""
            raise CheckpointError(
                path,
                f"field 'eagle_aux_hidden_state_layer_ids': entering-layer id {j}{read_as} is out of range for a "
                f"{target_num_layers}-layer target (valid 0..{target_num_layers})",
            )


def native_config_dict(cfg: DraftConfig) -> dict[str, Any]:
    """config.json for the native EAGLE-3 layout (SGLang / vLLM / SafeAILab), every field explicit."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.num_hidden_layers,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        # rope at top level (transformers 4.x, vLLM, SGLang) and under rope_parameters (transformers 5)
        "rope_theta": cfg.rope_theta,
        "partial_rotary_factor": (cfg.rotary_dim or cfg.head_dim) / cfg.head_dim,
        "rope_parameters": {**_scaling(cfg), "rope_theta": cfg.rope_theta,
                            "partial_rotary_factor": (cfg.rotary_dim or cfg.head_dim) / cfg.head_dim},
        "rope_scaling": _scaling(cfg) if _scaling(cfg)["rope_type"] != "default" else None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
        "tie_word_embeddings": False,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        # SGLang reads the ids and use_aux_hidden_state from eagle_config, vLLM from the top level
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids)},
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "torch_dtype": "float32",
    }


def speculators_config_dict(cfg: DraftConfig) -> dict[str, Any]:
    """config.json for the speculators `Eagle3Speculator` layout, every field explicit.

    The Eagle-3 fields sit at top level (speculators' Eagle3SpeculatorConfig; vLLM's speculators reader
    takes draft_vocab_size, target_hidden_size, norm_* and the aux ids from there and defaults a missing
    norm_before_residual to True, so it is always written); the decoder layer is a LlamaConfig dict.
    """
    layer = {k: v for k, v in native_config_dict(cfg).items()
             if k not in ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config",
                          "eagle_aux_hidden_state_layer_ids", "norm_before_residual", "norm_before_fc",
                          "fc_norm", "norm_output")}
    layer["architectures"] = ["LlamaForCausalLM"]
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": layer,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.norm_before_fc,
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"architectures": [], "name_or_path": None},
        },
    }


def eagle1_config_dict(cfg: DraftConfig) -> dict[str, Any]:
    """config.json in SafeAILab's EAGLE-1 shape (a Llama config with num_hidden_layers)."""
    d = native_config_dict(cfg)
    for k in ("draft_vocab_size", "target_hidden_size", "eagle_config", "eagle_aux_hidden_state_layer_ids",
              "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"):
        d.pop(k)
    d["architectures"] = ["LlamaForCausalLM"]
    d["eaglespec_method"] = "eagle1"
    return d
