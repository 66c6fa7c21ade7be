"""Fit a static draft tree for sampled decoding to a sibling-acceptance curve and print its expected tau.

    python bench/fit_sampled_tree.py --curve T1.json [--depth 3] [--budget 20] [--width 10] [--json OUT]

The curve comes from `bench/t1_acceptance.py --siblings N --json T1.json`; the model is
eaglespec.tree.sampled_fit's. The fitted tree is printed beside EAGLE-1's tree cut to depths 3-5 under the
same model, and --json writes a file whose "tree" `bench/tree_sweep.py --fit-json` drafts (static:fit/BUDGET).
Expected taus rank trees; a tree's speed also depends on its depth (one drafter step per depth), so time the
candidates with tree_sweep.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eaglespec.errors import EagleSpecError
from eaglespec.tree.sampled_fit import fit_sampled_tree, read_curve


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--curve", required=True, help="the --json of bench/t1_acceptance.py --siblings N")
    ap.add_argument("--depth", type=int, default=3, help="the tree's maximum depth (drafter steps per round)")
    ap.add_argument("--budget", type=int, default=20, help="nodes in the tree")
    ap.add_argument("--width", type=int, default=10, help="most children per node")
    ap.add_argument("--json", default=None, metavar="OUT",
                    help="write the tree (tree_sweep.py --fit-json reads it)")
    args = ap.parse_args(argv)
    try:
        out = fit_sampled_tree(read_curve(args.curve), args.depth, args.budget, args.width)
    except EagleSpecError as e:
        raise SystemExit(f"fit_sampled_tree: {e}") from None
    print(f"sibling curve a(1..{len(out['curve'])}): " + " ".join(f"{x:.3f}" for x in out["curve"]))
    for d, row in out["eagle1"].items():
        print(f"EAGLE-1's tree cut to depth {d} ({row['nodes']} nodes): "
              f"expected tau {row['expected_tau']:.3f}")
    by_depth = [sum(len(p) == d for p in out["tree"]) for d in range(1, args.depth + 1)]
    print(f"fitted: {len(out['tree'])} nodes within depth {args.depth} (per depth {by_depth}): expected tau "
          f"{out['expected_tau']:.3f}")
    print(json.dumps(out["tree"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
