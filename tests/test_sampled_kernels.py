"""The sampled sibling-test kernels (eaglespec.kernels.sampled) under Triton's CPU interpreter (TRITON_INTERPRET=1,
set by conftest): every live node's test values and every node's final residual equal verify.sibling_tests' (and a
float64 recursion's) over random trees with pruned children, zeros in p and q, rows in one chunk or several and up
to 32 ranks, the same values whatever the chunking (none of the uninitialised partial sums read); the edge cases
(exhausted mass, children holding all of q, a token twice); a negative control (the comparison tells a forgotten
removal or an off-by-one rank apart); and a sampled round graph emits the same tokens either way."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from _engines import enable_draft_graphs, enable_round_graphs
from eaglespec.backends.fast import FastTarget
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.kernels import sampled as SK
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.tree.core import TreeSpec
from eaglespec.verify import sibling_table_of, sibling_tests
from test_round_graph_sampled import DYNAMIC
from test_sampling_engine import PROMPT, sharp_target  # noqa: F401 (fixture)

from conftest import tiny_drafter


def recursion(tokens, kids, p, q, live, remove: bool = True, late: bool = False):
    """verify.sibling_tests' recursion in float64, one parent at a time: (r_at [T], q_at [T], final [T, V]).
    Deliberate bugs for the negative control: remove=False leaves a rejected sibling's token in q; late=True tests
    each child with the values after its own rejection (an off-by-one rank)."""
    p, q = p.double(), q.double()
    t = p.shape[0]
    r_at, q_at, final = torch.zeros(t, dtype=torch.float64), torch.zeros(t, dtype=torch.float64), p.clone()
    for a in range(t):
        r, left = p[a].clone(), q[a].clone()
        for i in range(kids.shape[1]):
            if not live[a, i]:
                continue
            node = int(kids[a, i])
            x = int(tokens[node])
            qn = left / left.sum().clamp_min(1e-30)
            r_at[node], q_at[node] = r[x], qn[x]
            rest = (r - qn).clamp_min(0)
            if rest.sum() > 1e-12:
                r = rest / rest.sum()
            if remove:
                left[x] = 0.0
            if late:
                qn = left / left.sum().clamp_min(1e-30)
                r_at[node], q_at[node] = r[x], qn[x]
        final[a] = r
    return r_at, q_at, final


def random_case(seed: int, v: int, k: int, t: int):
    """A random tree of t nodes (at most k children each) with its sibling table, p and q [t, v] with exact zeros
    (q unnormalised on some rows), children drawn from q without replacement (live), pruned children outside q's
    support and a few other non-live ones: (tokens, kids, p, q, live)."""
    g = torch.Generator().manual_seed(seed)
    counts = [0] * t
    parents = [-1]
    for j in range(1, t):
        open_ = [i for i in range(j) if counts[i] < k]
        par = open_[int(torch.randint(len(open_), (1,), generator=g))]
        counts[par] += 1
        parents.append(par)
    kids = sibling_table_of(torch.tensor(parents), k)
    p = torch.softmax(torch.randn(t, v, generator=g) * 2, -1)
    p = p * (torch.rand(t, v, generator=g) > 0.2)  # a processed target: zeros (top-p)
    p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(torch.randn(t, v, generator=g) * 2, -1)
    q = q * (torch.rand(t, v, generator=g) > 0.3)  # a draft vocab mapped to the target's: zeros
    q = q * torch.where(torch.rand(t, 1, generator=g) < 0.3, 0.5 + torch.rand(t, 1, generator=g), 1.0)
    tokens = torch.randint(v, (t,), generator=g)
    live = torch.zeros(t, k, dtype=torch.bool)
    for a in range(t):
        n = counts[a]
        if not n:
            continue
        support = int((q[a] > 0).sum())
        drawn = min(n, support, int(torch.randint(1, n + 1, (1,), generator=g)) + (n > 2))
        x = torch.multinomial(q[a], drawn, replacement=False, generator=g)  # children drawn from q, in order
        outside = (q[a] == 0).nonzero()[:, 0]
        x = torch.cat([x, outside[torch.randperm(outside.numel(), generator=g)[:n - drawn]]])  # pruned: q(x) = 0
        tokens[kids[a, :n]] = x
        live[a, :drawn] = torch.rand(drawn, generator=g) > 0.15  # and a few others left out
    return tokens, kids, p, q, live


def check(tokens, kids, p, q, live, chunk=None, nodes=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernels against verify.sibling_tests and the float64 recursion: r_at / q_at on the live nodes, the final
    residual (normalised) at every node (or `nodes`). Returns the kernels' (r_at, q_at, finals [T, V])."""
    r_at, q_at, state = SK.sibling_tests(tokens, kids, p, q, live, chunk=chunk)
    ref_r, ref_q, ref_final = sibling_tests(tokens, kids, p, q, live)
    r64, q64, final64 = recursion(tokens, kids, p, q, live)
    on = kids[live]  # the live nodes: what sampled_path reads
    assert r_at.dtype == q_at.dtype == torch.float32
    assert torch.isfinite(r_at).all() and torch.isfinite(q_at).all()
    torch.testing.assert_close(r_at[on], ref_r[on], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q_at[on], ref_q[on], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r_at[on].double(), r64[on], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(q_at[on].double(), q64[on], rtol=1e-5, atol=1e-6)
    finals = torch.zeros_like(p)
    for b in range(p.shape[0]) if nodes is None else nodes:
        f = SK.final_residual(p, q, state, torch.tensor([b]))
        assert f.shape == (1, p.shape[1]) and f.dtype == torch.float32
        finals[b] = f[0]
        norm = f[0] / f[0].sum()
        torch.testing.assert_close(norm, ref_final[b] / ref_final[b].sum(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(norm.double(), final64[b] / final64[b].sum(), rtol=1e-5, atol=1e-6)
    return r_at, q_at, finals


@pytest.mark.parametrize("seed,v,k,t,chunk", [(0, 37, 1, 6, None), (3, 300, 4, 14, 64), (8, 37, 10, 14, 16),
                                               (9, 300, 10, 16, None)])
def test_matches_verify_sibling_tests(seed, v, k, t, chunk):
    """Random trees, K = 1..10, V = 37 / 300 in one chunk or several (the last partial: V is no multiple of 16, 64
    or 128), removed tokens spread over the chunks."""
    tokens, kids, p, q, live = random_case(seed, v, k, t)
    assert live.any() and ((~live & (kids > 0)).any() or k == 1)  # live and left-out children both present
    r_at, q_at, finals = check(tokens, kids, p, q, live, chunk)
    assert (r_at[0] == 0) and (q_at[0] == 0)  # node 0 (never tested) stays 0
    off = kids[~live & (kids > 0)]
    assert (r_at[off] == 0).all() and (q_at[off] == 0).all()  # non-live nodes: 0 (sampled_path masks them)
    idle = ~live.any(1)  # parents with no live child (leaves among them): the residual is p itself
    assert torch.equal(finals[idle], p[idle])


def test_chunking_does_not_change_the_result(monkeypatch):
    """V = 300 in one chunk (512 wide), and in 19 chunks of 16 (the last of 12: S does not divide V) added 16 partial
    sums at a time (_SUMS = 16: two steps over S): the same values up to the summation order. The
    partial-sum buffers (and the carried states) come from torch.empty filled with NaN here: an entry read without
    being written would show. (The values themselves: test_matches_verify_sibling_tests, chunks of every size.)"""
    k = 4
    tokens, kids, p, q, live = random_case(12, 300, k, 8)
    real_empty = torch.empty
    def poisoned(*a, **kw):  # NaN, or in the carried removed tokens a wrong token id
        x = real_empty(*a, **kw)
        return x.fill_(float("nan") if x.is_floating_point() else 299)

    monkeypatch.setattr(torch, "empty", poisoned)
    nodes = [*live.any(1).nonzero()[:4, 0].tolist(), 7]  # parents with live children, and a leaf
    runs = {}
    for chunk, sums in ((None, SK._SUMS), (16, 16)):
        monkeypatch.setattr(SK, "_SUMS", sums)
        r_at, q_at, state = SK.sibling_tests(tokens, kids, p, q, live, chunk=chunk)
        s = -(-300 // (chunk or 512))
        assert state.left.shape == (k + 1, 8, s) and state.mass.shape == (k, 8, s)
        assert state.states.shape[:2] == state.removed.shape[:2] == (k, 8)  # poisoned where no launch stored
        finals = torch.cat([SK.final_residual(p, q, state, torch.tensor([b])) for b in nodes])
        assert torch.isfinite(finals).all()
        runs[chunk] = r_at, q_at, finals
    on = kids[live]
    for chunk in (16,):
        for got, want in zip(runs[chunk], runs[None]):
            torch.testing.assert_close(got[on] if got.dim() == 1 else got, want[on] if want.dim() == 1 else want,
                                       rtol=1e-5, atol=1e-7)


def test_thirty_two_ranks():
    """top_k = 32 (the limit): a root with 32 children drawn from q, one of them with children of its own."""
    g = torch.Generator().manual_seed(11)
    v = 300
    parents = torch.tensor([-1] + [0] * 32 + [1] * 3)
    kids = sibling_table_of(parents, 32)
    p = torch.softmax(torch.randn(36, v, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(36, v, generator=g) * 2, -1) * (torch.rand(36, v, generator=g) > 0.3)
    tokens = torch.zeros(36, dtype=torch.long)
    tokens[1:33] = torch.multinomial(q[0], 32, replacement=False, generator=g)
    tokens[33:] = torch.multinomial(q[1], 3, replacement=False, generator=g)
    check(tokens, kids, p, q, kids > 0, nodes=[0, 1, 5, 33])


def test_exhausted_mass_keeps_the_residual():
    """p == q on the root (uniform over 8 tokens: exact sums): rejecting its first child leaves no mass, so the
    residual stays p; the second child is tested against p with q = 1/7, the third against the one-hot residual
    on the first child's token."""
    v = 37
    parents = torch.tensor([-1, 0, 0, 0, 1])
    kids = sibling_table_of(parents, 3)
    p = torch.zeros(5, v)
    p[0, 8:16] = 1 / 8
    p[1:] = torch.softmax(torch.randn(4, v, generator=torch.Generator().manual_seed(0)), -1)
    q = p.clone()
    q[1:] = torch.softmax(torch.randn(4, v, generator=torch.Generator().manual_seed(1)), -1)
    tokens = torch.tensor([0, 9, 12, 15, 4])
    live = kids > 0
    r_at, q_at, finals = check(tokens, kids, p, q, live, chunk=16)
    assert r_at[1:4].tolist() == [1 / 8, 1 / 8, 0.0]
    torch.testing.assert_close(q_at[1:4], torch.tensor([1 / 8, 1 / 7, 1 / 6]))
    assert finals[0].tolist() == [float(x == 9) for x in range(v)]


def test_children_holding_all_of_q():
    """q's mass on exactly the live children's tokens: after they are rejected no q is left (S = 0, clamped as
    verify._normalised does), and a further live child outside q's support is tested with q = 0 against the
    unchanged residual; also a token twice among live siblings (never drawn so; the recursion still defines it)."""
    v = 70
    g = torch.Generator().manual_seed(3)
    parents = torch.tensor([-1, 0, 0, 0, 0, 1, 1, 1])
    kids = sibling_table_of(parents, 4)
    p = torch.softmax(torch.randn(8, v, generator=g), -1)
    q = torch.softmax(torch.randn(8, v, generator=g), -1)
    q[0] = 0.0
    q[0, [3, 40, 66]] = torch.tensor([0.5, 0.3, 0.2])
    tokens = torch.tensor([0, 40, 3, 66, 20, 7, 7, 50])  # node 6 repeats node 5's token
    live = kids > 0
    r_at, q_at, _ = check(tokens, kids, p, q, live, chunk=32)
    assert q_at[4] == 0 and q_at[6] == 0 and r_at[4] > 0


def test_negative_control_the_comparison_has_power():
    """Forgetting to take a rejected sibling's token out of q, or testing each child after its own rejection (an
    off-by-one rank), gives other values than the kernels on these trees: the checks above would catch either."""
    bugs = {"no removal": {"remove": False}, "off by one": {"late": True}}
    worst = dict.fromkeys(bugs, 0.0)
    for seed, v, k, t in ((2, 300, 3, 12), (8, 37, 10, 14)):
        tokens, kids, p, q, live = random_case(seed, v, k, t)
        r_at, q_at, _ = SK.sibling_tests(tokens, kids, p, q, live)
        on = kids[live]
        good_r, good_q, _ = recursion(tokens, kids, p, q, live)
        torch.testing.assert_close(r_at[on].double(), good_r[on], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(q_at[on].double(), good_q[on], rtol=1e-5, atol=1e-6)
        for name, bug in bugs.items():
            bad_r, bad_q, _ = recursion(tokens, kids, p, q, live, **bug)
            diff = max((r_at[on].double() - bad_r[on]).abs().max(), (q_at[on].double() - bad_q[on]).abs().max())
            worst[name] = max(worst[name], float(diff))
    assert min(worst.values()) > 1e-2, worst


def test_fits():
    assert SK.fits(49152, 10) and SK.fits(37, 32)
    assert not SK.fits(49152, 33) and not SK.fits(0, 1) and not SK.fits(100, 0)


def graphed(model, spec: TreeSpec, kernels: bool) -> SpeculativeEngine:
    """test_round_graph_sampled's sampled round graphs (a peaked q, unlike p), with the kernels or the torch code."""
    drafter = tiny_drafter(model, seed=1)
    with torch.no_grad():
        drafter.lm_head.weight.mul_(8.0)
    engine = SpeculativeEngine(FastTarget(model, max_len=64), drafter, spec)
    engine.proposer.kernels = kernels
    enable_draft_graphs(engine, max_len=64, kernels=kernels)
    assert enable_round_graphs(engine) is not None
    return engine


def test_round_graph_emits_the_same_tokens(sharp_target, monkeypatch):  # noqa: F811
    """A sampled round graph (eager on CPU) with the kernels (sibling_tests, final_residual, the walk) and with the
    torch code (verify.sibling_tests): the same tokens for the same seeds (the same coins and race noise; the tests'
    values agree to ~1e-7, no coin lands in between here)."""
    calls = {"n": 0}
    real = SK.sibling_tests

    def counted(*args, **kw):
        calls["n"] += 1
        return real(*args, **kw)

    monkeypatch.setattr(SK, "sibling_tests", counted)
    runs = {}
    for on in (False, True):
        engine = graphed(sharp_target, DYNAMIC, kernels=on)
        runs[on] = [engine.generate(PROMPT, 10, sampling=SamplingConfig(SamplingParams(temperature=1.0), seed=s))
                    for s in range(2)]
    assert calls["n"] >= 4  # the kernel path ran, every round of the second pass
    assert [r.token_ids for r in runs[True]] == [r.token_ids for r in runs[False]]
    accepted = [[x.accepted for x in r.rounds] for r in runs[True]]
    assert accepted == [[x.accepted for x in r.rounds] for r in runs[False]]
    assert sum(map(sum, accepted)) > 0  # drafts accepted (and rejected: 10 tokens in more than 1 round each)


def test_the_carried_state_is_what_the_final_residual_reads():
    """final_residual starts from the state the last rank launch stored: corrupting the root's stored scale changes
    its final row (the carried state, not a recompute from the partial sums, is what the tests above checked)."""
    tokens, kids, p, q, live = random_case(9, 300, 10, 16)
    _, _, state = SK.sibling_tests(tokens, kids, p, q, live)
    k = kids.shape[1]
    assert state.states.shape == (k, 16, 3 + 16) and state.removed.shape == (k, 16, 16)
    root = torch.tensor([0])
    before = SK.final_residual(p, q, state, root)
    state.states[k - 1, 0, 1] += 0.5  # beta after the root's ranks < K - 1
    after = SK.final_residual(p, q, state, root)
    assert (before - after).abs().max() > 1e-3
