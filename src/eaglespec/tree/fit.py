"""Static draft trees fitted to a drafter's own acceptance statistics (Sequoia / EAGLE-style tree construction).

The statistics: accept[d][r] = P(the target's greedy token at depth d+1 is the drafter's rank-r candidate | the
path to its parent was accepted), measured at T=0 (`measure_ranks`: the drafter driven as the engine drives it,
fed the accepted tokens, which equal the draft tokens along an accepted path).

The tree: under the usual independence assumption a node's value (the probability it is accepted) is the product
of accept[depth][rank] along its path, and the expected accepted length of a tree is the sum of its nodes' values;
tau (tokens per round) = 1 + that sum. A child's value never exceeds its parent's, so the N highest-value nodes
are ancestor-closed and are the best N-node tree (`fit_static_tree`, best-first). Ties are broken
deterministically: shallower first, then the lexicographically smaller rank path (parents before children,
siblings by rank). The paths come out in that value order, so every prefix is itself the best smaller tree and
TreeSpec's budget cut (the first `budget` paths as listed) keeps the best `budget` nodes.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eaglespec.draft.proposer import Proposer, shifted_tokens
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec, draft_topk

Paths = tuple[tuple[int, ...], ...]
MASS_EPS = 1e-6


def _table(accept: Sequence[Sequence[float]] | torch.Tensor) -> list[list[float]]:
    """accept as a [D][K] list of floats in [0, 1], every row summing to <= 1 (one-line errors otherwise)."""
    rows = accept.tolist() if isinstance(accept, torch.Tensor) else [list(r) for r in accept]
    if not rows or any(len(r) != len(rows[0]) or not r for r in rows):
        raise EagleSpecError("accept must be a non-empty [depth][rank] table with rows of one length")
    for d, r in enumerate(rows):
        if any(not (0.0 <= float(x) <= 1.0) for x in r) or sum(r) > 1 + MASS_EPS:
            raise EagleSpecError(f"accept[{d}] must hold probabilities in [0, 1] summing to <= 1, got {r}")
    return [[float(x) for x in r] for r in rows]


def path_value(accept: Sequence[Sequence[float]], path: Sequence[int]) -> float:
    """P(the node at `path` is accepted) = prod_i accept[i][path[i]] (depth i+1 uses row i); 0 past the table."""
    value = 1.0
    for i, r in enumerate(path):
        if i >= len(accept) or r >= len(accept[i]):
            return 0.0
        value *= accept[i][r]
    return value


def expected_tau(accept: Sequence[Sequence[float]] | torch.Tensor, choices: Iterable[Sequence[int]]) -> float:
    """1 + the sum of the nodes' values: the expected tokens per round of the static tree `choices`."""
    table = _table(accept)
    return 1.0 + sum(path_value(table, p) for p in choices)


def fit_static_tree(accept: Sequence[Sequence[float]] | torch.Tensor, budget: int) -> Paths:
    """The `budget` rank paths of highest value (the best static tree of that size under independence), in
    value order: parents before children, so every prefix is the best smaller tree. accept [D, K]: accept[d][r]
    = P(rank r accepted at depth d+1 | parent accepted). Fewer than `budget` paths only when the table has fewer
    nodes (sum K^d). See the module docstring for the tie-break."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise EagleSpecError(f"budget must be an integer >= 0, got {budget!r}")
    table = _table(accept)
    depth, width = len(table), len(table[0])
    heap = [(-table[0][r], 1, (r,)) for r in range(width)]  # (-value, depth, path): the smallest key pops first
    heapq.heapify(heap)
    out: list[tuple[int, ...]] = []
    while heap and len(out) < budget:
        neg, d, path = heapq.heappop(heap)
        out.append(path)
        if d < depth:
            for r in range(width):
                heapq.heappush(heap, (neg * table[d][r], d + 1, (*path, r)))
    return tuple(out)


# -- measuring the statistics -------------------------------------------------------------------------


@dataclass
class RankCounts:
    """counts[d, r]: anchors where the path reached depth d+1 and the target's token was the drafter's rank-r
    candidate there (column K: not in the top K). A path stops at the first depth outside the top K, and a
    depth past the end of the text (or where the text is not the target's greedy token) is not counted."""

    counts: torch.Tensor  # [D, K + 1] long
    # per anchor, the ranks along its path (a last rank K: not in the top K there); cut where the text ends
    paths: list[tuple[int, ...]] = field(default_factory=list)
    # per anchor, the draft probability of the target's token at each depth of its path (0.0 outside the top K)
    confs: list[tuple[float, ...]] = field(default_factory=list)

    @classmethod
    def zeros(cls, depth: int, top_k: int) -> RankCounts:
        return cls(torch.zeros(depth, top_k + 1, dtype=torch.long))

    @property
    def reached(self) -> torch.Tensor:  # [D]: anchors whose path reached depth d+1
        return self.counts.sum(1)

    def accept(self) -> torch.Tensor:
        """[D, K] float64: counts / reached (0 where a depth was never reached)."""
        c = self.counts.double()
        return c[:, :-1] / c.sum(1, keepdim=True).clamp(min=1)

    def __iadd__(self, other: RankCounts) -> RankCounts:
        self.counts += other.counts
        self.paths += other.paths
        self.confs += other.confs
        return self

    def empirical_tau(self, choices: Iterable[Sequence[int]]) -> float:
        """1 + the mean over anchors of the accepted length the tree `choices` would give on that anchor's path
        (its longest prefix in the tree): no independence assumption (paths cut at the text's end count as
        measured)."""
        tree = {tuple(p) for p in choices}
        total = 0
        for path in self.paths:
            d = 0
            while d < len(path) and path[:d + 1] in tree:
                d += 1
            total += d
        return 1.0 + total / max(len(self.paths), 1)

    def table(self) -> str:
        """A text table: per depth, the anchors reached and P(rank r), then P(not in the top K)."""
        k = self.counts.shape[1] - 1
        acc, reached = self.accept(), self.reached
        miss = self.counts[:, -1].double() / reached.double().clamp(min=1)
        lines = ["depth  reached  " + " ".join(f"r{r:<5d}" for r in range(k)) + " miss"]
        for d in range(acc.shape[0]):
            lines.append(f"{d + 1:5d}  {int(reached[d]):7d}  " + " ".join(f"{float(x):.4f}" for x in acc[d])
                         + f" {float(miss[d]):.4f}")
        return "\n".join(lines)


@torch.no_grad()
def measure_ranks(engine, ids: Sequence[int] | torch.Tensor, start: int, depth: int = 8, top_k: int = 10
                  ) -> RankCounts:
    """Rank statistics of the engine's drafter on `ids` (prompt + the target's greedy answer from index `start`).

    One target forward over `ids` gives the features and the target's greedy token after every row. Every
    answer position is taken as a round's root (anchor t = start-1 .. n-2: root ids[t+1]); a Proposer is driven
    as the engine drives it (catch-up rows from target features only, contract 7) and a chain from the anchor is
    fed the accepted tokens, i.e. the target's greedy tokens, which an accepted path's draft tokens equal, with
    the drafter's own states (positions committed + d - 1, as Proposer._chain / TreeRows). At depth d the
    target's token is ranked among the drafter's top-K (tree.draft_topk of the draft distribution, as the
    static tree picks children) after the draft -> target id map. `engine`: a SpeculativeEngine with a drafter
    (it wires the drafter to the target); the engine's own generation is not used.
    """
    if engine.proposer is None:
        raise EagleSpecError("measure_ranks needs an engine with a drafter")
    target, drafter = engine.target, engine.proposer.drafter
    dev = next(drafter.parameters()).device
    ids = torch.as_tensor(ids, dtype=torch.long).to(dev).reshape(-1)
    n = ids.numel()
    out = RankCounts.zeros(depth, top_k)
    if not 1 <= start < n or depth < 1:
        return out
    target.reset()
    fwd = target.forward(ids)
    truth, feats = fwd.logits.argmax(-1).to(dev), fwd.features.to(dev)  # truth[j]: the target's token after row j
    target.reset()
    prop = Proposer(drafter, TreeSpec("chain", depth=depth))
    first = start - 1
    if first > 0:
        prop.catch_up(feats[:first], shifted_tokens(ids, 0, first))
    counts = torch.zeros(depth, top_k + 1, dtype=torch.long)
    for t in range(first, n - 1):
        path: list[int] = []
        conf: list[float] = []
        logits, state = prop.catch_up(feats[t:t + 1], shifted_tokens(ids, t, 1))  # predicts depth 1 (ids[t+2])
        try:
            for d in range(1, depth + 1):
                if t + 1 + d > n - 1:
                    break  # past the end of the text: not observed
                want = truth[t + d]  # the target's token at depth d of the root ids[t+1]'s path
                top_p, top = draft_topk(prop.draft_dist(logits), min(top_k, logits.shape[-1]))
                hit = (drafter.to_target_ids(top) == want).nonzero()
                rank = int(hit[0, 0]) if hit.numel() else top_k
                conf.append(float(top_p[rank]) if rank < top_k else 0.0)
                counts[d - 1, rank] += 1
                path.append(rank)
                if rank >= top_k or d == depth or bool(ids[t + 1 + d] != want):
                    break  # rejected (outside the top K), the last depth, or the text leaves the greedy path
                pos = torch.full((1,), prop.committed + d - 1, dtype=torch.long, device=dev)
                step, states = prop.runner.run(state[None], ids[t + 1 + d: t + 2 + d], pos)  # fed the depth-d token
                logits, state = step[0], states[0]
        finally:
            prop.runner.crop(prop.committed)
        out.paths.append(tuple(path))
        out.confs.append(tuple(conf))
    out.counts += counts
    return out


def load_fitted(path: str | Path) -> Paths:
    """The paths of a fitted static tree file: the "tree" of bench/fit_static_tree.py's or fit_sampled_tree.py's
    --json (best first). A missing file, another format or an empty tree: EagleSpecError naming the file."""
    try:
        paths = tuple(tuple(int(i) for i in p) for p in json.loads(Path(path).read_text())["tree"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise EagleSpecError(f"{path}: no fitted tree there (a JSON object with \"tree\": a list of rank paths; "
                             f"{type(e).__name__}: {e})") from None
    if not paths:
        raise EagleSpecError(f"{path}: the fitted tree is empty")
    return paths


def fitted_spec(paths: Paths, budget: int | None = None) -> TreeSpec:
    """The static TreeSpec of a fitted tree's best `budget` nodes: its first `budget` paths (all without a budget;
    fit_static_tree lists them best first, parents first), as deep as the deepest of them."""
    kept = paths[:budget] if budget else paths
    if not kept:
        raise EagleSpecError("a fitted tree needs at least one path")
    return TreeSpec("static", depth=max(map(len, kept)), top_k=10, budget=len(kept), choices=kept)


def with_static_choices(manifest: dict, choices: Paths, note: str | None = None) -> dict:
    """A copy of a drafter manifest whose tree_defaults.static recommends the tree `choices` (best first): its
    depth and budget become the tree's (so the recommendation drafts all of it; --depth/--budget still cut it),
    other keys (top_k) are kept; `note` goes to tree_defaults.static_fit (provenance, ignored by the loader)."""
    if not choices:
        raise EagleSpecError("no static tree to write")
    out = dict(manifest)
    defaults = dict(out.get("tree_defaults") or {})
    static = dict(defaults.get("static") or {})
    static.update(depth=max(len(p) for p in choices), budget=len(choices), choices=[list(p) for p in choices])
    defaults["static"] = static
    if note:
        defaults["static_fit"] = note
    out["tree_defaults"] = defaults
    return out
