"""Aten ops of one round graph body (round_graph.RoundGraph.body), by phase and by name: a CPU proxy for the
kernels a round's CUDA graph replays (on the H200 each costs ~3.5 us whatever its size: bench/RESULTS.md,
session 8, 603 device activities per static-tree round, GPU busy 1.6 ms of 2.5).

Runs the real target (SmolLM2 by default) and drafter on CPU, fp32, the fast backend with the fused draft step
(draft/fused.py, torch path: no Triton on CPU, so a norm counts 1-2 ops where CUDA launches 1 kernel) and round
graphs run eagerly; counts the non-view, non-allocation ops dispatched in each phase of the rounds after the
first: catch-up (the drafter's rows of the last accepted tokens), tree (growth: drafter steps and the tree
bookkeeping), verify (the target's step), the rest (acceptance, KV commit, next inputs).

    PYTHONPATH=src python bench/round_ops.py [--tree static|chain|dynamic] [--k 5] [--depth 6] [--top-k 8]
        [--budget 40] [--rounds 4] [--names] [--temperature T] [--kernels [--new]]

--kernels counts what CUDA runs instead of the torch path: the code takes its Triton branches (tree_kernels,
target/kernels.py, the attention kernel: switched on as under TRITON_INTERPRET=1), but each kernel entry point runs
its torch reference with the counting paused and counts as `triton.<name>` x its launches (the interpreter itself is
far too slow for SmolLM2). What remains under other names is the generic torch kernels a CUDA round graph replays.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import traceback
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eaglespec.api import EagleSpec, tree_spec
from eaglespec.draft.fast import enable_draft_graphs
from eaglespec.engine.round_graph import RoundGraphs, enable_round_graphs

os.environ.setdefault("EAGLESPEC_ONEDNN", "0")  # a CUDA proxy: count the GEMMs F.linear / addmm would run

FREE = ("aten.empty", "aten.empty_strided", "aten.empty_like", "aten.new_empty", "aten.new_empty_strided",
        "aten._unsafe_view", "aten.lift_fresh", "aten.detach")


class PhaseOps(TorchDispatchMode):
    """Counts non-view ops by (phase, name); `phase` is set by the wrappers below (innermost wins)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack = ["rest"]
        self.ops: Counter = Counter()
        self.paused = False  # inside a kernel's reference (--kernels): counted once, as the kernel
        self.where: Counter | None = None  # --where: (phase, name, the innermost eaglespec line) -> count

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if not self.paused and not func.is_view and name not in FREE:
            self.ops[(self.stack[-1], name)] += 1
            if self.where is not None:
                self.where[(self.stack[-1], name, _origin())] += 1
        return func(*args, **(kwargs or {}))


def _origin() -> str:
    """The innermost frame of src/eaglespec calling the op, as path:line."""
    for frame in reversed(traceback.extract_stack()):
        if "/src/eaglespec/" in frame.filename:
            return f"{frame.filename.split('/src/eaglespec/')[1]}:{frame.lineno}"
    return "?"


def count_kernels(counter: PhaseOps) -> None:
    """--kernels: every Triton entry point the round can call runs its torch reference, counted as its launches."""
    from eaglespec.kernels import round_tail as round_kernels
    from eaglespec.kernels import tree as tree_kernels
    from eaglespec.kernels import attention as attn_kernels
    from eaglespec.kernels import step as kernels

    os.environ["TRITON_INTERPRET"] = "1"  # kernels.available(): the Triton branches are taken on CPU
    for var in ("EAGLESPEC_TREE_KERNELS", "EAGLESPEC_FUSED_KERNELS", "EAGLESPEC_ATTN_KERNEL"):
        os.environ[var] = "1"
    launches = {"children": 2, "race_children": 2, "rank_top": 1, "rank_top_ids": 1, "expand_rows": 1, "select_tree": 1,
                "accept_path": 1, "rms_norm_weight": 1, "eagle3_input": 1, "rope_qk_kv_write": 1, "silu_mul": 1,
                "ancestry": 1, "block_mask": 1, "round_tail": 1}
    plan = [(tree_kernels, n) for n in ("children", "race_children", "rank_top", "rank_top_ids", "expand_rows", "select_tree",
                                        "accept_path", "ancestry")]
    plan += [(kernels, n) for n in ("rms_norm_weight", "eagle3_input", "rope_qk_kv_write", "silu_mul", "block_mask")]
    plan += [(attn_kernels, "masked_attention"), (round_kernels, "round_tail")]

    def fake(mod, name):
        ref = getattr(mod, name + "_ref")

        def run(*a, **kw):
            if name == "masked_attention":  # a combine kernel after the attention above one share (256 slots)
                kw = {k: v for k, v in kw.items() if k in ("scale", "kv_len")}
                n = 1 + (a[1].shape[2] > 256)
            else:
                n = launches[name]
            counter.ops[(counter.stack[-1], f"triton.{name}")] += n
            counter.paused = True
            try:
                return ref(*a, **kw)
            finally:
                counter.paused = False

        return run

    for mod, name in plan:
        setattr(mod, name, fake(mod, name))


def wrap(obj, attr: str, counter: PhaseOps, phase) -> None:
    """obj.attr(...) runs under `phase` (a str, or a callable of the counter's current phase)."""
    fn = getattr(obj, attr)

    def inner(*a, **kw):
        counter.stack.append(phase(counter.stack[-1]) if callable(phase) else phase)
        try:
            return fn(*a, **kw)
        finally:
            counter.stack.pop()

    setattr(obj, attr, inner)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--tree", default="static")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--names", action="store_true", help="every phase's ops by name")
    ap.add_argument("--where", action="store_true", help="the last round's ops by the eaglespec line that ran them")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: sampled rounds (seeded)")
    ap.add_argument("--kernels", action="store_true", help="count CUDA's Triton kernels as one op per launch")
    ap.add_argument("--new", action="store_true", help="with --kernels: session 16's kernels too (EAGLESPEC_NEW_KERNELS=1, the default; without --new: 0)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    counter = PhaseOps()
    if args.kernels:
        if args.temperature > 0:
            ap.error("--kernels counts greedy rounds (sampled_kernels has no drop-in torch reference)")
        count_kernels(counter)
        os.environ["EAGLESPEC_NEW_KERNELS"] = "1" if args.new else "0"
    es = EagleSpec.from_pretrained(args.target, args.draft, device="cpu", dtype="float32", backend="fast",
                                   draft_graphs=True, round_graphs=True)
    spec = tree_spec(args.tree, k=args.k, top_k=args.top_k, depth=args.depth,
                     budget=None if args.tree == "static" else args.budget)
    es.engine.spec = es.engine.proposer.spec = spec
    enable_draft_graphs(es.engine, max_len=1024, fused=True)  # CUDA's draft step (torch path: no Triton on CPU)
    rgs: RoundGraphs = enable_round_graphs(es.engine)
    rg = rgs.get(spec)
    wrap(rg, "body", counter, "rest")
    wrap(rg.runner, "forward", counter, lambda cur: "catch-up" if cur == "rest" else "tree-step")
    wrap(es.engine.proposer, "_grow", counter, "tree")
    wrap(rg.target, "_step", counter, "verify")
    per_round: list[Counter] = []
    orig_body = rg.body

    def counted_body(*a, **kw):
        before = counter.ops.copy()
        counter.where = Counter() if args.where else None  # the last round's
        with counter:
            out = orig_body(*a, **kw)
        per_round.append(counter.ops - before)
        where.append(counter.where)
        return out

    where: list[Counter | None] = []

    rg.body = counted_body
    ids = es.encode("Explain speculative decoding in two sentences.")
    sampling = {"temperature": args.temperature, "seed": 0} if args.temperature > 0 else {}
    res = es.generate(ids, max_new_tokens=8 + 6 * args.rounds, **sampling)
    rounds = per_round[1:1 + args.rounds] or per_round
    phases = ("catch-up", "tree-step", "tree", "verify", "rest")
    totals = {p: statistics.median(sum(v for (ph, _), v in r.items() if ph == p) for r in rounds) for p in phases}
    print(f"{spec}: {len(rounds)} rounds counted (of {len(per_round)}), tau {res.stats.get('tau', 0):.2f}")
    print("ops per round (median): " + ", ".join(f"{p} {totals[p]:.0f}" for p in phases)
          + f", total {sum(totals.values()):.0f}")
    if args.names:
        last = rounds[-1]
        for p in phases:
            names = Counter({name: v for (ph, name), v in last.items() if ph == p})
            print(f"  {p}: " + ", ".join(f"{n.removeprefix('aten.')} {v}" for n, v in names.most_common()))
    if args.where:
        last = where[1:1 + args.rounds][-1] if len(where) > 1 else where[-1]
        for (ph, name, at), v in sorted(last.items()):
            print(f"  {ph:9s} {name.removeprefix('aten.'):24s} {v:3d}  {at}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
