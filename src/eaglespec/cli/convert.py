"""`eaglespec convert SRC DST --to native|speculators|eagle1`: rewrite a draft checkpoint in another layout
(eaglespec.checkpoint.convert). No target model is needed."""

from __future__ import annotations

import argparse

from eaglespec.checkpoint.config import AUX_RULES
from eaglespec.checkpoint.convert import DTYPES, LAYOUTS, convert
from eaglespec.cli.args import log


def add_parser(subparsers) -> None:
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
                        "output (output-of-layer ids, +1), entering (as written); default auto")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty destination (atomically)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="dtype of the written weights (float32)")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    cfg = convert(args.src, args.dst, args.to, target_layers=args.target_layers, aux_rule=args.aux_rule,
                  overwrite=args.overwrite, dtype=args.dtype)
    ids = f"aux ids {list(cfg.aux_layer_ids)} ({cfg.aux_rule}), " if cfg.method == "eagle3" else ""
    log(f"eaglespec: wrote {args.dst} ({args.to} layout) from {args.src} ({cfg.layout} layout, {cfg.method}): "
        f"{ids}draft vocab {cfg.draft_vocab_size}/{cfg.vocab_size}")
    return 0
