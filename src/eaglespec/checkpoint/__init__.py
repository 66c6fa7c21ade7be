"""Draft checkpoints: configs, layouts, tensor files, rope resolver."""

from eaglespec.checkpoint.config import (
    DraftConfig,
    default_aux_layer_ids,
    normalize_aux_layer_ids,
    parse_draft_config,
)
from eaglespec.checkpoint.drafter import build_drafter, load_drafter, save_drafter
from eaglespec.checkpoint.rope import resolve_rotary_dim

__all__ = [
    "DraftConfig",
    "build_drafter",
    "default_aux_layer_ids",
    "load_drafter",
    "normalize_aux_layer_ids",
    "parse_draft_config",
    "resolve_rotary_dim",
    "save_drafter",
]
