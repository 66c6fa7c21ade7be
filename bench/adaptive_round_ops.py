"""Host-side ops of an adaptive stream's plain step (engine._undrafted_round) vs a plain-decoding round, on CPU.

Usage: python bench/adaptive_round_ops.py [--root DIR] [--tokens 40 120]

A tiny random Llama target (tests/conftest.py) and drafter; a gate that drafts the first round and then always
takes plain steps. Counts (tests/_opcount.HostOps, a TorchDispatchMode) the aten ops dispatched OUTSIDE the
target model's forward over whole streams of two lengths and reports the difference per extra round, so prefill
and the drafted round cancel: the engine's own per-round work (sampling/argmax, commit, the round's telemetry, and
for the adaptive stream the queueing of tokens and features). Also the same for plain decoding (no drafter), and
host microseconds per round for both (the tiny model's forward included; noisy on a shared machine).
`--root DIR` runs another checkout's sources (DIR/src), e.g. `git archive <commit> | tar -x -C DIR`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("EAGLESPEC_ONEDNN", "0")  # a CUDA proxy: count the GEMMs F.linear / addmm would run

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=None)
    ap.add_argument("--tokens", type=int, nargs=2, default=(40, 120))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    if args.root:
        sys.path.insert(0, str(Path(args.root) / "src"))
    import torch

    import eaglespec.engine.loop as engine_mod
    from _opcount import HostOps
    from eaglespec.engine.loop import SpeculativeEngine
    from eaglespec.backends.hf import HFTarget
    from eaglespec.tree.core import TreeSpec

    from conftest import tiny_drafter, tiny_target

    print("eaglespec from", engine_mod.__file__)
    torch.set_num_threads(1)

    class FirstDraftThenPlain(engine_mod.SpeculationGate):
        def __init__(self):
            super().__init__()
            self.n = 0

        def draft(self) -> bool:
            return self.n == 0

        def record(self, drafted, tokens, seconds) -> None:
            self.n += 1

    engine_mod.SpeculationGate = FirstDraftThenPlain
    model = tiny_target("llama", seed=3, layers=2)
    drafter = tiny_drafter(model, seed=1)
    engines = {"plain decoding": SpeculativeEngine(HFTarget(model), None, TreeSpec("chain", depth=0)),
               "adaptive, plain steps": SpeculativeEngine(HFTarget(model), drafter, TreeSpec("chain", depth=3),
                                                          adaptive=True)}
    prompt = [4, 8, 15, 16, 23, 42]
    lo, hi = args.tokens
    for name, engine in engines.items():
        def ops(n: int, engine=engine) -> tuple[int, dict]:
            with HostOps() as c:
                hooks = [model.register_forward_pre_hook(lambda *_: setattr(c, "in_drafter", True)),
                         model.register_forward_hook(lambda *_: setattr(c, "in_drafter", False))]
                try:
                    out = engine.generate(prompt, n)
                finally:
                    for h in hooks:
                        h.remove()
            assert len(out.token_ids) == n
            return c.ops - c.inside, c.kernels

        engine.generate(prompt, 8)  # warm-up
        (a, ka), (b, kb) = ops(lo), ops(hi)
        per = (b - a) / (hi - lo)
        by_op = {k: (kb[k] - ka.get(k, 0)) / (hi - lo) for k in kb if kb[k] != ka.get(k, 0)}
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            engine.generate(prompt, hi)
            t1 = time.perf_counter()
            engine.generate(prompt, lo)
            times.append((t1 - t0 - (time.perf_counter() - t1)) / (hi - lo))
        print(f"{name}: {per:.2f} ops per round outside the target forward "
              f"(non-view: {sum(by_op.values()):.2f}); host {1e6 * min(times):.0f} us per round (best of 5)")
        for k, v in sorted(by_op.items(), key=lambda kv: -kv[1]):
            print(f"    {v:6.2f}  {k}")


if __name__ == "__main__":
    main()
