"""`--compile`: the torch.compile'd fast step gives the eager step's logits and features (CPU, fp32),
through tree verifies, commits and buckets, and greedy decoding with a drafter stays identical to
HF generate. Prefills (rows beyond the largest bucket) run the eager step: no compile per prompt length."""

from __future__ import annotations

import torch

from eaglespec.engine import SpeculativeEngine
from eaglespec.target.fast import FastTarget
from eaglespec.tree import TreeSpec, ancestry

from conftest import reference_greedy, tiny_drafter, tiny_target


def test_compiled_step_equals_eager_step_and_generate():
    model = tiny_target("qwen3", seed=3)
    ids = (0, 2, 4)
    eager = FastTarget(model, ids, max_len=64, buckets=(1, 8))
    compiled = FastTarget(model, ids, max_len=64, buckets=(1, 8), compile=True)
    calls = []
    step = compiled._step
    compiled._step = lambda *a: calls.append(a[0].shape[0]) or step(*a)  # the eager path (prefill)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 90, (11,), generator=gen)
    parents = torch.tensor([-1, 0, 0, 1, 2, 4])
    depths = torch.tensor([0, 1, 1, 2, 2, 3])
    for b in (eager, compiled):
        out = b.forward(prompt)
        b.commit(torch.arange(11))
        b.last = [out]
        toks = torch.randint(3, 90, (6,), generator=torch.Generator().manual_seed(1))
        b.last.append(b.forward(toks, depths, ancestry(parents)))  # bucket 8, compiled
        b.commit(torch.tensor([0, 2, 4, 5]))  # non-prefix path
        b.last.append(b.forward(toks[:1]))  # bucket 1, compiled
    assert calls == [11]  # only the prefill ran eagerly
    for a, c in zip(eager.last, compiled.last):
        torch.testing.assert_close(c.logits, a.logits, atol=1e-5, rtol=0)
        torch.testing.assert_close(c.features, a.features, atol=1e-5, rtol=0)

    drafter = tiny_drafter(model, seed=1)
    engine = SpeculativeEngine(FastTarget(model, max_len=96, buckets=(1, 8), compile=True), drafter,
                               TreeSpec("chain", depth=3))
    prompt_ids = [5, 9, 17, 3, 44]
    assert engine.generate(prompt_ids, 20).token_ids == reference_greedy(model, prompt_ids, 20)
