"""`--compile`: the torch.compile'd fast step gives the eager step's logits and features (CPU, fp32),
through tree verifies, commits and buckets, and greedy decoding with a drafter stays identical to
HF generate. Prefills (rows beyond the largest bucket) run the eager step: no compile per prompt length."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from eaglespec.backends.fast import FastTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.tree.core import TreeSpec, ancestry

from conftest import reference_greedy, tiny_drafter, tiny_target

pytestmark = pytest.mark.soak  # torch.compile of every bucket: minutes on a CPU


def test_compiled_step_equals_eager_step_and_generate():
    model = tiny_target("qwen3", seed=3)
    ids = (0, 2, 4)
    eager = FastTarget(model, ids, max_len=64, buckets=(1, 8))
    compiled = FastTarget(model, ids, max_len=64, buckets=(1, 8), compile=True)
    calls = []
    step = compiled.step
    compiled.step = lambda *a: calls.append(a[0].shape[0]) or step(*a)  # the eager path (prefill)
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


def test_compiled_spans_equal_eager_with_one_compile_per_bucket():
    """Compiled steps attend over spans (span_step 8) like the eager ones, across span boundaries, trees and
    non-prefix commits, and the span is a dynamic dimension: one compile per bucket, not one per span."""
    model = tiny_target("llama", seed=2)
    ids = (1, 4)
    eager = FastTarget(model, ids, max_len=64, buckets=(1, 8), span_step=8)
    compiled = FastTarget(model, ids, max_len=64, buckets=(1, 8), span_step=8, compile=True)
    torch._dynamo.reset()  # count this test's compiles only
    before = counters["stats"]["unique_graphs"]
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, 90, (5,), generator=gen)  # bucket 8: compiled, not the eager prefill
    _close(eager.forward(prompt), compiled.forward(prompt))
    for b in (eager, compiled):
        b.commit(torch.arange(5))
    tree_vis = ancestry(torch.tensor([-1, 0, 0, 1, 2]))
    tree_depths = torch.tensor([0, 1, 1, 2, 2])
    for step in range(21):  # committed 5 -> 54: spans 8, 16, ..., 64
        tree = step % 3 == 2  # a tree of 5 rows (bucket 8), else causal steps of 1 (bucket 1) or 3 rows
        t = 5 if tree else 1 + 2 * (step % 3)
        toks = torch.randint(3, 90, (t,), generator=gen)
        args = (toks, tree_depths, tree_vis) if tree else (toks,)
        _close(eager.forward(*args), compiled.forward(*args))
        keep = torch.tensor([0, 2, 4]) if tree else torch.arange(t)  # the tree: a non-prefix path
        for b in (eager, compiled):
            b.commit(keep)
    spans = {span for _, span in compiled._graphs}
    assert len(spans) >= 5 and max(spans) == compiled.max_len  # several spans, the whole cache the last
    assert {b for b, _ in compiled._graphs} == {1, 8}
    assert counters["stats"]["unique_graphs"] - before == 2, "a compile per span, not per bucket"


def test_compiled_steps_attend_over_the_whole_cache_without_maybe_mark_dynamic(monkeypatch):
    """On a torch without maybe_mark_dynamic every span would recompile: compiled steps take the whole cache."""
    model = tiny_target("llama", seed=1)
    assert FastTarget(model, max_len=64, span_step=8, compile=True).span(3) == 8
    monkeypatch.delattr(torch._dynamo, "maybe_mark_dynamic")
    assert FastTarget(model, max_len=64, span_step=8, compile=True).span(3) == 64


def _close(a, b) -> None:
    torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(b.features, a.features, atol=1e-5, rtol=0)
