"""Fit a static draft tree for sampled decoding (a temperature > 0) to a drafter's sibling-acceptance curve.

    PYTHONPATH=src python bench/fit_sampled_tree.py --curve T1.json [--depth 3] [--budget 20] [--width 10]
        [--json OUT]

The curve: a(j) = P(a depth-1 draft is accepted | the root has j children drawn from q without replacement and
tested by recursive rejection), from `bench/t1_acceptance.py --siblings N --json T1.json` (chain_t1's depth-1
row, rrs1_mc .. rrsN_mc). In a sampled static tree the node (r_1, ..., r_d) is the (r_i + 1)-th draw under its
parent, and it is tested only after the draws before it were rejected, so P(child r accepted | parent accepted)
= a(r + 1) - a(r), whatever follows it. Assuming the same curve at every depth (on the H200 at T=1 the conditional
rates were 0.63-0.70 at depths 1-5, session 29), `tree_fit.fit_static_tree` gives the best tree of --budget nodes
within --depth. The script prints its expected tau beside EAGLE-1's tree cut to the same depths under the same
model, and writes a --json whose "tree" `bench/tree_sweep.py --fit-json` drafts (static:fit/BUDGET). The expected
taus rank trees; a tree's speed also depends on its depth (one drafter step per depth), so sweep on the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import accumulate
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eaglespec.tree.core import MC_SIM_7B_63, TreeSpec
from eaglespec.tree.fit import expected_tau, fit_static_tree


def read_curve(path: str) -> list[float]:
    """a(1..N) from t1_acceptance.py's --json (one-line errors for a file without it)."""
    try:
        row = json.loads(Path(path).read_text())["chain_t1"]["by_depth"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise SystemExit(f"--curve {path}: not a bench/t1_acceptance.py --json ({type(e).__name__}: {e})") from None
    curve, j = [], 1
    while row.get(f"rrs{j}_mc") is not None:
        curve.append(float(row[f"rrs{j}_mc"]))
        j += 1
    if not curve:
        raise SystemExit(f"--curve {path}: no rrs1_mc in chain_t1's depth-1 row")
    return curve


def sibling_table(curve: list[float], depth: int, width: int) -> list[list[float]]:
    """[depth][width]: P(the r-th draw is the accepted child | parent accepted) = a(r + 1) - a(r), a(0) = 0; the
    curve's steps are clipped at 0 (Monte-Carlo noise) and draws past the curve get 0."""
    a = [0.0, *accumulate(curve, max)]  # non-decreasing
    row = [max(a[r + 1] - a[r], 0.0) if r + 1 < len(a) else 0.0 for r in range(width)]
    return [row] * depth


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--curve", required=True, help="bench/t1_acceptance.py --siblings N --json output")
    ap.add_argument("--depth", type=int, default=3, help="the tree's maximum depth (drafter steps per round)")
    ap.add_argument("--budget", type=int, default=20, help="nodes in the tree")
    ap.add_argument("--width", type=int, default=10, help="most children per node (tree_sweep drafts top-k 10)")
    ap.add_argument("--json", default=None, metavar="OUT", help="write the tree (tree_sweep.py --fit-json reads it)")
    args = ap.parse_args(argv)
    for name in ("depth", "budget", "width"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    curve = read_curve(args.curve)
    table = sibling_table(curve, args.depth, args.width)
    tree = fit_static_tree(table, args.budget)
    out = {"curve": curve, "depth": args.depth, "budget": args.budget, "width": args.width,
           "accept": table[0], "tree": [list(p) for p in tree], "expected_tau": round(expected_tau(table, tree), 4),
           "eagle1": {}}
    print(f"sibling curve a(1..{len(curve)}): " + " ".join(f"{x:.3f}" for x in curve))
    deep = sibling_table(curve, 5, args.width)
    for d in (3, 4, 5):
        choices = TreeSpec("static", depth=d, budget=len(MC_SIM_7B_63)).static_choices()
        out["eagle1"][str(d)] = {"nodes": len(choices), "expected_tau": round(expected_tau(deep, choices), 4)}
        print(f"EAGLE-1's tree cut to depth {d} ({len(choices)} nodes): expected tau "
              f"{out['eagle1'][str(d)]['expected_tau']:.3f}")
    by_depth = [sum(len(p) == d for p in tree) for d in range(1, args.depth + 1)]
    print(f"fitted: {len(tree)} nodes within depth {args.depth} (per depth {by_depth}): expected tau "
          f"{out['expected_tau']:.3f}")
    print(json.dumps(out["tree"]))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
