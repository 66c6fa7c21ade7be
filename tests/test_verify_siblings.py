"""verify._sibling_tests (sampled static trees: siblings drawn from q without replacement): every node's test
values and every node's final residual equal an independent float64 re-computation of the recursion
r <- norm(max(0, r - q)), q <- q without the rejected token; and the scalar walk over them accepts the same path
as tree_rejection_sample's vector loop with the same coins, over many random trees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from eaglespec.tree.core import ancestry
from eaglespec.verify import (
    _scalar_walk,
    _sibling_tests,
    point_mass_residual,
    point_mass_tests,
    sample_accept,
    sampled_path,
    sibling_table,
    sibling_table_of,
    sibling_tests,
    tree_rejection_sample,
)

V = 12


def random_tree(rng: np.random.Generator, n: int) -> tuple[list[int], list[int]]:
    """Parents (depth order, siblings adjacent as a static tree lays them out) and depths of an n-node tree."""
    parents, depths = [-1], [0]
    frontier = [0]
    while len(parents) < n:
        nxt = []
        for p in frontier:
            for _ in range(rng.integers(0, 4)):
                if len(parents) < n:
                    parents.append(p)
                    depths.append(depths[p] + 1)
                    nxt.append(len(parents) - 1)
        frontier = nxt or [len(parents) - 1]
    return parents, depths


def case(seed: int, n: int = 12):
    rng = np.random.default_rng(seed)
    parents, depths = random_tree(rng, n)
    p = rng.dirichlet(np.full(V, 0.5), size=n)  # [T, V] target distributions after each node
    q = rng.dirichlet(np.full(V, 0.5), size=n)  # [T, V] draft distributions
    tokens = [0] * n
    for a in range(n):  # children of a: drawn from q_a without replacement
        kids = [j for j in range(1, n) if parents[j] == a]
        if kids:
            drawn = rng.choice(V, size=len(kids), replace=False, p=q[a])
            for j, x in zip(kids, drawn):
                tokens[j] = int(x)
    coins = rng.random(n)
    return parents, depths, tokens, p, q, coins


def reference(parents, tokens, p, q):
    """float64 test values (r, q at x_j given earlier siblings rejected) and each node's final residual."""
    n = len(parents)
    r_at, q_at, final = np.zeros(n), np.zeros(n), p.copy()
    for a in range(n):
        r, ql = p[a].copy(), q[a].copy()
        for j in [j for j in range(1, n) if parents[j] == a]:
            qn = ql / ql.sum()
            r_at[j], q_at[j] = r[tokens[j]], qn[tokens[j]]
            rest = np.clip(r - qn, 0, None)
            r = rest / rest.sum() if rest.sum() > 1e-12 else r
            ql[tokens[j]] = 0.0
        final[a] = r
    return r_at, q_at, final


@pytest.mark.parametrize("seed", range(40))
def test_sibling_tests_equal_the_recursion(seed):
    parents, _depths, tokens, p, q, _coins = case(seed)
    r_at, q_at, final = _sibling_tests(torch.tensor(tokens), parents, torch.tensor(p, dtype=torch.float32),
                                       torch.tensor(q, dtype=torch.float32))
    ref_r, ref_q, ref_final = reference(parents, tokens, p, q)
    np.testing.assert_allclose(r_at[1:].numpy(), ref_r[1:], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(q_at[1:].numpy(), ref_q[1:], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(final.numpy(), ref_final, rtol=1e-4, atol=1e-6)


def test_walk_accepts_what_the_vector_loop_accepts():
    """400 random trees: the same accepted path as tree_rejection_sample (same coins), and a bonus residual
    equal to the recursion's at the path's last node (what the vector loop draws the bonus from)."""
    agree, deep = 0, 0
    for seed in range(400):
        parents, depths, tokens, p, q, coins = case(1000 + seed)
        pt, qt = torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)
        tok, coin = torch.tensor(tokens), torch.tensor(coins, dtype=torch.float32)
        r_at, q_at, final = _sibling_tests(tok, parents, pt, qt)
        path, _ = _scalar_walk(parents, depths, r_at.double().tolist(), q_at.double().tolist(),
                               coin.double().tolist(), residual_px=True)
        ref_path, _ref_acc, _ = tree_rejection_sample(tok[None], torch.tensor(parents)[None], torch.tensor(depths),
                                                     pt[None], qt[None], coins=coin[None])
        ref = [int(v) for v in ref_path[0].tolist() if v >= 0]
        agree += path == ref
        deep += len(path) > 2
        np.testing.assert_allclose(final[path[-1]].numpy(), reference(parents, tokens, p, q)[2][path[-1]],
                                   rtol=1e-4, atol=1e-6)
    assert agree == 400
    assert deep > 20  # paths past the first level were exercised


def test_sibling_order_matters():
    """Negative control: testing siblings in the opposite order gives other test values (a walk that ignored the
    earlier rejected siblings would pass the plain q_parent and p_parent values instead)."""
    parents, _, tokens, p, q, _ = case(7, n=12)
    r_at, q_at, _ = _sibling_tests(torch.tensor(tokens), parents, torch.tensor(p, dtype=torch.float32),
                                   torch.tensor(q, dtype=torch.float32))
    later = [j for j in range(2, len(parents)) if parents[j] == parents[j - 1]]  # a node with an earlier sibling
    assert later
    j = later[0]
    plain_q = q[parents[j], tokens[j]] / q[parents[j]].sum()
    assert abs(q_at[j].item() - plain_q) > 1e-4 or abs(r_at[j].item() - p[parents[j], tokens[j]]) > 1e-4


def test_sample_accept_takes_the_same_path_either_way():
    """sample_accept with sibling_tests on (CUDA's default) and off (CPU's): the same accepted rows for the same
    coins on random sampled-static-like trees over a 49k vocabulary, and a bonus drawn from the same residual
    (the same token for the same generator state, up to float ties)."""
    from eaglespec.tree.core import FlatTree, ancestry

    same_rows, same_bonus = 0, 0
    for seed in range(60):
        parents, depths, tokens, _p, _q, _ = case(2000 + seed)
        big = 49152
        pt = torch.softmax(torch.randn(len(parents), big, generator=torch.Generator().manual_seed(seed)) * 3, -1)
        qt = torch.softmax(torch.randn(len(parents), big, generator=torch.Generator().manual_seed(seed + 1)) * 3, -1)
        par = torch.tensor(parents)
        flat = FlatTree(tokens=torch.tensor(tokens) * 97 % big, depths=torch.tensor(depths), parents=par,
                        visible=ancestry(par).bool())
        a = sample_accept(flat, pt, qt, torch.Generator().manual_seed(seed), sibling_tests=True)
        b = sample_accept(flat, pt, qt, torch.Generator().manual_seed(seed), sibling_tests=False)
        same_rows += torch.equal(a.rows, b.rows)
        same_bonus += a.bonus == b.bonus
    assert same_rows == 60
    assert same_bonus >= 58


def test_tensor_walk_accepts_what_the_vector_loop_accepts():
    """sampled_path (the round graphs' walk: tensor ops, no host sync) ends where tree_rejection_sample's path ends,
    for the same coins, over 400 random trees; with some children pruned (left out of `live`), where the loop on the
    pruned tree ends."""
    agree = deep = 0
    for seed in range(400):
        parents, depths, tokens, p, q, coins = case(3000 + seed)
        pt, qt = torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)
        tok, coin, par = torch.tensor(tokens), torch.tensor(coins, dtype=torch.float32), torch.tensor(parents)
        kids = sibling_table(parents, tok.device)
        r_at, q_at, _ = sibling_tests(tok, kids, pt, qt)
        last = sampled_path(ancestry(par).bool(), torch.tensor(depths), kids, r_at, q_at, coin)
        ref_path, _, _ = tree_rejection_sample(tok[None], par[None], torch.tensor(depths), pt[None], qt[None],
                                               coins=coin[None])
        ref = [int(v) for v in ref_path[0].tolist() if v >= 0]
        agree += int(last) == ref[-1]
        deep += len(ref) > 2
    assert agree == 400 and deep > 20


def test_device_sibling_table_equals_the_host_one():
    """sibling_table_of (a dynamic tree's, built every round inside a round graph) equals sibling_table, padded to
    the width, for 300 random trees whose siblings need not be adjacent in node order (any parent before a child)."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        parents = [-1] + [int(rng.integers(0, j)) for j in range(1, n)]
        host = sibling_table(parents, torch.device("cpu"))
        width = host.shape[1] + int(rng.integers(0, 3))
        want = torch.zeros(n, width, dtype=torch.long)
        want[:, : host.shape[1]] = host
        assert torch.equal(sibling_table_of(torch.tensor(parents), width), want), parents


def test_tensor_walk_skips_pruned_children():
    """A pruned child is never accepted and leaves its siblings' tests as if it had not been drawn: the path equals
    the vector loop's over the tree without it (and its subtree)."""
    checked = 0
    for seed in range(200):
        parents, depths, tokens, p, q, coins = case(5000 + seed)
        n = len(parents)
        kids = sibling_table(parents, torch.device("cpu"))
        # prune every node's last child (and so its subtree) where it has two or more children
        cut = {int(row[row > 0][-1]) for row in kids if int((row > 0).sum()) >= 2}
        if not cut:
            continue
        keep = [True] * n
        for j in range(1, n):
            keep[j] = j not in cut and keep[parents[j]]
        live = (kids > 0) & torch.tensor(keep)[kids]
        pt, qt = torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)
        tok, coin, par = torch.tensor(tokens), torch.tensor(coins, dtype=torch.float32), torch.tensor(parents)
        r_at, q_at, _ = sibling_tests(tok, kids, pt, qt, live)
        last = int(sampled_path(ancestry(par).bool(), torch.tensor(depths), kids, r_at, q_at, coin, live))
        kept = [j for j in range(n) if keep[j]]
        new_id = {j: i for i, j in enumerate(kept)}
        sub_par = torch.tensor([-1] + [new_id[parents[j]] for j in kept[1:]])
        ref_path, _, _ = tree_rejection_sample(tok[kept][None], sub_par[None], torch.tensor(depths)[kept],
                                               pt[kept][None], qt[kept][None], coins=coin[kept][None])
        ref_last = kept[int(max(v for v in ref_path[0].tolist() if v >= 0))]
        assert last == ref_last and keep[last]
        checked += 1
    assert checked > 50


def test_point_mass_walk_and_bonus_equal_the_vector_loop():
    """Children drafted greedily (distinct tokens, q = 1): point_mass_tests + sampled_path end where
    tree_rejection_sample's point-mass loop ends for the same coins, over 400 random trees, and point_mass_residual
    there is the loop's final residual (up to its normalisation); with some children pruned (not live), the loop's
    on the tree without them."""
    agree = deep = pruned_checked = 0
    for seed in range(400):
        parents, depths, tokens, p, _, coins = case(7000 + seed)
        n = len(parents)
        for j in range(n - 1, 0, -1):  # half of each parent's mass on its first child: paths reach deeper
            p[parents[j]] *= 0.5
            p[parents[j], tokens[j]] += 0.5 if p[parents[j]].sum() < 0.75 else 0.0
        p /= p.sum(axis=1, keepdims=True)
        pt, coin, par = torch.tensor(p, dtype=torch.float32), torch.tensor(coins, dtype=torch.float32), \
            torch.tensor(parents)
        tok, dep = torch.tensor(tokens), torch.tensor(depths)
        kids = sibling_table(parents, tok.device)
        cut = {int(row[row > 0][-1]) for row in kids if int((row > 0).sum()) >= 2} if seed % 2 else set()
        keep = [True] * n
        for j in range(1, n):
            keep[j] = j not in cut and keep[parents[j]]
        live = (kids > 0) & torch.tensor(keep)[kids]
        r_at, q_at = point_mass_tests(tok, kids, pt, live)
        assert torch.equal(q_at, torch.ones(n))
        last = sampled_path(ancestry(par).bool(), dep, kids, r_at, q_at, coin, live)
        kept = [j for j in range(n) if keep[j]]
        new_id = {j: i for i, j in enumerate(kept)}
        sub_par = torch.tensor([-1] + [new_id[parents[j]] for j in kept[1:]])
        ids = torch.tensor(kept)
        ref_path, _, _ = tree_rejection_sample(tok[ids][None], sub_par[None], dep[ids], pt[ids][None], None,
                                               coins=coin[ids][None])
        ref = [kept[int(v)] for v in ref_path[0].tolist() if v >= 0]
        agree += int(last) == ref[-1]
        deep += len(ref) > 2
        pruned_checked += bool(cut)
        # the loop's final residual at its last node: p there with the live children's tokens removed
        want = pt[ref[-1]].clone()
        for j in range(1, n):
            if parents[j] == ref[-1] and keep[j]:
                want[tokens[j]] = 0.0
        got = point_mass_residual(pt, tok, kids, live, last)[0]
        torch.testing.assert_close(got / got.sum(), want / want.sum())
    assert agree == 400 and deep > 20 and pruned_checked > 100


def test_point_mass_tests_divide_by_the_mass_left():
    """Rank i's test is p(x_i) / (1 - p(x_1) - ... - p(x_{i-1})): an off-by-one in the exclusive sum (dividing by the
    mass left after x_i, or not at all) changes every later sibling's value."""
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25] * 4, [0.25] * 4, [0.25] * 4])
    tokens, kids = torch.tensor([0, 3, 1, 2]), torch.tensor([[1, 2, 3], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    r_at, _ = point_mass_tests(tokens, kids, p)
    torch.testing.assert_close(r_at[1:], torch.tensor([0.4, 0.2 / 0.6, 0.3 / 0.4]))
