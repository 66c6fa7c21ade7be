"""`eaglespec generate`: text for one prompt, with speculative decoding.

stdout holds the text (or, with --json, one JSON object: text, token_ids, prompt_token_ids, stats); the stats
line goes to stderr.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglespec.cli.args import (
    add_model_args,
    add_sampling_args,
    add_tree_args,
    check_model_inputs,
    load_eaglespec,
    log,
    non_negative,
    sampling_options,
)
from eaglespec.errors import EagleSpecError


def add_parser(subparsers) -> None:
    g = subparsers.add_parser("generate", help="generate text for one prompt with speculative decoding")
    add_model_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text (chat template applied unless --raw)")
    src.add_argument("--prompt-file", help="read the prompt text from this file")
    g.add_argument("--raw", action="store_true", help="feed the prompt as is (no chat template): plain completion")
    g.add_argument("--max-new-tokens", type=int, default=128, help="stop after this many new tokens (default 128)")
    add_tree_args(g)
    add_sampling_args(g)
    g.add_argument("--json", action="store_true", help="print one JSON object on stdout (text, ids, stats)")
    g.set_defaults(func=cmd_generate)


def read_prompt(args: argparse.Namespace) -> str:
    """--prompt, or the whole text of --prompt-file."""
    if not args.prompt_file:
        return args.prompt
    try:
        return Path(args.prompt_file).read_text()
    except OSError as exc:
        raise EagleSpecError(f"--prompt-file {args.prompt_file}: cannot read the file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise EagleSpecError(f"--prompt-file {args.prompt_file}: not UTF-8 text") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from eaglespec.api import tree_label

    non_negative(args, "max_new_tokens")
    config = check_model_inputs(args)
    prompt = read_prompt(args)
    es = load_eaglespec(args, config)
    opts = sampling_options(args, getattr(es.model, "generation_config", None))
    out = es.generate(prompt, args.max_new_tokens, raw=args.raw, **opts)
    if args.json:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "prompt_token_ids": out.prompt_token_ids,
                          "stats": out.stats}))
        return 0
    print(out.text)
    s = out.stats
    log(f"[{s['new_tokens']} tokens in {s['seconds']:.2f}s = {s['tokens_per_second']} tok/s | tau {s['tau']:.2f} | "
        f"{s['rounds']} rounds, {s['accepted']}/{s['drafted']} drafts accepted | backend {s['backend']} | "
        f"tree {tree_label(es.tree_for(opts.get('temperature')))}]")
    return 0
