"""Round graphs (round_graph.py) run eagerly on CPU: greedy output identical to HF generate, the same trees and
the same committed target / drafter KV as the per-phase rounds, round by round; no host sync or host->device
copy inside the round function (the CPU proxy for CUDA-graph capturability); the fallbacks (sampling, the first
round after the prefill, a too-long catch-up) keep the per-phase path. EAGLE-3 drafters on Llama and Qwen3 targets,
and an EAGLE-1 drafter."""

from __future__ import annotations

import pytest
import torch

from _engines import enable_draft_graphs, enable_round_graphs
from _hostcount import HostCounter
from eaglespec.backends.fast import FastTarget
from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.engine.round_graph import RoundGraph, unusable_reason
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.tree.core import TreeSpec
from test_draft_static import agreeing

from conftest import reference_greedy

SPECS = {
    "chain": TreeSpec("chain", depth=5),
    "static": TreeSpec("static", depth=4),
    "dynamic": TreeSpec("dynamic", depth=5, top_k=4, budget=12),
}
PROMPTS = ([4, 8, 15, 16, 23, 42, 7], [11, 3, 9, 27, 5, 60, 13, 21, 8, 40, 33])


@pytest.fixture(scope="module", params=[("llama", "eagle3"), ("qwen3", "eagle3"), ("llama", "eagle1")],
                ids=["llama-eagle3", "qwen3-eagle3", "llama-eagle1"])
def pair(request):
    return agreeing(*request.param)


def engines(model, drafter, spec: TreeSpec, max_len: int = 128) -> tuple[SpeculativeEngine, SpeculativeEngine]:
    """(per-phase engine, round-graph engine), both on the fast target and a StaticDraftRunner."""
    out = []
    for graphs in (False, True):
        engine = SpeculativeEngine(FastTarget(model, max_len=max_len), drafter, spec)
        enable_draft_graphs(engine, max_len=max_len)
        if graphs:
            assert enable_round_graphs(engine) is engine.graphs is not None
        out.append(engine)
    return out[0], out[1]


def count_bodies(rg: RoundGraph) -> list[int]:
    calls: list[int] = []
    body = rg.body

    def counted(*args):
        calls.append(rg.tlen)
        return body(*args)

    rg.body = counted
    return calls


def count_body_host_ops(rg: RoundGraph) -> list[tuple[bool, HostCounter]]:
    """Wrap rg.body: for each call (sampled or not, the HostCounter of what it dispatched)."""
    seen: list[tuple[bool, HostCounter]] = []
    body = rg.body

    def counted(span_d, span_t, sampling=None):
        with HostCounter() as c:
            out = body(span_d, span_t, sampling)
        seen.append((sampling is not None, c))
        return out

    rg.body = counted
    return seen


def _trees(result) -> list[tuple[list[int], list[int], list[int], list[int]]]:
    return [(r.detail["tokens"].tolist(), r.detail["parents"].tolist(), r.detail["depths"].tolist(),
             r.detail["rows"].tolist()) for r in result.rounds]


@pytest.mark.parametrize("kind", list(SPECS))
def test_rounds_equal_the_eager_rounds(pair, kind):
    """HF generate's tokens, the same tree and accepted rows every round, the same committed KV (target and
    drafter) after the stream; every round runs as a round graph (the drafter's prefill leaves the first round at
    most P pending rows)."""
    model, drafter = pair
    phased, graphed = engines(model, drafter, SPECS[kind])
    bodies = count_bodies(graphed.graphs.get(graphed.spec))
    rounds = 0
    for prompt in PROMPTS:
        ref = reference_greedy(model, prompt, 40)
        a, b = phased.generate(prompt, 40), graphed.generate(prompt, 40)
        assert a.token_ids == ref and b.token_ids == ref
        assert _trees(a) == _trees(b)
        for ra, rb in zip(a.rounds, b.rounds):
            assert (ra.drafted, ra.accepted, ra.emitted) == (rb.drafted, rb.accepted, rb.emitted)
            torch.testing.assert_close(ra.detail["logq"], rb.detail["logq"], rtol=1e-5, atol=1e-5)
        n = phased.target.committed_len
        assert n == graphed.target.committed_len > len(prompt) + 30
        torch.testing.assert_close(graphed.target.cache[:, :, :, :n], phased.target.cache[:, :, :, :n],
                                   rtol=1e-5, atol=1e-5)
        d = phased.proposer.committed
        assert d == graphed.proposer.committed == graphed.proposer.runner.length
        for ka, kb in zip(phased.proposer.runner.k + phased.proposer.runner.v,
                          graphed.proposer.runner.k + graphed.proposer.runner.v):
            torch.testing.assert_close(kb[:, :, :d], ka[:, :, :d], rtol=1e-5, atol=1e-5)
        assert len(b.rounds) > 8
        rounds += len(b.rounds)
    assert len(bodies) == rounds  # every round ran as a round graph, each stream's first too


def test_every_round_is_a_round_graph(pair):
    """The drafter's prefill (engine._draft_prefill) catches up on all but the prompt's last P rows, so the first
    round fits a round graph too; a prompt of at most P tokens needs none. Its drafter rows are the ones the
    per-phase first round computes (the trees of test_rounds_equal_the_eager_rounds)."""
    model, drafter = pair
    _, graphed = engines(model, drafter, SPECS["static"])
    rg = graphed.graphs.get(graphed.spec)
    bodies = count_bodies(rg)
    for prompt in (PROMPTS[0], PROMPTS[1], PROMPTS[0][: rg.P], PROMPTS[0][:2]):
        before = len(bodies)
        res = graphed.generate(prompt, 40)
        assert len(bodies) - before == len(res.rounds)
        assert res.token_ids == reference_greedy(model, prompt, 40)




def test_round_function_has_no_host_sync(pair):
    """What the CUDA graph captures: zero syncs and zero host->device copies inside RoundGraph.body."""
    model, drafter = pair
    for kind, spec in SPECS.items():
        _, graphed = engines(model, drafter, spec)
        seen = count_body_host_ops(graphed.graphs.get(graphed.spec))
        graphed.generate(PROMPTS[1], 24)
        assert seen, kind
        for _, c in seen:
            assert c.syncs == 0 and c.h2d == 0, (kind, c.names)
            assert c.ops > 100  # the counter saw the round


def test_eos_and_length_cut_mid_round(pair):
    model, drafter = pair
    phased, graphed = engines(model, drafter, SPECS["chain"])
    ref = reference_greedy(model, PROMPTS[1], 30)
    eos = ref[17]
    a = phased.generate(PROMPTS[1], 30, eos_token_ids=[eos])
    b = graphed.generate(PROMPTS[1], 30, eos_token_ids=[eos])
    assert a.token_ids == b.token_ids == ref[: ref.index(eos) + 1] and b.finish_reason == "stop"
    for new in (1, 2, 7):
        assert graphed.generate(PROMPTS[0], new).token_ids == reference_greedy(model, PROMPTS[0], new)


def test_target_cache_growth_mid_stream(pair):
    """A target KV cache that reallocates during the stream (max_len below the context): same tokens."""
    model, drafter = pair
    _, graphed = engines(model, drafter, SPECS["static"], max_len=128)
    graphed.target._allocate(24)  # smaller than prompt + 40 new tokens + tree rows: reserve() doubles it
    assert graphed.generate(PROMPTS[1], 40).token_ids == reference_greedy(model, PROMPTS[1], 40)
    assert graphed.target.max_len > 24


def test_dropping_the_round_graphs_drops_their_pool(pair):
    """Growing the id buffer drops the captured rounds and their pool handle (a pool whose graphs are all freed
    takes no new capture)."""
    model, drafter = pair
    _, graphed = engines(model, drafter, SPECS["chain"])
    rg = graphed.graphs.get(graphed.spec)
    rg.graphs[(1, 1, None)] = None
    rg._pool = object()
    rg._grow_ids(rg.ids.shape[0] + 1)
    assert not rg.graphs and rg._pool is None


def test_sampling_keeps_the_eager_rounds_when_sampled_round_graphs_are_off(pair):
    model, drafter = pair
    phased, graphed = engines(model, drafter, SPECS["chain"])
    enable_round_graphs(graphed, sampled=False)
    bodies = count_bodies(graphed.graphs.get(graphed.spec))
    cfg = SamplingConfig(SamplingParams(temperature=0.8), seed=5)
    a = phased.generate(PROMPTS[0], 24, sampling=cfg)
    b = graphed.generate(PROMPTS[0], 24, sampling=cfg)
    assert a.token_ids == b.token_ids and not bodies


def test_a_long_catch_up_takes_the_eager_round(pair):
    """More pending rows than a round graph holds (P = depth + 1): that round is per-phase, the next graphed."""
    model, drafter = pair
    _, graphed = engines(model, drafter, SPECS["chain"])
    rg = graphed.graphs.get(graphed.spec)
    ids = torch.arange(3, 3 + 12)
    assert not rg.stageable(ids, torch.zeros(rg.P + 1, rg.feats_in.shape[1]))  # n > P
    bodies = count_bodies(rg)
    assert graphed.generate(PROMPTS[0], 30).token_ids == reference_greedy(model, PROMPTS[0], 30) and bodies


def test_unusable_engines_get_none(pair):
    model, drafter = pair
    hf = SpeculativeEngine(HFTarget(model), drafter, SPECS["chain"])
    assert "fast backend" in unusable_reason(hf.target, hf.proposer, hf.spec)
    assert enable_round_graphs(hf) is None and hf.graphs is None
    eager = SpeculativeEngine(FastTarget(model, max_len=64), drafter, SPECS["chain"])  # no StaticDraftRunner
    assert "StaticDraftRunner" in unusable_reason(eager.target, eager.proposer, eager.spec)
    assert enable_round_graphs(eager) is None
    plain = SpeculativeEngine(FastTarget(model, max_len=64), None)
    assert unusable_reason(plain.target, plain.proposer, plain.spec) is not None

