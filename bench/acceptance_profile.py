"""Measure a drafter's acceptance profile (what `--tree auto` sizes trees from) and store it in its manifest.

    python bench/acceptance_profile.py [--draft DIR] [--dataset mtbench] [--limit 10] [--skip 0]
        [--max-new-tokens 256] [--depth 8] [--top-k 10] [--stride 1] [--t0-only] [--json OUT] [--write]

On calibration prompts the target answers (plain decoding through the engine: greedy, then sampled at T=1) and the
drafter is driven over the answers as the engine drives it (eaglespec.engine.calibrate.measure_profile): per depth
and rank the acceptance at T=0 and T=1, and the tokens per round of dynamic trees of widths 4/6/8/10 at every
depth and budget (T=0: the rounds a greedy run of each tree makes on those answers). --write stores it in
DIR/eaglespec_manifest.json as acceptance_profile (then `--tree auto` is the default on a GPU, unless the manifest
recommends a GPU tree in tree_defaults.cuda); without --write the manifest is left alone. --json writes the
profile to a file (bench/tree_sweep.py --profile-json reads it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from eaglespec.api import DEFAULT_DRAFT, EagleSpec
from eaglespec.checkpoint.manifest import with_acceptance_profile
from eaglespec.cli.args import add_model_args
from eaglespec.datasets import load_prompts
from eaglespec.engine.calibrate import measure_profile
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--dataset", default="mtbench", help="mtbench | humaneval | a FILE of prompts")
    ap.add_argument("--limit", type=int, default=10, help="calibration prompts")
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--depth", type=int, default=8, help="depths measured")
    ap.add_argument("--top-k", type=int, default=10, help="ranks (T=0) and sampled siblings (T=1) measured per depth")
    ap.add_argument("--stride", type=int, default=1,
                    help="at T=1, measure every N-th answer position (default: all; T=0 replays every round)")
    ap.add_argument("--t0-only", action="store_true", help="greedy acceptance only (no T=1 profile)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, metavar="OUT", help="write the profile to OUT")
    ap.add_argument("--write", action="store_true",
                    help="store the profile in the drafter's eaglespec_manifest.json (acceptance_profile)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        es = EagleSpec.from_args(args, TreeSpec("chain", depth=5))
        log(f"acceptance_profile: {es.draft_note}")
        prompts = [es.encode(t) for t in load_prompts(args.dataset, args.limit, skip=args.skip)]
        temps = ("t0",) if args.t0_only else ("t0", "t1")
        profile = measure_profile(es.engine, prompts, args.max_new_tokens, es.eos_ids(), depth=args.depth,
                                  top_k=args.top_k, temperatures=temps, stride=args.stride, seed=args.seed, log=log)
    except EagleSpecError as exc:
        log(f"error: {exc}")
        return 2
    profile["measured"] += f"; {args.dataset} prompts {args.skip + 1}..{args.skip + len(prompts)}"
    for key in temps:
        part = profile.get(key)
        if part:
            chain = [round(r[0], 3) for r in part["accept"]]
            log(f"{key}: {part['anchors']} anchors; P(rank 0 | depth reached) by depth: {chain}")
    log(f"measured in {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(profile, indent=1) + "\n")
    path = (Path(args.draft) if args.draft else DEFAULT_DRAFT) / "eaglespec_manifest.json"
    if args.write:
        if not path.is_file():
            log(f"--write: {path} does not exist")
            return 2
        manifest = json.loads(path.read_text())
        path.write_text(json.dumps(with_acceptance_profile(manifest, profile, str(path)), indent=2) + "\n")
        log(f"wrote acceptance_profile to {path}")
    else:
        log(f"not written (pass --write to store it in {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
