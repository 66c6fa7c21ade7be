"""Per-round host overhead of the engine: dispatched aten ops, host syncs and host time per round.

Usage: python bench/round_overhead.py [--model tiny|smollm2] [--rounds N] [--k K] [--device D] [--root DIR]

Two modes through `SpeculativeEngine` over the fast backend (`FastTarget`, CUDA graphs off on CPU):
plain decoding (no drafter) and greedy chain rounds of depth k with a random EAGLE-3 drafter
(tests/conftest.py tiny_drafter). Per round (one `next()` of `engine.stream`, prefill excluded):

- aten ops dispatched (TorchDispatchMode), split into the proposer's (draft/*) and the rest;
- host syncs: `_local_scalar_dense` (int(), bool(), .item()), `nonzero`, `equal`, `is_nonzero`,
  `Tensor.tolist`; and tensors made from host data (`lift_fresh`: on CUDA an H2D copy from pageable
  memory, which PyTorch follows with a stream sync);
- host microseconds per round with the target's forward replaced by cached outputs (`_step` /
  `_step_fn` monkeypatched), i.e. everything BUT the forward: median over the rounds.

`--root DIR` runs another checkout's sources (e.g. `git archive <commit> | tar -x -C DIR`) to compare.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.equal", "aten.is_nonzero")
H2D_OPS = ("aten.lift_fresh",)


class OpCount(TorchDispatchMode):
    """Counts dispatched aten ops (by overload packet) and Tensor.tolist calls."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self._tolist = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._tolist = torch.Tensor.tolist
        counter, orig = self.ops, self._tolist

        def tolist(t):
            counter["Tensor.tolist"] += 1
            return orig(t)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    @property
    def syncs(self) -> int:
        return sum(self.ops[o] for o in SYNC_OPS) + self.ops["Tensor.tolist"]

    @property
    def h2d(self) -> int:
        return sum(self.ops[o] for o in H2D_OPS)

    @property
    def total(self) -> int:
        return sum(n for o, n in self.ops.items() if o != "Tensor.tolist")


def build(model_name: str, device: str):
    from conftest import tiny_drafter, tiny_target

    if model_name == "tiny":
        model = tiny_target("llama", seed=0).to(device)
    else:
        from eaglespec.backends.loading import load_target

        model, _ = load_target(None, device=device, dtype="float32" if device == "cpu" else None)
    drafter = tiny_drafter(model, seed=1).to(device=device, dtype=next(model.parameters()).dtype)
    return model, drafter


def patch_forward(target, rows: int) -> None:
    """Replace the target's step by cached outputs (the forward's cost leaves the measurement)."""
    gen = torch.Generator().manual_seed(0)
    feat_dim = len(target.feature_layer_ids) * target.hidden_size
    logits = torch.randn(rows, target.vocab_size, generator=gen).to(target.device, target.dtype)
    feats = torch.randn(rows, feat_dim, generator=gen).to(target.device, target.dtype)

    def step(tokens, positions, visible, base, cols):
        b = tokens.shape[0]
        return logits[:b], feats[:b]

    target._step = step
    target._step_fn = step


def run_mode(engine, prompt: list[int], rounds: int, patched: bool) -> dict:
    """Count ops and syncs per round (one pass), then time the rounds (other passes, no counting)."""
    dev = engine.target.device
    prop = engine.proposer
    draft_ops = OpCount()
    if prop is not None:  # the proposer's ops (draft/*) are reported apart from the engine's
        inner = prop.propose

        def propose(*a, **kw):
            with draft_ops:
                return inner(*a, **kw)

    def rounds_of(count: OpCount | None) -> list[float]:
        times = []
        st = engine.stream(prompt, max_new_tokens=rounds * (engine.spec.depth + 1) + 1)
        next(st)  # prefill
        for _ in range(rounds):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            try:
                if count is not None:
                    with count:
                        next(st)
                else:
                    next(st)
            except StopIteration:
                break
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        st.close()
        return times

    rounds_of(None)  # warm-up
    count = OpCount()
    if prop is not None:
        prop.propose = propose
    n = len(rounds_of(count))
    if prop is not None:
        del prop.propose  # back to the class method: time without the counting wrapper
    # inside the counting mode the proposer's ops are seen by both modes: subtract them once
    engine_ops = count.total - draft_ops.total
    draft_us = []
    if prop is not None:
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                draft_us.append(time.perf_counter() - t0)
        prop.propose = timed
    times = [t for _ in range(3) for t in rounds_of(None)]
    if prop is not None:
        del prop.propose
    out = {
        "rounds": n,
        "ops_per_round": round(count.total / n, 1),
        "engine_ops_per_round": round(engine_ops / n, 1),
        "syncs_per_round": round(count.syncs / n, 2),
        "engine_syncs_per_round": round((count.syncs - draft_ops.syncs) / n, 2),
        "h2d_per_round": round(count.h2d / n, 2),
        "engine_h2d_per_round": round((count.h2d - draft_ops.h2d) / n, 2),
        "host_us_per_round" if patched else "us_per_round": round(1e6 * statistics.median(times), 1),
        "top_engine_ops": (count.ops - draft_ops.ops).most_common(12),
    }
    if draft_us:
        rest = [t - d for t, d in zip(times, draft_us)]
        out["engine_host_us_per_round" if patched else "engine_us_per_round"] = round(1e6 * statistics.median(rest), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("tiny", "smollm2"), default="tiny")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--k", type=int, default=4, help="chain depth of the speculative mode")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]), help="checkout to measure")
    ap.add_argument("--real-forward", action="store_true", help="keep the target's forward (times include it)")
    args = ap.parse_args()
    sys.path[:0] = [args.root + "/src", str(Path(__file__).resolve().parents[1] / "tests")]
    torch.set_num_threads(1)

    from eaglespec.engine.loop import SpeculativeEngine
    from eaglespec.backends.fast import FastTarget
    from eaglespec.tree.core import TreeSpec

    model, drafter = build(args.model, args.device)
    prompt = list(range(3, 19))
    print(f"root {args.root} | torch {torch.__version__} | model {args.model} | device {args.device}")
    for mode in ("plain", "chain"):
        spec = TreeSpec("chain", depth=0 if mode == "plain" else args.k)
        target = FastTarget(model, max_len=2048, cuda_graphs=args.device.startswith("cuda"))
        engine = SpeculativeEngine(target, drafter if mode == "chain" else None, spec)
        if not args.real_forward:
            patch_forward(target, max(len(prompt), 128))
        with torch.no_grad():
            res = run_mode(engine, prompt, args.rounds, patched=not args.real_forward)
        label = mode if mode == "plain" else f"chain k={args.k}"
        print(f"{label}: " + ", ".join(f"{k} {v}" for k, v in res.items() if k != "top_engine_ops"))
        print(f"  top engine ops per run: {res['top_engine_ops']}")


if __name__ == "__main__":
    main()
