"""The tree kernels (eaglespec.kernels.tree) under Triton's CPU interpreter (TRITON_INTERPRET=1, set by conftest):
children (softmax + top-k + log value, per chunk then merged) against softmax().topk(), race_children (a sampled
tree's draws) against topk(q / E), rank_top against a stable sort, select_tree, expand_rows, ancestry and the two
acceptance kernels against the torch code, and the trees and rounds they make: the same trees as the torch path,
greedy output identical to HF generate, sampled output identical to the torch path's for one seed."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("triton")

from _engines import enable_draft_graphs, enable_round_graphs
from eaglespec.backends.fast import FastTarget
from eaglespec.backends.hf import HFTarget
from eaglespec.draft.proposer import Proposer
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.errors import EagleSpecError
from eaglespec.kernels import round_tail as RK
from eaglespec.kernels import step as K
from eaglespec.kernels import tree as TK
from eaglespec.tree.core import CONF_FLOOR, TreeSpec, ancestry
from eaglespec.verify import matching_path_end, path_first, sampled_path, sibling_table_of
from test_kernels import count_calls

from conftest import reference_greedy, tiny_drafter, tiny_target


# -- the torch code each acceptance kernel replaces ---------------------------------------------------------
def accept_path_ref(tokens, parents, depths, visible, target_next, p):
    """round_graph's greedy acceptance in torch: verify.matching_path_end, then the path's length and its rows
    first (verify.path_first), cut to p."""
    from eaglespec.tree.core import FlatTree

    best, bonus = matching_path_end(FlatTree(tokens=tokens, depths=depths, parents=parents, visible=visible),
                                    target_next)
    on_path = visible.index_select(0, best)[0]
    return best, bonus, on_path.sum(), path_first(on_path)[:p]


def sampled_accept_path_ref(parents, kids, live, r_at, q_at, coins, visible, depths, p):
    """round_graph's sampled acceptance walk in torch: verify.sampled_path, then the path's length and rows."""
    best = sampled_path(visible, depths, kids, r_at, q_at, coins, live)
    on_path = visible.index_select(0, best)[0]
    return best, on_path.sum(), path_first(on_path)[:p]


# -- children, race_children, rank_top, select_tree, expand_rows -------------------------------------------
@pytest.mark.parametrize("dtype,chunk,vocab", [(torch.float32, 1024, 300), (torch.float32, 64, 300),
                                               (torch.bfloat16, 64, 130)], ids=["one-chunk", "chunks", "short-bf16"])
def test_children_is_softmax_topk_and_log_value(dtype, chunk, vocab, monkeypatch):
    """One chunk per row, several (the last partial), and a last chunk shorter than k (its keys padded)."""
    monkeypatch.setattr(TK, "_CHUNK", chunk)
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(0)).mul(3).to(dtype)
    conf, tok, logc = TK.children(logits, 7, CONF_FLOOR)
    ref_conf, ref_tok, ref_logc = TK.children_ref(logits, 7, CONF_FLOOR)
    assert conf.dtype == logc.dtype == torch.float32 and tok.dtype == torch.long
    torch.testing.assert_close(conf, ref_conf, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(logc, ref_logc, rtol=1e-6, atol=1e-6)
    if dtype == torch.float32:
        assert torch.equal(tok, ref_tok)
    else:  # bf16 logits tie often: the same logit at every rank, ids distinct per row
        assert torch.equal(logits.gather(1, tok), logits.gather(1, ref_tok))
        assert all(len(set(row)) == 7 for row in tok.tolist())


@pytest.mark.parametrize("chunk", [1024, 8])
def test_children_ties_go_to_the_lower_id_and_never_repeat(chunk, monkeypatch):
    monkeypatch.setattr(TK, "_CHUNK", chunk)
    logits = torch.full((3, 40), float("-inf"))
    logits[0, 3] = 1.0  # one finite logit: the rest of the top-6 are distinct zero-probability ids
    logits[1, [9, 4, 30]] = 0.5  # a three-way tie: by id
    logits[2] = 0.0  # all tied
    conf, tok, logc = TK.children(logits, 6, CONF_FLOOR)
    assert tok[0].tolist() == [3, 0, 1, 2, 4, 5]
    assert tok[1].tolist() == [4, 9, 30, 0, 1, 2]
    assert tok[2].tolist() == [0, 1, 2, 3, 4, 5]
    assert conf[0].tolist() == [1.0, 0, 0, 0, 0, 0]
    torch.testing.assert_close(conf[1, :3], torch.full((3,), 1 / 3))
    torch.testing.assert_close(logc[0, 1:], torch.full((5,), CONF_FLOOR).log())  # the floor, not -inf


def test_children_of_a_nan_row_stay_in_the_vocab():
    logits = torch.randn(2, 50)
    logits[1] = float("nan")
    conf, tok, _ = TK.children(logits, 4, CONF_FLOOR)
    assert int(tok.min()) >= 0 and int(tok.max()) < 50
    assert conf[1].isnan().all()  # the growth's flags report it


@pytest.mark.parametrize("m,k", [(1, 1), (150, 60)])  # one program; three, k past one tile
@pytest.mark.parametrize("descending", [True, False])
def test_rank_top_is_a_stable_sort_prefix(m, k, descending):
    gen = torch.Generator().manual_seed(m)
    floats = torch.randint(-4, 5, (m,), generator=gen).float() / 2  # many ties: the order among them is by index
    ints = torch.randperm(3 * m, generator=gen)[:m]
    for v in (floats, ints):
        vals, idx = TK.rank_top(v, k, descending)
        ref_vals, ref_idx = TK.rank_top_ref(v, k, descending)
        assert torch.equal(vals, ref_vals) and torch.equal(idx, ref_idx), (v.dtype, vals, ref_vals)


def test_rank_top_ids_add_the_offset_in_the_kernel():
    """rank_top_ids: rank_top's values and indices, and the indices plus the offset (a dynamic tree's candidate ids)."""
    v = torch.randint(-4, 5, (37,), generator=torch.Generator().manual_seed(2)).float() / 2
    vals, idx, ids = TK.rank_top_ids(v, 10, 23)
    ref_vals, ref_idx = TK.rank_top_ref(v, 10)
    assert torch.equal(vals, ref_vals) and torch.equal(idx, ref_idx) and torch.equal(ids, ref_idx + 23)
    assert all(torch.equal(a, b) for a, b in zip((vals, idx, ids), TK.rank_top_ids_ref(v, 10, 23)))


def test_children_add_their_parents_values_in_the_kernel(monkeypatch):
    """children / race_children with a base [n]: the log values are base + the log values without it, the same
    fp32 add as the torch code's (bitwise); conf and ids unchanged. A base of another shape is refused."""
    monkeypatch.setattr(TK, "_CHUNK", 64)
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 150, generator=g) * 3
    base = torch.randn(4, generator=g) * 5
    conf, tok, logc = TK.children(logits, 6, CONF_FLOOR)
    conf_b, tok_b, logv = TK.children(logits, 6, CONF_FLOOR, base)
    assert torch.equal(conf_b, conf) and torch.equal(tok_b, tok)
    assert torch.equal(logv, base[:, None] + logc)
    ref = TK.children_ref(logits, 6, CONF_FLOOR, base)
    torch.testing.assert_close(logv, ref[2], rtol=1e-6, atol=1e-6)
    q = torch.softmax(logits, dim=-1)
    noise = torch.empty(4, 150).exponential_(generator=g)
    _, _, logc = TK.race_children(q, noise, 6, CONF_FLOOR)
    _, _, logv = TK.race_children(q, noise, 6, CONF_FLOOR, base)
    assert torch.equal(logv, base[:, None] + logc)
    with pytest.raises(ValueError, match="a base of"):
        TK.children(logits, 6, CONF_FLOOR, base[:3])


def test_children_write_their_rows_and_parents_into_out(monkeypatch):
    """children with `out` (views of a dynamic tree's preallocated candidates): the same conf / ids / log values as
    without, written into the views (returned), and the parents column: each row's `parent`, or -1 (the root's
    children); the reference writes the same. Misshapen outs and a parent without an out are refused."""
    from eaglespec.tree.core import CandidateBuffers

    monkeypatch.setattr(TK, "_CHUNK", 64)
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 150, generator=g) * 3
    base = torch.randn(3, generator=g)
    parent = torch.tensor([4, 9, 2])
    for rows, at in ((None, 1), (parent, 2)):  # the root's row (-1), then three expanded nodes' rows at depth 2
        buf, ref = CandidateBuffers(5, 3, 2, "cpu"), CandidateBuffers(5, 3, 2, "cpu")
        x, b = (logits[:1], None) if rows is None else (logits, base)
        got = TK.children(x, 5, CONF_FLOOR, b, out=buf.layer(at), parent=rows)
        want = TK.children_ref(x, 5, CONF_FLOOR, b, out=ref.layer(at), parent=rows)
        assert all(a.data_ptr() == o.data_ptr() for a, o in zip((*got, *want), (*buf.layer(at)[:3], *ref.layer(at))))
        conf, tok, logv, parents = buf.layer(at)
        assert all(torch.equal(a, p) for a, p in zip((conf, tok, logv), TK.children(x, 5, CONF_FLOOR, b)))
        assert torch.equal(tok, ref.layer(at)[1]) and torch.equal(parents, ref.layer(at)[3])
        torch.testing.assert_close(conf, ref.layer(at)[0], rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(logv, ref.layer(at)[2], rtol=1e-6, atol=1e-6)
        assert parents.tolist() == ([[-1] * 5] if rows is None else [[r] * 5 for r in rows.tolist()])
    assert buf.depths.tolist() == [1] * 5 + [2] * 15 and buf.conf.numel() == 20
    with pytest.raises(ValueError, match="out must be"):
        TK.children(logits, 5, CONF_FLOOR, out=buf.layer(1))  # [1, 5] views for 3 rows
    with pytest.raises(ValueError, match="parent must be"):
        TK.children(logits, 5, CONF_FLOOR, parent=parent)


@pytest.mark.parametrize("case", ["valid", "nan", "above-one", "heavy-row", "none"])
def test_select_tree_checks_the_confidences(case):
    """select_tree's [4] flags: tree._child_flags of conf [R, C] (37 rows: more than one tile; 3 columns: padded) -
    confidences not in [0, 1] (NaN, above 1), a row's sum above 1 + MASS_EPS, the duplicate flag never checked -
    then not closed, as select_tree_ref and the torch checks."""
    from eaglespec.tree.core import MASS_EPS, _child_flags

    conf = torch.rand(37, 3, generator=torch.Generator().manual_seed(3)) / 3
    bad = {"nan": float("nan"), "above-one": 1.5}
    if case in bad:
        conf[33, 2] = bad[case]  # in the last tile
    if case == "heavy-row":
        conf[20] = torch.tensor([0.5, 0.4, 0.2])  # each in [0, 1], the sum above 1
    parents, tokens = torch.tensor([-1, -1, 0, 0]), torch.tensor([7, 8, 9, 10])
    args = (torch.tensor([5]), torch.tensor([0, 2]), parents, tokens, torch.tensor([1, 1, 2, 2]), torch.zeros(4), None)
    given = None if case == "none" else conf
    _, _, flags = TK.select_tree(*args, given, 1 + MASS_EPS)
    _, _, ref_flags = TK.select_tree_ref(*args, given, 1 + MASS_EPS)
    want = [False] * 3 if given is None else [bool(f) for f in _child_flags(None, conf)]
    assert flags.tolist() == ref_flags.tolist() == [*want, False]
    assert want == [case in bad, False, case in ("above-one", "heavy-row")]  # a NaN sum compares false


@pytest.mark.parametrize("mapped,closed", [(True, True), (False, False)], ids=["d2t-closed", "identity-open"])
def test_select_tree_assembles_the_tree_and_its_closure_flag(mapped, closed):
    """Candidates 0..8: 0-2 children of the root, 3-8 children of 0 and 2; node 1 + j is chosen[j]."""
    parents = torch.tensor([-1, -1, -1, 0, 0, 0, 2, 2, 2])
    tokens = torch.tensor([11, 12, 13, 14, 15, 16, 17, 18, 19])
    depths = torch.tensor([1, 1, 1, 2, 2, 2, 2, 2, 2])
    logv = -torch.arange(9, dtype=torch.float32) / 4
    chosen = torch.tensor([0, 2, 3, 7]) if closed else torch.tensor([0, 3, 7])  # 7's parent 2 not chosen
    table = torch.arange(40).flip(0) if mapped else None
    root = torch.tensor([5])
    ids, logq, flags = TK.select_tree(root, chosen, parents, tokens, depths, logv, table)
    ref_ids, ref_logq, ref_flags = TK.select_tree_ref(root, chosen, parents, tokens, depths, logv, table)
    assert torch.equal(ids, ref_ids) and torch.equal(logq, ref_logq)
    assert flags.tolist() == ref_flags.tolist() == [False, False, False, not closed]  # no conf: nothing checked
    if closed:
        assert ids[1].tolist() == [-1, 0, 0, 1, 2]  # parent nodes: the root, the root, node 1 (cand 0), node 2 (cand 2)


@pytest.mark.parametrize("inherit,mapped", [(True, True), (False, False)], ids=["deeper-d2t", "root-children"])
def test_expand_rows_gathers_states_ids_and_parent_mask_rows(inherit, mapped):
    gen = torch.Generator().manual_seed(1)
    k, r0, p0 = 4, 5, 1
    local = torch.tensor([7, 0, 3, 11]) if inherit else torch.tensor([2, 0, 3, 1])
    prev = torch.randn(3 if inherit else 1, 20, generator=gen).to(torch.bfloat16)  # the previous step's outputs
    newest = torch.randint(0, 50, (12,), generator=gen)
    table = torch.randperm(50, generator=gen) if mapped else None
    mask = torch.rand(10, 37, generator=gen) > 0.6
    before, ref_mask = mask.clone(), mask.clone()
    states, tokens = TK.expand_rows(local, k, prev, newest, table, mask, r0, p0, inherit)
    ref_states, ref_tokens = TK.expand_rows_ref(local, k, prev, newest, table, ref_mask, r0, p0, inherit)
    assert torch.equal(states, ref_states) and torch.equal(tokens, ref_tokens)
    assert torch.equal(mask, ref_mask)  # rows r0.. OR-ed with their parents' rows p0 + slot (or untouched)
    assert torch.equal(mask, before) != inherit


def test_kernels_refuse_shapes_they_cannot_take():
    with pytest.raises(ValueError, match="the first 5 of"):
        TK.rank_top(torch.zeros(4), 5)
    with pytest.raises(ValueError, match="top-9 of rows of 8"):
        TK.children(torch.zeros(2, 8), 9, CONF_FLOOR)
    assert TK.fits(TK.MAX_VOCAB, TK.MAX_K) and not TK.fits(TK.MAX_VOCAB + 1, 1) and not TK.fits(100, TK.MAX_K + 1)


@pytest.mark.parametrize("chunk,vocab,k", [(1024, 300, 5), (64, 130, 3)])
def test_race_children_are_q_top_k_and_the_race_draws(chunk, vocab, k, monkeypatch):
    """race_children: q's top-k values (exactly), the k largest q / E in order (exactly: torch's division), and
    log(max(value, floor)); a q with zeros (a processed q: top-p / top-k cut) keeps its zero-q tokens last."""
    monkeypatch.setattr(TK, "_CHUNK", chunk)
    g = torch.Generator().manual_seed(vocab + k)
    q = torch.softmax(torch.randn(6, vocab, generator=g) * 3, dim=-1)
    q[:3, vocab // 2:] = 0.0  # rows 0-2: half the vocabulary cut
    q[1, 7] = 0.0
    noise = torch.empty(6, vocab).exponential_(generator=g)
    conf, tok, logc = TK.race_children(q, noise, k, CONF_FLOOR)
    ref_conf, ref_tok, ref_logc = TK.race_children_ref(q, noise, k, CONF_FLOOR)
    assert torch.equal(conf, ref_conf) and torch.equal(tok, ref_tok)
    torch.testing.assert_close(logc, ref_logc, rtol=1e-6, atol=1e-6)
    assert (q.gather(1, tok) > 0).all()  # at least k tokens left in every row: no zero-q draw
    # the draws are not q's top-k (a race, not a sort): at least one row differs (a swapped order would show too)
    assert not torch.equal(tok, q.topk(k, dim=-1).indices)


def test_race_children_with_fewer_live_tokens_than_children():
    """Fewer than k tokens with q > 0: those come first (in race order), then zero-q tokens, valued 0 (the growth
    marks them dead), never a repeat."""
    q = torch.zeros(2, 40)
    q[0, [3, 11]] = torch.tensor([0.25, 0.75])
    q[1, 39] = 1.0
    noise = torch.empty(2, 40).exponential_(generator=torch.Generator().manual_seed(0))
    conf, tok, _ = TK.race_children(q, noise, 4, CONF_FLOOR)
    assert set(tok[0, :2].tolist()) == {3, 11} and tok[1, 0].item() == 39
    assert conf[0].tolist() == [0.75, 0.25, 0.0, 0.0] and conf[1].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert all(len(set(r)) == 4 for r in tok.tolist())


# -- the dynamic growth with the kernels (tree.core) --------------------------------------------------------
def _logits_of(nodes: torch.Tensor, vocab: int) -> torch.Tensor:
    """Deterministic draft logits [n, vocab] of candidate ids `nodes` (-1: the root): a fixed random row each."""
    g = torch.Generator().manual_seed(11)
    table = torch.randn(200, vocab, generator=g) * 2
    return table[nodes + 1]


def _grown(kernel: bool, spec: TreeSpec, vocab: int, poison: int | None = None, select: bool = True):
    """grow_dynamic_tree over _logits_of (NaN at node `poison`'s logit 5): the kernel path (children into
    CandidateBuffers, the root's log values; select_tree's flags where `select`, else the torch assembly) or the
    torch path (softmax + topk)."""
    from eaglespec.tree.core import CandidateBuffers, grow_dynamic_tree

    k = spec.top_k

    def logits_of(nodes):
        x = _logits_of(nodes, vocab)
        if poison is not None:
            x[nodes == poison, 5] = float("nan")
        return x

    buffers = CandidateBuffers(k, k, spec.depth, "cpu") if kernel else None
    if kernel:
        conf, tok, logv = TK.children(logits_of(torch.tensor([-1])), k, CONF_FLOOR, out=buffers.layer(1))
    else:
        conf, tok = torch.softmax(logits_of(torch.tensor([-1])), -1).topk(k, -1)

    def expand(nodes, cand, d):
        if kernel:
            c, t, v = TK.children(logits_of(nodes), k, CONF_FLOOR, cand.newest_values, out=buffers.layer(d + 1),
                                  parent=nodes)
            return t, c, v
        c, t = torch.softmax(logits_of(nodes), -1).topk(k, -1)
        return t, c

    return grow_dynamic_tree(7, tok[0], conf[0], expand, k, spec.depth, spec.budget, sorted_children=True,
                             distinct_children=True, with_chosen=True, root_logv=logv[0] if kernel else None,
                             buffers=buffers, kernels=kernel and select)


@pytest.mark.parametrize("spec,select", [(TreeSpec("dynamic", depth=4, top_k=4, budget=20), True),
                                         (TreeSpec("dynamic", depth=3, top_k=3, budget=100), True),  # every one
                                         (TreeSpec("dynamic", depth=1, top_k=5, budget=3), True),
                                         (TreeSpec("dynamic", depth=4, top_k=4, budget=20), False)],
                         ids=["4/4/20", "all", "depth-1", "torch-select"])
def test_buffered_kernel_growth_is_the_torch_growth(spec, select, monkeypatch):
    """The kernel path (children written into CandidateBuffers, no joins, the root's log values from the kernel, the
    ranking and the flags from rank_top_ids and select_tree; or, without them, the torch ranking and _child_flags
    over the buffers) grows the torch path's tree: the same tokens, parents, depths and chosen candidates, log
    values within fp32 rounding, the same flags."""
    from eaglespec.tree.core import check_dynamic_flags

    ref, ref_flags, ref_chosen = _grown(False, spec, 60)
    calls = count_calls(monkeypatch, "select_tree", "rank_top_ids", module=TK)
    tree, flags, chosen = _grown(True, spec, 60, select=select)
    assert calls["select_tree"] == select and calls["rank_top_ids"] == (spec.depth - 1) * select
    assert tree.tokens.tolist() == ref.tokens.tolist() and tree.parents.tolist() == ref.parents.tolist()
    assert tree.depths.tolist() == ref.depths.tolist() and chosen.tolist() == ref_chosen.tolist()
    torch.testing.assert_close(tree.logq, ref.logq, rtol=1e-6, atol=1e-6)
    assert flags.tolist() == ref_flags.tolist() == [False] * 4
    check_dynamic_flags(flags)
    assert tree.size == min(spec.budget, spec.top_k + (spec.depth - 1) * spec.top_k ** 2) + 1


@pytest.mark.parametrize("poison,select", [(-1, True), (2, False)], ids=["root-select-kernel", "node-torch-select"])
def test_a_nan_logit_raises_the_same_error_on_both_paths(poison, select):
    """A NaN among a node's logits (the root's, or an expanded node's) makes its children's confidences NaN: both
    paths flag invalid confidences (and nothing else), and check_dynamic_flags raises the same error."""
    from eaglespec.tree.core import check_dynamic_flags

    spec = TreeSpec("dynamic", depth=3, top_k=3, budget=10)
    _, ref_flags, _ = _grown(False, spec, 60, poison)
    _, flags, _ = _grown(True, spec, 60, poison, select=select)
    assert flags[:3].tolist() == ref_flags[:3].tolist() == [True, False, False]
    for f in (ref_flags, flags):
        with pytest.raises(EagleSpecError, match="draft confidences must be finite and in"):
            check_dynamic_flags(f)


def test_buffered_growth_refuses_children_outside_the_buffers():
    """With CandidateBuffers every layer must be written in place: a callback returning fresh tensors (nothing in the
    buffers), or unsorted children, is refused before anything is selected."""
    from eaglespec.tree.core import CandidateBuffers, grow_dynamic_tree

    buffers = CandidateBuffers(3, 3, 2, "cpu")
    conf, tok, logv = TK.children(_logits_of(torch.tensor([-1]), 40), 3, CONF_FLOOR, out=buffers.layer(1))

    def fresh(nodes, cand, d):
        c, t, v = TK.children(_logits_of(nodes, 40), 3, CONF_FLOOR, cand.newest_values)
        return t, c, v

    with pytest.raises(ValueError, match="must be written into"):
        grow_dynamic_tree(7, tok[0], conf[0], fresh, 3, 2, 5, sorted_children=True, distinct_children=True,
                          root_logv=logv[0], buffers=buffers, kernels=True)
    with pytest.raises(ValueError, match="sorted, distinct children only"):
        grow_dynamic_tree(7, tok[0], conf[0], fresh, 3, 2, 5, distinct_children=True, buffers=buffers)


@pytest.mark.parametrize("budget", [0, 7, 40])
def test_select_nodes_with_kernels_is_the_sorted_selection(budget):
    """The final pick: the top-`budget` candidates by value (ties to the lower id), returned in id order."""
    from eaglespec.tree.core import Candidates, select_nodes

    gen = torch.Generator().manual_seed(budget)
    logv = (torch.randint(-8, 0, (30,), generator=gen).float() / 2).sort(descending=True).values  # ties
    logv = logv[torch.randperm(30, generator=gen)]
    cand = Candidates(tokens=torch.arange(30), parents=torch.full((30,), -1), depths=torch.ones(30, dtype=torch.long),
                      logv=logv)
    ref = select_nodes(cand, budget)
    got = select_nodes(cand, budget, kernels=True)
    assert torch.equal(got, ref) and got.tolist() == sorted(got.tolist()) and got.numel() == min(budget, 30)


# -- ancestry and the acceptance kernels ---------------------------------------------------------------------
def _random_tree(t: int, depth: int, gen: torch.Generator) -> torch.Tensor:
    """parents [t] of a random tree in node order (parents before children), no node deeper than `depth`."""
    parents, depths = [-1], [0]
    for _ in range(1, t):
        p = int(torch.randint(0, len(parents), (1,), generator=gen))
        while depths[p] >= depth:
            p = parents[p]
        parents.append(p)
        depths.append(depths[p] + 1)
    return torch.tensor(parents)


@pytest.mark.parametrize("t,depth", [(1, 1), (17, 3), (61, 7)])
def test_ancestry_is_the_squarings(t, depth):
    """Each row walks up `depth` parents: the same [T, T] as tree.ancestry's squarings; a walk one level short
    misses the deepest nodes' oldest ancestors (the test can fail)."""
    gen = torch.Generator().manual_seed(t)
    for _ in range(2):
        parents = _random_tree(t, depth, gen)
        got = TK.ancestry(parents, depth)
        assert got.dtype == torch.bool and torch.equal(got, ancestry(parents, check=False, max_depth=depth))
        deepest = bool((got.sum(1) == depth + 1).any())  # some row sees `depth` ancestors
        if deepest and depth > 1:
            assert not torch.equal(TK.ancestry(parents, depth - 1), got)
    with pytest.raises(ValueError, match="ancestry over 0 rows"):
        TK.ancestry(torch.zeros(0, dtype=torch.long), 3)


@pytest.mark.parametrize("t,p", [(8, 9), (1, 4), (37, 8)])
def test_accept_path_is_the_greedy_acceptance(t, p, monkeypatch):
    """Random trees (parents before children) and target argmaxes drawn from the tree's own tokens, so paths of
    every length occur: the deepest matching row, the bonus, the path length and the row order (path first); the
    same from argmax_keys' chunks of logits whose argmax is that."""
    monkeypatch.setattr(TK, "_ARGMAX_CHUNK", 64)
    gen = torch.Generator().manual_seed(t * 10 + p)
    for _ in range(4):
        parents = torch.tensor([-1] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, t)])
        depths = torch.zeros(t, dtype=torch.long)
        for j in range(1, t):
            depths[j] = depths[parents[j]] + 1
        tokens = torch.randint(0, 4, (t,), generator=gen)
        target_next = torch.randint(0, 4, (t,), generator=gen)
        visible = ancestry(parents, check=False)
        got = TK.accept_path(tokens, parents, depths, visible, target_next, p)
        ref = accept_path_ref(tokens, parents, depths, visible, target_next, p)
        assert [x.tolist() for x in got] == [x.tolist() for x in ref]
        # the argmax merged in the kernel from argmax_keys' chunks: logits whose argmax is target_next, every row's
        # maximum tied at a higher id in another chunk and just below it elsewhere (the lower id must win)
        logits = torch.randn(t, 200, generator=gen).to(torch.bfloat16)
        rows = torch.arange(t)
        logits[rows, target_next] = 8.0
        logits[rows, 199 - target_next] = 8.0  # a tie, in the last chunk
        logits[rows, 100] = 7.96875  # the next bf16 below 8
        keys = TK.argmax_keys(logits)
        assert keys.shape == (t, 4) and torch.equal(TK.key_argmax_ref(keys), target_next)
        got = TK.accept_path(tokens, parents, depths, visible, keys, p)
        assert [x.tolist() for x in got] == [x.tolist() for x in ref]
    for bad in (target_next[0], target_next[:-1], target_next.float()):  # 0-dim, a row short, not long
        with pytest.raises(ValueError, match="accept_path's target_next must be"):
            TK.accept_path(tokens, parents, depths, visible, bad, p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_keys_give_torch_argmax(dtype, monkeypatch):
    """argmax_keys then key_argmax_ref = torch.argmax: ties to the first index (across and within chunks), a row of
    -inf, a NaN wherever it is (torch.argmax takes it), a row shorter than one chunk."""
    monkeypatch.setattr(TK, "_ARGMAX_CHUNK", 64)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 200, generator=gen).round(decimals=0).to(dtype)  # many exact ties
    x[1] = float("-inf")
    x[2, 170] = float("nan")
    x[3, 5], x[3, 190] = 50.0, 50.0
    assert torch.equal(TK.key_argmax_ref(TK.argmax_keys(x)), x.argmax(-1))
    short = torch.randn(3, 40, generator=gen).to(dtype)
    assert torch.equal(TK.key_argmax_ref(TK.argmax_keys(short)), short.argmax(-1))


@pytest.mark.parametrize("t,p,width", [(26, 6, 10), (1, 4, 2), (40, 8, 3)])
def test_sampled_accept_path_is_the_sampled_walk(t, p, width):
    """Random trees with their sibling tables (at most `width` children a node; odd trials cap a node's children
    at 3, so the table can be wider than any row needs), some children pruned (not live), tests that pass about
    half the time: the kernel's path end, length and row order are verify.sampled_path's and path_first's; also
    with tests placed so that a lower-rank sibling that passes must hide a higher-rank one that passes too."""
    gen = torch.Generator().manual_seed(t * 100 + p)
    for trial in range(6):
        parents = [-1]
        for j in range(1, t):
            q = int(torch.randint(0, j, (1,), generator=gen))
            while parents.count(q) >= min(width, 3 if trial % 2 else width):
                q = int(torch.randint(0, j, (1,), generator=gen))
            parents.append(q)
        parents = torch.tensor(parents)
        depths = torch.zeros(t, dtype=torch.long)
        for j in range(1, t):
            depths[j] = depths[parents[j]] + 1
        kids = sibling_table_of(parents, width)
        live = (kids > 0) & (torch.rand(kids.shape, generator=gen) > 0.15)
        coins = torch.rand(t, generator=gen)
        q_at = torch.rand(t, generator=gen) + 0.05
        r_at = q_at * (torch.rand(t, generator=gen) * 1.6) if trial < 5 else q_at * 2  # the last: every test passes
        visible = ancestry(parents, check=False)
        got = TK.sampled_accept_path(parents, kids, live, r_at, q_at, coins, visible, depths, p)
        ref = sampled_accept_path_ref(parents, kids, live, r_at, q_at, coins, visible, depths, p)
        assert [x.tolist() for x in got] == [x.tolist() for x in ref], trial
    with pytest.raises(ValueError, match="sampled_accept_path over"):
        TK.sampled_accept_path(parents, kids, live.long(), r_at, q_at, coins, visible, depths, p)


# -- trees and rounds with the kernels: the torch path's -----------------------------------------------------
def _trees(engine, prompt, n, sampling=None, field="logq"):
    """Generation (greedy, or under `sampling`); returns (tokens, every proposed tree as (tokens, parents) lists, the
    trees' `field`: their log values, or draft_probs)."""
    trees, values = [], []
    real = Proposer.propose

    def recording(self, *args):
        tree = real(self, *args)
        trees.append((tree.tokens.tolist(), tree.parents.tolist()))
        values.append(getattr(tree, field))
        return tree

    Proposer.propose = recording
    try:
        return engine.generate(prompt, max_new_tokens=n, sampling=sampling).token_ids, trees, values
    finally:
        Proposer.propose = real


def kernel_engine(target, drafter, spec: TreeSpec, kernels: bool, draft_graphs: bool = False,
                  round_graphs: bool = False, **runner) -> SpeculativeEngine:
    """An engine whose proposer (and static draft runner, round graphs) runs the kernels or the torch code."""
    engine = SpeculativeEngine(target, drafter, spec)
    engine.proposer.kernels = kernels
    if draft_graphs or round_graphs:  # on CPU the whole-tree growth runs eagerly over the graph's static buffers
        enable_draft_graphs(engine, kernels=kernels, **runner)
    if round_graphs:
        assert enable_round_graphs(engine) is not None
    return engine


def _count_kernels(monkeypatch) -> dict[str, int]:
    """test_kernels.count_calls over the tree kernels' launchers."""
    return count_calls(monkeypatch, "children", "rank_top", "expand_rows", "select_tree", "accept_path", module=TK)


@pytest.mark.parametrize("spec,graphs", [(TreeSpec("dynamic", depth=3, top_k=3, budget=15), True),
                                         (TreeSpec("static", depth=3, top_k=3, budget=6), False)],
                         ids=["dynamic-tree-graph", "static-eager"])
def test_kernel_trees_are_the_torch_trees_and_output_is_generate(spec, graphs, monkeypatch):
    model = tiny_target("llama", seed=5)
    prompt, n = [5, 17, 33, 62, 8], 8

    def run(kernels: bool):
        target = FastTarget(model, max_len=96) if graphs else HFTarget(model)
        engine = kernel_engine(target, tiny_drafter(model, seed=3), spec, kernels, draft_graphs=graphs, max_len=96,
                               buckets=(1, 4, 8))
        return _trees(engine, prompt, n)

    ref_tokens, ref_trees, ref_values = run(False)
    calls = _count_kernels(monkeypatch)
    tokens, trees, values = run(True)
    assert calls["children"] > 0
    assert min(calls["rank_top"], calls["expand_rows"], calls["select_tree"]) > 0 or spec.kind == "static"
    assert tokens == ref_tokens == reference_greedy(model, prompt, n)
    assert trees == ref_trees and len(trees) >= 3
    # the values too: a tiny random drafter often proposes the same children whatever a node's state, but not
    # with the same confidences (a node expanded from a wrong parent's state shows here)
    for a, b in zip(values, ref_values):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_nan_drafter_raises_the_same_error_with_and_without_the_kernels(monkeypatch):
    """A drafter whose logits hold NaN (one lm_head row): the greedy dynamic tree's flags come from select_tree on
    the kernel path (inside the whole-tree growth), from _child_flags on the torch path; both raise the same error
    from propose."""
    model = tiny_target("llama", seed=5)
    spec = TreeSpec("dynamic", depth=3, top_k=3, budget=10)
    for kernels in (False, True):
        drafter = tiny_drafter(model, seed=3)
        with torch.no_grad():
            drafter.lm_head.weight[4] = float("nan")
        engine = kernel_engine(FastTarget(model, max_len=96), drafter, spec, kernels, draft_graphs=True, max_len=96,
                               buckets=(1, 4, 8))
        calls = count_calls(monkeypatch, "select_tree", module=TK)
        with pytest.raises(EagleSpecError, match="invalid draft tree input: draft confidences must be finite"):
            engine.generate([5, 17, 33, 62, 8], max_new_tokens=4)
        assert calls["select_tree"] == kernels


def test_children_kernels_follow_the_proposers_choice():
    """Greedy children come from the logits (children), sampled ones from q (race_children): both kernel paths are
    on where the proposer takes the kernels and the shapes fit; the default on CPU is the torch code."""
    from eaglespec.sampling import SamplingParams

    model = tiny_target("llama", seed=5)
    spec = TreeSpec("dynamic", depth=3, top_k=3, budget=7)
    assert not Proposer(tiny_drafter(model, seed=3), spec).kernels
    proposer = Proposer(tiny_drafter(model, seed=3), spec, kernels=True)
    assert proposer._kernel_children(96, 3)
    proposer.sampling = SamplingParams(temperature=1.0)
    assert proposer._kernel_children(96, 3)
    assert not proposer._kernel_children(TK.MAX_VOCAB + 1, 3)


@pytest.mark.parametrize("spec", [TreeSpec("dynamic", depth=3, top_k=3, budget=10),
                                  TreeSpec("static", depth=3, top_k=3, budget=6)], ids=["dynamic", "static"])
def test_sampled_kernel_trees_are_the_torch_trees(spec, monkeypatch):
    """Sampled drafting with race_children (and, for dynamic trees, expand_rows / select_tree) proposes the same
    trees, with the same q, as the torch path for the same seed, and so emits the same tokens."""
    from eaglespec.sampling import SamplingConfig, SamplingParams

    model = tiny_target("llama", seed=5)
    prompt, n = [5, 17, 33, 62, 8], 8
    cfg = SamplingConfig(SamplingParams(temperature=0.8), seed=11)

    def run(kernels: bool):
        engine = kernel_engine(HFTarget(model), tiny_drafter(model, seed=3), spec, kernels)
        return _trees(engine, prompt, n, sampling=cfg, field="draft_probs")

    ref_tokens, ref_trees, ref_probs = run(False)
    calls = count_calls(monkeypatch, "children", "race_children", module=TK)
    tokens, trees, probs = run(True)
    assert calls["race_children"] > 0 and calls["children"] == 0
    assert tokens == ref_tokens and trees == ref_trees and len(trees) >= 3
    for a, b in zip(probs, ref_probs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@functools.cache
def _agreeing():
    """test_draft_static's agreeing pair (a drafter fitted to its target: long accepted paths), made once."""
    from test_draft_static import agreeing

    return agreeing("llama", "eagle3")


ROUND_SPECS = {"chain": TreeSpec("chain", depth=4), "static": TreeSpec("static", depth=3),
               "dynamic": TreeSpec("dynamic", depth=4, top_k=3, budget=10)}


def graphed_rounds(spec: TreeSpec, kernels: bool, graphs: bool = True, sampling=None, n: int = 20):
    """The agreeing pair's rounds (round graphs, or the rounds stage by stage) with the kernels or the torch code:
    (the tokens of one prompt, every round's (tree tokens, parents, accepted))."""
    model, drafter = _agreeing()
    engine = kernel_engine(FastTarget(model, max_len=96), drafter, spec, kernels, draft_graphs=True,
                           round_graphs=graphs, max_len=96)
    out = engine.generate(ROUND_PROMPT, n, sampling=sampling)
    return out.token_ids, [(r.detail["tokens"].tolist(), r.detail["parents"].tolist(), r.accepted) for r in out.rounds]


ROUND_PROMPT = [4, 8, 15, 16, 23, 42, 7]


@pytest.mark.parametrize("kind", ["chain", "static", "dynamic"])
def test_round_graphs_with_the_kernels_match_the_phased_rounds(kind, monkeypatch):
    """Round graphs with every kernel (a dynamic tree's ancestry, the tree rows' block_mask, argmax_keys and
    accept_path, the tail) give HF generate's tokens and the torch rounds' trees and acceptances, stage by stage;
    each of those kernels runs once a round (every round is a round graph, the first too)."""
    model, _ = _agreeing()
    spec = ROUND_SPECS[kind]
    ref_tokens, ref_rounds = graphed_rounds(spec, kernels=False, graphs=False)
    calls = count_calls(monkeypatch, "argmax_keys", "ancestry", calls=_count_kernels(monkeypatch), module=TK)
    count_calls(monkeypatch, "block_mask", module=K, calls=calls)
    count_calls(monkeypatch, "round_tail", module=RK, calls=calls)
    tokens, rounds = graphed_rounds(spec, kernels=True)
    assert tokens == ref_tokens == reference_greedy(model, ROUND_PROMPT, 20)
    assert rounds == ref_rounds and max(r[2] for r in rounds) >= 2
    n = len(rounds)
    assert calls["accept_path"] == calls["argmax_keys"] == calls["round_tail"] == n
    assert calls["ancestry"] == (n if kind == "dynamic" else 0)
    assert calls["block_mask"] == n, (calls, n)  # the tree rows of every tree graph
    assert calls["children"] > 0 or kind == "chain"


@pytest.mark.parametrize("kind", ["chain", "dynamic"])
def test_sampled_round_graphs_with_the_kernels_draw_the_torch_rounds(kind, monkeypatch):
    """Sampled round graphs (seeded, T=0.9): with the kernels every round's walk is sampled_accept_path and its tail
    round_tail, and the tokens and every round's tree and acceptance are those of the torch round graphs, for the
    same seed."""
    from eaglespec.sampling import SamplingConfig, SamplingParams

    cfg = SamplingConfig(SamplingParams(temperature=0.9), seed=7)
    ref_tokens, ref_rounds = graphed_rounds(ROUND_SPECS[kind], kernels=False, sampling=cfg)
    calls = count_calls(monkeypatch, "sampled_accept_path", module=TK)
    count_calls(monkeypatch, "round_tail", module=RK, calls=calls)
    tokens, rounds = graphed_rounds(ROUND_SPECS[kind], kernels=True, sampling=cfg)
    assert tokens == ref_tokens and rounds == ref_rounds and len(tokens) == 20
    assert calls["sampled_accept_path"] == calls["round_tail"] == len(rounds) and max(r[2] for r in rounds) >= 1
