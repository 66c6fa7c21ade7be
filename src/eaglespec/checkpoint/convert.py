"""`eaglespec convert SRC DST --to native|speculators|eagle1`: rewrite a draft checkpoint in another layout.

Reads any layout load_drafter reads (native EAGLE-3 from SGLang / vLLM / SpecForge / SafeAILab,
speculators, EAGLE-1) and writes the requested one with every config field explicit, aux ids in the
entering-layer convention (first id >= 2). No target model is needed: only when the source names no
aux ids must the target's layer count be given (`--target-layers N`), to resolve the default (2, L//2, L-3).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from eaglespec.checkpoint.config import AUX_RULES, DraftConfig
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


def cmd_convert(args: argparse.Namespace) -> int:
    cfg = convert(args.src, args.dst, args.to, target_layers=args.target_layers, aux_rule=args.aux_rule,
                  overwrite=args.overwrite, dtype=args.dtype)
    ids = f"aux ids {list(cfg.aux_layer_ids)} ({cfg.aux_rule}), " if cfg.method == "eagle3" else ""
    print(f"eaglespec: wrote {args.dst} ({args.to} layout) from {args.src} ({cfg.layout} layout, {cfg.method}): "
          f"{ids}draft vocab {cfg.draft_vocab_size}/{cfg.vocab_size}", file=sys.stderr)
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("convert", help="convert a draft checkpoint between layouts (no target needed)")
    p.add_argument("src", help="source checkpoint directory (native EAGLE-3, speculators, SafeAILab EAGLE-1/3)")
    p.add_argument("dst", help="destination directory (must not exist or be empty unless --overwrite)")
    p.add_argument("--to", required=True, choices=LAYOUTS,
                   help="native = LlamaForCausalLMEagle3 / midlayer.* (SGLang, vLLM); speculators = "
                        "Eagle3Speculator / layers.0.*; eagle1 = SafeAILab EAGLE-1")
    p.add_argument("--target-layers", type=int, default=None,
                   help="the target's layer count; needed only when the source names no aux layer ids")
    p.add_argument("--aux-rule", default="auto", choices=AUX_RULES,
                   help="how to read the source's aux layer ids: auto (+1 when the first id is 1, as SGLang), "
                        "output (output-of-layer ids, +1), entering (as written)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty destination (atomically)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype of the written weights (float32)")
    p.set_defaults(func=cmd_convert)
    return p
