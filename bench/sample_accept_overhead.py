"""Host syncs, aten ops and CPU time of one sampling acceptance (verify.sample_accept) against the
per-node vector loop it replaced (verify.tree_rejection_sample), on a 6-node chain with real q and a
61-node tree with point-mass q (the dynamic tree's scheme), vocabulary 49152.

    PYTHONPATH=src python bench/sample_accept_overhead.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from eaglespec.verify import sample_accept
from test_sampling_engine import _random_flat, vector_accept

SYNC_OPS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)


class Count(TorchDispatchMode):
    """Dispatched aten ops, and the host reads of device values: scalar reads and nonzero outside
    .tolist, plus one per .tolist call (under a dispatch mode tolist reads element by element)."""

    def __init__(self):
        super().__init__()
        self.ops = self.syncs = 0
        self.in_tolist = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_tolist:
            self.ops += 1
            self.syncs += func in SYNC_OPS
        return func(*args, **(kwargs or {}))


def main() -> None:
    torch.set_num_threads(1)
    tolist = torch.Tensor.tolist
    counter: list[Count] = []

    def counted_tolist(self):
        c = counter[-1]
        c.syncs += 1
        c.in_tolist = True
        try:
            return tolist(self)
        finally:
            c.in_tolist = False

    torch.Tensor.tolist = counted_tolist
    gen = torch.Generator().manual_seed(0)
    vocab = 49152
    for kind, n, real_q in (("chain", 6, True), ("tree", 61, False)):
        flat = _random_flat(kind, gen, n=n, vocab=64)
        flat.tokens = torch.randint(0, vocab, (n,), generator=gen)
        p = torch.softmax(torch.randn(n, vocab, generator=gen), -1)
        q = torch.softmax(torch.randn(n, vocab, generator=gen), -1) if real_q else None
        for name, fn in (("per-node vector loop", vector_accept), ("sample_accept", sample_accept)):
            c = Count()
            counter.append(c)
            with c:
                fn(flat, p, q, torch.Generator().manual_seed(1))
            ops, syncs = c.ops, c.syncs
            counter.append(Count())  # the timed calls below count elsewhere
            t0 = time.perf_counter()
            for s in range(20):
                fn(flat, p, q, torch.Generator().manual_seed(s))
            us = (time.perf_counter() - t0) / 20 * 1e6
            print(f"{kind} of {n} nodes, {'real q' if real_q else 'point mass'}: {name}: {ops} aten ops, "
                  f"{syncs} host syncs, {us:.0f} us CPU")


if __name__ == "__main__":
    main()
