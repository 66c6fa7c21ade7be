"""`eaglespec generate|chat|train|regenerate|synth-prompts|bench|convert|serve` (DESIGN.md, the command-line contract).

Exit status 0 on success; 2 on bad usage or bad input, with one line on stderr naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eaglespec.errors import EagleSpecError


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--target/--draft/--device/--dtype, shared by generate, chat, bench and serve."""
    p.add_argument("--target", default=None,
                   help="target model: a local HF directory or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None,
                   help="draft checkpoint directory (default: the shipped drafter for the default target)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bf16 on GPU, fp32 on CPU)")
    p.add_argument("--backend", default="auto", choices=["auto", "fast", "hf"],
                   help="target backend: fast (static KV cache; CUDA graphs on a GPU, oneDNN projections on CPU), hf "
                        "(the model's own forward), or auto (fast where the architecture is supported, default; "
                        "bench ignores it: its methods name their backends)")
    p.add_argument("--aux-rule", default="auto", choices=["auto", "output", "entering"],
                   help="how to read the checkpoint's aux layer ids: auto (+1 when the first id is 1, as SGLang), "
                        "output (output-of-layer ids, +1), entering (as written)")
    p.add_argument("--strict", action="store_true",
                   help="refuse a drafter whose manifest names a different target (default: warn)")
    p.add_argument("--draft-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="draft with a static drafter KV + CUDA graphs (default: on with the fast backend on CUDA)")
    p.add_argument("--round-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="greedy rounds (catch-up, tree, verify, acceptance, KV commit) as one CUDA graph each, one "
                        "host sync per round, with the fast backend and draft graphs (default: on CUDA; "
                        "$EAGLESPEC_ROUND_GRAPHS=0/1 overrides)")


def add_tree_args(p: argparse.ArgumentParser, policy: bool = True) -> None:
    """Tree flags. A flag left out takes the drafter's recommended shape (tree_defaults in its
    eaglespec_manifest.json, measured with bench/tree_sweep.py), else the generic default given in the help.
    policy=False leaves out --tree (bench runs every tree kind it is asked for)."""
    if policy:
        p.add_argument("--tree", default=None, choices=["chain", "static", "dynamic"],
                       help="draft tree policy (default: the drafter's recommendation where its manifest has one: "
                            "tree_defaults.cuda on a GPU, tree_defaults.sampled with a temperature; else chain)")
    p.add_argument("--k", type=int, default=None,
                   help="chain length (default: the drafter's recommendation, else 5; 0 = plain decoding)")
    p.add_argument("--top-k", type=int, default=None,
                   help="tree expansion width per node (default: the drafter's recommendation, else 10)")
    p.add_argument("--depth", type=int, default=None,
                   help="max tree depth (default: the drafter's recommendation, else 8)")
    p.add_argument("--budget", type=int, default=None,
                   help="draft tokens verified per round (default: the drafter's recommendation, else 60; "
                        "0 = plain decoding)")
    p.add_argument("--adaptive", action="store_true",
                   help="per round, draft or take a plain target step, whichever has cost less time per token "
                        "lately (probing both; lossless either way): for drafters that accept too little to pay, "
                        "e.g. at high temperatures")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """Sampling (issue 4). --top-k stays the tree width (DESIGN.md), so sampling top-k is --sample-top-k."""
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (0 = greedy; default: the target's generation_config)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (default: generation_config)")
    p.add_argument("--sample-top-k", type=int, default=None,
                   help="sample from the k most likely tokens (0 = off; default: generation_config)")
    p.add_argument("--min-p", type=float, default=None, help="min-p filter (default: generation_config)")
    p.add_argument("--seed", type=int, default=None, help="random seed: the same seed gives the same output")
    add_draft_temperature(p)


def add_draft_temperature(p: argparse.ArgumentParser) -> None:
    """--draft-temperature: the drafter's own temperature under sampling (default: the target's). 0 drafts the top-k
    children, verified with the point-mass scheme (q = 1), which the greedy tree kernels can build."""
    p.add_argument("--draft-temperature", type=float, default=None, metavar="T",
                   help="with a sampling temperature: the drafter's temperature (default: the target's; 0 = top-k "
                        "children, verified with the point-mass scheme; lossless either way)")


def sampling_options(args: argparse.Namespace, generation_config) -> dict:
    """Flags over the target's generation_config -> EagleSpec.generate keyword options ({} = greedy)."""
    from eaglespec.sampling import from_generation_config

    cfg = from_generation_config(generation_config, args.temperature, args.sample_top_k, args.top_p, args.min_p,
                                 args.seed)
    if cfg is None:
        return {}
    t = cfg.target
    opts = {"temperature": t.temperature, "top_k": t.top_k, "top_p": t.top_p, "min_p": t.min_p, "seed": cfg.seed}
    if getattr(args, "draft_temperature", None) is not None:
        opts["draft_temperature"] = args.draft_temperature
    return opts


def _non_negative(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        value = getattr(args, name, None)
        if value is not None and value < 0:
            raise EagleSpecError(f"--{name.replace('_', '-')} must be >= 0, got {value}")


def cmd_generate(args: argparse.Namespace) -> int:
    from eaglespec.api import EagleSpec, tree_label

    _non_negative(args, "max_new_tokens", "k", "top_k", "depth", "budget")
    if args.prompt_file:
        try:
            prompt = Path(args.prompt_file).read_text()
        except OSError as exc:
            raise EagleSpecError(f"{args.prompt_file}: cannot read the prompt file ({exc.strerror})") from None
    else:
        prompt = args.prompt
    es = EagleSpec.from_args(args)
    _log(f"eaglespec: {es.draft_note}")
    opts = sampling_options(args, getattr(es.model, "generation_config", None))
    out = es.generate(prompt, args.max_new_tokens, raw=args.raw, **opts)
    if args.json:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "prompt_token_ids": out.prompt_token_ids,
                          "stats": out.stats}))
    else:
        print(out.text)
        s = out.stats
        _log(f"[{s['new_tokens']} tokens in {s['seconds']:.2f}s = {s['tokens_per_second']} tok/s | tau "
             f"{s['tau']:.2f} | {s['rounds']} rounds, {s['accepted']}/{s['drafted']} drafts accepted | "
             f"backend {s['backend']} | tree {tree_label(es.tree_for(opts.get('temperature')))}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eaglespec", description="EAGLE speculative decoding for HF causal LMs")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt with speculative decoding")
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

    # subcommands owned by other modules register themselves here
    __import__("eaglespec.cli.train", fromlist=["add_parser"]).add_parser(sub)
    __import__("eaglespec.cli.chat", fromlist=["add_parser"]).add_parser(sub)
    __import__("eaglespec.server", fromlist=["add_parser"]).add_parser(sub)
    __import__("eaglespec.telemetry", fromlist=["add_parser"]).add_parser(sub)
    __import__("eaglespec.checkpoint.convert", fromlist=["add_parser"]).add_parser(sub)
    __import__("eaglespec.cli.bench", fromlist=["add_parser"]).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except EagleSpecError as exc:
        _log(f"eaglespec: error: {exc}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
