"""`eaglespec report`: generate for a few prompts, print the telemetry table and render it to a PNG
(eaglespec.telemetry: summarize, format_report, plot_report)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglespec.cli.args import (
    add_model_args,
    add_sampling_args,
    add_tree_args,
    check_model_inputs,
    check_module,
    load_eaglespec,
    log,
    non_negative,
    sampling_options,
)
from eaglespec.errors import EagleSpecError

DEFAULT_PROMPTS = (
    "Explain speculative decoding in two sentences.",
    "Write a short poem about the sea.",
    "List three uses of a hash map, with one line each.",
    "What is the capital of France, and why is it famous?",
)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "report", help="run prompts and report acceptance by depth, calibration, time split (table + PNG)",
        description="Generate for a few prompts (or load a saved summary with --from), print a telemetry table "
                    "and render it to a PNG: acceptance-length histogram, acceptance by tree depth, draft "
                    "confidence vs observed acceptance, time split, tree nodes, temporary KV, MoE experts.")
    add_model_args(p)
    add_tree_args(p)
    add_sampling_args(p)
    p.add_argument("--prompt", action="append", default=None,
                   help="a prompt (repeat for several; default: four built-in prompts)")
    p.add_argument("--prompt-file", default=None,
                   help="prompts from a file: .jsonl with 'prompt' / 'turns' (MT-bench) / 'text', else one a line")
    p.add_argument("--limit", type=int, default=None, help="use at most N prompts (default: all)")
    p.add_argument("--raw", action="store_true", help="feed prompts as is (no chat template)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    p.add_argument("--out", default="eaglespec-report.png", help="the PNG to write (default eaglespec-report.png)")
    p.add_argument("--json", default=None, help="also write the summary as JSON to this file")
    p.add_argument("--from", dest="from_json", default=None,
                   help="render a saved summary (a --json file of report) instead of generating")
    p.set_defaults(func=cmd_report)


def read_summary(path: str) -> dict:
    """A summary saved by `report --json`."""
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EagleSpecError(f"{path}: cannot read the summary ({exc})") from None
    if not isinstance(summary, dict) or "acceptance_length_hist" not in summary:
        raise EagleSpecError(f"{path}: not an eaglespec report summary (no acceptance_length_hist)")
    return summary


def report_prompts(args: argparse.Namespace) -> list[str]:
    """--prompt and --prompt-file, else the built-in prompts; at most --limit."""
    from eaglespec.datasets import read_prompt_file

    prompts = list(args.prompt or [])
    if args.prompt_file:
        prompts += read_prompt_file(args.prompt_file)
    prompts = prompts or list(DEFAULT_PROMPTS)
    prompts = prompts[: args.limit] if args.limit is not None else prompts
    if not prompts:
        raise EagleSpecError("no prompts to run (--limit 0?)")
    return prompts


def cmd_report(args: argparse.Namespace) -> int:
    from eaglespec.telemetry import format_report, plot_report, run_report

    check_module("matplotlib", "plot", "report")
    if args.from_json:
        summary = read_summary(args.from_json)
    else:

        non_negative(args, "max_new_tokens", "limit")
        config = check_model_inputs(args)
        prompts = report_prompts(args)
        es = load_eaglespec(args, config)
        summary = run_report(es, prompts, args.max_new_tokens, raw=args.raw, progress=args.verbose,
                             **sampling_options(args, getattr(es.model, "generation_config", None)))
    print(format_report(summary))
    log(f"eaglespec: wrote {plot_report(summary, args.out)}")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
        log(f"eaglespec: wrote {args.json}")
    return 0
