"""Sampling through the real SpeculativeEngine: processors, wiring, reproducibility, greedy path.

The statistical end-to-end check is smaller than test_sampling.py's (a few thousand full
generate() calls) but still a real goodness-of-fit test of the first 3 tokens, with a power check
(the same samples must REJECT the distribution of a different processor setting).
"""

from __future__ import annotations

import pytest
import torch

from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.sampling import SamplingConfig, SamplingParams, from_generation_config, process_logits
from eaglespec.tree.core import TreeSpec, chain_tree, flatten
from eaglespec.verify import greedy_accept, sample_accept
from test_sampling import first3_pvalue

from conftest import reference_greedy, tiny_drafter, tiny_target

V = 16
PROMPT = [3, 9, 4]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7), SamplingParams(top_k=5), SamplingParams(top_p=0.8),
    SamplingParams(min_p=0.2), SamplingParams(temperature=1.3, top_k=7, top_p=0.9, min_p=0.05),
    SamplingParams(top_k=3, top_p=0.5),
])
def test_processors_match_hf_warpers(params):
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, :5] = logits[0, 0]  # ties at the top-k boundary
    x = TemperatureLogitsWarper(params.temperature)(None, logits.clone())
    if params.top_k:
        x = TopKLogitsWarper(params.top_k)(None, x)
    if params.top_p < 1:
        x = TopPLogitsWarper(params.top_p)(None, x)
    if params.min_p:
        x = MinPLogitsWarper(params.min_p)(None, x)
    torch.testing.assert_close(process_logits(logits, params), x.softmax(-1))


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.randn(3, 20)
    probs = process_logits(logits, SamplingParams(temperature=0))
    assert torch.equal(probs.argmax(-1), logits.argmax(-1)) and torch.equal(probs.sum(-1), torch.ones(3))


def test_from_generation_config():
    from transformers import GenerationConfig

    greedy = GenerationConfig(do_sample=False)
    assert from_generation_config(greedy) is None
    assert from_generation_config(greedy, temperature=0.0) is None
    cfg = from_generation_config(greedy, temperature=0.8, seed=3)
    assert cfg.target == SamplingParams(temperature=0.8) and cfg.seed == 3  # HF's top_k=50 default is NOT used
    model_cfg = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.95, top_k=20)
    assert from_generation_config(model_cfg).target == SamplingParams(0.6, 20, 0.95)
    assert from_generation_config(model_cfg, top_p=1.0).target == SamplingParams(0.6, 20, 1.0)
    assert from_generation_config(model_cfg, temperature=0) is None


def test_sample_accept_returns_a_root_path_and_a_bonus_in_support():
    """sample_accept on a chain returns a root path and a bonus in the processed support."""
    flat = flatten(chain_tree(5, torch.tensor([1, 2, 3])))
    logits = torch.randn(4, V)
    p = process_logits(logits, SamplingParams(top_k=2))
    acc = sample_accept(flat, p, None, torch.Generator().manual_seed(0))
    assert torch.equal(acc.rows, torch.arange(acc.accepted + 1))
    assert p[acc.accepted, acc.bonus] > 0
    greedy = greedy_accept(flat, logits)
    assert greedy.bonus == int(logits[greedy.accepted].argmax())


@pytest.fixture(scope="module")
def sharp_target():
    model = tiny_target("llama", seed=5, vocab=V, layers=2)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)  # fewer likely 3-token continuations: more power per sample
    return model


def _exact_first3(model, params: SamplingParams) -> torch.Tensor:
    grid = torch.cartesian_prod(*[torch.arange(V)] * 2)  # [V^2, 2]
    seqs = torch.cat([torch.tensor(PROMPT).expand(grid.shape[0], -1), grid], dim=1)
    with torch.no_grad():
        probs = process_logits(model(seqs).logits, params)  # [V^2, P+2, V]
    p1 = probs[0, len(PROMPT) - 1]
    p2 = probs[torch.arange(V) * V, len(PROMPT)]  # [V, V]
    p3 = probs[:, len(PROMPT) + 1].reshape(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.mark.parametrize("spec,params,runs", [
    (TreeSpec("chain", depth=1), SamplingParams(temperature=0.7, top_p=0.9), 2000),
    (TreeSpec("dynamic", depth=2, top_k=3, budget=4), SamplingParams(temperature=1.0, top_k=5), 1500),
], ids=["chain-T0.7-top_p0.9", "dynamic-T1-top_k5"])
def test_engine_first_three_tokens_match_target(sharp_target, spec, params, runs):
    engine = SpeculativeEngine(HFTarget(sharp_target), tiny_drafter(sharp_target, seed=1), spec)
    tokens, accepted = [], 0
    for seed in range(runs):
        out = engine.generate(PROMPT, 3, sampling=SamplingConfig(params, seed=seed))
        tokens.append(out.token_ids)
        accepted += sum(r.accepted for r in out.rounds)
    emitted = torch.tensor(tokens)
    assert accepted > runs // 10  # drafts are accepted AND rejected: both branches run
    p, impossible = first3_pvalue(emitted, _exact_first3(sharp_target, params))
    assert impossible == 0 and p > 1e-3, f"engine output is not the target's distribution (p = {p:.2e})"
    other = SamplingParams(temperature=1.0) if params.temperature != 1.0 else SamplingParams(temperature=0.6)
    p_other, _ = first3_pvalue(emitted, _exact_first3(sharp_target, other))
    assert p_other < 1e-3, "the check has no power: it cannot tell two processor settings apart"


@pytest.mark.soak
@pytest.mark.parametrize("broken", [False, True], ids=["rank-valued", "negative-control-own-q"])
def test_sampled_dynamic_tree_keeps_its_first_draws(sharp_target, broken, monkeypatch):
    """A sampled dynamic tree (children drawn without replacement, real-q rejection sampling) whose budget keeps
    2 of the root's 4 draws: the first two tokens follow the target (the first is the prefill's, the second the
    first round's; chi-square over 3000 seeds). Negative control: valuing each draw by its own q, the budget keeps
    the likeliest draws rather than the first ones, and the test must see the bias."""
    from eaglespec.draft import proposer

    if broken:
        monkeypatch.setattr(proposer, "draw_values", lambda ranked, probs, draws: probs.gather(-1, draws))
    params = SamplingParams(temperature=1.0)
    engine = SpeculativeEngine(HFTarget(sharp_target), tiny_drafter(sharp_target, seed=1),
                               TreeSpec("dynamic", depth=2, top_k=4, budget=2))
    codes, sizes = [], set()
    for seed in range(3000):
        out = engine.generate(PROMPT, 2, sampling=SamplingConfig(params, seed=seed))
        codes.append(out.token_ids[0] * V + out.token_ids[1])
        sizes.add(out.rounds[0].drafted)
    assert sizes == {2}  # the budget cut every tree
    with torch.no_grad():
        seqs = torch.cat([torch.tensor(PROMPT).expand(V, -1), torch.arange(V)[:, None]], dim=1)  # [V, P+1]
        probs = process_logits(sharp_target(seqs).logits, params).double()  # [V, P+1, V]
    exp = (probs[0, -2][:, None] * probs[:, -1]).reshape(-1) * len(codes)  # p(t1) p(t2 | t1) n
    obs = torch.bincount(torch.tensor(codes), minlength=V * V).double()
    big = exp >= 5
    o, e = torch.cat([obs[big], obs[~big].sum()[None]]), torch.cat([exp[big], exp[~big].sum()[None]])
    chi2 = float(((o - e) ** 2 / e).sum())
    pval = float(torch.special.gammaincc(torch.tensor((o.numel() - 1) / 2, dtype=torch.float64),
                                         torch.tensor(chi2 / 2, dtype=torch.float64)))
    if broken:
        assert pval < 1e-3, f"the own-q valuation went unseen (p = {pval:.2e})"
    else:
        assert pval > 1e-3, f"the first two tokens are not the target's distribution (p = {pval:.2e})"


def test_seeded_runs_are_reproducible(sharp_target):
    engine = SpeculativeEngine(HFTarget(sharp_target), tiny_drafter(sharp_target, seed=1), TreeSpec("chain", depth=3))
    cfg = SamplingConfig(SamplingParams(temperature=1.0), seed=7)
    a = engine.generate(PROMPT, 20, sampling=cfg).token_ids
    assert engine.generate(PROMPT, 20, sampling=cfg).token_ids == a
    others = {tuple(engine.generate(PROMPT, 20, sampling=SamplingConfig(cfg.target, seed=s)).token_ids)
              for s in range(8, 12)}
    assert len(others | {tuple(a)}) > 2  # different seeds give different samples


@pytest.mark.parametrize("kind", ["chain", "dynamic"])
def test_temperature_zero_takes_the_greedy_path(sharp_target, kind):
    spec = TreeSpec(kind, depth=3, top_k=3, budget=6)
    engine = SpeculativeEngine(HFTarget(sharp_target), tiny_drafter(sharp_target, seed=1), spec,
                               sampling=SamplingConfig(SamplingParams(temperature=0.0), seed=1))
    out = engine.generate(PROMPT, 16)
    assert out.token_ids == reference_greedy(sharp_target, PROMPT, 16)


def test_cli_sampling_flags():
    from transformers import GenerationConfig

    from eaglespec.cli.args import sampling_options
    from eaglespec.cli.main import build_parser

    parse = build_parser().parse_args
    args = parse(["generate", "--prompt", "x", "--top-k", "4", "--temperature", "0.7", "--sample-top-k", "5",
                  "--top-p", "0.9", "--seed", "3"])
    assert args.top_k == 4  # --top-k stays the tree width (the CLI contract)
    assert sampling_options(args, GenerationConfig()) == {"temperature": 0.7, "top_k": 5, "top_p": 0.9,
                                                          "min_p": 0.0, "seed": 3}
    assert sampling_options(parse(["generate", "--prompt", "x"]), GenerationConfig()) == {}
    assert sampling_options(parse(["generate", "--prompt", "x", "--temperature", "0"]), GenerationConfig()) == {}
    sampled = GenerationConfig(do_sample=True, temperature=0.5, top_k=0)
    assert sampling_options(parse(["generate", "--prompt", "x"]), sampled)["temperature"] == 0.5
    drafted = parse(["generate", "--prompt", "x", "--temperature", "1", "--draft-temperature", "0"])
    assert sampling_options(drafted, GenerationConfig())["draft_temperature"] == 0.0
    assert sampling_options(parse(["generate", "--prompt", "x", "--draft-temperature", "0"]), GenerationConfig()) == {}


def vector_accept(flat, target_probs, draft_probs, generator=None, replacement: bool = False):
    """The per-node vector loop (verify.tree_rejection_sample) as an Acceptance: the reference for sample_accept."""
    from eaglespec.verify import _read_path, tree_rejection_sample

    path, _, bonus = tree_rejection_sample(flat.tokens[None], flat.parents[None], flat.depths, target_probs[None],
                                           None if draft_probs is None else draft_probs[None], generator,
                                           replacement=replacement)
    on_path = torch.zeros(flat.tokens.shape[0], dtype=torch.bool, device=flat.tokens.device)
    on_path[path[0].clamp(min=0)] = True  # the -1 padding lands on the root, which is on the path anyway
    return _read_path(flat, on_path, bonus[0])


def _random_flat(kind: str, gen: torch.Generator, n: int = 12, vocab: int = 9):
    """A FlatTree in flatten's order: a chain, or a random tree (distinct sibling tokens), depths sorted."""
    from eaglespec.tree.core import FlatTree, ancestry

    if kind == "chain":
        parents = list(range(-1, n - 1))
    else:
        parents = [-1]
        depth = [0]
        for i in range(1, n):  # parents among earlier nodes keep depths non-decreasing when sorted below
            parents.append(int(torch.randint(0, i, (1,), generator=gen)))
            depth.append(depth[parents[-1]] + 1)
        order = sorted(range(n), key=lambda i: (depth[i], i))
        new = {old: k for k, old in enumerate(order)}
        parents = [-1 if parents[o] < 0 else new[parents[o]] for o in order]
    par = torch.tensor(parents)
    depths = torch.zeros(n, dtype=torch.long)
    for i in range(1, n):
        depths[i] = depths[par[i]] + 1
    tokens = torch.zeros(n, dtype=torch.long)
    for u in range(n):  # distinct tokens among each node's children
        kids = (par == u).nonzero().flatten()
        tokens[kids] = torch.randperm(vocab, generator=gen)[: kids.numel()]
    return FlatTree(tokens=tokens, depths=depths, parents=par, visible=ancestry(par).bool())


@pytest.mark.parametrize("kind,with_q", [("chain", True), ("chain", False), ("tree", False), ("tree", True)])
def test_sample_accept_equals_the_vector_rejection_loop(kind, with_q):
    """The host walk (point mass, or chains with real q) and its vector-loop fallback (trees with real q)
    take exactly tree_rejection_sample's decisions and bonus for the same random stream."""
    gen = torch.Generator().manual_seed(11)
    accepted = 0
    for seed in range(150):
        flat = _random_flat(kind, gen)
        t, v = flat.tokens.shape[0], 9
        p = torch.softmax(3 * torch.randn(t, v, generator=gen), -1)
        q = torch.softmax(3 * torch.randn(t, v, generator=gen), -1) if with_q else None
        got = sample_accept(flat, p, q, torch.Generator().manual_seed(seed))
        want = vector_accept(flat, p, q, torch.Generator().manual_seed(seed))
        assert got.rows.tolist() == want.rows.tolist() and got.bonus == want.bonus, seed
        accepted += got.accepted
    assert accepted > 10  # the draws exercise acceptance as well as rejection


@pytest.mark.parametrize("with_q", [True, False])
def test_chains_accepted_together_equal_each_alone(with_q):
    """sample_accept_chains over a batch of chains (the batched engine's sampled rows) takes each chain's decisions
    and bonus distribution exactly as sample_accept does alone, for the same coins and bonus draw; p with zeros
    (top-k) exercises the residual's support."""
    from eaglespec.verify import sample_accept_chains

    gen = torch.Generator().manual_seed(5)
    n, v, accepted, rejected = 6, 9, 0, 0
    for width in (1, 2, 5):
        for _ in range(40):
            flats = [_random_flat("chain", gen, n=width) for _ in range(n)]
            tokens = torch.stack([f.tokens for f in flats])  # [n, W]
            logits = 3 * torch.randn(n, width, v, generator=gen)
            p = torch.softmax(logits.masked_fill(logits < logits.topk(4, dim=-1).values[..., -1:], -torch.inf), -1)
            q = torch.softmax(3 * torch.randn(n, width, v, generator=gen), -1) if with_q else None
            seeds = torch.randint(0, 2**31, (n,), generator=gen).tolist()
            gens = [torch.Generator().manual_seed(s) for s in seeds]
            coins = torch.cat([torch.rand((1, width), generator=g) for g in gens])
            m, residual = sample_accept_chains(tokens, p, q, coins)
            for i, (flat, g) in enumerate(zip(flats, gens)):
                bonus = int(torch.multinomial(residual[i: i + 1], 1, generator=g))
                alone = sample_accept(flat, p[i], None if q is None else q[i], torch.Generator().manual_seed(seeds[i]))
                assert (int(m[i]), bonus) == (alone.accepted, alone.bonus)
                accepted += alone.accepted
                rejected += alone.accepted < width - 1
    assert accepted > 20 and rejected > 20  # both outcomes are exercised


def test_sample_accept_with_a_repeated_sibling_token_takes_the_vector_loop():
    """Point mass with one token twice under a node: the host walk's closed form does not hold there, so
    sample_accept must defer to the vector loop (same decisions and bonus for the same stream)."""
    from eaglespec.tree.core import FlatTree, ancestry

    parents = torch.tensor([-1, 0, 0, 0, 1])
    flat = FlatTree(tokens=torch.tensor([5, 2, 2, 4, 1]), depths=torch.tensor([0, 1, 1, 1, 2]), parents=parents,
                    visible=ancestry(parents))
    gen = torch.Generator().manual_seed(3)
    for seed in range(60):
        p = torch.softmax(2 * torch.randn(5, 6, generator=gen), -1)
        got = sample_accept(flat, p, None, torch.Generator().manual_seed(seed))
        want = vector_accept(flat, p, None, torch.Generator().manual_seed(seed))
        assert got.rows.tolist() == want.rows.tolist() and got.bonus == want.bonus, seed
