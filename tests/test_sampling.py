"""Contract 2 (sampling is lossless), statistically: the first 3 emitted tokens of speculative
sampling, over 100k samples, follow the target's exact processed distribution (by enumeration).

Vectorised: a tiny real target (vocab 16) and a disagreeing draft model are run ONCE on every
context up to depth 3 (16^3 = 4096 continuations of a fixed prompt); rounds of drafting +
verify.tree_rejection_sample are then simulated for 100k samples at once from those tables.
Tokens after position 3 cannot change the first 3 (every emitted token depends only on drafts and
coins at its own depth), so deeper contexts reuse the depth-3 table. Negative controls (the
same test with a deliberately broken scheme) must FAIL: they prove the test has power.
"""

from __future__ import annotations

import math

import pytest
import torch

from eaglespec.sampling import SamplingParams, process_logits, sample_without_replacement
from eaglespec.verify import tree_rejection_sample

from conftest import tiny_target

V = 16
PROMPT = [3, 9, 4]
N_SAMPLES = 100_000
ALPHA = 1e-3
OFF = [0, 1, 1 + V, 1 + V + V * V, 1 + V + V * V + V**3]  # row offset of the depth-d contexts

CONFIGS = {
    "T1": SamplingParams(temperature=1.0),
    "T0.7-top_p0.9": SamplingParams(temperature=0.7, top_p=0.9),
    "T1-top_k5": SamplingParams(temperature=1.0, top_k=5),
}

# tree templates (node order = depth order = sibling draw order); parents[0] = -1
CHAIN = [-1, 0, 1]  # depth-2 chain: the bonus lands at position 3 when both drafts are accepted
SAMPLED_TREE = [-1, 0, 0, 0, 1, 1, 2, 4]  # root: 3 children, node 1: 2, node 2: 1, node 4: 1
FULL_TREE = [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]  # top-3, top-2 each, top-2 below nodes 4, 5
DYNAMIC_BUDGET = 7  # draft nodes kept from FULL_TREE by path score (EAGLE-2 rerank)


def _depths(parents: list[int]) -> list[int]:
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


@pytest.fixture(scope="module")
def logit_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """(target logits, draft logits), each [1 + V + V^2 + V^3, V]: row OFF[d] + code(context)."""
    target = tiny_target("llama", seed=5, vocab=V, layers=2)
    other = tiny_target("llama", seed=11, vocab=V, layers=2)
    grid = torch.cartesian_prod(*[torch.arange(V)] * 3)  # [V^3, 3]
    seqs = torch.cat([torch.tensor(PROMPT).expand(grid.shape[0], -1), grid], dim=1)
    with torch.no_grad():
        lt, lo = target(seqs).logits, other(seqs).logits  # [V^3, P+3, V]
    rows_t, rows_d = [], []
    for d in range(4):
        idx = torch.arange(V**d) * V ** (3 - d)  # one continuation per depth-d prefix
        t = 3.0 * lt[idx, len(PROMPT) - 1 + d]  # sharpen the tiny random target
        rows_t.append(t)
        rows_d.append(0.6 * t + 2.0 * lo[idx, len(PROMPT) - 1 + d])  # a drafter that disagrees
    return torch.cat(rows_t), torch.cat(rows_d)


def _child_rows(rows: torch.Tensor, length: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Table row of (context at `rows`, of `length`) + token; beyond depth 3 the depth-3 prefix is kept."""
    off = torch.tensor(OFF)
    code = rows - off[length.clamp(max=3)]
    return torch.where(length < 3, off[(length + 1).clamp(max=3)] + code * V + token, rows)


def exact_first3(p_table: torch.Tensor) -> torch.Tensor:
    """[V, V, V]: P(y1, y2, y3) of sampling the target alone, by enumeration."""
    p1 = p_table[OFF[0]]
    p2 = p_table[OFF[1]:OFF[2]]
    p3 = p_table[OFF[2]:OFF[3]].reshape(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def simulate(logits_t: torch.Tensor, logits_d: torch.Tensor, params: SamplingParams, template: list[int],
             scheme: str, n: int, seed: int, broken: str | None = None) -> torch.Tensor:
    """First 3 emitted tokens [n, 3] of speculative sampling, rounds simulated in batch.

    scheme: "sample" = children drawn without replacement from the processed draft q, real-q
    acceptance; "pointmass" = deterministic top-k children, q = 1; "dynamic" = point mass on
    FULL_TREE pruned per sample to the DYNAMIC_BUDGET best nodes by path log q (EAGLE-2 rerank).
    broken: "raw_bonus" (leaf rows verified/bonus-sampled from UNPROCESSED target logits) or
    "replacement" (siblings drawn without replacement verified as if drawn with replacement).
    """
    return _simulate(logits_t, logits_d, params, template, scheme, n, seed, broken)


def _simulate(logits_t: torch.Tensor, logits_d: torch.Tensor, params: SamplingParams, template: list[int],
              scheme: str, n: int, seed: int, broken: str | None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    p_table = process_logits(logits_t, params)
    q_table = process_logits(logits_d, params)
    raw_table = torch.softmax(logits_t, -1)
    parents = torch.tensor(template)
    depths = torch.tensor(_depths(template))
    nn_ = len(template)
    children = [[c for c in range(nn_) if template[c] == u] for u in range(nn_)]
    leaf = torch.tensor([not children[u] for u in range(nn_)])
    emitted = torch.zeros(n, 3, dtype=torch.long)
    count = torch.zeros(n, dtype=torch.long)
    root_rows = torch.zeros(n, dtype=torch.long)  # table row of each sample's context so far
    todo = torch.arange(n)
    while todo.numel():
        b = todo.numel()
        batch = torch.arange(b)
        rows = torch.zeros(b, nn_, dtype=torch.long)  # table row of each node's context
        length = torch.zeros(b, nn_, dtype=torch.long)
        rows[:, 0], length[:, 0] = root_rows[todo], count[todo]
        tokens = torch.zeros(b, nn_, dtype=torch.long)
        par = parents.expand(b, -1).clone()
        logq = torch.zeros(b, nn_)
        for u in range(nn_):
            if not children[u]:
                continue
            q = q_table[rows[:, u]]  # [b, V]
            m = len(children[u])
            if scheme == "sample":
                draws = sample_without_replacement(q, m, gen)
                absent = q.gather(1, draws) == 0  # support smaller than m: fewer children
            else:
                draws = q.topk(m, dim=-1).indices
                absent = torch.zeros_like(draws, dtype=torch.bool)
            for j, c in enumerate(children[u]):
                tokens[:, c] = draws[:, j]
                par[:, c] = torch.where(absent[:, j], -2, u)
                rows[:, c] = _child_rows(rows[:, u], length[:, u], draws[:, j])
                length[:, c] = length[:, u] + 1
                logq[:, c] = logq[:, u] + q.gather(1, draws[:, j:j + 1])[:, 0].clamp_min(1e-30).log()
        if scheme == "dynamic":  # keep the DYNAMIC_BUDGET best draft nodes (ancestor-closed)
            keep = logq[:, 1:].topk(DYNAMIC_BUDGET, dim=-1).indices + 1
            kept = torch.zeros(b, nn_, dtype=torch.bool)
            kept[batch[:, None], keep] = True
            kept[:, 0] = True
            par = torch.where(kept, par, -2)
        p = p_table[rows]
        if broken == "raw_bonus":
            p = torch.where(leaf[None, :, None], raw_table[rows], p)
        q = q_table[rows] if scheme == "sample" else None
        path, accepted, nxt = tree_rejection_sample(tokens, par, depths, p, q, gen,
                                                    replacement=broken == "replacement")
        out = torch.cat([tokens.gather(1, path[:, 1:].clamp(min=0)), torch.zeros(b, 1, dtype=torch.long)], 1)
        out[batch, accepted] = nxt  # accepted drafts then the correction / bonus token
        cnt, root = count[todo], root_rows[todo]
        for i in range(out.shape[1]):  # append to the first 3 positions
            take = (cnt < 3) & (i <= accepted)
            emitted[todo[take], cnt[take]] = out[take, i]
            root = torch.where(take, _child_rows(root, cnt, out[:, i]), root)
            cnt = cnt + take.long()
        count[todo], root_rows[todo] = cnt, root
        todo = todo[cnt < 3]
    return emitted


def first3_pvalue(emitted: torch.Tensor, exact: torch.Tensor) -> tuple[float, int]:
    """Chi-square goodness of fit of the (y1, y2, y3) counts; cells expected < 5 are pooled.

    Returns (p-value, observations in zero-probability cells).
    """
    n = emitted.shape[0]
    codes = emitted[:, 0] * V * V + emitted[:, 1] * V + emitted[:, 2]
    obs = torch.bincount(codes, minlength=V**3).double()
    exp = exact.reshape(-1).double() * n
    impossible = int(obs[exp == 0].sum())
    big = exp >= 5
    o = torch.cat([obs[big], obs[~big].sum()[None]])
    e = torch.cat([exp[big], exp[~big].sum()[None]])
    if float(e[-1]) < 5:  # too little pooled mass for its own cell: merge it into the smallest cell
        i = int(e[:-1].argmin())
        o[i] += o[-1]
        e[i] += e[-1]
        o, e = o[:-1], e[:-1]
    chi2 = float(((o - e) ** 2 / e).sum())
    df = o.numel() - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                      torch.tensor(chi2 / 2, dtype=torch.float64)))
    return p, impossible


CASES = [(scheme, tmpl, cfg) for scheme, tmpl in (("sample", CHAIN), ("sample", SAMPLED_TREE),
                                                   ("pointmass", CHAIN), ("dynamic", FULL_TREE))
         for cfg in CONFIGS]


@pytest.mark.parametrize("scheme,template,config", CASES,
                         ids=[f"{s}-{'chain' if t is CHAIN else 'tree'}-{c}" for s, t, c in CASES])
def test_first_three_tokens_match_target(logit_tables, scheme, template, config):
    lt, ld = logit_tables
    params = CONFIGS[config]
    emitted = simulate(lt, ld, params, template, scheme, N_SAMPLES, seed=1234)
    p, impossible = first3_pvalue(emitted, exact_first3(process_logits(lt, params)))
    assert impossible == 0, f"{impossible} samples outside the processed target's support"
    assert p > ALPHA, f"chi-square p = {p:.2e}: not the target's distribution"


NEGATIVE = [("sample", CHAIN, "T0.7-top_p0.9", "raw_bonus"), ("sample", CHAIN, "T1-top_k5", "raw_bonus"),
            ("dynamic", FULL_TREE, "T1-top_k5", "raw_bonus"), ("sample", SAMPLED_TREE, "T1", "replacement")]


@pytest.mark.parametrize("scheme,template,config,broken", NEGATIVE,
                         ids=[f"{s}-{b}-{c}" for s, _, c, b in NEGATIVE])
def test_negative_control_broken_scheme_fails(logit_tables, scheme, template, config, broken):
    """The same test must reject a deliberately broken implementation (it has statistical power)."""
    lt, ld = logit_tables
    params = CONFIGS[config]
    emitted = simulate(lt, ld, params, template, scheme, N_SAMPLES, seed=1234, broken=broken)
    p, impossible = first3_pvalue(emitted, exact_first3(process_logits(lt, params)))
    assert impossible > 0 or p < ALPHA, f"broken scheme {broken!r} passed (p = {p:.3g})"


def test_simulation_acceptance_is_informative(logit_tables):
    """Guard: the drafter disagrees enough that both acceptance and rejection paths are exercised."""
    lt, ld = logit_tables
    p = process_logits(lt, CONFIGS["T1"])
    q = process_logits(ld, CONFIGS["T1"])
    overlap = torch.minimum(p, q).sum(-1).mean()  # per-token acceptance probability of chain drafts
    assert 0.3 < float(overlap) < 0.9
    assert math.isfinite(float(overlap))
