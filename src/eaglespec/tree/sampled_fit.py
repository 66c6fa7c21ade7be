"""Static draft trees for sampled decoding (temperature > 0), fitted to a drafter's sibling-acceptance curve.

The curve: a(j) = P(a depth-1 draft is accepted | the root has j children drawn from q without replacement
and tested by recursive rejection sampling), j = 1..N (`sibling_acceptance` estimates it by Monte Carlo).
In a sampled static tree the node (r_1, ..., r_d) is the (r_i + 1)-th draw under its parent and is tested only
after the draws before it were rejected, so P(child r accepted | parent accepted) = a(r + 1) - a(r), whatever
follows it. Assuming the same curve at every depth, `fit_static_tree` over that table gives the best tree of a
budget (`fit_sampled_tree`).
"""

from __future__ import annotations

import json
from itertools import accumulate
from pathlib import Path

import torch

from eaglespec.errors import EagleSpecError
from eaglespec.sampling import sample_without_replacement
from eaglespec.tree.core import MC_SIM_7B_63, TreeSpec
from eaglespec.tree.fit import expected_tau, fit_static_tree
from eaglespec.verify import tree_rejection_sample


@torch.no_grad()
def sibling_acceptance(pd: torch.Tensor, q: torch.Tensor, n: int, generator: torch.Generator | None = None,
                       samples: int = 32, chunk: int = 16) -> torch.Tensor:
    """Monte-Carlo P(a depth-1 draft is accepted) with j = 1..n sampled siblings, per row.

    pd [m, Vd]: the target's p on the draft vocabulary; q [m, Vd]: the drafter's q. Each row is tested
    `samples` times: n children drawn from q without replacement, verified by recursive rejection sampling
    with the real q (verify.tree_rejection_sample). One run with n children gives every j: the j-th draw is
    tested only after the first j-1 were rejected and never depends on later draws, so "accepted with j
    siblings" is "the accepted child is among the first j". The vocabulary is compressed to Vd + 1 entries:
    the last holds p's mass outside the draft vocabulary (q = 0 there). Returns [m, n]: column j-1 is the rate
    with j siblings (rows with fewer than j tokens in q's support keep their rate with all of them)."""
    out = torch.empty(pd.shape[0], n)
    parents = torch.tensor([-1] + [0] * n)
    depths = torch.tensor([0] + [1] * n)
    for i in range(0, pd.shape[0], chunk):
        p_rows = pd[i:i + chunk]
        pc = torch.cat([p_rows, (1 - p_rows.sum(-1, keepdim=True)).clamp_min(0)], -1)  # [c, Vd + 1]
        qc = torch.cat([q[i:i + chunk], q.new_zeros(pc.shape[0], 1)], -1)
        rows, vc = pc.shape
        pc, qc = pc.repeat_interleave(samples, 0), qc.repeat_interleave(samples, 0)  # [B, Vd + 1]
        drawn = min(n, int((qc > 0).sum(-1).min()))
        draws = sample_without_replacement(qc, drawn, generator)  # [B, drawn] in draw order
        b = pc.shape[0]
        tokens = torch.cat([torch.zeros(b, 1, dtype=torch.long), draws], 1)
        shape = (b, drawn + 1, vc)
        path, _, _ = tree_rejection_sample(tokens, parents[:drawn + 1].expand(b, -1), depths[:drawn + 1],
                                           pc[:, None].expand(shape), qc[:, None].expand(shape), generator)
        child = path[:, 1]  # [B]: the accepted depth-1 node = its draw index 1..drawn, -1 if none
        within = (child[:, None] >= 1) & (child[:, None] <= torch.arange(1, n + 1))  # [B, n]
        out[i:i + rows] = within.float().reshape(rows, samples, n).mean(1)
    return out


def read_curve(path: str | Path) -> list[float]:
    """a(1..N) from a bench/t1_acceptance.py --json (chain_t1's depth-1 row, rrs1_mc .. rrsN_mc)."""
    try:
        row = json.loads(Path(path).read_text())["chain_t1"]["by_depth"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise EagleSpecError(f"{path}: not a sibling-acceptance curve file (bench/t1_acceptance.py --json; "
                             f"{type(e).__name__}: {e})") from None
    curve, j = [], 1
    while row.get(f"rrs{j}_mc") is not None:
        curve.append(float(row[f"rrs{j}_mc"]))
        j += 1
    if not curve:
        raise EagleSpecError(f"{path}: no rrs1_mc in chain_t1's depth-1 row")
    return curve


def sibling_table(curve: list[float], depth: int, width: int) -> list[list[float]]:
    """[depth][width]: P(the r-th draw is the accepted child | parent accepted) = a(r + 1) - a(r), a(0) = 0.
    The curve is made non-decreasing first (Monte-Carlo dips) and draws past its end get 0."""
    a = [0.0, *accumulate(curve, max)]
    row = [max(a[r + 1] - a[r], 0.0) if r + 1 < len(a) else 0.0 for r in range(width)]
    return [row] * depth


def fit_sampled_tree(curve: list[float], depth: int, budget: int, width: int) -> dict:
    """The best `budget`-node sampled static tree within `depth` (at most `width` children a node) for the
    curve, its expected tau, and EAGLE-1's default tree cut to depths 3, 4 and 5 under the same model:
    {"curve", "depth", "budget", "width", "accept", "tree", "expected_tau", "eagle1": {depth: {"nodes",
    "expected_tau"}}}."""
    for name, value in (("depth", depth), ("budget", budget), ("width", width)):
        if value < 1:
            raise EagleSpecError(f"{name} must be >= 1, got {value}")
    table = sibling_table(curve, depth, width)
    tree = fit_static_tree(table, budget)
    deep = sibling_table(curve, 5, width)
    eagle1 = {}
    for d in (3, 4, 5):
        choices = TreeSpec("static", depth=d, budget=len(MC_SIM_7B_63)).static_choices()
        eagle1[str(d)] = {"nodes": len(choices), "expected_tau": round(expected_tau(deep, choices), 4)}
    return {"curve": curve, "depth": depth, "budget": budget, "width": width, "accept": table[0],
            "tree": [list(p) for p in tree], "expected_tau": round(expected_tau(table, tree), 4),
            "eagle1": eagle1}
