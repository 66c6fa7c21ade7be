"""Adaptive streams after long stretches of plain steps: the drafter's catch-up over more queued rows than the
largest bucket (StaticDraftRunner.run's oversized causal rows, run in chunks of the largest bucket through the
bucket steps) equals the unchunked step and the eager drafter (logits, states, KV, trees), and a stream whose gate
takes > 64 plain steps before drafting again still emits HF generate's tokens and drafts the tree a fresh run
would (contract 7's queued tokens and features, joined once, each once and in order)."""

from __future__ import annotations

import pytest
import torch

import eaglespec.engine.loop as engine_mod
from _engines import enable_draft_graphs
from eaglespec.backends.hf import HFTarget
from eaglespec.draft.fast import DEFAULT_BUCKETS, StaticDraftRunner
from eaglespec.draft.proposer import EagerRows, Proposer
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.tree.core import TreeSpec
from test_gate import Pattern

from conftest import reference_greedy, tiny_drafter, tiny_target

SPECS = {"chain": TreeSpec("chain", depth=3), "dynamic": TreeSpec("dynamic", depth=3, top_k=3, budget=6),
         "static": TreeSpec("static", depth=3, top_k=4, budget=8)}


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    # padded matmuls and longer attention rows round differently (~1e-7 relative in fp32)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_chunked_catch_up_equals_one_step_and_eager():
    """Rows past the largest bucket (64): 150 rows after 10 (chunks 64 + 64 + 22), then 70 after those (64 + 6):
    the chunked runner gives the logits, states and KV of one 256-row bucket step and of the eager drafter.
    A chunk that did not see the earlier chunks (or ran them at other positions) would differ."""
    model = tiny_target("llama", seed=3)
    drafter = tiny_drafter(model, seed=1)
    chunked = StaticDraftRunner(drafter, max_len=400)
    one = StaticDraftRunner(drafter, max_len=400, buckets=(*DEFAULT_BUCKETS, 256))  # each call: one step
    eager = EagerRows(drafter)
    g = torch.Generator().manual_seed(0)
    h = drafter.cfg.hidden_size
    for n in (10, 150, 70):
        state = torch.randn(n, h, generator=g)
        tokens = torch.randint(3, 90, (n,), generator=g)
        positions = torch.arange(eager.length, eager.length + n)
        le, se = eager.run(state, tokens, positions)
        lo, so = one.run(state, tokens, positions)
        lc, sc = chunked.run(state, tokens, positions)
        assert lc.shape == le.shape and sc.shape == se.shape
        for lg, st in ((lo, so), (lc, sc)):
            close(lg, le)
            close(st, se)
        live = eager.length
        assert chunked.length == one.length == live
        for layer, cache in enumerate(eager.cache):
            for runner in (one, chunked):
                close(runner.k[layer][:, :, :live], cache.k)
                close(runner.v[layer][:, :, :live], cache.v)
    assert max(b for b, _ in chunked._graphs) == 64  # no step past the largest bucket ran
    assert (256, one.span(10 + 256)) in one._graphs  # the reference did run 150 rows as one step


@pytest.mark.parametrize("kind", list(SPECS))
def test_trees_after_a_chunked_catch_up(kind):
    """The tree drafted after a 150-row catch-up (3 chunks) equals the eager proposer's and the unchunked one's."""
    model = tiny_target("llama", seed=3)
    drafter = tiny_drafter(model, seed=1)
    spec = SPECS[kind]
    proposers = [Proposer(drafter, spec), Proposer(drafter, spec, StaticDraftRunner(drafter, max_len=400)),
                 Proposer(drafter, spec, StaticDraftRunner(drafter, max_len=400, buckets=(*DEFAULT_BUCKETS, 256)))]
    g = torch.Generator().manual_seed(1)
    f = drafter.fc.in_features
    trees = [[] for _ in proposers]
    for n in (150, 5, 90):
        feats = torch.randn(n, f, generator=g)
        ids = torch.randint(3, 90, (n + 1,), generator=g)
        for p, out in zip(proposers, trees):
            out.append(p.propose(int(ids[-1]), feats, ids[1:]))
    for other in trees[1:]:
        for a, b in zip(trees[0], other):
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
            close(a.logq, b.logq)


def record(engine: SpeculativeEngine) -> list:
    calls = []
    orig = engine.proposer.propose
    engine.proposer.propose = lambda *a: calls.append((a[1].shape[0], orig(*a))) or calls[-1][1]
    return calls


@pytest.mark.parametrize("runner", ["eager", "static"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_long_plain_stretch_then_drafting(monkeypatch, kind, runner):
    """Two drafted rounds, 80 plain steps (80 queued tokens and features, > the largest bucket), then drafting
    again: HF generate's tokens, and the first tree after the stretch equals a fresh run's first tree (whose
    prompt is the text so far, caught up in one prefill by the eager drafter)."""
    model = tiny_target("llama", seed=3)
    drafter = tiny_drafter(model, seed=1)
    pattern = (True, True) + (False,) * 80 + (True,) * 8
    monkeypatch.setattr(engine_mod, "SpeculationGate", lambda: Pattern(pattern))
    engine = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind], adaptive=True)
    if runner == "static":
        enable_draft_graphs(engine, max_len=256)
    calls = record(engine)
    prompt = [4, 8, 15, 16, 23, 42]
    new = 100
    out = engine.generate(prompt, new)
    assert out.token_ids == reference_greedy(model, prompt, new)
    i = 82  # the round after the stretch
    assert [r.drafted > 0 for r in out.rounds[:i + 1]] == list(pattern[:i + 1])
    n_feats, tree = calls[2]  # the third drafted round: the first after the stretch
    assert n_feats > 80  # the stretch's 80 queued rows (+ the last drafted round's accepted rows)
    prefix = prompt + out.token_ids[: 1 + sum(r.emitted for r in out.rounds[:i])]
    fresh = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind])
    first = record(fresh)
    fresh.generate(prefix[:-1], 2)  # its prefill emits prefix[-1] (greedy), then it drafts from there
    assert torch.equal(first[0][1].tokens, tree.tokens) and torch.equal(first[0][1].parents, tree.parents)
    close(first[0][1].logq, tree.logq)
