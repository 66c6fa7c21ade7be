"""Tree construction (EAGLE-2 dynamic, static, chain) and flattening, without a drafter."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import eaglespec.tree.core as tree_mod
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import (
    MC_SIM_7B_63,
    Candidates,
    DraftTree,
    TreeSpec,
    ancestry,
    chain_tree,
    check_dynamic_flags,
    draft_topk,
    dynamic_tree,
    flatten,
    grow_dynamic,
    grow_dynamic_tree,
    select_nodes,
    select_tree,
    static_layout,
)

# -- the article's fixture ------------------------------------------------------------------------
A, B, A1, A2, B1, B2 = 10, 11, 20, 21, 22, 23
ROOT = 5


def _article_expand(nodes: torch.Tensor, cand: Candidates, depth: int):
    children = {A: ([A1, A2], [0.80, 0.20]), B: ([B1, B2], [0.95, 0.05])}
    toks, confs = zip(*(children[int(cand.tokens[i])] for i in nodes))
    return torch.tensor(toks), torch.tensor(confs)


def _paths(tree: DraftTree) -> list[tuple[int, ...]]:
    """Each node as its root-to-node token path (root excluded), in node order."""
    out = []
    for i in range(1, tree.size):
        path, j = [], i
        while j > 0:
            path.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
        out.append(tuple(reversed(path)))
    return out


def test_article_fixture_selects_a_a1_b_b1():
    tree = dynamic_tree(ROOT, torch.tensor([A, B]), torch.tensor([0.60, 0.40]), _article_expand,
                        top_k=2, depth=2, budget=4)
    assert sorted(_paths(tree)) == sorted([(A,), (A, A1), (B,), (B, B1)])  # breadth-first would take A2
    assert int(tree.tokens[0]) == ROOT
    # selection order is (-log value, depth, id): A .60, A1 .48, B .40, B1 .38
    order = torch.sort(-tree.logq[1:], stable=True).indices + 1
    assert [_paths(tree)[i - 1] for i in order.tolist()] == [(A,), (A, A1), (B,), (B, B1)]
    expected = torch.tensor([0.60, 0.48, 0.40, 0.38]).log()
    assert torch.allclose(tree.logq[order], expected)


def test_article_fixture_budget_5_adds_a2_last():
    tree = dynamic_tree(ROOT, torch.tensor([A, B]), torch.tensor([0.60, 0.40]), _article_expand,
                        top_k=2, depth=2, budget=5)
    assert set(_paths(tree)) == {(A,), (A, A1), (B,), (B, B1), (A, A2)}


def test_confidence_is_conditional_not_renormalised():
    """top_k=1 keeps only A1 under A: its value stays 0.6*0.8, not 0.6*1.0."""
    tree = dynamic_tree(ROOT, torch.tensor([A, B]), torch.tensor([0.60, 0.40]), _article_expand,
                        top_k=1, depth=2, budget=2)
    assert _paths(tree) == [(A,), (A, A1)]
    assert torch.allclose(tree.logq[1:], torch.tensor([0.6, 0.48]).log())


def test_one_expansion_call_per_depth():
    calls = []

    def expand(nodes, cand, depth):
        calls.append((depth, nodes.numel()))
        n = nodes.numel()
        return torch.arange(3).repeat(n, 1) + 100 * depth, torch.full((n, 3), 0.3)

    dynamic_tree(0, torch.arange(3), torch.full((3,), 0.3), expand, top_k=2, depth=4, budget=6)
    assert calls == [(1, 2), (2, 2), (3, 2)]  # depth-1 layer from the root, then top-2 per depth


def test_budget_and_depth_zero_mean_no_speculation():
    for depth, budget in ((0, 5), (3, 0)):
        tree = dynamic_tree(ROOT, torch.tensor([A, B]), torch.tensor([0.6, 0.4]), _article_expand,
                            top_k=2, depth=depth, budget=budget)
        assert tree.size == 1 and int(tree.tokens[0]) == ROOT
    assert not TreeSpec("dynamic", budget=0).speculates
    assert not TreeSpec("static", depth=0).speculates
    assert TreeSpec("dynamic").speculates


@pytest.mark.parametrize("kwargs, match", [
    (dict(top_k=0), "width"), (dict(depth=-1), "depth"), (dict(budget=-2), "budget"),
    (dict(budget=1.5), "budget"), (dict(top_k=True), "width"),
])
def test_spec_validation(kwargs, match):
    with pytest.raises(EagleSpecError, match=match):
        TreeSpec("dynamic", **kwargs)
    args = dict(top_k=2, depth=2, budget=4) | kwargs
    with pytest.raises(EagleSpecError, match=match):
        dynamic_tree(ROOT, torch.tensor([A, B]), torch.tensor([0.6, 0.4]), _article_expand, **args)


@pytest.mark.parametrize("tokens, conf, match", [
    ([A, B], [0.6, float("nan")], "finite"),
    ([A, B], [float("inf"), 0.0], "finite"),
    ([A, B], [0.3, float("-inf")], "finite"),
    ([A, B], [0.6, -0.1], r"\[0, 1\]"),
    ([A, B], [1.2, 0.0], r"\[0, 1\]"),
    ([A, A], [0.5, 0.4], "same child token"),
    ([A, B], [0.7, 0.6], "sum to more than 1"),
])
def test_child_validation_at_the_root(tokens, conf, match):
    with pytest.raises(EagleSpecError, match=match):
        dynamic_tree(ROOT, torch.tensor(tokens), torch.tensor(conf), _article_expand, top_k=2, depth=2, budget=3)


def test_child_validation_below_the_root():
    def dup(nodes, cand, depth):
        return torch.tensor([[7, 7]]).repeat(nodes.numel(), 1), torch.tensor([[0.3, 0.3]]).repeat(nodes.numel(), 1)

    with pytest.raises(EagleSpecError, match="same child token"):
        dynamic_tree(ROOT, torch.tensor([A, B]), torch.tensor([0.6, 0.4]), dup, top_k=2, depth=2, budget=3)


def test_selection_never_repairs_a_non_closed_set():
    """select_tree asserts closure: a child valued above its parent (impossible from valid input) fails."""
    cand = Candidates(tokens=torch.tensor([1, 2]), parents=torch.tensor([-1, 0]), depths=torch.tensor([1, 2]),
                      logv=torch.tensor([-2.0, -1.0]))
    with pytest.raises(AssertionError, match="ancestor-closed"):
        select_tree(0, cand, budget=1)



def test_selection_flags_a_parent_beyond_every_chosen_id():
    """Closure is checked by id, not by position: a chosen node whose parent id is above every chosen id."""
    cand = Candidates(tokens=torch.tensor([1, 2, 3]), parents=torch.tensor([-1, 2, -1]),
                      depths=torch.tensor([1, 2, 1]), logv=torch.tensor([-1.0, -2.0, -3.0]))
    with pytest.raises(AssertionError, match="ancestor-closed"):
        select_tree(0, cand, budget=2)  # ids 0 and 1: 1's parent (2) is not chosen


def test_candidates_join_row_major_parts():
    """Layers given as [n, c] parts (expanded views included) read row-major, as [m] parts do; one width or mixed."""
    lv = torch.arange(-1, 4)
    cand = Candidates(tokens=torch.tensor([[5, 6, 7]]), parents=lv[0].expand(1, 3), depths=lv[2].expand(1, 3),
                      logv=torch.tensor([[-1.0, -2.0, -3.0]]))
    assert cand.size == 3 and torch.equal(cand.newest_tokens, torch.tensor([5, 6, 7]))
    ids = torch.tensor([0, 2])
    cand.append(torch.tensor([[8, 9, 10], [11, 12, 13]]), ids[:, None].expand(2, 3), lv[3].expand(2, 3),
                torch.full((2, 3), -4.0))
    assert cand.start == 3 and cand.size == 9 and torch.equal(cand.newest_tokens, torch.arange(8, 14))
    assert torch.equal(cand.tokens, torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 13]))
    assert torch.equal(cand.parents, torch.tensor([-1, -1, -1, 0, 0, 0, 2, 2, 2]))
    assert torch.equal(cand.depths, torch.tensor([1, 1, 1, 2, 2, 2, 2, 2, 2]))
    cand.append(torch.tensor([[14], [15]]), torch.tensor([3, 4])[:, None].expand(2, 1), lv[4].expand(2, 1),
                torch.full((2, 1), -5.0))  # another width, after a read
    assert torch.equal(cand.parents, torch.tensor([-1, -1, -1, 0, 0, 0, 2, 2, 2, 3, 4]))
    assert torch.equal(cand.depths, torch.tensor([1, 1, 1, 2, 2, 2, 2, 2, 2, 3, 3]))
    assert torch.equal(cand.logv, torch.tensor([-1.0, -2, -3, -4, -4, -4, -4, -4, -4, -5, -5]))


def _width_two_expand(nodes, cand, depth):
    return torch.tensor([[7, 8]]).repeat(nodes.numel(), 1) + 10 * depth, torch.tensor([[0.5, 0.25]]).repeat(
        nodes.numel(), 1)


def test_grow_dynamic_tree_token_map_and_distinct_children():
    """token_map maps every token but the root's; distinct_children only skips the duplicate check."""
    args = (ROOT, torch.tensor([A, B, 12]), torch.tensor([0.5, 0.3, 0.2]), _width_two_expand, 3, 3, 7)
    plain, flags = grow_dynamic_tree(*args, sorted_children=True)  # root width 3, expansions width 2
    check_dynamic_flags(flags)
    mapped, mflags = grow_dynamic_tree(*args, sorted_children=True, distinct_children=True,
                                       token_map=lambda t: t * 100)
    assert torch.equal(flags, mflags) and not flags.any()
    assert int(mapped.tokens[0]) == ROOT and torch.equal(mapped.tokens[1:], plain.tokens[1:] * 100)
    assert torch.equal(mapped.parents, plain.parents) and torch.equal(mapped.depths, plain.depths)
    assert torch.equal(mapped.logq, plain.logq)
    # with_chosen: node j >= 1 is candidate chosen[j - 1] (its token, parent's candidate and value), in node order
    seen = {}

    def recording(nodes, cand, depth):
        seen["cand"] = cand
        return _width_two_expand(nodes, cand, depth)

    tree, _, chosen = grow_dynamic_tree(ROOT, *args[1:3], recording, *args[4:], sorted_children=True, with_chosen=True)
    cand = seen["cand"]
    assert chosen.shape[0] == tree.size - 1 == 7 and bool((chosen[1:] > chosen[:-1]).all())
    assert torch.equal(tree.tokens[1:], cand.tokens[chosen]) and torch.equal(tree.logq[1:], cand.logv[chosen])
    node_of = {int(c): j + 1 for j, c in enumerate(chosen.tolist())}
    assert [node_of.get(int(cand.parents[c]), 0) for c in chosen] == tree.parents[1:].tolist()
    empty, _, none = grow_dynamic_tree(*args[:6], 0, with_chosen=True)  # budget 0: the root alone
    assert empty.size == 1 and none.numel() == 0

    def dup(nodes, cand, depth):
        return torch.tensor([[7, 7]]).repeat(nodes.numel(), 1), torch.tensor([[0.5, 0.25]]).repeat(nodes.numel(), 1)

    dup_args = (ROOT, torch.tensor([A, B, 12]), torch.tensor([0.5, 0.3, 0.2]), dup, 3, 3, 7)
    _, flags = grow_dynamic_tree(*dup_args, sorted_children=True)
    assert flags.tolist() == [False, True, False, False]
    _, flags = grow_dynamic_tree(*dup_args, sorted_children=True, distinct_children=True)
    assert flags.tolist() == [False, False, False, False]

    def bad(nodes, cand, depth):  # mixed widths (3 at the root, 2 below): every flag still reported
        return torch.tensor([[7, 8]]).repeat(nodes.numel(), 1), torch.tensor([[0.9, 0.6]]).repeat(nodes.numel(), 1)

    _, flags = grow_dynamic_tree(ROOT, torch.tensor([A, A, 12]), torch.tensor([0.5, 0.3, float("nan")]), bad,
                                 3, 3, 7, sorted_children=True)
    assert flags.tolist() == [True, True, True, False]


# -- property tests -------------------------------------------------------------------------------

@st.composite
def growth_cases(draw):
    width = draw(st.integers(1, 4))
    depth = draw(st.integers(1, 5))
    budget = draw(st.integers(0, 30))
    n_children = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    ties = draw(st.booleans())
    return width, depth, budget, n_children, seed, ties


def _random_expand(n_children: int, seed: int, ties: bool):
    """Children whose confidences depend only on the node's path (deterministic per path)."""

    def conf_for(path: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((seed, *path)) % (2**31))
        if ties:  # heavy ties: a few quantised levels, some exact zeros and ones
            raw = torch.randint(0, 3, (n_children,), generator=g).float() / 2
            raw = raw / max(1.0, float(raw.sum()))
        else:
            raw = torch.rand(n_children + 1, generator=g)
            raw = (raw / raw.sum())[:n_children]
        return raw

    def path_of(cand: Candidates, i: int) -> tuple[int, ...]:
        path = []
        while i >= 0:
            path.append(int(cand.tokens[i]))
            i = int(cand.parents[i])
        return tuple(reversed(path))

    def expand(nodes, cand, depth):
        toks = torch.arange(n_children).repeat(nodes.numel(), 1) + 10 * (depth + 1)
        confs = torch.stack([conf_for(path_of(cand, int(i))) for i in nodes])
        return toks, confs

    return conf_for(()), expand


@settings(max_examples=60, deadline=None)
@given(growth_cases())
def test_dynamic_tree_properties(case):
    width, depth, budget, n_children, seed, ties = case
    root_conf, expand = _random_expand(n_children, seed, ties)
    root_tok = torch.arange(n_children) + 10
    tree = dynamic_tree(0, root_tok, root_conf, expand, width, depth, budget)
    again = dynamic_tree(0, root_tok, root_conf, expand, width, depth, budget)
    # deterministic
    assert torch.equal(tree.tokens, again.tokens) and torch.equal(tree.parents, again.parents)
    # within budget; full budget used when enough candidates exist
    c = min(width, n_children)  # children kept per expanded node
    n_cand, newest = c, c
    for _ in range(depth - 1):
        newest = min(width, newest) * c
        n_cand += newest
    assert tree.size - 1 == min(budget, n_cand)
    # depth order, ancestor-closed, depths consistent
    assert int(tree.parents[0]) == -1
    for i in range(1, tree.size):
        p = int(tree.parents[i])
        assert 0 <= p < i
        assert int(tree.depths[i]) == int(tree.depths[p]) + 1 <= depth
        assert float(tree.logq[i]) <= float(tree.logq[p]) + 1e-6  # monotone values
    # mask == ancestor relation: no sibling/cousin edge, no future edge
    flat = flatten(tree)
    anc = torch.zeros(tree.size, tree.size, dtype=torch.bool)
    for i in range(tree.size):
        j = i
        while j >= 0:
            anc[i, j] = True
            j = int(tree.parents[j])
    assert torch.equal(flat.visible, anc)
    assert not flat.visible.triu(1).any()


@settings(max_examples=60, deadline=None)
@given(growth_cases())
def test_selection_is_global_top_budget(case):
    """Every selected node is valued >= every unselected candidate (ties to the shallower / earlier)."""
    width, depth, budget, n_children, seed, ties = case
    root_conf, expand = _random_expand(n_children, seed, ties)
    cand, flags = grow_dynamic(torch.arange(n_children) + 10, root_conf, expand, width, depth)
    assert flags == [False, False, False]
    chosen = select_nodes(cand, budget).tolist()
    assert len(chosen) == min(budget, cand.size) and chosen == sorted(set(chosen))
    rest = sorted(set(range(cand.size)) - set(chosen))
    if chosen and rest:
        key = [(-v, d, i) for i, (v, d) in enumerate(zip(cand.logv.tolist(), cand.depths.tolist()))]
        assert max(key[i] for i in chosen) < min(key[i] for i in rest)
    tree = select_tree(0, cand, budget)
    assert torch.equal(tree.logq[1:], cand.logv[chosen])


# -- flatten --------------------------------------------------------------------------------------

def test_flatten_chain_and_retrieve():
    tree = chain_tree(7, torch.tensor([3, 4, 5]))
    flat = flatten(tree)
    assert torch.equal(flat.visible, torch.ones(4, 4, dtype=torch.bool).tril())
    assert flat.retrieve.tolist() == [[0, 1, 2, 3]]
    assert flat.depths.tolist() == [0, 1, 2, 3]


def test_flatten_tree_retrieve_paths():
    # root -> 1, 2 ; 1 -> 3, 4 ; 2 -> 5 ; 4 -> 6
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 4])
    depths = torch.tensor([0, 1, 1, 2, 2, 2, 3])
    flat = flatten(DraftTree(tokens=torch.arange(7), parents=parents, depths=depths))
    assert flat.retrieve.tolist() == [[0, 1, 3, -1], [0, 2, 5, -1], [0, 1, 4, 6]]
    assert flat.visible[6].nonzero().flatten().tolist() == [0, 1, 4, 6]
    assert not flat.visible[3, 4] and not flat.visible[5, 1]  # sibling / cousin


@pytest.mark.parametrize("depth", range(1, 10))
def test_ancestry_with_max_depth_is_the_full_closure(depth):
    """max_depth bounds the squarings (2^k levels after k): for trees whose deepest node is exactly `depth`, the
    result equals the brute-force ancestor sets (an off-by-one in the bound misses the deepest ancestors)."""
    g = torch.Generator().manual_seed(depth)
    parents, depths = [-1], [0]
    for i in range(1, 3 * depth + 8):  # a chain down to `depth`, then random nodes no deeper
        p = i - 1 if i <= depth else int(torch.randint(0, i, (1,), generator=g))
        if depths[p] == depth:
            p = 0
        parents.append(p)
        depths.append(depths[p] + 1)
    n = len(parents)
    expected = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            expected[i, j] = True
            j = parents[j]
    got = ancestry(torch.tensor(parents), max_depth=depth)
    assert max(depths) == depth and torch.equal(got, expected) and torch.equal(ancestry(torch.tensor(parents)), expected)


def test_ancestry_rejects_non_depth_order():
    with pytest.raises(ValueError, match="depth order"):
        ancestry(torch.tensor([-1, 2, 0]))


# -- static trees ---------------------------------------------------------------------------------

def test_static_layout_mc_sim():
    layout = static_layout(MC_SIM_7B_63)
    assert len(layout.parents) == 26 and max(layout.depths) == 5 and layout.max_rank == 3
    for i in range(1, 26):
        assert layout.parents[i] < i and layout.depths[i] == layout.depths[layout.parents[i]] + 1
    spec = TreeSpec("static", depth=3, budget=60)
    assert all(len(p) <= 3 for p in spec.static_choices()) and len(spec.static_choices()) == 20
    assert len(TreeSpec("static", depth=8, budget=7).static_choices()) == 7
    static_layout(TreeSpec("static", depth=8, budget=7).static_choices())  # a budget cut stays closed


@pytest.mark.parametrize("choices, match", [
    ([[0], [0, 1], [0, 1]], "twice"), ([[0], [1, 0]], "no parent"), ([[0], [-1]], "ranks"), ([[]], "non-empty"),
])
def test_static_layout_validation(choices, match):
    with pytest.raises(EagleSpecError, match=match):
        TreeSpec("static", choices=choices)


# -- the grower against EAGLE-2 written out in plain Python ----------------------------------------

PRIMES = (5, 7, 11, 13, 17)  # the confidences at depth d are 0, 1/p_d or 1/p_d^2


def _prime_conf(path: tuple[int, ...], n_children: int, seed: int) -> list[float]:
    """Deterministic per path, with ties among siblings (and between cousins on equal paths), zeros,
    and no accidental ties between different paths: a path value is a product of distinct prime
    powers per depth (or the 1e-12 floor), so float32 and float64 order it alike."""
    g = torch.Generator().manual_seed(hash((seed, *path)) % (2**31))
    p = PRIMES[len(path)]
    levels = torch.tensor([0.0, 1 / p, 1 / p**2])
    return levels[torch.randint(0, 3, (n_children,), generator=g)].tolist()


def _reference_eagle2(root_conf: list[float], conf_of, tokens_of, top_k: int, depth: int, budget: int):
    """EAGLE-2 by the definition, in Python floats: stable sorts on explicit keys, ties to the lower id.

    Returns the selected candidates as (token path, value) in depth order, then candidate id order.
    """
    def top(ids, k, values):
        return sorted(ids, key=lambda i: -values[i])[:k]  # sorted() is stable: ties keep id order

    cands = []  # dicts: path (tokens), depth, logv
    for j in top(range(len(root_conf)), top_k, root_conf):
        cands.append({"path": (tokens_of(())[j],), "logv": math.log(max(root_conf[j], 1e-12))})
    newest = list(range(len(cands)))
    for _ in range(1, depth):
        logv = [c["logv"] for c in cands]
        layer = top(newest, top_k, logv)
        start = len(cands)
        for i in layer:
            path = cands[i]["path"]
            conf, toks = conf_of(path), tokens_of(path)
            for j in top(range(len(conf)), top_k, conf):
                cands.append({"path": (*path, toks[j]), "logv": logv[i] + math.log(max(conf[j], 1e-12))})
        newest = list(range(start, len(cands)))
    chosen = sorted(top(range(len(cands)), budget, [c["logv"] for c in cands]))
    return [(cands[i]["path"], cands[i]["logv"]) for i in chosen]


@pytest.mark.parametrize("sorted_children", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_dynamic_tree_equals_plain_python_reference(seed, sorted_children):
    """Same nodes, parents and values as the definition, with sibling ties, zero confidences and a
    budget that cuts through ties; `sorted_children` (the proposer's top-k input) changes nothing."""
    g = torch.Generator().manual_seed(seed)
    width, depth, n_children = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((1, 5), (1, 6), (1, 6)))
    budget = int(torch.randint(0, 40, (1,), generator=g))

    def tokens_of(path):  # distinct per parent; depend on the path so that paths are tokens
        return [100 * len(path) + 10 * (path[-1] % 7 if path else 0) + j for j in range(n_children)]

    def conf_of(path):
        return _prime_conf(path, n_children, seed)

    def as_input(path):
        """The children of `path` as tensors, sorted (top-k, stable) when `sorted_children`."""
        tok, conf = torch.tensor(tokens_of(path)), torch.tensor(conf_of(path))
        if sorted_children:
            order = conf.sort(descending=True, stable=True).indices[:width]
            tok, conf = tok[order], conf[order]
        return tok, conf

    def expand(nodes, cand, d):
        rows = []
        for i in nodes.tolist():
            path = []
            while i >= 0:
                path.append(int(cand.tokens[i]))
                i = int(cand.parents[i])
            rows.append(as_input(tuple(reversed(path))))
        return torch.stack([t for t, _ in rows]), torch.stack([c for _, c in rows])

    root_tok, root_conf = as_input(())
    tree = dynamic_tree(0, root_tok, root_conf, expand, width, depth, budget, sorted_children=sorted_children)
    ref = _reference_eagle2(conf_of(()), conf_of, tokens_of, width, depth, budget)
    assert [p for p, _ in ref] == _paths(tree)
    logq = tree.logq[1:] if tree.logq is not None else torch.zeros(0)  # budget 0: the bare root
    assert torch.allclose(logq.double(), torch.tensor([v for _, v in ref], dtype=torch.float64), rtol=1e-6, atol=1e-5)
    assert torch.equal(tree.depths[1:], torch.tensor([len(p) for p, _ in ref], dtype=torch.long))


# -- draft_topk: the two-stage top-k ----------------------------------------------------------------

def force_split_topk(monkeypatch, chunk: int = 8) -> None:
    """draft_topk's two stages on CPU too (CUDA only by default), with chunks of >= `chunk` entries."""
    monkeypatch.setattr(tree_mod, "TOPK_SPLIT_DEVICES", ("cpu", "cuda"))
    monkeypatch.setattr(tree_mod, "TOPK_CHUNK", chunk)


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
@pytest.mark.parametrize(("shape", "k", "chunks"), [
    ((5, 96), 1, 12), ((5, 96), 3, 12), ((5, 96), 8, 12), ((5, 96), 10, 8), ((5, 96), 96, 1),
    ((96,), 4, 12), ((2, 3, 96), 6, 12), ((4, 97), 3, 1), ((4, 12000), 10, 1200),
])
def test_draft_topk_equals_torch_topk(monkeypatch, shape, k, chunks, ties):
    """Same values as torch.topk (sorted, descending), indices pointing at them, distinct per row, and
    torch.topk's index set wherever the k-th value is not tied with the (k+1)-th. k = 1 and k = V; V prime
    (no chunking)."""
    force_split_topk(monkeypatch)
    assert tree_mod._topk_chunks(shape[-1], k, 8) == chunks  # the two stages ran where chunks > 1
    gen = torch.Generator().manual_seed(k + shape[-1])
    for _ in range(20):
        x = torch.randint(0, 6, shape, generator=gen).float() if ties else torch.rand(shape, generator=gen)
        vals, idx = draft_topk(x, k)
        ref_vals, ref_idx = x.topk(k, dim=-1)
        assert torch.equal(vals, ref_vals)
        assert torch.equal(x.gather(-1, idx), vals)
        assert torch.equal(idx.sort(-1).values.diff(dim=-1) > 0, torch.ones_like(idx[..., 1:], dtype=torch.bool))
        if k < shape[-1]:
            clear = x.topk(k + 1, dim=-1).values.diff(dim=-1)[..., -1] < 0  # [...] the k-th beats the next
            assert torch.equal(idx.sort(-1).values[clear], ref_idx.sort(-1).values[clear])
            assert ties or bool(clear.all())
