"""draft/fused.py's FusedEagle3Step (torch path, CPU fp32) against Eagle3Drafter.forward over the same StaticKV:
the same logits, states and KV rows for every config switch (norm_before_residual, norm_output, GQA / MHA,
biases, a draft vocabulary, the drafter's own embedding), the rope table bitwise equal to Rotary's per-step
values, and whole engine runs through StaticDraftRunner(fused=True) giving the eager proposer's trees and HF
generate's output. FusedEagle1Step likewise against Eagle1Drafter.forward (1 and 2 layers, GQA / MHA, biases, its
own embedding). The Triton paths are in tests/test_kernels.py (under Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from _engines import enable_draft_graphs
from eaglespec.backends.fast import _rope, _rope_table
from eaglespec.backends.hf import HFTarget
from eaglespec.draft.eagle1 import Eagle1Drafter
from eaglespec.draft.fast import StaticDraftRunner, StaticKV
from eaglespec.draft.fused import FusedEagle1Step, FusedEagle3Step
from eaglespec.draft.layers import Rotary
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec
from test_draft_static import PROMPTS, SPECS, agreeing, same_runs

from conftest import tiny_draft_config, tiny_drafter, tiny_target

CONFIGS = {
    "default": {},
    "norm-before-residual": dict(norm_before_residual=True),
    "norm-output": dict(norm_output=True),
    "mha": dict(num_key_value_heads=4),
    "gqa-g3": dict(num_attention_heads=6, num_key_value_heads=2),  # G = 3 != Hkv = 2: a swapped head order shows
    "biases": dict(attention_bias=True, mlp_bias=True),
    "draft-vocab": dict(draft_vocab_size=40),
}


def drafter_for(name: str, seed: int = 4):
    model = tiny_target("llama", seed=1)
    d = tiny_drafter(model, seed=seed, **CONFIGS[name])
    with torch.no_grad():  # biases and norm weights away from their init (zeros / ones): a dropped one shows
        for n, p in d.named_parameters():
            if "bias" in n or "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    return model, d


def caches(d, size: int, slots: torch.Tensor, span: int) -> list[StaticKV]:
    at = d.midlayer.self_attn
    k = torch.randn(1, at.kv_heads, size, at.head_dim)
    return [StaticKV(k, torch.randn_like(k), slots, span)]


def tree_rows(rows: int, slots: torch.Tensor, span: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [rows], visible [rows, span]) of a tree step's rows: positions shared by siblings (not the slots),
    a random visibility (seeded by the caller) in which each row sees its own slot."""
    positions = torch.tensor([3, 9, 9, 12, 16][:rows])
    visible = torch.rand(rows, span) < 0.6
    visible[torch.arange(rows), slots] = True
    return positions, visible


def clone(cache: list[StaticKV]) -> list[StaticKV]:
    return [StaticKV(c.k.clone(), c.v.clone(), c.slots, c.span) for c in cache]


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_step_equals_the_drafter_forward(name, rows):
    _, d = drafter_for(name)
    size, start, span = 48, 17, 32
    torch.manual_seed(0)
    slots = torch.arange(start, start + rows)
    cache = caches(d, size, slots, span)
    state, tokens = torch.randn(rows, d.cfg.hidden_size), torch.randint(0, d.cfg.vocab_size, (rows,))
    positions, visible = tree_rows(rows, slots, span)
    ref_cache, fused_cache = clone(cache), clone(cache)
    with torch.no_grad():
        ref_logits, ref_state = d(state, tokens, positions, ref_cache, visible=visible)
        logits, new_state = FusedEagle3Step(d, size)(state, tokens, positions, fused_cache, visible)
    assert logits.shape == ref_logits.shape == (rows, d.cfg.draft_vocab_size)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_state, ref_state, rtol=1e-5, atol=1e-5)
    for a, b in zip(ref_cache, fused_cache):  # the same rows written at the same slots, nothing else touched
        torch.testing.assert_close(b.k, a.k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.v, a.v, rtol=0, atol=0)
    assert not torch.equal(fused_cache[0].k, cache[0].k)  # it did write


def test_fused_step_ignores_hidden_slots():
    """Slots a row may not see change nothing: the mask reaches every grouped query row (a mask expanded
    over the wrong axis lets a GQA row attend to a hidden slot)."""
    _, d = drafter_for("default")
    rows, size, span = 3, 40, 32
    slots = torch.arange(10, 10 + rows)
    cache = caches(d, size, slots, span)
    state, tokens, positions = torch.randn(rows, d.cfg.hidden_size), torch.tensor([1, 2, 3]), torch.tensor([4, 5, 5])
    visible = torch.zeros(rows, span, dtype=torch.bool)
    visible[:, :10] = True
    visible[torch.arange(rows), slots] = True
    step = FusedEagle3Step(d, size)
    with torch.no_grad():
        a, _ = step(state, tokens, positions, clone(cache), visible)
        noisy = clone(cache)
        noisy[0].k[:, :, 20:] += 5.0  # hidden slots only (their KV rows 13.. are never visible)
        noisy[0].v[:, :, 20:] -= 5.0
        b, _ = step(state, tokens, positions, noisy, visible)
        visible[0, 25] = True  # now row 0 sees one of them: it must change
        c, _ = step(state, tokens, positions, noisy, visible)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert not torch.allclose(a[0], c[0]) and torch.equal(a[1:], c[1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_table_is_rotary_bitwise(dtype):
    """The table's rows are Rotary.cos_sin's values and _rope reproduces Rotary.apply exactly."""
    rot = Rotary(16, 10000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    positions = torch.tensor([0, 7, 300, 1023])
    table = _rope_table(*rot.cos_sin(torch.arange(1024), dtype))
    x = torch.randn(3, 4, 16).to(dtype)  # [heads, rows, D]
    cos, sin = rot.cos_sin(positions, dtype)
    assert torch.equal(_rope(x, table[positions][None]), rot.apply(x, cos, sin))


def test_static_runner_fused_equals_the_eager_proposer():
    """Whole engine runs (chain, dynamic, static trees; per-step and whole-tree growth): HF generate's output
    and the eager proposer's trees."""
    model, drafter = agreeing("llama", "eagle3")
    for kind in SPECS:
        for tree_graphs in (False, True):
            eager = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind])
            fused = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind])
            runner = enable_draft_graphs(fused, max_len=96, buckets=(1, 4, 8), tree_graphs=tree_graphs, fused=True)
            assert isinstance(runner.forward, FusedEagle3Step)
            same_runs(model, eager, fused, PROMPTS)


def test_fused_is_off_on_cpu_by_default_and_refused_where_it_cannot_run():
    model = tiny_target("llama", seed=1)
    d = tiny_drafter(model, seed=2)
    assert StaticDraftRunner(d, max_len=32).forward is d  # CPU default: the drafter's own forward
    torch.manual_seed(0)
    e1 = Eagle1Drafter(tiny_draft_config(model, method="eagle1", aux_layer_ids=())).eval()
    with pytest.raises(EagleSpecError, match="no target lm_head"):  # not wired to a target yet
        StaticDraftRunner(e1, max_len=32, fused=True)
    SpeculativeEngine(HFTarget(model), e1)  # wiring: embedding, final norm + lm_head
    assert StaticDraftRunner(e1, max_len=32).forward is e1
    assert isinstance(StaticDraftRunner(e1, max_len=32, fused=True).forward, FusedEagle1Step)
    partial = tiny_drafter(model, seed=2, rotary_dim=d.cfg.head_dim // 2)
    with pytest.raises(EagleSpecError, match="partial rotary"):
        StaticDraftRunner(partial, max_len=32, fused=True)
    partial1 = eagle1_for(model, rotary_dim=d.cfg.head_dim // 2)
    with pytest.raises(EagleSpecError, match="partial rotary"):
        StaticDraftRunner(partial1, max_len=32, fused=True)
    with pytest.raises(ValueError, match="not an EAGLE-3 drafter"):
        FusedEagle3Step(e1, 32)
    with pytest.raises(ValueError, match="not an EAGLE-1 drafter"):
        FusedEagle1Step(d, 32)


def test_sampled_trees_use_the_fused_q():
    """At T > 0 the static runner's fused step is what the sampler reads: a run is reproducible per seed."""
    from eaglespec.sampling import SamplingConfig, SamplingParams

    model, drafter = agreeing("llama", "eagle3")
    outs = []
    for _ in range(2):
        engine = SpeculativeEngine(HFTarget(model), drafter, TreeSpec("dynamic", depth=3, top_k=3, budget=6))
        enable_draft_graphs(engine, max_len=96, buckets=(1, 4, 8), fused=True)
        cfg = SamplingConfig(SamplingParams(temperature=0.8), seed=5)
        outs.append(engine.generate(PROMPTS[0], 16, sampling=cfg).token_ids)
    assert outs[0] == outs[1] and len(outs[0]) == 16


# -- FusedEagle1Step -----------------------------------------------------------------------------------------
E1_CONFIGS = {
    "default": {},  # G = 2, Hkv = 2: o_proj's columns are permuted
    "gqa-g3": dict(num_attention_heads=6, num_key_value_heads=2),
    "mha": dict(num_key_value_heads=4),
    "biases": dict(attention_bias=True, mlp_bias=True),
    "own-embedding": {},
}


def eagle1_for(model, layers: int = 1, seed: int = 4, own_embedding: bool = False, **overrides) -> Eagle1Drafter:
    """A tiny EAGLE-1 drafter wired to `model` (embedding, final norm + lm_head), its biases and norm weights
    moved away from their init (zeros / ones: a dropped or added one shows)."""
    torch.manual_seed(seed)
    cfg = tiny_draft_config(model, method="eagle1", aux_layer_ids=(), num_hidden_layers=layers, **overrides)
    d = Eagle1Drafter(cfg, own_embedding=own_embedding).eval()
    SpeculativeEngine(HFTarget(model), d)  # wiring
    with torch.no_grad():
        for n, p in d.named_parameters():
            if "bias" in n or "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    return d


def eagle1_caches(d: Eagle1Drafter, size: int, slots: torch.Tensor, span: int) -> list[StaticKV]:
    out = []
    for layer in d.layers:
        at = layer.self_attn
        k = torch.randn(1, at.kv_heads, size, at.head_dim)
        out.append(StaticKV(k, torch.randn_like(k), slots, span))
    return out


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("name", list(E1_CONFIGS))
def test_fused_eagle1_step_equals_the_drafter_forward(name, layers, rows):
    """Logits, the next state and every layer's KV rows as Eagle1Drafter.forward (fp32, to accumulation order);
    the slots not written untouched; the caller's state (a view of a larger tensor) never written."""
    model = tiny_target("llama", seed=1)
    d = eagle1_for(model, layers, own_embedding=name == "own-embedding", **E1_CONFIGS[name])
    size, start, span = 48, 17, 32
    torch.manual_seed(0)
    slots = torch.arange(start, start + rows)
    cache = eagle1_caches(d, size, slots, span)
    h = d.cfg.hidden_size
    state = torch.randn(rows, 2 * h)[:, h:]  # a view: writing into it would show in the base too
    base_before = state._base.clone()
    tokens = torch.randint(0, d.cfg.vocab_size, (rows,))
    positions, visible = tree_rows(rows, slots, span)
    ref_cache, fused_cache = clone(cache), clone(cache)
    with torch.no_grad():
        ref_logits, ref_state = d(state, tokens, positions, ref_cache, visible=visible)
        logits, new_state = FusedEagle1Step(d, size)(state, tokens, positions, fused_cache, visible)
    assert torch.equal(state._base, base_before)  # read, never written
    assert logits.shape == ref_logits.shape == (rows, d.cfg.vocab_size)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(new_state, ref_state, rtol=1e-5, atol=1e-5)
    untouched = torch.ones(size, dtype=torch.bool)
    untouched[slots] = False
    for before, a, b in zip(cache, ref_cache, fused_cache):  # the same rows at the same slots, nothing else
        torch.testing.assert_close(b.k, a.k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(b.v, a.v, rtol=1e-5, atol=1e-5)
        assert torch.equal(b.k[:, :, untouched], before.k[:, :, untouched])
        assert torch.equal(b.v[:, :, untouched], before.v[:, :, untouched])
        assert not torch.equal(b.k[:, :, slots], before.k[:, :, slots])  # it did write


def test_static_runner_fused_eagle1_equals_the_eager_proposer():
    """Whole engine runs with EAGLE-1 drafters (a fitted 1-layer one, a random 2-layer one; chain, dynamic and
    static trees; per-step and whole-tree growth): HF generate's output and the eager proposer's trees."""
    model, fitted = agreeing("llama", "eagle1")
    for drafter in (fitted, eagle1_for(model, layers=2, seed=7)):
        for kind in SPECS:
            for tree_graphs in (False, True):
                eager = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind])
                fused = SpeculativeEngine(HFTarget(model), drafter, SPECS[kind])
                runner = enable_draft_graphs(fused, max_len=96, buckets=(1, 4, 8), tree_graphs=tree_graphs,
                                             fused=True)
                assert isinstance(runner.forward, FusedEagle1Step)
                same_runs(model, eager, fused, PROMPTS)


def test_round_graphs_with_the_fused_eagle1_step():
    """The round graph (round_graph.py, eager on CPU) over FusedEagle1Step: HF generate's tokens, and no host sync
    or host->device copy inside the round function (the CPU proxy for CUDA-graph capturability)."""
    from _engines import enable_round_graphs
    from eaglespec.backends.fast import FastTarget
    from test_round_graph import count_body_host_ops

    from conftest import reference_greedy

    model, drafter = agreeing("llama", "eagle1")
    for kind in ("chain", "dynamic"):
        engine = SpeculativeEngine(FastTarget(model, max_len=128), drafter, SPECS[kind])
        runner = enable_draft_graphs(engine, max_len=128, fused=True)
        assert isinstance(runner.forward, FusedEagle1Step)
        seen = count_body_host_ops(enable_round_graphs(engine).get(engine.spec))
        for prompt in PROMPTS:
            assert engine.generate(prompt, 24).token_ids == reference_greedy(model, prompt, 24)
        assert seen and all(c.syncs == 0 and c.h2d == 0 for _, c in seen), kind
