"""Sampled round graphs (round_graph.py, sampled=True), run eagerly on CPU: the first 3 emitted tokens follow the
target's processed distribution (chi-square, with a power check and a negative control that breaks the acceptance
test), for a sampled chain, static tree and dynamic tree whose first round is already a round graph; no host sync
inside the sampled round; sampled=False keeps the per-phase rounds."""

from __future__ import annotations

import pytest
import torch

import eaglespec.engine.round_graph as rg_mod
from _engines import enable_draft_graphs, enable_round_graphs
from eaglespec.backends.fast import FastTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.tree.core import TreeSpec
from test_round_graph import count_bodies, count_body_host_ops
from test_sampling import first3_pvalue
from test_sampling_engine import PROMPT, _exact_first3, sharp_target  # noqa: F401 (fixture)
from test_sampling_static import SPEC as STATIC

from conftest import tiny_drafter

CHAIN = TreeSpec("chain", depth=3)  # P = 4 rows >= the 3-token prompt: the first round is a round graph too
DYNAMIC = TreeSpec("dynamic", depth=3, top_k=3, budget=5)  # the budget cuts the 3 + 9 + 9 candidates


def graphed(model, spec: TreeSpec, sampled: bool = True) -> SpeculativeEngine:
    drafter = tiny_drafter(model, seed=1)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(8.0)  # peaked q, unlike p: sibling order and removal matter
    engine = SpeculativeEngine(FastTarget(model, max_len=64), drafter, spec)
    enable_draft_graphs(engine, max_len=64)
    enable_round_graphs(engine, sampled=sampled)
    return engine


def first3(engine, params: SamplingParams, runs: int, draft: SamplingParams | None = None
           ) -> tuple[torch.Tensor, int, int, int]:
    """(first 3 tokens [runs, 3], drafts accepted, rounds run as round graphs, trees with children pruned: outside
    q's support, left out of the acceptance tests)."""
    bodies = count_bodies(engine.graphs.get(engine.spec))
    grow, pruned = engine.proposer.grow, []

    def watched(*args):
        tree, flags, keep = grow(*args)
        pruned.append(keep is not None and not bool(keep.all()))  # a test-only host read (CPU, eager)
        return tree, flags, keep

    engine.proposer.grow = watched
    tokens, accepted = [], 0
    for seed in range(runs):
        out = engine.generate(PROMPT, 3, sampling=SamplingConfig(params, draft=draft, seed=seed))
        tokens.append(out.token_ids)
        accepted += sum(r.accepted for r in out.rounds)
    return torch.tensor(tokens), accepted, len(bodies), sum(pruned)


@pytest.mark.parametrize("spec,params,runs", [
    pytest.param(CHAIN, SamplingParams(temperature=1.0), 1500, marks=pytest.mark.soak),
    (STATIC, SamplingParams(temperature=1.0), 1200),
    pytest.param(STATIC, SamplingParams(temperature=0.7, top_p=0.9), 1200, marks=pytest.mark.soak),
    (DYNAMIC, SamplingParams(temperature=1.0), 1200),
    pytest.param(DYNAMIC, SamplingParams(temperature=0.7, top_p=0.9), 1200, marks=pytest.mark.soak),
], ids=["chain-T1", "static-T1", "static-T0.7-top_p0.9", "dynamic-T1", "dynamic-T0.7-top_p0.9"])
def test_sampled_round_graphs_match_the_target(sharp_target, spec, params, runs):  # noqa: F811
    engine = graphed(sharp_target, spec)
    emitted, accepted, bodies, pruned = first3(engine, params, runs)
    assert bodies >= runs  # every stream's first round (at least) ran as a round graph
    assert accepted > runs // 10  # drafts are accepted and rejected: both branches run
    if params.top_p < 1:
        assert pruned > 0  # q's support was narrower than the fan-out: children left out, still exact
    p, impossible = first3_pvalue(emitted, _exact_first3(sharp_target, params))
    assert impossible == 0 and p > 1e-3, f"round graph output is not the target's distribution (p = {p:.2e})"
    other = SamplingParams(temperature=0.6) if params.temperature == 1.0 else SamplingParams(temperature=1.0)
    p_other, _ = first3_pvalue(emitted, _exact_first3(sharp_target, other))
    assert p_other < 1e-3, "the check has no power: it cannot tell two processor settings apart"


@pytest.mark.parametrize("spec,params", [
    pytest.param(DYNAMIC, SamplingParams(temperature=1.0), marks=pytest.mark.soak),
    (STATIC, SamplingParams(temperature=0.7, top_p=0.9)),
    pytest.param(CHAIN, SamplingParams(temperature=1.0), marks=pytest.mark.soak),
], ids=["dynamic-T1", "static-T0.7-top_p0.9", "chain-T1"])
def test_top_k_children_under_a_sampled_target_match_it(sharp_target, spec, params):  # noqa: F811
    """Greedy draft processors under a sampled target: top-k children, verified in the round graph with the
    point-mass scheme (q = 1; verify.point_mass_tests). The first 3 tokens follow the target's distribution."""
    engine = graphed(sharp_target, spec)
    calls = {"n": 0}
    real = rg_mod.point_mass_tests

    def counted(*args):
        calls["n"] += 1
        return real(*args)

    rg_mod.point_mass_tests = counted
    try:
        emitted, accepted, bodies, _ = first3(engine, params, 1200, draft=SamplingParams(temperature=0.0))
    finally:
        rg_mod.point_mass_tests = real
    assert bodies >= 1200 and calls["n"] >= 1200 and accepted > 60  # drafts accepted and rejected: both branches
    p, impossible = first3_pvalue(emitted, _exact_first3(sharp_target, params))
    assert impossible == 0 and p > 1e-3, f"round graph output is not the target's distribution (p = {p:.2e})"


@pytest.mark.soak
def test_negative_control_point_mass_bonus_from_p_is_caught(sharp_target, monkeypatch):  # noqa: F811
    """Top-k children under a sampled target, the bonus drawn from p itself instead of p without the rejected
    children: not the target's distribution, and the check says so."""
    monkeypatch.setattr(rg_mod, "point_mass_residual",
                        lambda p, tokens, kids, live, node: p.index_select(0, node).float())
    params = SamplingParams(temperature=1.0)
    emitted, _, bodies, _ = first3(graphed(sharp_target, DYNAMIC), params, 3000, draft=SamplingParams(temperature=0.0))
    assert bodies >= 3000
    p, _ = first3_pvalue(emitted, _exact_first3(sharp_target, params))
    assert p < 1e-3


def test_negative_control_point_mass_test_is_caught(sharp_target, monkeypatch):  # noqa: F811
    """Accepting with the point-mass test (q = 1) while the children were drawn from q: not the target's
    distribution, and the check says so."""
    real = rg_mod.sampled_path

    def point_mass(visible, depths, kids, r_at, q_at, coins, live=None):
        return real(visible, depths, kids, r_at, torch.ones_like(q_at), coins, live)

    monkeypatch.setattr(rg_mod, "sampled_path", point_mass)
    params = SamplingParams(temperature=1.0)
    emitted, _, bodies, _ = first3(graphed(sharp_target, STATIC), params, 1200)
    assert bodies >= 1200
    p, _ = first3_pvalue(emitted, _exact_first3(sharp_target, params))
    assert p < 1e-3


@pytest.mark.parametrize("spec,draft", [(CHAIN, None), (STATIC, None), (DYNAMIC, None),
                                        (DYNAMIC, SamplingParams(temperature=0.0))],
                         ids=["chain", "static", "dynamic", "dynamic-top-k-children"])
def test_sampled_round_has_no_host_sync(sharp_target, spec, draft):  # noqa: F811
    engine = graphed(sharp_target, spec)
    seen = count_body_host_ops(engine.graphs.get(engine.spec))
    engine.generate(PROMPT, 20, sampling=SamplingConfig(SamplingParams(temperature=0.8, top_k=10), draft=draft, seed=1))
    assert len(seen) > 3 and all(s for s, _ in seen)
    for _, c in seen[1:]:  # the first call builds the tree's static plan once (on CUDA: in the capture's warm-up)
        assert c.syncs == 0 and c.h2d == 0, c.names
        assert c.ops > 100


def test_the_draws_are_the_generators(sharp_target):  # noqa: F811
    """One seed, one output; another seed, another output (the random inputs come from the stream's generator)."""
    engine = graphed(sharp_target, STATIC)
    runs = [engine.generate(PROMPT, 24, sampling=SamplingConfig(SamplingParams(temperature=1.0), seed=s)).token_ids
            for s in (3, 3, 4)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


@pytest.mark.parametrize("spec", [CHAIN, DYNAMIC], ids=["chain", "dynamic"])
def test_per_phase_where_sampled_round_graphs_are_off(sharp_target, spec):  # noqa: F811
    engine = graphed(sharp_target, spec, sampled=False)
    bodies = count_bodies(engine.graphs.get(engine.spec))
    out = engine.generate(PROMPT, 12, sampling=SamplingConfig(SamplingParams(temperature=1.0), seed=0))
    assert len(out.token_ids) == 12 and not bodies

