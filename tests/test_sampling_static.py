"""Static trees under sampling: children drawn WITHOUT replacement from the drafter's q.

End-to-end through the real SpeculativeEngine: the first 3 tokens follow the target's processed
distribution (chi-square goodness of fit, with a power check), and a negative control (the same
trees verified as if the siblings were drawn WITH replacement) is rejected. The drafter's head is
sharpened so that q is peaked and differs from p: the without-replacement correction then matters.
"""

from __future__ import annotations

import pytest
import torch

import eaglespec.engine.loop as engine_mod
from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.tree.core import TreeSpec
from test_sampling import first3_pvalue
from test_sampling_engine import PROMPT, V, _exact_first3, sharp_target, vector_accept  # noqa: F401 (fixture)

from conftest import reference_greedy, tiny_drafter

# root: 4 children; its first three children: 3, 2 and 1 children (depth 2 = the first 3 tokens)
CHOICES = ((0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0))
SPEC = TreeSpec("static", depth=2, budget=len(CHOICES), choices=CHOICES)


@pytest.fixture(scope="module")
def engine(sharp_target):  # noqa: F811
    drafter = tiny_drafter(sharp_target, seed=1)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(8.0)  # peaked q, unlike p: sibling order and removal matter
    return SpeculativeEngine(HFTarget(sharp_target), drafter, SPEC)


def _run(engine, params: SamplingParams, runs: int) -> tuple[torch.Tensor, int, int]:
    """(first 3 tokens [runs, 3], accepted drafts, rounds whose tree lost children beyond q's support)."""
    tokens, accepted, pruned = [], 0, 0
    for seed in range(runs):
        out = engine.generate(PROMPT, 3, sampling=SamplingConfig(params, seed=seed))
        tokens.append(out.token_ids)
        accepted += sum(r.accepted for r in out.rounds)
        pruned += sum(r.drafted < len(CHOICES) for r in out.rounds)
    return torch.tensor(tokens), accepted, pruned


@pytest.mark.parametrize("params,runs", [
    (SamplingParams(temperature=1.0), 1200),
    pytest.param(SamplingParams(temperature=0.7, top_p=0.9), 1200, marks=pytest.mark.soak),
], ids=["T1", "T0.7-top_p0.9"])
def test_static_sampled_children_match_target(sharp_target, engine, params, runs):  # noqa: F811
    emitted, accepted, pruned = _run(engine, params, runs)
    assert accepted > runs // 10  # drafts are accepted and rejected: both branches run
    if params.top_p < 1:
        assert pruned > 0  # q's support was narrower than the fan-out: children dropped, still exact
    p, impossible = first3_pvalue(emitted, _exact_first3(sharp_target, params))
    assert impossible == 0 and p > 1e-3, f"engine output is not the target's distribution (p = {p:.2e})"
    other = SamplingParams(temperature=0.6) if params.temperature == 1.0 else SamplingParams(temperature=1.0)
    p_other, _ = first3_pvalue(emitted, _exact_first3(sharp_target, other))
    assert p_other < 1e-3, "the check has no power: it cannot tell two processor settings apart"


def _accept_as_if_with_replacement(flat, target_probs, draft_probs, generator=None):
    """The classic bug: siblings drawn without replacement, verified as i.i.d. draws from q."""
    return vector_accept(flat, target_probs, draft_probs, generator, replacement=True)


def test_negative_control_with_replacement_verification_is_biased(sharp_target, engine, monkeypatch):  # noqa: F811
    monkeypatch.setattr(engine_mod, "sample_accept", _accept_as_if_with_replacement)
    params = SamplingParams(temperature=1.0)
    emitted, _, _ = _run(engine, params, 1000)
    p, _ = first3_pvalue(emitted, _exact_first3(sharp_target, params))
    assert p < 1e-3, f"the goodness-of-fit test misses the with-replacement bias (p = {p:.2e})"


def test_static_sampling_records_draft_probs_greedy_does_not(sharp_target, engine):  # noqa: F811
    cfg = SamplingConfig(SamplingParams(temperature=1.0), seed=0)
    out = engine.generate(PROMPT, 12, sampling=cfg)
    details = [r.detail for r in out.rounds]
    assert all(d["draft_probs"] is not None for d in details)
    for d in details:  # siblings distinct; each recorded q sums to 1 over the target vocab where it has children
        q, parents, tokens = d["draft_probs"], d["parents"], d["tokens"]
        assert q.shape == (parents.shape[0], V)
        for u in set(parents[1:].tolist()):
            kids = tokens[parents == u]
            assert kids.unique().numel() == kids.numel()
            assert torch.isclose(q[u].sum(), torch.tensor(1.0)) and bool((q[u][kids] > 0).all())
    assert sum(r.accepted for r in out.rounds) > 0
    # greedy: deterministic top-k children, no draft_probs, exact greedy output
    greedy = engine.generate(PROMPT, 12)
    assert all(r.detail["draft_probs"] is None for r in greedy.rounds)
    assert greedy.token_ids == reference_greedy(sharp_target, PROMPT, 12)
