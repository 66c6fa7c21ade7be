"""Test helpers that give an engine built without them a static draft runner or round graphs, with the knobs the
tests vary (buckets, span steps, tree graphs, fused steps). Library code builds engines in engine/build.py."""

from __future__ import annotations

from eaglespec.draft.fast import StaticDraftRunner
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.engine.round_graph import RoundGraphs, unusable_reason


def enable_draft_graphs(engine: SpeculativeEngine, max_len: int = 4096, **kw) -> StaticDraftRunner | None:
    """Switch `engine`'s proposer to a StaticDraftRunner (kw: buckets, cuda_graphs, tree_graphs, span_step,
    fused). None without a drafter."""
    proposer = engine.proposer
    if proposer is None:
        return None
    runner = StaticDraftRunner(proposer.drafter, max_len=max_len, **kw)
    proposer.runner = runner
    proposer.reset()
    return runner


def enable_round_graphs(engine: SpeculativeEngine, sampled: bool = True) -> RoundGraphs | None:
    """Give `engine` round graphs (engine.graphs); None when its target, proposer and tree cannot have them."""
    inner = getattr(engine.target, "inner", engine.target)
    if unusable_reason(inner, engine.proposer, engine.spec) is not None:
        return None
    engine.graphs = RoundGraphs(inner, engine.proposer, sampled=sampled, overlap=engine.overlap)
    return engine.graphs
