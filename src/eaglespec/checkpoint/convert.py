"""Rewrite a draft checkpoint in another layout (`eaglespec convert SRC DST --to native|speculators|eagle1`).

Reads any layout load_drafter reads (native EAGLE-3 from SGLang / vLLM / SpecForge / SafeAILab,
speculators, EAGLE-1) and writes the requested one with every config field explicit, aux ids in the
entering-layer convention (first id >= 2). No target model is needed: only when the source names no
aux ids must the target's layer count be given (`--target-layers N`), to resolve the default (2, L//2, L-3).
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglespec.checkpoint.config import DraftConfig
from eaglespec.errors import EagleSpecError

LAYOUTS = ("native", "speculators", "eagle1")
DTYPES = ("float32", "bfloat16", "float16")


def convert(
    src: str | Path,
    dst: str | Path,
    to: str,
    *,
    target_layers: int | None = None,
    aux_rule: str = "auto",
    overwrite: bool = False,
    dtype: str = "float32",
) -> DraftConfig:
    """Convert the checkpoint at `src` into layout `to` at `dst`; returns the written config."""
    from eaglespec.checkpoint.drafter import load_drafter, save_drafter

    if dtype not in DTYPES:
        raise EagleSpecError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if to not in LAYOUTS:
        raise EagleSpecError(f"--to must be one of {', '.join(LAYOUTS)}, got {to!r}")
    if target_layers is not None and target_layers <= 0:
        raise EagleSpecError(f"--target-layers must be a positive integer, got {target_layers}")
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise EagleSpecError(f"{dst}: the destination is the source checkpoint; write to a new directory")
    drafter = load_drafter(src, target_num_layers=target_layers, aux_rule=aux_rule)
    cfg: DraftConfig = drafter.cfg
    if cfg.method == "eagle3" and not cfg.aux_layer_ids:
        raise EagleSpecError(f"{src / 'config.json'}: names no eagle_aux_hidden_state_layer_ids; pass "
                             "--target-layers N (the target's layer count) to write the default (2, N//2, N-3)")
    save_drafter(drafter, dst, to, manifest=getattr(drafter, "manifest", None), overwrite=overwrite,
                 dtype=getattr(torch, dtype))
    return cfg
