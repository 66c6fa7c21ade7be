"""Aten ops per dynamic-tree propose() with a SmolLM2-sized draft vocab: the tiny drafter (hidden 32) over a
12000-token vocab, so the tree bookkeeping and the top-k over [n, 12000] dominate, not the drafter's math.

Reports per propose() (bench/propose_overhead.py's measure: one counted generation, then timed ones): ops (every
dispatched aten op), host (ops outside the drafter's forward, views included), us / cpu_us (CPU wall / thread
time, median); then the non-view ops outside the drafter of one propose (tests/_opcount.py), with torch.topk
and with tree.draft_topk's two stages (CUDA's path) forced on, by name with --names. CPU only: op counts are the proxy for the kernels a
whole-tree CUDA graph replays; no GPU timing is claimed.

    .venv/bin/python bench/draft_tree_ops.py [--vocab 12000] [--runner eager|static|tree] [--rounds N] [--names]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from propose_overhead import measure  # noqa: E402

from _opcount import HostOps, count_host_ops  # noqa: E402
from eaglespec.tree import core as tree
from eaglespec.draft.fast import enable_draft_graphs  # noqa: E402
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.backends.hf import HFTarget
from eaglespec.tree.core import TreeSpec

os.environ.setdefault("EAGLESPEC_ONEDNN", "0")  # a CUDA proxy: count the GEMMs F.linear / addmm would run

SPECS = {
    "d8k10b60": TreeSpec("dynamic", depth=8, top_k=10, budget=60),
    "d5k6b24": TreeSpec("dynamic", depth=5, top_k=6, budget=24),
}


def names(model, drafter, spec: TreeSpec, runner: str, prompt: list[int], split: bool) -> HostOps:
    """The last propose() of a short generation under HostOps (non-view ops outside the drafter, by name)."""
    engine = SpeculativeEngine(HFTarget(model), drafter, spec)
    if runner != "eager":
        enable_draft_graphs(engine, max_len=len(prompt) + 256, tree_graphs=runner == "tree")
    orig, last = engine.proposer.propose, {}

    def counted(*a):
        tree, last["ops"] = count_host_ops(drafter, lambda: orig(*a))
        return tree

    engine.proposer.propose = counted
    with split_topk(split):
        engine.generate(prompt, 6)
    return last["ops"]


@contextlib.contextmanager
def split_topk(on: bool):
    """tree.draft_topk's two stages (CUDA's path) on CPU too while `on`."""
    devices = tree.TOPK_SPLIT_DEVICES
    tree.TOPK_SPLIT_DEVICES = ("cpu", "cuda") if on else devices
    try:
        yield
    finally:
        tree.TOPK_SPLIT_DEVICES = devices


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=12000)
    ap.add_argument("--runner", choices=["eager", "static", "tree"], default="tree")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--names", action="store_true", help="also list one propose's host ops by name")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from conftest import tiny_drafter, tiny_target

    model = tiny_target("llama", seed=3, vocab=args.vocab)
    drafter = tiny_drafter(model, seed=0)
    prompt = [4, 8, 15, 16, 23, 42, 7, 11, 3, 9]
    print(f"torch {torch.__version__}, cpu, tiny drafter, vocab {args.vocab}, runner {args.runner}")
    print(f"{'tree':10} {'rounds':>6} {'ops':>7} {'host':>6} {'us':>8} {'cpu_us':>8}")
    for name, spec in SPECS.items():
        r = measure(model, drafter, spec, args.runner, prompt, args.rounds, args.repeats)
        print(f"{name:10} {r['rounds']:6d} {r['ops']:7.1f} {r['host_ops']:6.1f} {r['us']:8.1f} {r['cpu_us']:8.1f}")
        for split in (False, True):
            ops = names(model, drafter, spec, args.runner, prompt, split)
            print(f"    {sum(ops.kernels.values())} non-view ops outside the drafter (of {ops.ops}), "
                  f"top-k {'two-stage (as on CUDA)' if split else 'torch.topk (CPU default)'}")
            if args.names:
                for op, n in ops.kernels.most_common():
                    print(f"    {n:4d} {op}")


if __name__ == "__main__":
    main()
