"""Host syncs and host->device copies (as bench/propose_overhead.py's HostCounter counts them), aten ops
and CPU time of one sampling acceptance (verify.sample_accept) against the per-node vector loop it replaced
(verify.tree_rejection_sample), on a 6-node chain with real q, a 61-node tree with point-mass q (the
dynamic tree's scheme) and a 25-node tree with real q and siblings (sampled static trees: their test values come
from verify._sibling_tests, one pass per sibling rank), vocabulary 49152.

    PYTHONPATH=src python bench/sample_accept_overhead.py
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from propose_overhead import HostCounter  # syncs and host->device copies as that bench defines them

from eaglespec.verify import sample_accept
from test_sampling_engine import _random_flat, vector_accept


def main() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    vocab = 49152
    for kind, n, real_q in (("chain", 6, True), ("tree", 61, False), ("tree", 25, True)):
        flat = _random_flat(kind, gen, n=n, vocab=64)
        flat.tokens = torch.randint(0, vocab, (n,), generator=gen)
        p = torch.softmax(torch.randn(n, vocab, generator=gen), -1)
        q = torch.softmax(torch.randn(n, vocab, generator=gen), -1) if real_q else None
        fns = [("per-node vector loop", vector_accept), ("sample_accept", sample_accept)]
        if real_q and kind == "tree":  # CUDA's default for these: per-rank passes on the device, then scalars
            fns.append(("sample_accept, sibling_tests=True", functools.partial(sample_accept, sibling_tests=True)))
        for name, fn in fns:
            with HostCounter() as c:
                fn(flat, p, q, torch.Generator().manual_seed(1))
            t0 = time.perf_counter()
            for s in range(20):
                fn(flat, p, q, torch.Generator().manual_seed(s))
            us = (time.perf_counter() - t0) / 20 * 1e6
            print(f"{kind} of {n} nodes, {'real q' if real_q else 'point mass'}: {name}: {c.ops} aten ops, "
                  f"{c.syncs} host syncs, {c.h2d} host->device copies, {us:.0f} us CPU")


if __name__ == "__main__":
    main()
