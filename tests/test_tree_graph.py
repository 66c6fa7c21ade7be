"""The whole-tree draft graph (draft/tree_graph.py) run eagerly on CPU: the same DraftTrees as the eager
Proposer over whole generations (greedy output identical to HF generate; sampled chains and static trees:
the same draws and recorded q for one seed), zero host syncs inside the growth (the CPU proxy for
CUDA-graph capturability), one function object correct for every committed length, sampled static trees'
children raced over the right noise rows and lossless through the engine, the fallback to the per-step
path when a capture fails, and the switches that keep the per-step path."""

from __future__ import annotations

import warnings
from dataclasses import fields, is_dataclass

import pytest
import torch

import eaglespec.tree.core as tree_mod
from _engines import enable_draft_graphs
from _hostcount import HostCounter
from _opcount import count_host_ops
from eaglespec.backends.hf import HFTarget
from eaglespec.draft.fast import StaticDraftRunner
from eaglespec.draft.proposer import EagerRows, Proposer
from eaglespec.draft.tree_graph import TreeGraph
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.sampling import SamplingConfig, SamplingParams, exponential_noise
from eaglespec.tree.core import TreeSpec, static_layout
from test_draft_static import agreeing, record, same_runs, same_tree
from test_sampling import first3_pvalue
from test_sampling_engine import _exact_first3, sharp_target  # noqa: F401 (fixture)
from test_sampling_static import SPEC as SAMPLED_SPEC
from test_sampling_static import _run as run_first3
from test_tree import force_split_topk

from conftest import reference_greedy, tiny_drafter, tiny_target

SPECS = {
    "chain": TreeSpec("chain", depth=5),
    "dynamic": TreeSpec("dynamic", depth=5, top_k=4, budget=12),
    "static": TreeSpec("static", depth=4),
}
PROMPTS = ([4, 8, 15, 16, 23, 42, 7], [11, 3, 9, 27, 5, 60, 13, 21, 8, 40, 33])
T07 = SamplingConfig(SamplingParams(temperature=0.7, top_p=0.9, top_k=20), seed=3)
T1 = SamplingConfig(SamplingParams(temperature=1.0), seed=4)


def count_grows(runner: StaticDraftRunner) -> list[int]:
    """Counts TreeGraph.grow calls of this runner's tree graphs (patched on the class for the test)."""
    calls: list[int] = []
    orig = TreeGraph.grow

    def grow(self):
        if self.runner is runner:
            calls.append(int(self.base))
        return orig(self)

    TreeGraph.grow = grow
    return calls


def pair(model, drafter, spec: TreeSpec, max_len: int = 128):
    """(eager engine, whole-tree engine, its runner, grow() bases, trees each proposed): recorders attached."""
    eager = SpeculativeEngine(HFTarget(model), drafter, spec)
    whole = SpeculativeEngine(HFTarget(model), drafter, spec)
    runner = enable_draft_graphs(whole, max_len=max_len)
    return eager, whole, runner, count_grows(runner), record(eager), record(whole)


def _tensors(out) -> list[torch.Tensor]:
    """The tensors of a captured call's outputs: tensors, tuples of them, DraftTrees."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    if is_dataclass(out):
        return [t for f in fields(out) for t in _tensors(getattr(out, f.name))]
    return []


class EagerGraph:
    """CPU stand-in for a captured CUDA graph: replay() reruns fn into the first call's output tensors."""

    def __init__(self, fn):
        self.fn, self.out = fn, fn()

    def replay(self):
        for o, n in zip(_tensors(self.out), _tensors(self.fn())):
            o.copy_(n)


@pytest.fixture
def restore_grow():
    orig = TreeGraph.grow
    yield
    TreeGraph.grow = orig


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_whole_tree_equals_eager_proposer(arch, kind, restore_grow):
    model, drafter = agreeing(arch, "eagle3")
    spec = SPECS[kind]
    eager, whole, runner, grows, t_eager, t_whole = pair(model, drafter, spec)
    accepted = 0
    for prompt in PROMPTS:
        a, b = eager.generate(prompt, 24), whole.generate(prompt, 24)
        assert a.token_ids == b.token_ids == reference_greedy(model, prompt, 24)
        accepted += sum(r.accepted for r in b.rounds)
        assert runner.length == whole.proposer.committed  # the tree rows never count as live
    assert len(t_eager) == len(t_whole) == len(grows) > 4  # every round grew through the tree graph
    assert len(set(grows)) > 4  # ... at many committed lengths
    assert list(runner.trees) == [(spec, None)]
    for ta, tb in zip(t_eager, t_whole):
        same_tree(ta, tb)
    assert accepted > 0


def test_wide_dynamic_random_drafter(restore_grow):
    """The benchmark's shape (top-k 10, budget 60, depth 8) with a random drafter: 70 tree rows."""
    model = tiny_target("llama", seed=12)
    drafter = tiny_drafter(model, seed=5)
    spec = TreeSpec("dynamic", depth=8, top_k=10, budget=60)
    eager, whole, _, grows, t_eager, t_whole = pair(model, drafter, spec, max_len=256)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert eager.generate(prompt, 12).token_ids == whole.generate(prompt, 12).token_ids == \
        reference_greedy(model, prompt, 12)
    assert len(grows) == len(t_whole) == len(t_eager)
    for ta, tb in zip(t_eager, t_whole):
        same_tree(ta, tb)


def same_sampled_tree(a, b) -> None:
    """same_tree, and the recorded q (verify.sample_accept's real-q scheme) equal too."""
    same_tree(a, b)
    assert (a.draft_probs is None) == (b.draft_probs is None)
    if a.draft_probs is not None:
        torch.testing.assert_close(a.draft_probs, b.draft_probs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cfg", [T07, T1], ids=["t0.7-topk-topp", "t1"])
def test_sampled_trees_use_the_graph(cfg, restore_grow):
    """At T>0 sampled chains race over noise drawn before the growth, and sampled static and dynamic trees draw
    their children without replacement by a race over noise drawn before the growth: whole-tree graph, the same
    trees (tokens, parents, q) and the same sampled tokens as the eager Proposer for the same seed, over whole
    generations at many committed lengths. At T=0.7 with top-p 0.9 / top-k 20 some static trees lose children
    outside q's support (pruned after the growth)."""
    model, drafter = agreeing("llama", "eagle3")
    full = len(static_layout(SPECS["static"].static_choices()).parents)
    for kind in ("dynamic", "chain", "static"):
        spec = SPECS[kind]
        eager, whole, runner, grows, t_eager, t_whole = pair(model, drafter, spec)
        for prompt in PROMPTS:
            a = eager.generate(prompt, 20, sampling=cfg)
            b = whole.generate(prompt, 20, sampling=cfg)
            assert a.token_ids == b.token_ids
        assert len(grows) == len(t_whole) and len(set(grows)) > 4
        assert list(runner.trees) == [(spec, cfg.draft_params)]
        assert len(t_eager) == len(t_whole) > 4
        assert all(t.draft_probs is not None for t in t_whole)
        for ta, tb in zip(t_eager, t_whole):
            same_sampled_tree(ta, tb)
        if kind == "static" and cfg is T07:
            assert any(t.size < full for t in t_whole)  # pruned: the keep mask ran through finish_tree
            assert any(t.size == full for t in t_whole)


def test_sampled_chain_replays_read_fresh_noise(monkeypatch):
    """CPU stand-in for CUDA-graph replays (span_step 4: several graphs): each replay reads the noise the
    proposer drew into TreeGraph.noise for that round (noise drawn anywhere else never reaches the graph:
    the trees would leave the eager Proposer's). test_growth_has_no_host_sync checks the growth draws nothing."""
    model, drafter = agreeing("llama", "eagle3")
    spec = SPECS["chain"]
    eager = SpeculativeEngine(HFTarget(model), drafter, spec)
    whole = SpeculativeEngine(HFTarget(model), drafter, spec)
    runner = enable_draft_graphs(whole, max_len=128, span_step=4)
    runner.use_graphs = True

    def capture(fn):
        g = EagerGraph(fn)
        return g, g.out

    monkeypatch.setattr(runner, "capture", capture)
    t_eager, t_whole = record(eager), record(whole)
    for seed, prompt in enumerate(PROMPTS):
        cfg = SamplingConfig(SamplingParams(temperature=1.0), seed=seed)
        assert eager.generate(prompt, 24, sampling=cfg).token_ids == whole.generate(prompt, 24, sampling=cfg).token_ids
    (graph,) = runner.trees.values()
    assert not graph.failed and len(graph.graphs) >= 3
    assert len(t_eager) == len(t_whole) > 4
    for ta, tb in zip(t_eager, t_whole):
        same_sampled_tree(ta, tb)
    assert len({tuple(t.tokens.tolist()) for t in t_whole}) > 4


def _rounds(model, drafter, lengths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(features, next tokens, root) per catch-up: rows committed..length-1 of one token sequence."""
    seq = torch.tensor([4, 8, 15, 16, 23, 42, 9, 31, 77, 5, 60, 13, 21, 8, 40, 33, 17, 50, 6, 29])
    feats = SpeculativeEngine(HFTarget(model), drafter, SPECS["chain"]).target.forward(seq).features  # wiring
    out, start = [], 0
    for end in lengths:
        out.append((feats[start:end], seq[start + 1: end + 1], int(seq[end])))
        start = end
    return out


CASES = [("chain", None), ("dynamic", None), ("static", None), ("chain", T07.draft_params),
         ("static", T07.draft_params), ("static", T1.draft_params)]


@pytest.mark.parametrize("kind,sampling", CASES, ids=["chain", "dynamic", "static", "chain-t0.7", "static-t0.7",
                                                       "static-t1"])
def test_one_graph_object_for_every_committed_length(kind, sampling):
    """A committed length baked in anywhere (a host int read at trace time, the proposer's or the runner's
    counters) would make the one function object wrong at the next length: the proposer's and the runner's
    host counters are poisoned while it runs, and every tree must still equal the eager Proposer's (a
    sampled chain or static tree: its noise drawn into the graph's buffer from a generator seeded like the
    eager one's)."""
    model, drafter = agreeing("llama", "eagle3")
    spec = SPECS[kind]
    eager = Proposer(drafter, spec)
    static = Proposer(drafter, spec, runner=StaticDraftRunner(drafter, max_len=64))
    for prop in (eager, static):
        prop.sampling, prop.generator = sampling, torch.Generator().manual_seed(5)
    graph = None
    for lengths in ([6, 9, 10, 14], [3, 4]):  # a second sequence after reset: bases 6, 9, 10, 3, 4
        eager.reset()
        static.reset()
        for feats, next_tokens, root in _rounds(model, drafter, lengths):
            ref = eager.propose(root, feats, next_tokens)
            logits, state = static.catch_up(feats, next_tokens)
            g = static._tree_graph(logits.shape[-1])
            graph = graph or g
            assert g is graph  # the same function object (one CUDA graph on the device)
            assert static.draft_noise(logits.shape[-1], g.noise) is g.noise  # None unless sampled
            committed = static.committed
            static.committed = static.runner.length = 10_000  # poisoned: nothing may read them now
            try:
                tree = g.run(root, logits, state, committed)
            finally:
                static.committed = static.runner.length = committed
            same_sampled_tree(ref, tree)


@pytest.mark.parametrize("sampling", [None, SamplingParams(0.7, top_k=20, min_p=0.05), SamplingParams(0.7, top_p=0.9)],
                         ids=["greedy", "t0.7-topk-minp", "t0.7-topp"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_growth_has_no_host_sync(kind, sampling):
    """The growth the CUDA graph captures: zero syncs (item, nonzero, bool masks, tolist) and zero
    host->device copies, with the draft processors for greedy dynamic trees and sampled chains, static and dynamic
    trees (their noise is drawn before the growth; a tree's pruning is after it, in finish_tree). (top-p's `drop[..., -1] = False` lifts a CPU scalar on CPU, counted as a
    copy; on CUDA that scalar is made on the device by a fill.)"""
    model, drafter = agreeing("llama", "eagle3")
    prop = Proposer(drafter, SPECS[kind], runner=StaticDraftRunner(drafter, max_len=64))
    prop.sampling, prop.generator = sampling, torch.Generator().manual_seed(0)
    (feats, next_tokens, root), = _rounds(model, drafter, [8])
    logits, state = prop.catch_up(feats, next_tokens)
    graph = prop._tree_graph(logits.shape[-1])
    prop.draft_noise(logits.shape[-1], graph.noise)
    graph.run(root, logits, state, prop.committed)  # stages the inputs (and builds a static plan once)
    rng = prop.generator.get_state()
    with HostCounter() as c:
        tree, flags, keep, _ = graph.grow()
    assert c.syncs == 0, c.names
    assert torch.equal(prop.generator.get_state(), rng)  # nothing drawn inside: a CUDA graph can replay it
    if sampling is None or sampling.top_p == 1:
        assert c.h2d == 0
    assert c.ops > 50  # the counter saw the growth
    assert tree.size > 1 and (flags is not None) == (kind == "dynamic")
    drawn = sampling is not None  # sampled chains and static and dynamic trees race over noise
    assert (graph.noise is not None) == drawn == (tree.draft_probs is not None)
    assert (keep is not None) == (drawn and kind != "chain")


@pytest.mark.parametrize("broken", [False, True], ids=["race", "negative-control-argmax"])
def test_sampled_chain_first_draft_is_q_distributed(broken, monkeypatch):
    """The chain's draw through the whole-tree graph: x_1 ~ q_1 (chi-square over 3000 rounds, fresh noise
    drawn into TreeGraph.noise each round), and q_1 recorded in draft_probs. Negative control: argmax q
    instead of the race must fail."""
    import eaglespec.draft.proposer as proposer_mod
    from test_sampling import V, first3_pvalue

    if broken:
        monkeypatch.setattr(proposer_mod, "race_argmax", lambda probs, noise: probs.argmax(-1))
    model = tiny_target("llama", seed=12)
    drafter = tiny_drafter(model, seed=5)  # random: a spread q
    prop = Proposer(drafter, TreeSpec("chain", depth=1), runner=StaticDraftRunner(drafter, max_len=32))
    prop.sampling, prop.generator = SamplingParams(temperature=1.0, top_k=12), torch.Generator().manual_seed(9)
    (feats, next_tokens, root), = _rounds(model, drafter, [8])
    logits, state = prop.catch_up(feats, next_tokens)
    q = prop.to_target_probs(prop.draft_dist(logits))  # [V]
    graph, n = prop._tree_graph(logits.shape[-1]), 3000
    draws = []
    for _ in range(n):
        prop.draft_noise(logits.shape[-1], graph.noise)
        tree = graph.run(root, logits, state, prop.committed)
        draws.append(int(tree.tokens[1]))
    torch.testing.assert_close(tree.draft_probs[0], q)
    # first3_pvalue codes (y1, y2, y3) as y1 V^2 + y2 V + y3: (0, 0, y) is cell y of a flat table
    flat = torch.zeros(V**3, dtype=torch.float64)
    flat[: q.numel()] = q.double()
    emitted = torch.stack([torch.zeros(n, dtype=torch.long)] * 2 + [torch.tensor(draws)], dim=1)
    p, impossible = first3_pvalue(emitted, flat)
    if broken:
        assert p < 1e-3
    else:
        assert impossible == 0 and p > 1e-3, p


def check_races(prop: Proposer, tree, noise: torch.Tensor) -> None:
    """An unpruned sampled static tree's children, node by node: the exponential race over the recorded q
    (draft vocab) and the node's own noise row (row 0: the root; row j: the j-th expanded node in node order
    = tree row j - 1), in draw order = node order."""
    vd = noise.shape[1]
    ids = prop.drafter.to_target_ids(torch.arange(vd))  # [Vd] draft id -> target id
    parents = tree.parents.tolist()
    expanded = sorted(set(parents[1:]))  # node order: the root first
    assert len(expanded) == noise.shape[0]
    for j, u in enumerate(expanded):
        kids = (tree.parents == u).nonzero()[:, 0]
        q = tree.draft_probs[u][ids]  # [Vd]
        race = (q / noise[j]).topk(kids.numel()).indices
        assert torch.equal(ids[race], tree.tokens[kids]), f"node {u}: children not raced over noise row {j}"


@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.7, top_k=20)], ids=["t1", "t0.7-topk"])
def test_sampled_static_children_race_their_noise_rows(sampling):
    """Each expanded node's children are the race top-c over ITS noise row (the eager Proposer's noise
    rebuilt from its generator state, the graph's read from TreeGraph.noise), and the graph tree equals the
    eager one. Negative controls: the graph's noise rows shifted by one (misassigned) or drawn from another
    seed give other trees, and the shifted rows fail check_races."""
    model, drafter = agreeing("llama", "eagle3")
    spec = SPECS["static"]
    eager = Proposer(drafter, spec)
    graphed = Proposer(drafter, spec, runner=StaticDraftRunner(drafter, max_len=64))
    for prop in (eager, graphed):
        prop.sampling, prop.generator = sampling, torch.Generator().manual_seed(11)
    other_seed, shifted = 0, 0
    for feats, next_tokens, root in _rounds(model, drafter, [6, 9, 12, 15]):
        rng = eager.generator.get_state()
        ref = eager.propose(root, feats, next_tokens)
        logits, state = graphed.catch_up(feats, next_tokens)
        g = graphed._tree_graph(logits.shape[-1])
        assert g.noise is not None and g.noise.shape == (1 + g.rows, logits.shape[-1])
        graphed.draft_noise(logits.shape[-1], g.noise)
        assert torch.equal(g.noise, exponential_noise(torch.empty_like(g.noise),
                                                      torch.Generator().set_state(rng)))  # one generator call
        tree = g.run(root, logits, state, graphed.committed)
        same_sampled_tree(ref, tree)
        check_races(graphed, ref, g.noise)
        check_races(graphed, tree, g.noise)
        noise = g.noise.clone()
        g.noise.copy_(noise.roll(1, 0))  # misassigned rows
        bad = g.run(root, logits, state, graphed.committed)
        shifted += not torch.equal(bad.tokens, ref.tokens)
        with pytest.raises(AssertionError, match="not raced"):
            check_races(graphed, bad, noise)
        exponential_noise(g.noise, torch.Generator().manual_seed(99))
        other_seed += not torch.equal(g.run(root, logits, state, graphed.committed).tokens, ref.tokens)
    assert shifted == other_seed == 4


@pytest.mark.soak
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9)],
                         ids=["T1", "T0.7-top_p0.9"])
def test_sampled_static_graph_engine_is_lossless(sharp_target, params, restore_grow, monkeypatch):  # noqa: F811
    """tests/test_sampling_static.py's first-3-token check with the whole-tree graph on (CPU: its growth run
    eagerly): every round grows through TreeGraph, the output follows the target's processed distribution
    (recursive rejection sampling over the graph's recorded q), children dropped outside q's support at
    top-p 0.9. Negative control: noise drawn once and never redrawn (stale graph input) is rejected."""
    drafter = tiny_drafter(sharp_target, seed=1)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(8.0)  # as test_sampling_static: peaked q, unlike p

    def run(runs: int) -> tuple[torch.Tensor, int, int, int]:
        engine = SpeculativeEngine(HFTarget(sharp_target), drafter, SAMPLED_SPEC)
        grows = count_grows(enable_draft_graphs(engine, max_len=64))
        emitted, accepted, pruned = run_first3(engine, params, runs)
        return emitted, accepted, pruned, len(grows)

    emitted, accepted, pruned, grows = run(1200)
    assert grows >= 1200 and accepted > 120
    if params.top_p < 1:
        assert pruned > 0
    exact = _exact_first3(sharp_target, params)
    p, impossible = first3_pvalue(emitted, exact)
    assert impossible == 0 and p > 1e-3, f"graph-drafted output is not the target's distribution (p = {p:.2e})"
    if params.top_p < 1:
        return
    drawn = []
    orig = Proposer.draft_noise

    def stale(self, draft_vocab, out=None):
        if out is not None and drawn:
            return out  # the graph replays over last round's noise
        drawn.append(1)
        return orig(self, draft_vocab, out)

    monkeypatch.setattr(Proposer, "draft_noise", stale)
    emitted, *_ = run(1000)
    p, _ = first3_pvalue(emitted, exact)
    assert p < 1e-3, f"the check misses stale draft noise (p = {p:.2e})"


def test_capture_failure_warns_once_and_falls_back(monkeypatch):
    """A whole-tree capture that raises: one warning, then the per-step path for that tree (output exact)."""
    model, drafter = agreeing("llama", "eagle3")
    engine = SpeculativeEngine(HFTarget(model), drafter, SPECS["dynamic"])
    runner = enable_draft_graphs(engine, max_len=128)
    runner.use_graphs = True  # CPU stand-in: per-step "graphs" replay eagerly, the tree capture raises

    def capture(fn):
        if getattr(fn, "__self__", None).__class__ is TreeGraph:
            raise RuntimeError("operation not permitted when stream is capturing\nsecond line")
        g = EagerGraph(fn)
        return g, g.out

    monkeypatch.setattr(runner, "capture", capture)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = engine.generate(PROMPTS[0], 24)
    assert out.token_ids == reference_greedy(model, PROMPTS[0], 24)
    assert len(out.rounds) > 2
    assert [str(w.message).count("\n") for w in caught] == [0]  # once, one line
    assert "capture failed (RuntimeError: operation not permitted" in str(caught[0].message)
    assert all(g.failed for g in runner.trees.values())


@pytest.mark.parametrize("kind", list(SPECS))
def test_one_tree_graph_per_span(kind, monkeypatch):
    """span_step 4: every tree attends over committed + its rows rounded up to 4 slots, one "captured" graph
    per span (CPU stand-in: replay reruns the growth); whole generations cross many span boundaries with
    the same trees as the eager Proposer (a span from the committed length alone, or rounded down, hides
    tree rows from the rows below them)."""
    model, drafter = agreeing("llama", "eagle3")
    spec = SPECS[kind]
    eager = SpeculativeEngine(HFTarget(model), drafter, spec)
    whole = SpeculativeEngine(HFTarget(model), drafter, spec)
    runner = enable_draft_graphs(whole, max_len=128, span_step=4)
    runner.use_graphs = True
    captured: list[str] = []

    def capture(fn):
        captured.append(type(getattr(fn, "__self__", None)).__name__)
        g = EagerGraph(fn)
        return g, g.out

    monkeypatch.setattr(runner, "capture", capture)
    same_runs(model, eager, whole, PROMPTS)
    (graph,) = runner.trees.values()
    spans = sorted(graph.graphs)
    assert not graph.failed and len(spans) >= 4 and spans[-1] < runner.size
    assert all(span % 4 == 0 for span in spans)
    assert captured.count("TreeGraph") == len(spans)  # captured once per span, replayed after


def test_tree_graphs_off_keeps_the_per_step_path(restore_grow):
    model, drafter = agreeing("llama", "eagle3")
    engine = SpeculativeEngine(HFTarget(model), drafter, SPECS["dynamic"])
    runner = enable_draft_graphs(engine, max_len=128, tree_graphs=False)
    grows = count_grows(runner)
    assert engine.generate(PROMPTS[0], 16).token_ids == reference_greedy(model, PROMPTS[0], 16)
    assert not grows and not runner.trees
    eager = SpeculativeEngine(HFTarget(model), drafter, SPECS["dynamic"])
    assert isinstance(eager.proposer.runner, EagerRows) and eager.generate(PROMPTS[0], 4).token_ids


def test_overflow_is_checked_before_the_tree_rows():
    """The whole tree's rows are checked against max_len before anything is written (no OOB index on CUDA)."""
    model, drafter = agreeing("llama", "eagle3")
    prop = Proposer(drafter, SPECS["dynamic"], runner=StaticDraftRunner(drafter, max_len=20))
    (feats, next_tokens, root), = _rounds(model, drafter, [8])  # 8 rows + (5-1)*4 tree rows > 20
    with pytest.raises(Exception, match=r"needs 24 KV rows .*max_len=20"):
        prop.propose(root, feats, next_tokens)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_two_stage_topk_keeps_the_trees(kind, monkeypatch, restore_grow):
    """tree.draft_topk's two stages (CUDA's path, forced on CPU: chunks of 8 of the 96 draft ids) in the
    dynamic growth and the greedy static tree: the eager Proposer and the whole-tree graph build the same
    trees as plain torch.topk does (distinct fp32 probabilities: no tie to order differently), and the
    greedy output stays HF generate's."""
    import eaglespec.draft.proposer as proposer_mod

    model, drafter = agreeing("llama", "eagle3")
    spec = SPECS[kind]
    plain = SpeculativeEngine(HFTarget(model), drafter, spec)
    t_plain = record(plain)
    for prompt in PROMPTS:
        plain.generate(prompt, 20)
    force_split_topk(monkeypatch)
    split_calls = []

    def spy(x, k):
        split_calls.append(tree_mod._topk_chunks(x.shape[-1], k, tree_mod.TOPK_CHUNK) > 1)
        return tree_mod.draft_topk(x, k)

    monkeypatch.setattr(proposer_mod, "draft_topk", spy)
    eager, whole, _, grows, t_eager, t_whole = pair(model, drafter, spec)
    for prompt in PROMPTS:
        assert eager.generate(prompt, 20).token_ids == whole.generate(prompt, 20).token_ids == \
            reference_greedy(model, prompt, 20)
    assert split_calls and all(split_calls) and len(grows) == len(t_whole) > 4
    assert len(t_plain) == len(t_eager) == len(t_whole)
    for ta, tb, tc in zip(t_plain, t_eager, t_whole):
        same_tree(ta, tb)
        same_tree(ta, tc)


def _growth_host_ops(model, drafter, spec: TreeSpec) -> int:
    """Non-view aten ops outside the drafter's forward in one whole-tree growth."""
    prop = Proposer(drafter, spec, runner=StaticDraftRunner(drafter, max_len=96))
    (feats, next_tokens, root), = _rounds(model, drafter, [8])
    logits, state = prop.catch_up(feats, next_tokens)
    graph = prop._tree_graph(logits.shape[-1])
    graph.run(root, logits, state, prop.committed)  # stages the inputs
    _, c = count_host_ops(drafter, graph.grow)
    return sum(c.kernels.values())


def test_dynamic_growth_ops_per_depth():
    """Each CUDA-graph node has a fixed cost whatever it does: one more depth of a dynamic tree adds a fixed
    handful of non-view ops outside the drafter (softmax, top-k, sort, log values, candidate ids, parents,
    depths, parent states, mask rows, tokens: 16 kernels and an _unsafe_view), no cat of the growing candidate
    lists (joined once) and no mask gathers (no per-depth cats, [n, span] masks rebuilt from the [R, R] rows or
    slots by arange)."""
    model, drafter = agreeing("llama", "eagle3")
    ops = [_growth_host_ops(model, drafter, TreeSpec("dynamic", depth=d, top_k=4, budget=12)) for d in (4, 6)]
    assert (ops[1] - ops[0]) / 2 <= 18, ops
