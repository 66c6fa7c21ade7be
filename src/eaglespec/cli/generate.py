"""`eaglespec generate`: text for one prompt, or for every prompt of a .jsonl file (batched), with speculative
decoding.

stdout holds the text (or, with --json, one JSON object per prompt: text, token_ids, prompt_token_ids, stats);
the stats line goes to stderr.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglespec.cli.args import (
    add_batch_args,
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
    g = subparsers.add_parser("generate", help="generate text for a prompt (or a .jsonl file of prompts, batched) "
                                               "with speculative decoding")
    add_model_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text (chat template applied unless --raw)")
    src.add_argument("--prompt-file",
                     help="read the prompt text from this file; a .jsonl file holds one prompt per line (a JSON "
                          "string, or an object with a \"prompt\" string), generated together by the batched engine")
    g.add_argument("--raw", action="store_true", help="feed the prompt as is (no chat template): plain completion")
    g.add_argument("--max-new-tokens", type=int, default=128, help="stop after this many new tokens (default 128)")
    add_tree_args(g)
    add_sampling_args(g)
    add_batch_args(g, "8")
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


def read_prompts(path: str, text: str) -> list[str]:
    """The prompts of a .jsonl file's text: one per non-empty line, a JSON string or {"prompt": "..."}."""
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EagleSpecError(f"--prompt-file {path}: line {n} is not JSON ({exc.msg})") from None
        if isinstance(item, dict):
            item = item.get("prompt")
        if not isinstance(item, str):
            raise EagleSpecError(f"--prompt-file {path}: line {n} is not a prompt string or an object with a "
                                 '"prompt" string')
        prompts.append(item)
    if not prompts:
        raise EagleSpecError(f"--prompt-file {path}: no prompts")
    return prompts


def cmd_generate(args: argparse.Namespace) -> int:
    non_negative(args, "max_new_tokens")
    config = check_model_inputs(args)
    text = read_prompt(args)
    many = bool(args.prompt_file) and args.prompt_file.endswith(".jsonl")
    prompts = read_prompts(args.prompt_file, text) if many else [text]
    es = load_eaglespec(args, config)
    opts = sampling_options(args, getattr(es.model, "generation_config", None))
    if many:
        outs = es.generate_batch(prompts, args.max_new_tokens, raw=args.raw, **opts)
    else:
        outs = [es.generate(text, args.max_new_tokens, raw=args.raw, **opts)]
    for out in outs:
        if args.json:
            print(json.dumps({"text": out.text, "token_ids": out.token_ids, "prompt_token_ids": out.prompt_token_ids,
                              "stats": out.stats}))
        else:
            print(out.text)
    if not args.json:
        log(stats_line(es, outs, opts.get("temperature")))
    return 0


def stats_line(es, outs: list, temperature: float | None) -> str:
    """One line: tokens, time, tokens/s, tau, rounds and drafts over every output, backend and tree."""
    from eaglespec.api import tree_label

    n = sum(o.stats["new_tokens"] for o in outs)
    seconds = max(o.stats["seconds"] for o in outs)  # batched outputs run at the same time
    rounds = sum(o.stats["rounds"] for o in outs)
    accepted, drafted = sum(o.stats["accepted"] for o in outs), sum(o.stats["drafted"] for o in outs)
    tau = sum(o.stats["tau"] * o.stats["rounds"] for o in outs) / rounds if rounds else 0.0
    rate = round(n / seconds, 2) if seconds > 0 else 0.0
    where = f"{len(outs)} prompts | " if len(outs) > 1 else ""
    return (f"[{where}{n} tokens in {seconds:.2f}s = {rate} tok/s | tau {tau:.2f} | {rounds} rounds, "
            f"{accepted}/{drafted} drafts accepted | backend {outs[0].stats['backend']} | "
            f"tree {tree_label(es.tree_for(temperature))}]")
