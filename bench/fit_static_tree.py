"""Fit a static draft tree to a drafter at T=0 and print its expected tau beside EAGLE-1's 25-node tree's.

    python bench/fit_static_tree.py [--draft DIR] [--dataset mtbench] [--limit 10] [--holdout 0]
        [--max-new-tokens 256] [--depth 8] [--top-k 10] [--budget 60] [--json OUT] [--write]

On calibration prompts the target answers greedily (HF generate); at every depth of each accepted path the
rank of the target's token among the drafter's top-K candidates is counted (eaglespec.tree.fit.measure_ranks),
and the `--budget` highest-value rank paths form the tree (fit_static_tree). Prints the per-depth/rank table,
the fitted tree and the taus of its cuts. --write stores it in DIR/eaglespec_manifest.json as
tree_defaults.static.choices (with its depth and budget), which `--tree static` then drafts; without --write
the manifest is left alone. Taus weigh every answer position as a round's root (a real run visits fewer,
harder ones): "expected" assumes independent acceptance across depths (the fit's model), "empirical" replays
the measured rank paths through the tree. They rank trees; they are not a measured tau.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from eaglespec.api import DEFAULT_DRAFT, EagleSpec
from eaglespec.cli.args import add_model_args
from eaglespec.cli.bench import environment
from eaglespec.datasets import load_prompts
from eaglespec.tree.core import MC_SIM_7B_63, TreeSpec
from eaglespec.tree.fit import RankCounts, expected_tau, fit_static_tree, measure_ranks, with_static_choices


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def greedy_answer(es: EagleSpec, ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy answer (HF generate, do_sample=False): the accepted path of every T=0 round."""
    x = torch.tensor([ids], device=es.model.device)
    eos = es.eos_ids()
    out = es.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                            min_new_tokens=0, eos_token_id=eos or None, pad_token_id=es.tokenizer.pad_token_id or 0)
    return out[0, len(ids):].tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--dataset", default="mtbench", help="mtbench | humaneval | a FILE of prompts")
    ap.add_argument("--limit", type=int, default=10, help="calibration prompts")
    ap.add_argument("--holdout", type=int, default=0, help="further prompts, measured but not fitted (their taus)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--depth", type=int, default=8, help="depths measured (the fitted tree's max depth)")
    ap.add_argument("--top-k", type=int, default=10, help="ranks measured per depth")
    ap.add_argument("--budget", type=int, default=60, help="nodes of the fitted tree")
    ap.add_argument("--json", default=None, help="write the statistics and the tree here")
    ap.add_argument("--write", action="store_true",
                    help="store the tree in the drafter's eaglespec_manifest.json (tree_defaults.static)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    es = EagleSpec.from_args(args, TreeSpec("chain", depth=5), backend="hf", draft_graphs=False)
    log(f"fit_static_tree: {es.draft_note}")
    counts = RankCounts.zeros(args.depth, args.top_k)
    texts = load_prompts(args.dataset, args.limit + args.holdout)
    held = RankCounts.zeros(args.depth, args.top_k)  # the last --holdout prompts: not used for the fit
    answered = 0
    for i, text in enumerate(texts):
        ids = es.encode(text)
        answer = greedy_answer(es, ids, args.max_new_tokens)
        part = measure_ranks(es.engine, ids + answer, len(ids), args.depth, args.top_k)
        if i < args.limit:
            counts += part
            answered += len(answer)
        else:
            held += part
        log(f"  prompt {i + 1}{' (held out)' if i >= args.limit else ''}: {len(answer)} tokens "
            f"({time.perf_counter() - t0:.0f} s)")
    accept = counts.accept()
    tree = fit_static_tree(accept, args.budget)
    default_tau = expected_tau(accept, MC_SIM_7B_63)
    cuts = sorted({n for n in (10, 16, 25, 32, 40, 48, 60, len(tree)) if n <= len(tree)})
    print(f"rank statistics ({min(args.limit, len(texts))} {args.dataset} prompts, {answered} answer "
          f"tokens, {es.model.dtype}, {next(es.model.parameters()).device}): P(rank r | depth reached)")
    print(counts.table())
    print("\ntau per round, every answer position a root: expected (independence) / empirical (the measured rank "
          f"paths replayed){' / empirical on the held-out prompts' if held.paths else ''}")
    chain5 = [(0,) * d for d in range(1, 6)]
    ho = f" / held out {held.empirical_tau(MC_SIM_7B_63):.3f}" if held.paths else ""
    print(f"  chain k=5: {expected_tau(accept, chain5):.3f} / {counts.empirical_tau(chain5):.3f}"
          + (f" / held out {held.empirical_tau(chain5):.3f}" if held.paths else ""))
    print(f"  EAGLE-1 default tree (25 nodes): {default_tau:.3f} / {counts.empirical_tau(MC_SIM_7B_63):.3f}{ho}")
    for n in cuts:
        print(f"  fitted tree, first {n:2d} nodes: {expected_tau(accept, tree[:n]):.3f} / "
              f"{counts.empirical_tau(tree[:n]):.3f}"
              + (f" / held out {held.empirical_tau(tree[:n]):.3f}" if held.paths else ""))
    print(f"\nfitted tree ({len(tree)} nodes, depth {max(map(len, tree), default=0)}), best first:")
    print(json.dumps([list(p) for p in tree]))
    draft_dir = Path(args.draft) if args.draft else DEFAULT_DRAFT
    manifest_path = draft_dir / "eaglespec_manifest.json"
    note = (f"bench/fit_static_tree.py: {args.limit} {args.dataset} prompts, {answered} answer tokens, depth "
            f"{args.depth}, top-{args.top_k}, {es.model.dtype} on {next(es.model.parameters()).device}; expected tau "
            f"{expected_tau(accept, tree):.3f} (default 25-node tree {default_tau:.3f})")
    if args.json:
        out = {"environment": environment(next(es.model.parameters()).device), "config": vars(args),
               "drafter": str(draft_dir), "trained_steps": (es.drafter.manifest or {}).get("trained_steps")
               if getattr(es.drafter, "manifest", None) else None,
               "counts": counts.counts.tolist(), "accept": accept.tolist(), "tree": [list(p) for p in tree],
               "expected_tau": {"default_25": default_tau, **{f"fitted_{n}": expected_tau(accept, tree[:n])
                                                             for n in cuts}},
               "empirical_tau": {"default_25": counts.empirical_tau(MC_SIM_7B_63),
                                 **{f"fitted_{n}": counts.empirical_tau(tree[:n]) for n in cuts}},
               "heldout_empirical_tau": {"default_25": held.empirical_tau(MC_SIM_7B_63),
                                         **{f"fitted_{n}": held.empirical_tau(tree[:n]) for n in cuts}}
               if held.paths else None,
               "paths": [list(p) for p in counts.paths], "heldout_paths": [list(p) for p in held.paths]}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    if args.write:
        if not manifest_path.is_file():
            raise SystemExit(f"--write: {manifest_path} does not exist")
        manifest = json.loads(manifest_path.read_text())
        manifest_path.write_text(json.dumps(with_static_choices(manifest, tree, note), indent=2) + "\n")
        log(f"wrote tree_defaults.static (choices: {len(tree)} nodes) to {manifest_path}")
    else:
        log(f"not written (pass --write to store it in {manifest_path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
