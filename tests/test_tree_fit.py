"""Static trees fitted to a drafter's acceptance statistics (tree/fit.py): the best-first fit is the optimal
parent-closed tree, the rank statistics are measured where the engine drafts, the fitted tree drafts exactly,
and a manifest's tree_defaults.static.choices round-trips (a malformed one is a one-line error)."""

from __future__ import annotations

import itertools
import json
import types
from functools import cache

import pytest
import torch

from _agree import fit_drafter
from eaglespec.api import tree_defaults, tree_spec
from eaglespec.backends.hf import HFTarget
from eaglespec.checkpoint.config import read_json
from eaglespec.draft.proposer import Proposer, shifted_tokens
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import MC_SIM_7B_63, TreeSpec, static_layout
from eaglespec.tree.fit import (
    RankCounts,
    expected_tau,
    fit_static_tree,
    measure_ranks,
    path_value,
    with_static_choices,
)

from conftest import byte_tokenizer, cycle_target, reference_greedy, tiny_drafter, tiny_target

# -- the fit -------------------------------------------------------------------------------------------

def _table(depth: int, width: int, seed: int) -> list[list[float]]:
    """A random accept table: rows of probabilities summing to < 1, decaying with rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(depth, width, generator=g, dtype=torch.float64).sort(dim=1, descending=True).values
    return (x / x.sum(1, keepdim=True) * (0.5 + 0.5 * torch.rand(depth, 1, generator=g, dtype=torch.float64))).tolist()


def _closed(paths) -> bool:
    s = set(paths)
    return all(len(p) == 1 or p[:-1] in s for p in s)


def _brute_best(table: list[list[float]], budget: int) -> float:
    """max over every parent-closed set of `budget` nodes of the summed node values."""
    depth, width = len(table), len(table[0])
    nodes = [p for d in range(1, depth + 1) for p in itertools.product(range(width), repeat=d)]
    best = -1.0
    for subset in itertools.combinations(nodes, budget):
        if _closed(subset):
            best = max(best, sum(path_value(table, p) for p in subset))
    return best


@pytest.mark.parametrize("depth, width", [(3, 2), (2, 3), (4, 1)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_is_the_best_parent_closed_tree(depth, width, seed):
    # depth rows differ a lot (row 0 low, deeper rows high): an off-by-one in the depth index changes the tree
    table = _table(depth, width, seed)
    table[0] = [x * 0.3 for x in table[0]]
    n_nodes = sum(width ** d for d in range(1, depth + 1))
    for budget in range(1, min(n_nodes, 6) + 1):
        tree = fit_static_tree(table, budget)
        assert len(tree) == budget and len(set(tree)) == budget and _closed(tree)
        static_layout(tree)  # a valid static tree
        assert all(len(p) == 1 or tree.index(p[:-1]) < tree.index(p) for p in tree)  # parents listed first
        got = sum(path_value(table, p) for p in tree)
        assert got == pytest.approx(_brute_best(table, budget), abs=1e-12)
        assert expected_tau(table, tree) == pytest.approx(1 + got, abs=1e-12)
        assert fit_static_tree(table, budget + 3)[:budget] == tree  # value order: every prefix is the best tree


def test_fit_by_hand_and_ties():
    # depth 1: ranks 0.5 / 0.3; depth 2: 0.9 / 0.05. Values: (0,) .5, (1,) .3, (0,0) .45, (1,0) .27, (0,1) .025
    table = [[0.5, 0.3], [0.9, 0.05]]
    assert fit_static_tree(table, 4) == ((0,), (0, 0), (1,), (1, 0))
    assert expected_tau(table, fit_static_tree(table, 4)) == pytest.approx(1 + 0.5 + 0.45 + 0.3 + 0.27)
    # ties: shallower first, then rank order; a child of value equal to its parent's comes after it
    tie = [[0.5, 0.5], [1.0, 0.0]]
    assert fit_static_tree(tie, 4) == ((0,), (1,), (0, 0), (1, 0))
    assert fit_static_tree(tie, 4) == fit_static_tree(tie, 4)
    assert fit_static_tree([[0.2]], 5) == ((0,),)  # the table holds one node
    assert fit_static_tree(table, 0) == ()
    for bad in ([[1.2]], [[0.6, 0.6]], [[0.5], [0.5, 0.1]], []):
        with pytest.raises(EagleSpecError):
            fit_static_tree(bad, 3)


def test_static_budget_cuts_keep_the_listed_value_order():
    table = _table(4, 4, 7)
    tree = fit_static_tree(table, 20)
    for budget in (1, 5, 12, 20):
        assert TreeSpec("static", depth=8, budget=budget, choices=tree).static_choices() == tree[:budget]
    deep = [p for p in tree if len(p) <= 2]
    assert TreeSpec("static", depth=2, budget=60, choices=tree).static_choices() == tuple(deep)
    # the default tree: unchanged (it is listed by length already)
    for depth in range(1, 7):
        for budget in range(0, 30):
            old = tuple(sorted((p for p in MC_SIM_7B_63 if len(p) <= depth), key=len)[:budget])
            assert TreeSpec("static", depth=depth, budget=budget).static_choices() == old
    # a list with a child before its parent is still sorted by length first
    assert TreeSpec("static", budget=2, choices=[(0, 0), (0,), (1,)]).static_choices() == ((0,), (1,))


def test_a_budget_above_the_tree_is_named(capsys):
    assert TreeSpec("static", depth=6, budget=40).static_shortfall() is not None
    assert TreeSpec("static", depth=5, budget=25).static_shortfall() is None
    assert TreeSpec("dynamic", budget=400).static_shortfall() is None
    spec = tree_spec("static", depth=6, budget=40)
    assert len(spec.static_choices()) == 25
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "budget 40" in err and "25 nodes" in err
    tree_spec("static")  # the generic budget (60) means the whole tree: no note
    tree_spec("static", budget=25)
    tree_spec("dynamic", budget=400)
    assert capsys.readouterr().err == ""
    tree_spec("static", defaults={"static": {"budget": 30}})  # a recommended budget is named too
    assert "budget 30" in capsys.readouterr().err


# -- the statistics ------------------------------------------------------------------------------------

def _oracle_engine(rank: int, depth: int = 4):
    """A target whose greedy token depends on the last token only (conftest.cycle_target), and a drafter whose
    logits put the target's next token after the token it is fed at rank `rank` exactly."""
    tok = byte_tokenizer()
    model = cycle_target(tok)
    vocab = model.get_output_embeddings().weight.shape[0]
    with torch.no_grad():
        nxt = model(torch.arange(vocab)[:, None]).logits[:, -1].argmax(-1)  # [V]: next token after each token
    drafter = tiny_drafter(model, seed=3)
    engine = SpeculativeEngine(HFTarget(model), drafter, TreeSpec("chain", depth=depth))
    real = drafter.forward

    def forward(state, tokens, positions, cache, visible=None):
        _, states = real(state, tokens, positions, cache, visible=visible)
        want = nxt[tokens]  # the target's token after each fed token
        logits = torch.zeros(tokens.shape[0], vocab)
        ahead = [(want + j + 1) % vocab for j in range(rank)]  # `rank` other tokens score higher
        for j, other in enumerate(ahead):
            logits[torch.arange(tokens.shape[0]), other] = 30.0 - j
        logits[torch.arange(tokens.shape[0]), want] = 10.0
        return logits, states

    drafter.forward = forward
    return model, engine


@pytest.mark.parametrize("rank", [0, 2])
def test_a_drafter_that_ranks_the_target_token_at_r_gives_accept_r_one(rank):
    model, engine = _oracle_engine(rank)
    prompt = [40, 41, 42]
    answer = reference_greedy(model, prompt, 12)
    ids, a = prompt + answer, len(prompt)
    counts = measure_ranks(engine, ids, a, depth=5, top_k=4)
    n = len(ids)
    # every answer position is a root (anchors a-1 .. n-2); depth d is observed while the text lasts
    expected = torch.zeros(5, 5, dtype=torch.long)
    for d in range(1, 6):
        expected[d - 1, rank] = n - a - d
    assert torch.equal(counts.counts, expected)
    acc = counts.accept()
    assert torch.equal(acc[:, rank], torch.ones(5, dtype=torch.float64))
    assert fit_static_tree(acc, 5) == tuple((rank,) * d for d in range(1, 6))  # the chain of rank `rank`
    assert "depth" in counts.table()


def test_a_token_outside_the_top_k_stops_the_path():
    model, engine = _oracle_engine(rank=3)
    prompt = [40, 41]
    answer = reference_greedy(model, prompt, 8)
    counts = measure_ranks(engine, prompt + answer, len(prompt), depth=3, top_k=3)
    assert counts.counts[0].tolist() == [0, 0, 0, len(answer) - 1]  # all at depth 1 in the miss column
    assert counts.reached[1:].tolist() == [0, 0]  # no path goes further
    assert counts.accept().sum() == 0


def test_depth_one_ranks_equal_one_causal_drafter_pass():
    """Depth 1 from an independent computation: the drafter over every committed row at once (row t: f_t with
    x_{t+1}, predicting x_{t+2}), the rank of the target's token after row t+1 among its top K."""
    model, drafter = agreeing()
    engine = SpeculativeEngine(HFTarget(model), drafter, TreeSpec("chain", depth=3))
    prompt = [7, 8, 9, 10]
    ids = prompt + reference_greedy(model, prompt, 20)
    a, n, k = len(prompt), len(ids), 4
    counts = measure_ranks(engine, ids, a, depth=3, top_k=k)
    x = torch.tensor(ids)
    target = engine.target
    target.reset()
    out = target.forward(x)
    truth = out.logits.argmax(-1)
    with torch.no_grad():
        logits, _ = drafter(drafter.project(out.features[:-1]), x[1:], torch.arange(n - 1), drafter.new_cache())
    top = drafter.to_target_ids(torch.softmax(logits, -1).topk(k, dim=-1).indices)  # [n-1, k]
    want = torch.zeros(k + 1, dtype=torch.long)
    for t in range(a - 1, n - 2):
        hit = (top[t] == truth[t + 1]).nonzero()
        want[int(hit[0, 0]) if hit.numel() else k] += 1
    assert torch.equal(counts.counts[0], want)
    assert counts.reached[0] == n - a - 1 and want[0] > 0


def test_rank_zero_paths_match_the_engines_own_chains():
    """Deeper depths against the engine's own drafting: from every anchor, Proposer.propose's greedy chain (its
    drafted tokens fed, positions and masks as in a round) is accepted to depth d exactly when measure_ranks
    found rank 0 at depths 1..d (its per-anchor rank paths), with the same draft probabilities there; and the
    chain's tau from those paths."""
    model, drafter = agreeing()
    depth = 4
    engine = SpeculativeEngine(HFTarget(model), drafter, TreeSpec("chain", depth=depth))
    g = torch.Generator().manual_seed(11)
    counts, reach = RankCounts.zeros(depth, 3), torch.zeros(depth, dtype=torch.long)
    for _ in range(3):
        prompt = torch.randint(3, 90, (4,), generator=g).tolist()
        ids = prompt + reference_greedy(model, prompt, 24)
        a, n = len(prompt), len(ids)
        counts += measure_ranks(engine, ids, a, depth, 3)
        x = torch.tensor(ids)
        engine.target.reset()
        out = engine.target.forward(x)
        truth, feats = out.logits.argmax(-1), out.features
        prop = Proposer(drafter, TreeSpec("chain", depth=depth))
        prop.catch_up(feats[:a - 1], shifted_tokens(x, 0, a - 1))
        for i, t in enumerate(range(a - 1, n - 1)):
            tree = prop.propose(x[t + 1], feats[t:t + 1], shifted_tokens(x, t, 1))
            chain, conf = tree.tokens[1:], tree.logq.diff().exp()  # conf[d-1]: the draft probability at depth d
            d = 0
            while d < depth and t + 2 + d <= n - 1 and chain[d] == truth[t + 1 + d]:
                # the same token with the same draft probability: same positions, masks and states as a round
                assert counts.confs[-(n - a) + i][d] == pytest.approx(float(conf[d]), abs=1e-5)
                reach[d] += 1
                d += 1
    zeros = torch.tensor([sum(p[:d] == (0,) * d for p in counts.paths) for d in range(1, depth + 1)])
    assert torch.equal(zeros, reach)
    assert reach[1] > 0  # depth 2 and beyond are exercised
    assert counts.counts[:, 0].sum() >= reach.sum()  # rank 0 below a rank-1 parent counts in the table too
    chain = [(0,) * d for d in range(1, depth + 1)]
    assert counts.empirical_tau(chain) == pytest.approx(1 + float(reach.sum()) / len(counts.paths))


# -- the fitted tree drafts exactly ---------------------------------------------------------------------

@cache
def agreeing():
    model = tiny_target("llama", seed=3)
    return model, fit_drafter(model, tiny_drafter(model, seed=0), steps=60, n_seqs=8, length=32)


def test_fitted_tree_is_exact_and_accepts():
    model, drafter = agreeing()
    engine = SpeculativeEngine(HFTarget(model), drafter, TreeSpec("chain", depth=4))
    counts = RankCounts.zeros(4, 4)
    g = torch.Generator().manual_seed(5)
    for _ in range(3):
        prompt = torch.randint(3, 90, (5,), generator=g).tolist()
        counts += measure_ranks(engine, prompt + reference_greedy(model, prompt, 24), len(prompt), 4, 4)
    tree = fit_static_tree(counts.accept(), 12)
    assert len(tree) == 12 and _closed(tree)
    spec = TreeSpec("static", depth=4, budget=12, choices=tree)
    engine = SpeculativeEngine(HFTarget(model), drafter, spec)
    accepted = 0
    for prompt in ([5, 6, 7], [11, 3, 40, 41, 42, 9]):
        out = engine.generate(prompt, max_new_tokens=24)
        assert out.token_ids == reference_greedy(model, prompt, 24)
        accepted += sum(r.accepted for r in out.rounds)
        assert all(r.drafted <= 12 for r in out.rounds)
    assert accepted > 0


# -- the manifest ---------------------------------------------------------------------------------------

def _drafter(manifest):
    return types.SimpleNamespace(manifest=manifest)


def test_manifest_choices_round_trip(tmp_path, capsys):
    tree = fit_static_tree(_table(5, 4, 3), 30)
    base = {"eaglespec_manifest": 1, "tree_defaults": {"static": {"depth": 5, "top_k": 10, "budget": 25},
                                                      "measured": "notes"}}
    path = tmp_path / "eaglespec_manifest.json"
    path.write_text(json.dumps(with_static_choices(base, tree, "fitted by hand")))
    manifest = read_json(path)
    assert manifest["tree_defaults"]["measured"] == "notes" and base["tree_defaults"]["static"]["budget"] == 25
    found = tree_defaults(_drafter(manifest), "drafter /x")
    assert found["static"]["choices"] == tree
    assert (found["static"]["depth"], found["static"]["budget"]) == (max(map(len, tree)), 30)
    spec = tree_spec("static", defaults=found)
    assert spec.choices == tree and spec.static_choices() == tree
    assert tree_spec("static", budget=10, defaults=found).static_choices() == tree[:10]  # flags cut the fitted tree
    assert tree_spec("static", depth=2, defaults=found).static_choices() == tuple(p for p in tree if len(p) <= 2)
    assert tree_spec("dynamic", defaults=found).choices is None
    assert capsys.readouterr().err == ""
    tree_spec("static", budget=31, defaults=found)
    err = capsys.readouterr().err
    assert "budget 31" in err and "the given static tree has 30 nodes" in err


@pytest.mark.parametrize("choices, why", [
    ([[0], [0, 0], [1, 1]], "no parent path"),
    ([[0], [-1]], "ranks >= 0"),
    ([[0], [0]], "appears twice"),
    ([[0], [True]], "ranks >= 0"),
    ([], "non-empty list"),
    ([0, 1], "non-empty list"),
    ("[[0]]", "non-empty list"),
])
def test_malformed_manifest_choices_are_one_line_errors(choices, why):
    manifest = {"tree_defaults": {"static": {"depth": 3, "choices": choices}}}
    with pytest.raises(EagleSpecError, match=why) as err:
        tree_defaults(_drafter(manifest), "drafter /x")
    msg = str(err.value)
    assert msg.startswith("drafter /x: eaglespec_manifest.json field tree_defaults.static.choices") and "\n" not in msg
    with pytest.raises(EagleSpecError, match=r"tree_defaults\.dynamic\.choices"):  # only static trees take choices
        tree_defaults(_drafter({"tree_defaults": {"dynamic": {"choices": [[0]]}}}), "drafter /x")
