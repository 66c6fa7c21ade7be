"""Batched rounds (engine/batch.py, backends/hf_batch.py, backends/fast_batch.py): every row emits exactly what it
emits alone.

Greedy rows equal HF generate (fp32) with mixed prompt lengths, chunked prefills, requests joining and leaving
mid-run and one cancelled; sampled rows draw the same tokens alone, batched, and in the one-sequence engine.
"""

from __future__ import annotations

import pytest
import torch

from _agree import fit_drafter, greedy_sequences
from eaglespec.backends.fast_batch import FastBatchTarget
from eaglespec.backends.hf import HFTarget
from eaglespec.backends.hf_batch import HFBatchTarget, Prefilled
from eaglespec.draft.batch import BatchDrafts
from eaglespec.draft.fused import FusedBatchEagle3Step
from eaglespec.draft.proposer import Proposer
from eaglespec.engine.batch import BatchEngine, BatchRequest
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.engine.plan import DepthPlan
from eaglespec.errors import EagleSpecError
from eaglespec.rows import compaction, move_rows
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.tree.core import DraftTree, FlatTree, TreeSpec, chain_tree, flatten, stack_flat
from eaglespec.verify import greedy_accept, greedy_accept_rows, greedy_chain_walk, read_chains

from conftest import reference_greedy, tiny_drafter, tiny_target

pytestmark = pytest.mark.xdist_group("batch_engine")  # one worker builds the fitted drafter once

TREES = {
    "chain": TreeSpec("chain", depth=4),
    "dynamic": TreeSpec("dynamic", depth=5, top_k=4, budget=16),
    "static": TreeSpec("static"),
}

# the batched targets: the model's own forward, and the fused layers attending over spans of 16 slots (so that a
# forward reads fewer slots than the buffers hold), and the same through the Triton kernels (the interpreter on CPU:
# the leak test only)
TARGETS = {"hf": HFBatchTarget, "fast": lambda model, *a, **kw: FastBatchTarget(model, *a, span_step=16, **kw),
           "fast-kernels": lambda model, *a: FastBatchTarget(model, *a, span_step=16, kernels=True)}
ENGINE_TARGETS = ["fast", "hf"]


@pytest.fixture(scope="module")
def fitted():
    """A tiny llama target and a drafter that agrees with it often (long accepted paths, ragged trees)."""
    model = tiny_target("llama", seed=0)
    drafter = fit_drafter(model, tiny_drafter(model, seed=1), steps=60, n_seqs=8, length=32)
    return model, drafter


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Prompts of lengths 3..n+2 from the target's own continuations (the drafter's training data)."""
    model = tiny_target("llama", seed=0)
    return [s[: 3 + i].tolist() for i, s in enumerate(greedy_sequences(model, n, 3 + n, seed=seed))]


@pytest.mark.parametrize("backend", ENGINE_TARGETS)
@pytest.mark.parametrize("tree", sorted(TREES))
def test_greedy_rows_equal_generate(fitted, tree, backend):
    model, drafter = fitted
    engine = BatchEngine(TARGETS[backend](model), drafter, TREES[tree], max_batch=4, prefill_chunk=4)
    prompts = _prompts(6)
    lengths = [16 + 3 * i for i in range(6)]  # rows leave at different rounds; the queue joins as they do
    results = engine.generate([BatchRequest(p, n) for p, n in zip(prompts, lengths)])
    for p, n, r in zip(prompts, lengths, results):
        assert r.token_ids == reference_greedy(model, p, n)
    assert max(r.tau for r in results) > 1.5  # real accepted paths, not only bonus tokens
    assert engine.idle and engine.target.batch == 0


@pytest.mark.parametrize("backend", ENGINE_TARGETS)
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_greedy_rows_equal_generate_other_archs(arch, backend):
    model = tiny_target(arch, seed=3)
    engine = BatchEngine(TARGETS[backend](model), tiny_drafter(model, seed=1), TREES["dynamic"], max_batch=3)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (int(torch.randint(1, 14, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(4)]
    results = engine.generate([BatchRequest(p, 12) for p in prompts])
    assert [r.token_ids for r in results] == [reference_greedy(model, p, 12) for p in prompts]


@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_join_mid_run_and_cancel(fitted, tree):
    """Requests join mid-run (chunked prefills) and one is cancelled: its row is freed at once, and every other row,
    greedy or sampled, emits what it emits alone."""
    model, drafter = fitted
    spec = TREES[tree]
    engine = BatchEngine(HFBatchTarget(model), drafter, spec, max_batch=4, prefill_chunk=3)
    prompts = _prompts(5)
    sampled = SamplingConfig(SamplingParams(temperature=0.8), seed=4)
    first = [engine.submit(BatchRequest(p, 24, sampling=sampled if i == 2 else None)) for i, p in enumerate(prompts[:3])]
    for _ in range(3):
        engine.step()
    later = [engine.submit(BatchRequest(p, 20)) for p in prompts[3:]]
    engine.step()
    victim = first[1]
    engine.cancel(victim)
    rows_before = engine.target.batch
    engine.step()
    assert victim.done and victim.result.finish_reason == "cancelled"
    assert engine.target.batch <= rows_before  # its row was freed (and no other row lost)
    while not engine.idle:
        engine.step()
    for r in first[:2] + later:
        if r is not victim:
            assert r.result.token_ids == reference_greedy(model, r.prompt_ids, r.max_new_tokens)
    assert victim.result.token_ids == reference_greedy(model, victim.prompt_ids, 24)[: len(victim.result.token_ids)]
    alone = SpeculativeEngine(HFTarget(model), drafter, spec).generate(prompts[2], 24, sampling=sampled)
    assert first[2].result.token_ids == alone.token_ids


def test_a_prompt_within_a_chunk_waits_to_join_whole(fitted):
    """While rows decode, a prompt longer than what is left of the step's prefill budget but within prefill_chunk
    joins whole at the next step (never split across steps); one longer than prefill_chunk goes chunk by chunk."""
    model, drafter = fitted
    engine = BatchEngine(TARGETS["fast"](model), drafter, TREES["chain"], max_batch=4, prefill_chunk=6)
    split = []  # the chunks of prompts split across steps (whole prompts join through join_prompts)
    prefill = engine.target.prefill
    engine.target.prefill = lambda state, chunk: split.append((id(state), chunk.numel())) or prefill(state, chunk)
    prompts = [*_prompts(3, seed=1), _prompts(7, seed=2)[-1]]  # 3, 4 and 5 tokens, then 9
    first = engine.submit(BatchRequest(prompts[0], 20))
    engine.step()  # first decodes from here on
    reqs = [engine.submit(BatchRequest(p, 12)) for p in prompts[1:]]
    engine.step()
    assert reqs[0] in engine.live and reqs[1] not in engine.live  # 4 of 6 tokens taken: the 5 wait
    engine.step()
    assert reqs[1] in engine.live
    while not engine.idle:
        engine.step()
    assert len({state for state, _ in split}) == 1  # only the 9-token prompt, longer than a chunk, was split
    assert sum(n for _, n in split) == 9 and len(split) > 1
    for r in [first, *reqs]:
        assert r.result.token_ids == reference_greedy(model, r.prompt_ids, r.max_new_tokens)


def test_token_bound_limits_the_live_batch(fitted):
    model, drafter = fitted
    prompts = _prompts(4)  # 3..6 tokens, 10 new each: two fit in 32, three do not
    engine = BatchEngine(HFBatchTarget(model), drafter, TREES["chain"], max_batch=4, max_tokens=32)
    reqs = [engine.submit(BatchRequest(p, 10)) for p in prompts]
    most = 0
    while not engine.idle:
        engine.step()
        most = max(most, len(engine.live))
    assert most == 2
    assert [r.result.token_ids for r in reqs] == [reference_greedy(model, p, 10) for p in prompts]


def _held_bytes(engine: BatchEngine) -> int:
    """Bytes the target's and the batched drafts' KV buffers hold now (the staging row's too)."""
    t = engine.target
    buffers = [t._kv] if t._kv is not None else [*t.keys, *t.values]
    buffers += [*getattr(t, "_stage_k", []), *getattr(t, "_stage_v", [])]
    if engine.drafts is not None:
        buffers += [*engine.drafts.k, *engine.drafts.v]
    return sum(x.numel() * x.element_size() for x in buffers)


@pytest.mark.parametrize("backend", ENGINE_TARGETS)
def test_kv_budget_bounds_the_buffers(fitted, backend):
    """With a KV budget, a request joins only while the buffers its row makes them grow to fit (the longest row
    sizes every row's slots): the held bytes never pass the budget, the rest queue, and every output is exact. A
    request that can never fit is refused at submit, in one line naming both sizes."""
    model, drafter = fitted
    spec = TREES["chain"]
    prompts = _prompts(6)
    lengths = [12 + 4 * i for i in range(6)]
    probe = BatchEngine(TARGETS[backend](model), drafter, spec, max_batch=6)
    reqs = [BatchRequest(p, n) for p, n in zip(prompts, lengths)]
    budget = probe.kv_bytes(reqs[:3])  # room for three rows of the longest request's slots, grown from nothing
    engine = BatchEngine(TARGETS[backend](model), drafter, spec, max_batch=6, kv_budget=budget)
    for r in reqs:
        engine.submit(r)
    most = 0
    while not engine.idle:
        engine.step()
        most = max(most, len(engine.live))
        assert _held_bytes(engine) <= budget
    assert 1 < most < 6  # the budget, not max_batch, bounded the batch
    for p, n, r in zip(prompts, lengths, reqs):
        assert r.result.token_ids == reference_greedy(model, p, n)
    with pytest.raises(EagleSpecError, match=r"needs [\d.]+ MiB of KV, more than the [\d.]+ MiB"):
        BatchEngine(TARGETS[backend](model), drafter, spec, kv_budget=budget // 8).submit(BatchRequest(prompts[0], 64))


def test_eos_and_length_edges(fitted):
    model, drafter = fitted
    prompts = _prompts(3)
    free = reference_greedy(model, prompts[0], 20)
    eos = free[5]
    engine = BatchEngine(HFBatchTarget(model), drafter, TREES["chain"], max_batch=3)
    reqs = [BatchRequest(prompts[0], 20, eos_token_ids=[eos]), BatchRequest(prompts[1], 1),
            BatchRequest(prompts[2], 0)]
    out = engine.generate(reqs)
    assert out[0].token_ids == reference_greedy(model, prompts[0], 20, eos=eos) and out[0].finish_reason == "stop"
    assert out[1].token_ids == reference_greedy(model, prompts[1], 1) and out[1].finish_reason == "length"
    assert out[2].token_ids == []
    with pytest.raises(ValueError, match="empty"):
        BatchRequest([], 4)
    with pytest.raises(ValueError, match="max_batch"):
        BatchEngine(HFBatchTarget(model), drafter, max_batch=0)


def test_no_speculation_above_the_batch_limit(fitted):
    model, drafter = fitted
    prompts = _prompts(4)
    engine = BatchEngine(HFBatchTarget(model), drafter, TREES["dynamic"], max_batch=4, speculate_up_to=2)
    results = engine.generate([BatchRequest(p, 8 + 4 * i) for i, p in enumerate(prompts)])
    for i, (p, r) in enumerate(zip(prompts, results)):
        assert r.token_ids == reference_greedy(model, p, 8 + 4 * i)
    # four rows: plain steps; once two have left, the rest draft (catching up on the plain steps' rows)
    drafted = [[rnd.drafted for rnd in r.rounds] for r in results]
    assert all(d[0] == 0 for d in drafted) and any(x > 0 for x in drafted[-1])


class Cycle(DepthPlan):
    """A plan that walks given depths in a fixed order, round by round (to force every depth in tests)."""

    def __init__(self, order: tuple[int, ...], depths: int):
        super().__init__({8: dict.fromkeys(range(depths), 1.0)}, [1.0] * depths)
        self.order, self.i, self.recorded = order, 0, []

    def depth(self, batch: int) -> int:
        return self.order[self.i % len(self.order)]

    def record(self, depth: int, accepted, chain: bool) -> None:
        assert depth == self.depth(0)
        self.recorded.append((depth, chain))
        self.i += 1


@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_planned_depths_stay_exact(fitted, tree):
    """A plan may take plain steps, chains of every depth 1..k (batched chains) or drafted trees, in any order;
    every row is still exact, and each round drafted what the plan chose."""
    model, drafter = fitted
    order = (4, 0, 2, 1, 0, 0, 3, 4, 1) if tree == "chain" else (1, 0, 1, 0, 0, 1)
    prompts = _prompts(3)
    engine = BatchEngine(HFBatchTarget(model), drafter, TREES[tree], max_batch=3, adaptive=True)
    engine.plan = Cycle(order, 5 if tree == "chain" else 2)
    results = engine.generate([BatchRequest(p, 30) for p in prompts])
    for p, r in zip(prompts, results):
        assert r.token_ids == reference_greedy(model, p, 30)
    assert {chain for _, chain in engine.plan.recorded} == {tree == "chain"}
    if tree == "chain":  # the three rows ran together for the first rounds: a chain of the plan's depth each
        drafted = [rnd.drafted for rnd in results[0].rounds]
        assert drafted[: len(order)] == list(order)


@pytest.mark.parametrize("tree", ["chain", "static"])
def test_calibrate_times_every_bucket_and_depth(fitted, tree):
    """calibrate times each batch size at each depth, leaves the engine idle, and the planned rounds that follow stay
    exact."""
    model, drafter = fitted
    engine = BatchEngine(FastBatchTarget(model, span_step=16), drafter, TREES[tree], max_batch=3, adaptive=True)
    plan = engine.calibrate(steps=1, prompt_len=8)
    depths = set(range(5)) if tree == "chain" else {0, 1}
    assert set(plan.seconds) == {1, 2, 3} and all(set(row) == depths for row in plan.seconds.values())
    assert engine.idle and engine.target.batch == 0 and engine.plan is plan
    prompts = _prompts(3)
    for p, r in zip(prompts, engine.generate([BatchRequest(p, 20) for p in prompts])):
        assert r.token_ids == reference_greedy(model, p, 20)
    assert sum(plan._rows) > 0  # the rounds' outcomes reached the plan


def test_calibrate_needs_an_idle_engine_with_a_drafter(fitted):
    model, drafter = fitted
    with pytest.raises(EagleSpecError, match="needs a drafter"):
        BatchEngine(HFBatchTarget(model), None, TREES["chain"]).calibrate()
    engine = BatchEngine(HFBatchTarget(model), drafter, TREES["chain"])
    engine.submit(BatchRequest([1, 2, 3], 4))
    with pytest.raises(EagleSpecError, match="idle"):
        engine.calibrate()


def test_default_plan_decides_greedy_batches_only(fitted):
    """EngineConfig's default (adaptive None) plans a greedy batch, never a round with a sampled row, whose draws
    would then depend on its companions: that row's tokens stay those it samples alone."""
    from eaglespec.config import EngineConfig
    from eaglespec.engine.build import build_batch_engine, build_engine

    model, drafter = fitted
    built = build_batch_engine(model, drafter, TREES["chain"], EngineConfig(max_batch=2))
    assert built.adaptive is None and set(built.plan.seconds) == {1, 2}
    assert build_batch_engine(model, drafter, TREES["chain"], EngineConfig(adaptive=False)).plan is None
    assert build_engine(HFTarget(model), drafter, TREES["chain"], EngineConfig()).adaptive is False
    prompts = _prompts(3)
    greedy = BatchEngine(HFBatchTarget(model), drafter, TREES["chain"], max_batch=3, adaptive=None)
    greedy.plan = Cycle((4,), 5)
    greedy.generate([BatchRequest(p, 12) for p in prompts])
    assert greedy.plan.recorded
    sampled = SamplingConfig(SamplingParams(temperature=0.8), seed=5)
    mixed = BatchEngine(HFBatchTarget(model), drafter, TREES["chain"], max_batch=3, adaptive=None)
    mixed.plan = Cycle((2,), 5)
    results = mixed.generate([BatchRequest(p, 12, sampling=sampled if i == 1 else None) for i, p in enumerate(prompts)])
    alone = BatchEngine(HFBatchTarget(model), drafter, TREES["chain"], max_batch=1).generate(
        [BatchRequest(prompts[1], 12, sampling=sampled)])[0]
    assert results[1].token_ids == alone.token_ids
    assert len(mixed.plan.recorded) < len(results[0].rounds)  # rounds with the sampled row were not planned


@pytest.mark.parametrize("backend", ENGINE_TARGETS)
@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_sampled_rows_do_not_depend_on_companions(fitted, tree, backend):
    model, drafter = fitted
    spec = TREES[tree]
    prompts = _prompts(4)

    def cfg(i):
        return SamplingConfig(SamplingParams(temperature=0.8, top_p=0.9), seed=100 + i)

    batched = BatchEngine(TARGETS[backend](model), drafter, spec, max_batch=4).generate(
        [BatchRequest(p, 16, sampling=cfg(i)) for i, p in enumerate(prompts)])
    single = SpeculativeEngine(HFTarget(model), drafter, spec)
    for i, (p, r) in enumerate(zip(prompts, batched)):
        alone = BatchEngine(TARGETS[backend](model), drafter, spec, max_batch=1).generate(
            [BatchRequest(p, 16, sampling=cfg(i))])[0]
        assert r.token_ids == alone.token_ids == single.generate(p, 16, sampling=cfg(i)).token_ids


@pytest.mark.parametrize("tree", ["static", "dynamic"])
def test_pooled_row_runners_draft_as_eager_rows(fitted, tree):
    """Rows with their own proposer (sampled rows of a static tree; every row of a dynamic tree) draft on static row
    runners lent by
    the engine's pool: each row's tokens equal its tokens on eager rows; a finished row's runner goes back to the
    pool and a later request reuses it (never more runners than live rows); a request too long for a runner's KV
    runs eager rows."""
    from eaglespec.config import EngineConfig
    from eaglespec.draft.fast import StaticDraftRunner
    from eaglespec.engine.build import build_batch_engine

    model, drafter = fitted
    spec = TREES[tree]
    made: list[StaticDraftRunner] = []

    def runner(d):
        made.append(StaticDraftRunner(d, max_len=96, span_step=16))
        return made[-1]

    def requests():
        return [BatchRequest(p, 12 + 3 * i, sampling=SamplingConfig(SamplingParams(temperature=0.8), seed=i)
                             if i % 2 else None) for i, p in enumerate(_prompts(6))]

    pooled = BatchEngine(FastBatchTarget(model, span_step=16), drafter, spec, max_batch=3, draft_runner=runner)
    results = pooled.generate(requests())
    eager = BatchEngine(FastBatchTarget(model, span_step=16), drafter, spec, max_batch=3).generate(requests())
    assert [r.token_ids for r in results] == [r.token_ids for r in eager]
    own = 3 if tree == "static" else 6  # the requests with their own proposer
    assert 1 <= len(made) <= min(own, 3) and len(pooled._idle_runners) == len(made)
    assert max(r.tau for r in results) > 1.5

    long = pooled.submit(BatchRequest(_prompts(1)[0], 95, sampling=SamplingConfig(SamplingParams(temperature=0.8))))
    pooled.step()
    assert long.runner is None and not isinstance(long.proposer.runner, StaticDraftRunner)
    pooled.abort()
    assert build_batch_engine(model, drafter, spec, EngineConfig(adaptive=False, draft_graphs=True)).draft_runner
    assert build_batch_engine(model, drafter, spec, EngineConfig(adaptive=False)).draft_runner is None


@pytest.mark.parametrize("tree", ["chain", "static"])
def test_chained_rows_accept_what_they_accept_alone(fitted, tree):
    """Greedy rows of one chain or static shape draft in one drafter call per step (a chain takes the [B, k+1]
    round): each row's drafter is fed each verified token once (its drafter rows never run ahead of its tokens),
    and its drafts are accepted round by round as the one-sequence engine's are (a row that saw another row's
    drafter KV, or its own tree rows in the wrong slots, would accept differently)."""
    model, drafter = fitted
    spec = TREES[tree]
    prompts = _prompts(4)
    engine = BatchEngine(HFBatchTarget(model), drafter, spec, max_batch=4)
    reqs = [engine.submit(BatchRequest(p, 24)) for p in prompts]
    while not all(r.done for r in reqs):
        engine.step()
        for b, r in enumerate(engine.live):
            fed = engine.drafts.committed[b] + engine.pending(b)
            assert fed == len(r.tokens) - 1  # every token but the root, once
    assert all(r.chained for r in reqs) and (engine.drafts.plan is None) == (tree == "chain")
    single = SpeculativeEngine(HFTarget(model), drafter, spec)
    for p, r in zip(prompts, reqs):
        alone = single.generate(p, 24)
        assert r.result.token_ids == alone.token_ids
        assert [x.accepted for x in r.result.rounds] == [x.accepted for x in alone.rounds]


@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_joining_prompts_catch_up_at_the_join(fitted, tree, monkeypatch):
    """A joining prompt's features go through the drafter when it joins, so that a round drafts from a block of at
    most k + 1 rows per row (the last prompt row, or a round's accepted rows), whatever the prompt's length."""
    model, drafter = fitted
    spec = TREES[tree]
    widths = []
    draft, block, propose = BatchDrafts.draft, BatchDrafts.draft_block, Proposer.propose
    monkeypatch.setattr(BatchDrafts, "draft", lambda self, rows, feats, *a, **kw: (
        widths.extend(f.shape[0] for f in feats), draft(self, rows, feats, *a, **kw))[1])
    monkeypatch.setattr(BatchDrafts, "draft_block", lambda self, feats, ids, counts, *a, **kw: (
        widths.extend(counts), block(self, feats, ids, counts, *a, **kw))[1])
    monkeypatch.setattr(Proposer, "propose", lambda self, root, feats, nxt: (
        widths.append(feats.shape[0]), propose(self, root, feats, nxt))[1])
    prompts = [p * 3 for p in _prompts(5)]  # 9..21 tokens
    engine = BatchEngine(HFBatchTarget(model), drafter, spec, max_batch=3, prefill_chunk=8)
    results = engine.generate([BatchRequest(p, 12) for p in prompts])
    assert [r.token_ids for r in results] == [reference_greedy(model, p, 12) for p in prompts]
    assert widths and max(widths) <= spec.depth + 1
    assert engine.seconds["join"] > 0 and engine.seconds["round"] > 0 and engine.graphs == 0  # no graphs on CPU


@pytest.mark.parametrize("tree", ["chain", "static"])
def test_padded_draft_blocks_draft_the_same(fitted, tree):
    """Graphed drafts pad the batch and the catch-up block to powers of two (at least MIN_BLOCK rows): the padding
    rows change no row's drafts or drafter KV (the replay stands in for the graph here); nor do the rows past each
    row's count in draft_block's one block."""
    _, drafter = fitted
    spec = TREES[tree]

    class Padded(BatchDrafts):
        _replay = BatchDrafts._draft

    plain, padded, block = BatchDrafts(drafter, spec), Padded(drafter, spec), Padded(drafter, spec)
    padded.use_graphs = block.use_graphs = True
    gen = torch.Generator().manual_seed(0)
    F = drafter.fc.in_features
    for drafts in (plain, padded, block):
        for _ in range(3):
            drafts.join()
    for counts in ([5, 1, 3], [1, 2, 1], [2, 2, 2]):
        feats = [torch.randn(n, F, generator=gen) for n in counts]
        nxt = [torch.randint(0, 90, (n,), generator=gen).tolist() for n in counts]
        # draft_block's form: one [B, w] block whose rows past each row's count hold other values
        held = torch.randn(3, max(counts), F, generator=gen)
        ids = torch.randint(0, 90, (3, max(counts)), generator=gen)
        for b, (f, t) in enumerate(zip(feats, nxt)):
            held[b, : len(t)], ids[b, : len(t)] = f, torch.tensor(t)
        want = plain.draft(range(3), feats, nxt)
        assert torch.equal(want, padded.draft(range(3), feats, nxt))
        assert torch.equal(want, block.draft_block(held, ids, counts))
    assert plain.committed == padded.committed == block.committed
    n = min(plain.committed)
    for a, b, c in zip(plain.k, padded.k, block.k):
        assert torch.allclose(a[:3, :, :n], b[:3, :, :n], atol=1e-6)
        assert torch.allclose(a[:3, :, :n], c[:3, :, :n], atol=1e-6)


@pytest.mark.parametrize("tree", ["chain", "static"])
def test_fused_batched_drafts_draft_as_the_drafter(fitted, tree):
    """The batched drafts through draft/fused.py's FusedBatchEagle3Step (the CUDA default) propose what the
    drafter's own forward proposes and write the same drafter KV, over ragged catch-up blocks round after round (a
    row's rope, KV slots or mask taken from another row would change both)."""
    _, drafter = fitted
    spec = TREES[tree]
    plain, fused = BatchDrafts(drafter, spec, fused=False), BatchDrafts(drafter, spec, fused=True)
    assert fused.fused and fused._step is drafter  # the fused step is built with the slot buffers
    gen = torch.Generator().manual_seed(3)
    F = drafter.fc.in_features
    for drafts in (plain, fused):
        for _ in range(3):
            drafts.join()
    for counts in ([5, 1, 3], [1, 2, 1], [2, 4, 2], [1, 1, 1]):
        feats = [torch.randn(n, F, generator=gen) for n in counts]
        nxt = [torch.randint(0, 90, (n,), generator=gen).tolist() for n in counts]
        assert torch.equal(plain.draft(range(3), feats, nxt), fused.draft(range(3), feats, nxt))
    assert isinstance(fused._step, FusedBatchEagle3Step)
    n = min(plain.committed)
    for a, b in zip(plain.k + plain.v, fused.k + fused.v):
        torch.testing.assert_close(b[:3, :, :n], a[:3, :, :n], rtol=1e-5, atol=1e-5)


def test_chained_and_sampled_rows_together(fitted, monkeypatch):
    """Greedy and sampled rows draft their chains in one drafter call per step (draft/batch.py): a sampled row draws
    its drafts from its own processed draft distribution and noise from its own generator (rows at two temperatures,
    and one whose drafter drafts greedily, draft_temperature 0), joining as rows leave (after chained greedy rounds
    left their features on the device), and every row's chain is accepted in the same pass (no row by row
    sample_accept). Each is what it is alone in the one-sequence engine."""
    import eaglespec.engine.batch as batch_module
    from eaglespec.sampling import draft_processors

    def row_by_row(*args, **kwargs):
        raise AssertionError("a chained round accepts its sampled rows row by row")

    monkeypatch.setattr(batch_module, "sample_accept", row_by_row)

    model, drafter = fitted
    spec = TREES["chain"]
    prompts = _prompts(8)
    sampled = {4: SamplingConfig(SamplingParams(temperature=0.9), seed=7),
               5: SamplingConfig(SamplingParams(temperature=0.6, top_k=20), seed=8),
               6: SamplingConfig(SamplingParams(temperature=0.9), seed=9, draft=draft_processors(0)),
               7: SamplingConfig(SamplingParams(temperature=0.9), seed=10)}
    engine = BatchEngine(HFBatchTarget(model), drafter, spec, max_batch=4, prefill_chunk=6)
    assert engine.drafts is not None and engine.drafts.samples
    calls = []
    sampled_rows = engine.drafts.sampled_rows
    engine.drafts.sampled_rows = lambda rows, *a: calls.append(list(rows)) or sampled_rows(rows, *a)
    lengths = [10, 8, 24, 20, 24, 16, 20, 12]  # the sampled rows join as greedy ones leave, after greedy rounds
    reqs = [BatchRequest(p, n, sampling=sampled.get(i)) for i, (p, n) in enumerate(zip(prompts, lengths))]
    results = engine.generate(reqs)
    assert all(r.chained for r in reqs) and max(len(c) for c in calls) == 4  # every row in one drafter call
    single = SpeculativeEngine(HFTarget(model), drafter, spec)
    for i, (p, n, r) in enumerate(zip(prompts, lengths, results)):
        if i in sampled:
            assert r.token_ids == single.generate(p, n, sampling=sampled[i]).token_ids
        else:
            assert r.token_ids == reference_greedy(model, p, n)
    assert max(r.tau for r in results) > 2  # the chained drafts are accepted (the drafter's KV is right)
    assert max(results[i].tau for i in sampled) > 1.5  # drawn drafts are accepted too
    assert engine.drafts.batch == 0


def test_greedy_acceptance_of_padded_rows_equals_each_row():
    """greedy_accept_rows over trees of different sizes (padded) equals greedy_accept of each tree alone, including
    a one-row tree and paths that end at the root."""
    gen = torch.Generator().manual_seed(0)
    flats, logits = [], []
    for size in (1, 6, 3, 9):
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, size)])
        tree = DraftTree(tokens=torch.randint(0, 5, (size,), generator=gen), parents=parents,
                         depths=torch.zeros(size, dtype=torch.long))
        for i in range(1, size):
            tree.depths[i] = tree.depths[parents[i]] + 1
        flats.append(flatten(tree))
        logits.append(torch.randn(size, 5, generator=gen))
    rows = stack_flat(flats)
    padded = torch.zeros(len(flats), rows.tokens.shape[1], 5)
    for b, lg in enumerate(logits):
        padded[b, : lg.shape[0]] = lg
    for acc, flat, lg in zip(greedy_accept_rows(rows, padded), flats, logits):
        ref = greedy_accept(flat, lg)
        assert (acc.tokens, acc.bonus, acc.accepted, acc.rows.tolist()) == (ref.tokens, ref.bonus, ref.accepted,
                                                                            ref.rows.tolist())


def test_chain_acceptance_equals_tree_acceptance():
    """greedy_chain_walk over chains whose drafts match the argmax for 0..k steps (and a mismatch, then a match:
    the walk stops at the first mismatch) equals greedy_accept of each chain alone."""
    gen = torch.Generator().manual_seed(0)
    B, k, V = 6, 4, 7
    logits = torch.randn(B, k + 1, V, generator=gen)
    best = logits.argmax(-1)
    tokens = torch.randint(0, V, (B, k + 1), generator=gen)
    for b in range(B):
        good = min(b, k)  # row b's first b drafts are the target's tokens
        tokens[b, 1: good + 1] = best[b, :good]
        if good < k:
            tokens[b, good + 1] = (best[b, good] + 1) % V  # then a mismatch
        if good + 2 <= k:
            tokens[b, good + 2] = best[b, good + 1]  # a match after the mismatch is not accepted
    for b, (m, emitted) in enumerate(read_chains(*greedy_chain_walk(tokens, logits))):
        ref = greedy_accept(flatten(chain_tree(tokens[b, :1], tokens[b, 1:])), logits[b])
        assert m == ref.accepted == min(b, k)
        assert emitted == [*ref.tokens[1:], ref.bonus]


@pytest.mark.parametrize("backend", ["fast", "fast-kernels"])
def test_fused_prefill_equals_the_models_forward(fitted, backend):
    """The fused layers' chunked prefill gives the model's own last-row logits, every row's features and the KV
    a one-pass prefill of the whole prompt gives (an off-by-one in the causal mask or the chunk's positions fails)."""
    model, _ = fitted
    ids = (1, 2, 4)
    prompt = torch.tensor([5, 9, 11, 40, 2, 7, 3, 60, 30])
    hf, fused = HFBatchTarget(model, ids), TARGETS[backend](model, ids)
    whole = Prefilled()
    logits, features = hf.prefill(whole, prompt)
    chunked, feats = Prefilled(), []
    for part in (prompt[:2], prompt[2:3], prompt[3:]):
        last, f = fused.prefill(chunked, part)
        feats.append(f)
    assert chunked.length == whole.length == 9
    torch.testing.assert_close(last, logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat(feats), features, rtol=1e-4, atol=1e-4)
    for a, b in zip(chunked.keys + chunked.values, whole.keys + whole.values):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["fast", "fast-kernels"])
def test_joined_prompts_equal_prompts_prefilled_one_by_one(fitted, backend):
    """join_prompts' one padded pass gives each prompt the last-row logits, features and KV of its own prefill (a
    padding row leaking into a shorter prompt's rows, or a wrong last row, fails); so does join_chunked's staging row
    in chunks of 3 (a chunk that misses the slots before it, or a padded last chunk's rows in the KV, fails)."""
    model, _ = fitted
    ids = (1, 2, 4)
    prompts = [[5, 9, 11, 40, 2], [7, 3], [30, 31, 32, 33, 34, 35, 36]]
    one, many = TARGETS[backend](model, ids), TARGETS[backend](model, ids)
    staged = TARGETS["fast"](model, ids)  # the staging row's code is the same with the kernels (slow, interpreted)
    alone = one.join_prompts(prompts[:1]) + one.join_prompts(prompts[1:2]) + one.join_prompts(prompts[2:])
    together = many.join_prompts(prompts)
    chunked = [staged.join_chunked(p, chunk=3) for p in prompts]
    assert one.lengths == many.lengths == staged.lengths == [5, 2, 7]
    for (a_logits, a_feats), (b_logits, b_feats), (c_logits, c_feats) in zip(alone, together, chunked):
        torch.testing.assert_close(b_logits, a_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b_feats, a_feats, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(c_logits, a_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(c_feats, a_feats, rtol=1e-4, atol=1e-4)
    for b, n in enumerate(many.lengths):
        for x, y, z in zip(one.keys + one.values, many.keys + many.values, staged.keys + staged.values):
            torch.testing.assert_close(y[b, :, :n], x[b, :, :n], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(z[b, :, :n], x[b, :, :n], rtol=1e-4, atol=1e-4)


def test_compaction_moves_only_rows_into_holes():
    """Rows leaving: staying rows below the new size keep their place, holes take staying rows from above, and
    move_rows copies exactly those rows."""
    assert compaction(5, [1, 3]) == [0, 4, 2]
    assert compaction(4, [3]) == [0, 1, 2]
    assert compaction(4, [0, 1, 2, 3]) == []
    assert compaction(6, [0, 5]) == [4, 1, 2, 3]
    with pytest.raises(ValueError, match="not all rows"):
        compaction(3, [3])
    x = torch.arange(6.0)[:, None].repeat(1, 2)
    move_rows([x], compaction(6, [0, 5]))
    assert x[:4, 0].tolist() == [4.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize(("backend", "stacked"), [(b, True) for b in sorted(TARGETS)] + [("hf", False)])
def test_batch_rows_do_not_leak(fitted, backend, stacked, monkeypatch):
    """Rows of different lengths keeping rows of different counts (moved down past the rows left out), then a row
    dropped: each row's logits and features equal its sequence's alone, and so do the row's that moved into its
    place; with every layer's KV in one tensor or each layer's apart (models whose layers' KV shapes differ)."""
    model, _ = fitted
    ids = (1, 2, 4)
    if not stacked:
        monkeypatch.setattr(HFBatchTarget, "_stackable", lambda self: False)
    batch = TARGETS[backend](model, ids)
    solo = [HFTarget(model, ids), HFTarget(model, ids), HFTarget(model, ids)]
    prompts = [[5, 9, 11, 40, 2], [7, 3, 60], [30, 31, 32, 33, 34, 35, 36]]
    for p, t in zip(prompts, solo):
        state = Prefilled()
        batch.prefill(state, torch.tensor(p[:2]))
        batch.prefill(state, torch.tensor(p[2:]))
        batch.join(state)
        t.forward(torch.tensor(p))
        t.commit(torch.arange(len(p)))
    gen = torch.Generator().manual_seed(0)

    def step(rows: list[int], width: list[int], n: int) -> None:
        tokens = [torch.randint(3, 90, (w,), generator=gen) for w in width]
        depths = [torch.arange(w) for w in width]
        visible = [torch.ones(w, w, dtype=torch.bool).tril() for w in width]
        flat = stack_flat([FlatTree(t, d, d - 1, v) for t, d, v in zip(tokens, depths, visible)])
        out = batch.forward(flat.tokens, flat.depths, flat.visible)
        keeps = [torch.arange(0, w, 2)[: 1 + (n + b) % w] for b, w in enumerate(width)]  # rows 0, 2, ...: moved
        for b, i in enumerate(rows):
            ref = solo[i].forward(tokens[b], depths[b], visible[b])
            torch.testing.assert_close(out.logits[b, : width[b]], ref.logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(out.features[b, : width[b]], ref.features, rtol=1e-4, atol=1e-4)
            solo[i].commit(keeps[b])
        batch.commit(keeps)

    for n in range(6):
        step([0, 1, 2], [3, 1, 2] if n % 2 else [1, 4, 3], n)
    assert batch.lengths == [t.committed_len for t in solo]
    assert (batch._kv is not None) == stacked
    order = batch.drop([0])
    assert order == [2, 1]  # the last row fills the hole: one row moves
    for n in range(3):
        step(order, [2, 3], n)
    assert batch.lengths == [solo[i].committed_len for i in order]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("backend", ENGINE_TARGETS)
@pytest.mark.parametrize("tree", ["chain", "static", "dynamic"])
def test_cuda_graph_rows_equal_generate(tree, backend):
    """On a GPU the verify forward replays a CUDA graph per (batch bucket, rows, slots), the batched chains and
    static trees one per (batch bucket, catch-up rows, slots, k), and a dynamic tree's row its pooled static
    runner's graphs (a sampled row's too, except under chains, which it drafts with the other rows); fp32 rows stay
    exact, and a sampled row samples what it samples alone."""
    from functools import partial

    from eaglespec.draft.fast import StaticDraftRunner

    reference = tiny_target("llama", seed=0)
    drafter = fit_drafter(reference, tiny_drafter(reference, seed=1), steps=60, n_seqs=8, length=32).cuda()
    runner = partial(StaticDraftRunner, max_len=256)
    target = TARGETS[backend](tiny_target("llama", seed=0).cuda())
    engine = BatchEngine(target, drafter, TREES[tree], max_batch=3, prefill_chunk=4, draft_runner=runner)
    prompts = _prompts(5)
    sampled = SamplingConfig(SamplingParams(temperature=0.8), seed=3)
    results = engine.generate([BatchRequest(p, 12 + 2 * i, sampling=sampled if i == 4 else None)
                               for i, p in enumerate(prompts)])
    assert target._graphs, "no graph was captured"
    if engine.drafts is not None:
        assert engine.drafts._graphs, "the batched drafts ran without a graph"
    if tree == "chain":  # the sampled row draws its chain with the other rows'
        assert not engine._idle_runners
    else:
        assert engine._idle_runners and all(r._graphs for r in engine._idle_runners), "a pooled runner ran eagerly"
    for i, (p, r) in enumerate(zip(prompts[:4], results)):
        assert r.token_ids == reference_greedy(reference, p, 12 + 2 * i)
    alone = BatchEngine(TARGETS[backend](tiny_target("llama", seed=0).cuda()), drafter, TREES[tree], max_batch=1,
                        draft_runner=runner).generate([BatchRequest(prompts[4], 20, sampling=sampled)])[0]
    assert results[4].token_ids == alone.token_ids


def test_attention_with_changing_shapes_keeps_cudnn_off(fitted, monkeypatch):
    """cuDNN's attention builds a plan per new shape (tens of ms each on a GPU): a prefill, a batched verify and
    the drafter (its KV grows every call) run SDPA with it disabled."""
    import torch.nn.functional as F

    model, drafter = fitted
    seen: list[bool] = []
    real = F.scaled_dot_product_attention

    def spy(*a, **kw):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    engine = BatchEngine(HFBatchTarget(model), drafter, TREES["chain"], max_batch=2)
    engine.generate([BatchRequest(p, 6) for p in _prompts(2)])
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored after each call


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_to_device_all_equals_to_device_each(device):
    """The batched draft's host inputs go over in one copy (views of one buffer on CUDA), each equal to its own."""
    from eaglespec.tensors import to_device, to_device_all

    dev = torch.device(device)
    data = ([3, 1], [[1, 2, 3], [4, 5, 6]], [], [7])
    got = to_device_all(dev, *data)
    for d, t in zip(data, got):
        assert t.device.type == device and torch.equal(t.cpu(), to_device(d, torch.device("cpu")))
    if device == "cuda":
        assert len({t.untyped_storage().data_ptr() for t in got}) == 1


def test_static_drafts_carry_their_ancestry(fitted):
    """Every static tree of the batched drafts shares the shape's ancestry mask, computed once: flatten takes it."""
    from eaglespec.tree.core import ancestry

    _, drafter = fitted
    drafts = BatchDrafts(drafter, TREES["static"])
    for _ in range(2):
        drafts.join()
    gen = torch.Generator().manual_seed(0)
    feats = [torch.randn(n, drafter.fc.in_features, generator=gen) for n in (3, 1)]
    trees = drafts.propose(range(2), torch.tensor([5, 7]), feats, [[1, 2, 3], [4]])
    assert [int(t.tokens[0]) for t in trees] == [5, 7]  # each row's root
    for tree in trees:
        assert torch.equal(tree.visible, ancestry(tree.parents)) and flatten(tree).visible is tree.visible
