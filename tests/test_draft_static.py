"""The static (CUDA-graph-capturable) drafter path, run eagerly on CPU: the same DraftTrees as the eager
Proposer for chain / dynamic / static trees over whole engine runs (EAGLE-1 and EAGLE-3, llama and
qwen3 targets), greedy output identical to HF generate, slot bookkeeping across non-prefix commits,
and a clear error when the static drafter KV overflows."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from _agree import fit_drafter
from _engines import enable_draft_graphs
from eaglespec.backends.hf import HFTarget
from eaglespec.draft.eagle1 import Eagle1Drafter
from eaglespec.draft.fast import StaticDraftRunner
from eaglespec.draft.proposer import EagerRows
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec

from conftest import reference_greedy, tiny_draft_config, tiny_drafter, tiny_target

SPECS = {
    "chain": TreeSpec("chain", depth=4),
    "dynamic": TreeSpec("dynamic", depth=4, top_k=3, budget=8),
    "static": TreeSpec("static", depth=4),  # EAGLE-1's mc_sim_7b_63 cut to depth 4
}
PROMPTS = ([4, 8, 15, 16, 23, 42, 7], [11, 3, 9])


@cache
def agreeing(arch: str, method: str):
    """(target, drafter fitted on the target's greedy continuations): acceptance well above 0."""
    model = tiny_target(arch, seed=3)
    if method == "eagle1":
        torch.manual_seed(0)
        drafter = Eagle1Drafter(tiny_draft_config(model, method="eagle1", aux_layer_ids=())).eval()
    else:
        drafter = tiny_drafter(model, seed=0)
    return model, fit_drafter(model, drafter, steps=40, n_seqs=8, length=32)


def record(engine: SpeculativeEngine) -> list:
    trees = []
    orig = engine.proposer.propose
    engine.proposer.propose = lambda *a: trees.append(orig(*a)) or trees[-1]
    return trees


def same_tree(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
    assert torch.equal(a.depths, b.depths)
    # padded matmuls and the longer attention row round differently (~1e-7 relative): logq to 1e-5
    torch.testing.assert_close(a.logq, b.logq, rtol=1e-5, atol=1e-5)


def same_runs(model, eager: SpeculativeEngine, other: SpeculativeEngine, prompts, new: int = 24) -> None:
    """Both engines' greedy output == HF generate, with the same DraftTrees round by round."""
    t_eager, t_other = record(eager), record(other)
    for prompt in prompts:
        assert eager.generate(prompt, new).token_ids == other.generate(prompt, new).token_ids == \
            reference_greedy(model, prompt, new)
    assert len(t_eager) == len(t_other) > 4
    for ta, tb in zip(t_eager, t_other):
        same_tree(ta, tb)


@pytest.mark.parametrize("tree_graphs", [False, True], ids=["per-step", "whole-tree"])
@pytest.mark.parametrize("buckets", [(1, 2, 4, 8, 16, 32, 64), (1, 4)], ids=["default-buckets", "small-buckets"])
@pytest.mark.parametrize("method", ["eagle1", "eagle3"])
@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_static_runner_equals_eager_proposer(arch, kind, method, buckets, tree_graphs):
    """tree_graphs: the tree after catch-up grows in one function (draft/tree_graph.py) or row by row."""
    model, drafter = agreeing(arch, method)
    spec = SPECS[kind]
    eager = SpeculativeEngine(HFTarget(model), drafter, spec)
    static = SpeculativeEngine(HFTarget(model), drafter, spec)
    runner = enable_draft_graphs(static, max_len=96, buckets=buckets, tree_graphs=tree_graphs)
    assert isinstance(eager.proposer.runner, EagerRows) and static.proposer.runner is runner
    assert not runner.use_graphs  # CPU: the captured step runs eagerly, same code
    t_eager, t_static = record(eager), record(static)
    accepted, non_prefix = 0, 0
    for prompt in PROMPTS:
        a, b = eager.generate(prompt, 24), static.generate(prompt, 24)
        assert a.token_ids == b.token_ids == reference_greedy(model, prompt, 24)
        for r in b.rounds:
            rows = r.detail["rows"]
            accepted += r.accepted
            non_prefix += not torch.equal(rows, torch.arange(rows.numel()))  # a branch other than the first
        assert runner.length == static.proposer.committed  # tree rows discarded after each round
    assert len(t_eager) == len(t_static) > 4
    assert bool(runner.trees) == tree_graphs
    for ta, tb in zip(t_eager, t_static):
        same_tree(ta, tb)
    assert accepted > 0  # multi-row catch-ups after accepted drafts are exercised
    if kind != "chain":
        assert non_prefix > 0  # catch-up after a non-prefix accepted path rewrites the right slots


@pytest.mark.parametrize("tree_graphs", [False, True], ids=["per-step", "whole-tree"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_attention_spans_cross_boundaries(kind, tree_graphs):
    """span_step 4: the steps attend over the first span slots only (length + bucket rounded up to 4), so
    whole generations cross many span boundaries; every step must still see the committed rows and its
    own (a span from the live rows alone, or rounded down, drops them: other trees, another output)."""
    model, drafter = agreeing("llama", "eagle3")
    spec = SPECS[kind]
    eager = SpeculativeEngine(HFTarget(model), drafter, spec)
    static = SpeculativeEngine(HFTarget(model), drafter, spec)
    runner = enable_draft_graphs(static, max_len=96, buckets=(1, 2, 4, 8), tree_graphs=tree_graphs, span_step=4)
    same_runs(model, eager, static, PROMPTS)
    spans = {span for _, span in runner._graphs}
    assert len(spans) >= 4 and max(spans) < runner.size  # several spans, none the whole static KV
    assert all(span % 4 == 0 for span in spans)


def test_span_rounds_up_and_is_capped():
    model = tiny_target("llama", seed=1)
    drafter = tiny_drafter(model, seed=2)
    runner = StaticDraftRunner(drafter, max_len=100, buckets=(1, 4), span_step=8)
    assert runner.size == 128 and [runner.span(n) for n in (1, 8, 9, 121, 128)] == [8, 8, 16, 128, 128]
    assert StaticDraftRunner(drafter, max_len=1000).span(257) == 512  # default span_step 256, as the target
    assert StaticDraftRunner(drafter, max_len=100).span(3) == 192  # 256 > the static KV: all of it
    with pytest.raises(EagleSpecError, match="span_step"):
        StaticDraftRunner(drafter, max_len=16, span_step=0)


def test_random_drafter_dynamic_defaults():
    """Wide trees (top-k 10, budget 60: rows padded to 16) with a random drafter, several rounds."""
    model = tiny_target("llama", seed=12)
    drafter = tiny_drafter(model, seed=5)
    spec = TreeSpec("dynamic", depth=6, top_k=10, budget=60)
    eager, static = SpeculativeEngine(HFTarget(model), drafter, spec), SpeculativeEngine(HFTarget(model), drafter, spec)
    enable_draft_graphs(static, max_len=256)
    t_eager, t_static = record(eager), record(static)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert eager.generate(prompt, 12).token_ids == static.generate(prompt, 12).token_ids == \
        reference_greedy(model, prompt, 12)
    for ta, tb in zip(t_eager, t_static):
        same_tree(ta, tb)


def test_step_writes_slots_by_index():
    """Rows land at slots length..length+n-1; crop rewinds; padding rows never leak into live slots."""
    model = tiny_target("llama", seed=1)
    drafter = tiny_drafter(model, seed=2)
    runner = StaticDraftRunner(drafter, max_len=32, buckets=(4,))
    ref = EagerRows(drafter)
    h = drafter.cfg.hidden_size
    g = torch.Generator().manual_seed(0)
    for n, crop in ((5, 5), (3, 6), (2, 7)):  # 5 rows > the largest bucket: chunks of 4 + 1
        state = torch.randn(n, h, generator=g)
        tokens = torch.randint(3, 90, (n,), generator=g)
        positions = torch.arange(runner.length, runner.length + n)
        la, sa = ref.run(state, tokens, positions)
        lb, sb = runner.run(state, tokens, positions)
        torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sb, sa, rtol=1e-5, atol=1e-5)
        live = ref.length
        torch.testing.assert_close(runner.k[0][:, :, :live], ref.cache[0].k, rtol=1e-5, atol=1e-5)
        ref.crop(crop)
        runner.crop(crop)
        assert runner.length == ref.length == crop


def test_overflow_is_a_clear_error():
    model = tiny_target("llama", seed=2)
    engine = SpeculativeEngine(HFTarget(model), tiny_drafter(model, seed=1), SPECS["dynamic"])
    enable_draft_graphs(engine, max_len=20)
    with pytest.raises(EagleSpecError, match=r"max_len=20"):
        engine.generate([4, 5, 6, 7, 8, 9], 40)
    engine.proposer.reset()
    assert engine.generate([4, 5], 2).token_ids == reference_greedy(model, [4, 5], 2)  # usable again


def test_cuda_graphs_need_cuda():
    model = tiny_target("llama", seed=2)
    with pytest.raises(EagleSpecError, match="CUDA"):
        StaticDraftRunner(tiny_drafter(model), max_len=16, cuda_graphs=True)


def test_api_and_cli_default_to_graphs_only_with_the_fast_backend_on_cuda():
    """Default (None): on only where the target runs the fast backend on CUDA, so off here (CPU);
    EngineConfig(draft_graphs=True) / --draft-graphs switch the proposer's runner, --no-draft-graphs keeps it eager."""
    from eaglespec import EagleSpec
    from eaglespec.cli.main import build_parser
    from eaglespec.config import EngineConfig

    from conftest import BYTE_VOCAB, byte_tokenizer

    tok = byte_tokenizer()
    model = tiny_target(vocab=BYTE_VOCAB, seed=5)
    drafter = tiny_drafter(model)
    plain = EagleSpec(model, tok, drafter)
    assert isinstance(plain.engine.proposer.runner, EagerRows)
    es = EagleSpec(model, tok, drafter, TreeSpec("dynamic", depth=3, top_k=4, budget=10),
                   config=EngineConfig(draft_graphs=True))
    runner = es.engine.proposer.runner
    assert isinstance(runner, StaticDraftRunner) and runner.max_len == min(es.context_length, 8192) + 512
    assert es.generate("hi", 8, raw=True).token_ids == plain.generate("hi", 8, raw=True).token_ids
    for cmd in ("generate", "bench"):
        base = [cmd, "--prompt", "x"] if cmd == "generate" else [cmd]
        assert build_parser().parse_args(base).draft_graphs is None
        assert build_parser().parse_args([*base, "--draft-graphs"]).draft_graphs is True
        assert build_parser().parse_args([*base, "--no-draft-graphs"]).draft_graphs is False
