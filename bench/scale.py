"""Scale benchmark: random-weight Llama / Qwen3 targets of published shapes on one device (eaglespec.scale).

    python bench/scale.py [--shapes llama-3.2-1b,llama-3.1-8b] [--context 1024] [--verify-contexts 512,4096]
        [--bandwidth-gbs 4800] [--tau chain=2.95,static=3.55,dynamic=4.62] [--batches 1,4,16,64] [--quick]
        [--device cuda] [--json OUT]

Plain decoding against the memory-bandwidth floor, the verify cost curve over 1..256 rows, the drafter's step,
round costs of chain / static / dynamic trees through the engine, the implied speedup for an acceptance profile,
the batched engine's plain steps and chain rounds per batch size (--batches) and peak memory, per shape. Progress goes to stderr; the tables are printed last on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from eaglespec.cpu import apply_threads
from eaglespec.errors import EagleSpecError
from eaglespec.scale import (
    DEFAULT_BANDWIDTH_GBS,
    DEFAULT_SHAPES,
    DEFAULT_TAU,
    SHAPES,
    Settings,
    device_name,
    format_tables,
    get_shapes,
    parse_tau,
    run,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/scale.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES),
                   help=f"comma-separated shapes among {', '.join(SHAPES)} (default: {','.join(DEFAULT_SHAPES)})")
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu ... (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default=None, choices=list(DTYPES),
                   help="weights and activations (default: bfloat16 on a GPU, float32 on CPU)")
    p.add_argument("--context", type=int, default=1024,
                   help="prefix length of the plain steps, draft steps and engine prompts (default 1024)")
    p.add_argument("--verify-contexts", type=int_list, default=(512, 4096),
                   help="prefix lengths of the verify cost curve (default 512,4096)")
    p.add_argument("--verify-rows", type=int_list, default=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                   help="row counts R of the verify cost curve (default 1,2,4,...,256)")
    p.add_argument("--draft-rows", type=int_list, default=(1, 10),
                   help="row counts of the drafter step (default 1,10)")
    p.add_argument("--decode-steps", type=int, default=64, help="plain steps per timed sample (default 64)")
    p.add_argument("--samples", type=int, default=5, help="timed samples per measurement (default 5)")
    p.add_argument("--round-tokens", type=int, default=48, help="new tokens per engine run (default 48)")
    p.add_argument("--round-repeats", type=int, default=3,
                   help="timed engine runs per tree policy, after one untimed run (default 3)")
    p.add_argument("--bandwidth-gbs", type=float, default=DEFAULT_BANDWIDTH_GBS,
                   help=f"memory bandwidth of the floor in GB/s (default {DEFAULT_BANDWIDTH_GBS:g}: H200 HBM3e)")
    p.add_argument("--tau", default=None,
                   help="acceptance profile for the implied speedup, POLICY=TAU,... (default "
                        + ",".join(f"{k}={v:g}" for k, v in DEFAULT_TAU.items())
                        + ": the shipped SmolLM2 drafter on MT-bench)")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="draft vocabulary of the random drafter (the first N target ids; default: the target's "
                        "whole vocabulary)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for torch on a CPU device (default: the cores not busy with other processes)")
    p.add_argument("--batches", type=int_list, default=(),
                   help="batch sizes at which to time the batched engine's plain steps and chain rounds, e.g. "
                        "1,4,16,64 (default: none)")
    p.add_argument("--batch-steps", type=int, default=32, help="timed batched steps per batch size (default 32)")
    p.add_argument("--predict", action="store_true",
                   help="fit --tree auto's cost model on each shape and print its predicted round costs beside "
                        "measured ones")
    p.add_argument("--quick", action="store_true", help="fewer samples, steps and engine runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, metavar="OUT", help="write every number to OUT as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise EagleSpecError(f"device {device} asked for, but CUDA is not available")
        dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
        shapes = get_shapes(args.shapes)
        apply_threads(args.threads, device)
        settings = Settings(context=args.context, decode_steps=args.decode_steps, samples=args.samples,
                            verify_contexts=args.verify_contexts, verify_rows=args.verify_rows,
                            draft_rows=args.draft_rows, round_tokens=args.round_tokens,
                            round_repeats=args.round_repeats, bandwidth_gbs=args.bandwidth_gbs,
                            tau=parse_tau(args.tau), draft_vocab=args.draft_vocab, batches=args.batches,
                            batch_steps=args.batch_steps, predict=args.predict, seed=args.seed)
        if args.quick:
            settings = settings.quick()
        print(f"device: {device_name(device)}", file=sys.stderr, flush=True)
        report = run(shapes, settings, device, dtype, log=lambda s: print(s, file=sys.stderr, flush=True))
    except EagleSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(format_tables(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
