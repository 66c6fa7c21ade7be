"""engine/plan.py: the batched engine's depth per batch size, from round times and tokens per round."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eaglespec.engine.plan import DEFAULT_ACCEPT, DepthPlan, drafter_prior
from eaglespec.errors import EagleSpecError
from eaglespec.tree.auto import chain_tau
from eaglespec.tree.core import TreeSpec

# round seconds per batch size and depth: drafting is cheap at one row, dear at 64
SECONDS = {1: {0: 1.0, 1: 1.3, 2: 1.6, 3: 1.9}, 64: {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}}


def test_without_a_profile_the_prior_accepts_each_depth_at_the_default_rate():
    bare = SimpleNamespace()
    taus = [1.0, 1 + DEFAULT_ACCEPT, 1 + DEFAULT_ACCEPT + DEFAULT_ACCEPT ** 2]
    assert drafter_prior(bare, TreeSpec("chain", depth=2), chains=True) == pytest.approx(taus)
    assert drafter_prior(bare, TreeSpec("static", depth=2), chains=False) == pytest.approx([1.0, taus[-1]])


def test_the_plan_takes_the_known_optimum_per_batch_size():
    plan = DepthPlan(SECONDS, [chain_tau([[0.8]] * 3, k) for k in range(4)])  # tokens 1, 1.8, 2.44, 2.952
    # B=1: tokens / seconds = 1, 1.38, 1.53, 1.55 -> the deepest; B=64: 1, 0.9, 0.81, 0.74 -> plain steps
    assert plan.best(1) == 3 and plan.best(64) == 0
    assert plan.bucket(1) == 1 and plan.bucket(5) == 64 and plan.bucket(100) == 64
    assert plan.tokens_per_second(64, 0) == pytest.approx(64.0)
    assert plan.summary() == "B<=1: depth 3, B<=64: depth 0"


def test_a_chain_round_also_counts_for_every_shallower_depth():
    """A chain of 3 that accepted m drafts would have emitted min(m, d) + 1 tokens as a chain of d."""
    plan = DepthPlan(SECONDS, [1.0, 9.0, 9.0, 9.0], weight=1e-9)  # the prior counts for (almost) nothing
    plan.record(3, [1, 3], chain=True)
    assert [plan.tokens(d) for d in (1, 2, 3)] == pytest.approx([2.0, 2.5, 3.0])
    plan.record(0, [0, 0], chain=True)  # a plain step tells nothing
    assert plan.tokens(1) == pytest.approx(2.0)


def test_a_tree_round_counts_for_the_tree_only():
    plan = DepthPlan({1: {0: 1.0, 1: 2.0}}, [1.0, 3.0], weight=1.0)
    plan.record(1, [4, 4, 4], chain=False)
    assert plan.tokens(1) == pytest.approx((3.0 + 15.0) / 4)


def test_a_drafter_that_stops_agreeing_sends_the_plan_to_plain_steps_with_probes():
    plan = DepthPlan({1: {0: 1.0, 1: 1.2, 2: 1.4}}, [1.0, 1.9, 2.7], weight=4, probe_every=4)
    assert plan.depth(1) == 2
    for _ in range(20):
        plan.record(2, [0], chain=True)
    assert plan.best(1) == 0
    assert [plan.depth(1) for _ in range(9)] == [2, 0, 0, 0, 2, 0, 0, 0, 2]  # one probe in four rounds


@pytest.mark.parametrize("seconds, prior, match", [
    ({}, [1.0, 2.0], "at least one batch size"),
    ({4: {0: 1.0}}, [1.0, 2.0], "batch size 4: round seconds"),
    ({4: {0: 1.0, 1: 0.0}}, [1.0, 2.0], "batch size 4: round seconds must be > 0"),
    ({4: {0: 1.0, 1: 1.0}}, [2.0, 2.0], r"prior\[0\]"),
])
def test_malformed_plans_are_one_line_errors(seconds, prior, match):
    with pytest.raises(EagleSpecError, match=match):
        DepthPlan(seconds, prior)


def test_record_names_a_depth_outside_the_plan():
    with pytest.raises(EagleSpecError, match="depth 5"):
        DepthPlan(SECONDS, [1.0, 2.0, 3.0, 4.0]).record(5, [1], chain=True)


def test_drafter_prior_reads_the_greedy_acceptance_profile():
    manifest = {"acceptance_profile": {"t0": {"accept": [[0.8, 0.1], [0.5, 0.2]]}, "t1": {"accept": [[0.1, 0.1]]}}}
    drafter = SimpleNamespace(manifest=manifest)
    assert drafter_prior(drafter, TreeSpec("chain", depth=2), chains=True) == pytest.approx([1.0, 1.8, 2.2])
    static = TreeSpec("static", depth=2, choices=((0,), (1,), (0, 0)))
    assert drafter_prior(drafter, static, chains=False) == pytest.approx([1.0, 1 + 0.8 + 0.1 + 0.8 * 0.5])
    bare = SimpleNamespace()
    assert drafter_prior(bare, TreeSpec("chain", depth=1), chains=True) == pytest.approx([1.0, 1 + DEFAULT_ACCEPT])


def test_a_bucket_keeps_its_depth_until_another_promises_the_margin_more():
    plan = DepthPlan({1: {0: 1.0, 1: 1.5}}, [1.0, 1.6], weight=10.0, margin=0.05)
    assert plan.depth(1) == 1  # 1.6 / 1.5 tokens per second against 1: drafting
    plan.record(1, [0] * 3, chain=True)  # depth 1: (16 + 3) / 13 = 1.46 tokens, 0.97 per second
    assert plan.best(1) == 0 and plan.depth(1) == 1  # plain steps promise 2.6% more: within the margin
    plan.record(1, [0] * 7, chain=True)  # (16 + 10) / 20 = 1.3 tokens, 0.87 per second
    assert [plan.depth(1) for _ in range(3)] == [1, 0, 0]  # moved to plain steps, whose first round is a probe
