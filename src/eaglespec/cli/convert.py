"""`eaglespec convert SRC DST --to native|speculators|eagle1`: rewrite a draft checkpoint in another layout, as
vLLM, SGLang, SpecForge, speculators and SafeAILab's EAGLE load it (eaglespec.checkpoint.convert)."""

from __future__ import annotations

import argparse

from eaglespec.checkpoint.config import AUX_RULES
from eaglespec.checkpoint.convert import DEFAULT_MAX_SHARD_SIZE, DTYPES, LAYOUTS, convert
from eaglespec.cli.args import log


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert a draft checkpoint between layouts, ready for vLLM, SGLang, "
                                              "SpecForge, speculators or SafeAILab EAGLE")
    p.add_argument("src", help="source checkpoint directory (native EAGLE-3, speculators, SafeAILab EAGLE-1/3)")
    p.add_argument("dst", help="destination directory (must not exist or be empty unless --overwrite)")
    p.add_argument("--to", required=True, choices=LAYOUTS,
                   help="native = LlamaForCausalLMEagle3 / midlayer.* (vLLM, SGLang, SpecForge, SafeAILab EAGLE-3); "
                        "speculators = Eagle3Speculator / layers.0.* (vLLM, speculators); eagle1 = SafeAILab EAGLE-1")
    p.add_argument("--target", default=None,
                   help="the drafter's target (HF directory or hub id; default SmolLM2-135M-Instruct). Its "
                        "embedding is written when the drafter has none of its own, its name and architectures "
                        "fill speculators' verifier, its layer count resolves missing aux ids. Only its config and "
                        "embedding are read")
    p.add_argument("--target-layers", type=int, default=None,
                   help="the target's layer count, when the source names no aux layer ids and no --target is given")
    p.add_argument("--aux-rule", default="auto", choices=AUX_RULES,
                   help="how to read the source's aux layer ids: auto (+1 when the first id is 1, as SGLang), "
                        "output (output-of-layer ids, +1), entering (as written); default auto")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty destination (atomically)")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="dtype of the written weights (default: the source's)")
    p.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE,
                   help="largest weights file (e.g. 5GB, 500MB, 2GiB): up to it the weights are one "
                        "model.safetensors (SafeAILab's loader reads no index), above it shards with an index; "
                        f"default {DEFAULT_MAX_SHARD_SIZE}")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    done = convert(args.src, args.dst, args.to, target=args.target, target_layers=args.target_layers,
                          aux_rule=args.aux_rule, overwrite=args.overwrite, dtype=args.dtype,
                          max_shard_size=args.max_shard_size)
    from eaglespec.checkpoint.io import floating_dtype, weights_file

    cfg, target = done.cfg, done.target
    ids = f"aux ids {list(cfg.aux_layer_ids)} ({cfg.aux_rule}), " if cfg.method == "eagle3" else ""
    embedding = "the drafter's own" if done.own_embedding else "the target's"
    written = str(floating_dtype(args.dst)).replace("torch.", "")
    log(f"eaglespec: wrote {args.dst} ({args.to} layout, {written}, {weights_file(args.dst).name}) from {args.src} "
        f"({cfg.layout} layout, {cfg.method}): {ids}draft vocab {cfg.draft_vocab_size}/{cfg.vocab_size}, "
        f"embed_tokens {embedding}" + (f", target {target.name}" if target is not None else ""))
    return 0
