"""Acceptance: which drafted rows the target agrees with, and the bonus token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eaglespec.tree.core import FlatTree


@dataclass
class Acceptance:
    rows: torch.Tensor  # [m+1] flattened-row indices of the accepted path, root first (device, a view)
    bonus: int  # the target's token after the last accepted row
    accepted: int  # m: draft tokens accepted
    tokens: list[int]  # the path's tokens, root first (read in the same host sync)
    path_tokens: torch.Tensor  # [m+1] the path's tokens on the device, root first (a view)
    bonus_token: torch.Tensor  # [1] the bonus token on the device


def _read_path(flat: FlatTree, on_path: torch.Tensor, bonus: torch.Tensor) -> Acceptance:
    """Everything the host needs about an accepted path in ONE device->host copy, and nothing else
    (the rows and tokens stay on the device as views: no host->device copy back).

    on_path [T] bool marks the path's rows; rows in index order are in depth order (flatten's order).
    """
    order = path_first(on_path)
    path = flat.tokens[order]  # [T]: the path's tokens first
    bonus = bonus.reshape(1)
    vals = torch.cat([on_path.sum().reshape(1), bonus, path]).tolist()
    m = vals[0]
    return Acceptance(rows=order[:m], bonus=vals[1], accepted=m - 1, tokens=vals[2:2 + m],
                      path_tokens=path[:m], bonus_token=bonus)


def path_first(on_path: torch.Tensor) -> torch.Tensor:
    """on_path [T] bool -> the row order [T] with the path's rows first, each part in index (= depth) order."""
    return torch.argsort((~on_path).to(torch.int8), stable=True)


def greedy_path_end(flat: FlatTree, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the last row of the longest root path whose every token equals the target's argmax at its parent row [1],
    the target's token after it: the bonus [1]). Tensor ops only, no host sync (round graphs capture it)."""
    return matching_path_end(flat, logits.argmax(dim=-1))


def matching_path_end(flat: FlatTree, target_next: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """greedy_path_end given the target's argmax at every row, target_next [..., T] (leading batch dims allowed:
    a FlatTree of [B, T] rows gives [B, 1] and [B, 1])."""
    match = (flat.tokens == target_next.gather(-1, flat.parents.clamp(min=0))) | (flat.parents < 0)  # root: emitted
    ok = (flat.visible <= match.unsqueeze(-2)).all(dim=-1)  # visible implies match: every ancestor-or-self matches
    best = torch.where(ok, flat.depths, -1).argmax(dim=-1, keepdim=True)  # deepest; siblings never both match
    return best, target_next.gather(-1, best)


def greedy_accept(flat: FlatTree, logits: torch.Tensor) -> Acceptance:
    """Longest root path whose every token equals the target's argmax at its parent row.

    One host sync (in _read_path); indices stay tensors (indexing with a 0-d tensor would sync).
    """
    best, bonus = greedy_path_end(flat, logits)
    return _read_path(flat, flat.visible.index_select(0, best)[0], bonus)


def greedy_accept_rows(flat: FlatTree, logits: torch.Tensor) -> list[Acceptance]:
    """greedy_accept for B trees at once: flat's fields [B, W] (visible [B, W, W]) with every tree padded to W rows
    by rows that are their own root (parent -1, depth 0, seeing themselves: never deeper than the real root), and
    logits [B, W, V]. One host sync for the whole batch."""
    best, bonus = greedy_path_end(flat, logits)  # [B, 1], [B, 1]
    B, W = flat.tokens.shape
    on_path = flat.visible.gather(1, best[:, :, None].expand(B, 1, W))[:, 0]  # [B, W]
    order = torch.argsort((~on_path).to(torch.int8), dim=-1, stable=True)  # the path's rows first, in depth order
    path = flat.tokens.gather(1, order)  # [B, W]
    m = on_path.sum(-1)  # [B]
    vals = torch.cat([m, bonus[:, 0], path.flatten()]).tolist()
    out = []
    for b in range(B):
        n = vals[b]
        row = vals[2 * B + b * W: 2 * B + b * W + n]
        out.append(Acceptance(rows=order[b, :n], bonus=vals[B + b], accepted=n - 1, tokens=row,
                              path_tokens=path[b, :n], bonus_token=bonus[b]))
    return out


def greedy_chain_walk(tokens: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """greedy_accept for B chains at once, on the device: tokens [B, W] (a root, then W - 1 drafts, each the child of
    the one before) and logits [B, W, V]. Row b's draft d is accepted while it and every draft before it equal the
    target's argmax at the row before it; row b emits its m_b accepted drafts, then the target's token after them
    (the bonus). Returns (m [B], emitted [B, W]: row b's tokens are emitted[b, :m_b + 1]; read_chains reads them)."""
    best = logits.argmax(dim=-1)  # [B, W]: the target's token after each row
    match = (tokens[:, 1:] == best[:, :-1]).long().cumprod(dim=-1)  # [B, W-1]: 1 up to the first mismatch
    return match.sum(dim=-1), best


def read_chains(accepted: torch.Tensor, emitted: torch.Tensor) -> list[tuple[int, list[int]]]:
    """(m_b, emitted[b, :m_b + 1]) per row of accepted [B] and emitted [B, W], in one host sync."""
    B, W = emitted.shape
    vals = torch.cat([accepted, emitted.flatten()]).tolist()
    return [(vals[b], vals[B + b * W: B + b * W + vals[b] + 1]) for b in range(B)]


def sample_accept_chains(tokens: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                         coins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_accept for n chains at once, as tensor ops (no host sync). tokens [n, W] (a root, then W - 1 drafts),
    target_probs [n, W, V] processed, draft_probs [n, W, V]: the q each node's child was drawn from (None: the
    point-mass scheme, q = delta of the child), coins [n, W] (sample_accept's: coin j tests draft j). Draft j is
    accepted while every test up to it passes, coin_j * q(x_j) < p(x_j) in float64 as sample_accept's walk. Returns
    (m [n]: drafts accepted, the bonus distribution [n, V]: the residual norm(max(0, p - q)) after the first rejected
    draft, p after a fully accepted chain)."""
    n, W = tokens.shape
    V = target_probs.shape[-1]
    x = tokens[:, 1:, None]  # [n, W-1, 1]
    if draft_probs is None:  # q = delta(x): every draft passes with prob p(x); a rejection removes x from p
        draft_probs = torch.zeros_like(target_probs)
        draft_probs[:, :-1].scatter_(2, x, 1.0)
    px = target_probs[:, :-1].gather(2, x)[..., 0].double()  # [n, W-1]: p at each draft's parent
    q = draft_probs[:, :-1]
    qx = (q.gather(2, x)[..., 0] / q.sum(-1).clamp_min(1e-30)).double()  # q normalised as sample_accept does
    passed = coins[:, 1:].double() * qx < px
    m = passed.long().cumprod(dim=-1).sum(dim=-1)  # [n]
    at = m[:, None, None].expand(n, 1, V)
    r = target_probs.gather(1, at)[:, 0].float()  # [n, V]: p after the last accepted node
    rest = _rejected_residual((r - _normalised(draft_probs.gather(1, at)[:, 0].float())).clamp_min(0), r)
    return m, torch.where((m < W - 1)[:, None], rest, r)


def _normalised(q: torch.Tensor) -> torch.Tensor:
    """q [..., V] (a draft distribution with some tokens removed) scaled to sum 1 over the last dim."""
    return q / q.sum(-1, keepdim=True).clamp_min(1e-30)


def _rejected_residual(rest: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The residual after a rejection, norm(rest) for rest = max(0, r - q) [..., V]; r itself where rest has no
    mass (only where rejecting had probability 0)."""
    mass = rest.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, rest / mass.clamp_min(1e-30), r)


# -- sampling (contract 2, docs/contracts.md; the schemes and why they are lossless: sampling.py) -------

def tree_rejection_sample(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                          target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                          generator: torch.Generator | None = None, replacement: bool = False,
                          coins: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Lossless multi-draft rejection sampling over a batch of trees that share a node order.

    tokens [B, N] (node 0 = root), parents [B, N] (-1 at the root; a node absent from sample b
    has a parent that is never its current node, e.g. -2), depths [N] shared and non-decreasing.
    target_probs [B, N, V]: processed target distribution of the token AFTER each node.
    draft_probs [B, N, V] or None: the distribution each node's children were drawn from, without
    replacement, in node order (chains: one child per node); None = point-mass scheme (q = 1).
    replacement=True: siblings were drawn i.i.d. WITH replacement (SpecInfer's original setting).
    coins [B, N] uniform: node j is accepted iff coins[:, j] * q(x_j) < r(x_j) (None: drawn here).
    Returns (path [B, D+1] accepted node indices root first, -1 padded; accepted [B] draft tokens
    accepted; next_token [B] the correction / bonus token, drawn from the final residual).
    """
    b, n = tokens.shape
    dev = target_probs.device
    max_depth = int(depths.max()) if n else 0
    path = torch.full((b, max_depth + 1), -1, dtype=torch.long, device=dev)
    path[:, 0] = 0
    cur = torch.zeros(b, dtype=torch.long, device=dev)  # last accepted node
    cur_depth = torch.zeros(b, dtype=torch.long, device=dev)
    walking = torch.ones(b, dtype=torch.bool, device=dev)
    residual = target_probs[:, 0].float().clone()  # [B, V]: r_i at the current node
    q_left = draft_probs[:, 0].float().clone() if draft_probs is not None else None  # q minus drawn siblings
    if coins is None:
        coins = torch.rand((b, n), generator=generator, device=dev)
    depth_list = depths.tolist()
    for j in range(1, n):
        d = depth_list[j]
        walking &= cur_depth >= d - 1  # no candidate left at depth cur_depth + 1: stop
        idx = (walking & (parents[:, j] == cur)).nonzero()[:, 0]  # samples for which j is the next sibling
        if idx.numel() == 0:
            continue
        x = tokens[idx, j][:, None]
        r = residual[idx]
        px = r.gather(1, x)[:, 0]
        if q_left is None:  # point mass: q = delta(x)
            qx = torch.ones_like(px)
            rest = r.scatter(1, x, 0.0)
        else:  # q_i: the draft distribution with the earlier (rejected) siblings removed
            ql = q_left[idx]
            q = _normalised(ql)
            qx = q.gather(1, x)[:, 0]
            rest = (r - q).clamp_min(0)
        accept = coins[idx, j] * qx < px  # prob min(1, px / qx)
        rest = _rejected_residual(rest, r)  # rejected: r <- norm(max(0, r - q_i))
        rej = ~accept
        residual[idx[rej]] = rest[rej]
        if q_left is not None and not replacement:  # without replacement: x leaves q for the next sibling
            q_left[idx[rej]] = ql[rej].scatter(1, x[rej], 0.0)
        # accepted: descend; the child's own target / draft distributions take over
        acc = idx[accept]
        cur[acc] = j
        cur_depth[acc] = d
        path[acc, d] = j
        residual[acc] = target_probs[acc, j].float()
        if q_left is not None:
            q_left[acc] = draft_probs[acc, j].float()
    next_token = torch.multinomial(residual, 1, generator=generator)[:, 0]
    return path, cur_depth, next_token


def _scalar_walk(parents: list[int], depths: list[int], px: list[float], qx: list[float] | None,
                 coins: list[float], residual_px: bool = False) -> tuple[list[int], list[int]]:
    """tree_rejection_sample's walk for ONE tree when each test needs only scalars: the point-mass
    scheme (any tree: after rejecting siblings x_1..x_k the residual is p with them removed, so
    r(x) = p(x) / (1 - sum p(x_i))), or real q where no node has two children (chains: r = p, q).

    px[j] = p_parent(j)(x_j), qx[j] = q_parent(j)(x_j) (None: point mass). residual_px: px[j] and qx[j]
    are already the residual and the draft distribution at x_j's test, given its earlier siblings were
    rejected (_sibling_tests). Returns (accepted path root first, the rejected children of its last node).
    """
    path, rejected, removed = [0], [], 0.0
    for j in range(1, len(parents)):
        if depths[path[-1]] < depths[j] - 1:
            break  # no candidate left one level below the current node
        if parents[j] != path[-1]:
            continue
        left = 1.0 - removed
        if residual_px:
            r = px[j]
        else:
            r = px[j] / left if left > 1e-12 else px[j]  # tree_rejection_sample keeps r when no mass is left
        if coins[j] * (1.0 if qx is None else qx[j]) < r:
            path.append(j)
            rejected, removed = [], 0.0
        else:
            rejected.append(j)
            removed += px[j] if left > 1e-12 else 0.0
    return path, rejected


def sibling_table(parents: list[int], device: torch.device) -> torch.Tensor:
    """[T, K] long: the child of each node by sibling rank (children in node order), 0 where there is none (node 0,
    the root, is never anyone's child). parents: host list, -1 at the root."""
    t = len(parents)
    children: list[list[int]] = [[] for _ in range(t)]
    for j in range(1, t):
        children[parents[j]].append(j)
    ranks = max([len(c) for c in children] + [1])
    return torch.tensor([[c[i] if i < len(c) else 0 for i in range(ranks)] for c in children],
                        dtype=torch.long).to(device, non_blocking=True)


def sibling_table_of(parents: torch.Tensor, width: int) -> torch.Tensor:
    """sibling_table from the device parents [T] (-1 at the root) of a tree with at most `width` children per
    node, as tensor ops (no host sync: a dynamic tree's, which changes every round). [T, width] long."""
    t, dev = parents.shape[0], parents.device
    earlier = torch.ones(t, t, dtype=torch.bool, device=dev).tril(-1)  # [T, T]: j' < j
    rank = ((parents[:, None] == parents[None, :]) & earlier).sum(1)  # [T]: earlier siblings, in node order
    kids = torch.zeros(t * width, dtype=torch.long, device=dev)
    at = parents[1:].clamp(min=0) * width + rank[1:]  # [T-1]: one distinct (parent, rank) cell per node
    kids.index_copy_(0, at, torch.arange(1, t, device=dev))
    return kids.view(t, width)


def sibling_tests(tokens: torch.Tensor, kids: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  live: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For a tree whose siblings were drawn from q without replacement (sampled static trees, chains): every node's
    test values in tree_rejection_sample's recursion, given its earlier siblings were all rejected, computed for all
    parents at once (one pass per sibling rank, no host sync), so the walk itself needs only scalars.

    tokens [T], kids [T, K] (sibling_table), target_probs / draft_probs [T, V]; live [T, K] bool: the children that
    take part (default kids > 0; a pruned child, outside q's support, is left out as if never drawn). Returns
    (r [T]: the residual at x_j when x_j is tested, q [T]: the normalised q_left at x_j, final [T, V]: the residual
    at each node once all its children are rejected: the bonus distribution when the walk ends there)."""
    t, dev = tokens.shape[0], tokens.device
    live = kids > 0 if live is None else live
    r = target_probs.float().clone()  # [T, V]: each parent's residual as its children are tested in turn
    q_left = draft_probs.float().clone()  # [T, V]: q with the earlier (rejected) siblings removed, unnormalised
    r_at = torch.zeros(t, dtype=r.dtype, device=dev)
    q_at = torch.zeros(t, dtype=r.dtype, device=dev)
    for i in range(kids.shape[1]):
        node, on = kids[:, i], live[:, i:i + 1]  # [T], [T, 1]
        x = tokens[node][:, None]  # [T, 1]: the rank-i child's token under each parent
        q = _normalised(q_left)
        r_at.index_put_((node,), r.gather(1, x)[:, 0])  # padding writes land on node 0 (the root: never tested)
        q_at.index_put_((node,), q.gather(1, x)[:, 0])
        rest = _rejected_residual((r - q).clamp_min(0), r)  # rejected: r <- norm(max(0, r - q)), x leaves q
        r = torch.where(on, rest, r)
        q_left = torch.where(on, q_left.scatter(1, x, 0.0), q_left)
    return r_at, q_at, r


def _sibling_tests(tokens: torch.Tensor, parents: list[int], target_probs: torch.Tensor,
                   draft_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """sibling_tests for a tree given by its host parents list."""
    return sibling_tests(tokens, sibling_table(parents, tokens.device), target_probs, draft_probs)


def point_mass_tests(tokens: torch.Tensor, kids: torch.Tensor, target_probs: torch.Tensor,
                     live: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sibling_tests for a tree with deterministic children (the point-mass scheme, q = 1: top-k children drafted
    greedily under a sampled target), as tensor ops over [T, K] only: after rejecting siblings x_1..x_{i-1} the
    residual is p with them removed, so child i is tested with r(x_i) = p(x_i) / (1 - sum_{s<i} p(x_s)) (p(x_i)
    itself where no mass is left, as tree_rejection_sample keeps r then). A node's children must be distinct tokens
    (top-k children are). tokens [T], kids / live [T, K] (sibling_table; live default kids > 0), target_probs
    [T, V] -> (r [T], q [T] = 1: sampled_path's inputs; entries of non-live nodes are not read)."""
    live = kids > 0 if live is None else live
    px = target_probs.gather(1, tokens[kids]).float()  # [T, K]: p_parent at each rank's child
    px = torch.where(live, px, 0.0)
    left = 1.0 - (px.cumsum(dim=1) - px)  # [T, K]: p's mass left when rank i is tested
    r = torch.where(left > 1e-12, px / left.clamp_min(1e-30), px)
    r_at = torch.zeros(tokens.shape[0], dtype=r.dtype, device=r.device)
    r_at.index_put_((kids.flatten(),), r.flatten())  # padding writes land on node 0 (the root: never tested)
    return r_at, torch.ones_like(r_at)


def point_mass_residual(target_probs: torch.Tensor, tokens: torch.Tensor, kids: torch.Tensor, live: torch.Tensor,
                        node: torch.Tensor) -> torch.Tensor:
    """The bonus distribution where a point-mass walk ends at `node` [1]: p there with its (rejected, distinct) live
    children removed, unnormalised (race_argmax is scale-free); p itself where they held all the mass. -> [1, V]."""
    p = target_probs.index_select(0, node).float()  # [1, V]
    x = tokens[kids.index_select(0, node)]  # [1, K]: padding ranks hold the root's token, maybe a live child's too
    removed = torch.zeros_like(p).scatter_add_(1, x, live.index_select(0, node).to(p.dtype))  # [1, V]: live ranks
    rest = torch.where(removed > 0, 0.0, p)
    return torch.where(rest.sum(dim=1, keepdim=True) > 1e-12, rest, p)


def sampled_path(visible: torch.Tensor, depths: torch.Tensor, kids: torch.Tensor, r_at: torch.Tensor,
                 q_at: torch.Tensor, coins: torch.Tensor, live: torch.Tensor | None = None) -> torch.Tensor:
    """tree_rejection_sample's walk as tensor ops (no host sync): the deepest node of the accepted path, [1] long.

    A node is accepted when tested iff coins[j] * q_at[j] < r_at[j] (sibling_tests' values, which assume its earlier
    siblings were rejected); the walk takes, under each node it reaches, the first accepted child in sibling order,
    so a node is on the path iff it and every ancestor is the first accepted child of its parent: the same path as
    the walk for the same coins. visible [T, T] (ancestor-or-self), depths [T], kids / live [T, K] as sibling_tests.
    """
    t, dev = coins.shape[0], coins.device
    live = kids > 0 if live is None else live
    passed = coins * q_at < r_at  # [T]
    first = torch.zeros(t, dtype=torch.bool, device=dev)  # [T]: its parent's first accepted child
    earlier = torch.zeros(t, dtype=torch.bool, device=dev)  # [T] per parent: an earlier live child accepted
    for i in range(kids.shape[1]):
        node, on = kids[:, i], live[:, i]
        hit = on & passed[node]  # [T] per parent: its rank-i child passes
        first.index_put_((node,), hit & ~earlier)  # every node is one parent's child once; padding writes node 0
        earlier |= hit
    first |= torch.arange(t, device=dev) == 0  # the root is emitted
    ok = (visible <= first).all(dim=-1)  # every ancestor-or-self is its parent's first accepted child
    return torch.where(ok, depths, -1).argmax().reshape(1)


def sample_accept(flat: FlatTree, target_probs: torch.Tensor, draft_probs: torch.Tensor | None,
                  generator: torch.Generator | None = None, sibling_tests: bool | None = None) -> Acceptance:
    """One round's acceptance under sampling: target_probs [T, V] processed; draft_probs [T, V] or None.

    The per-node tests read only p_parent(x_j) (and q_parent(x_j)): they are gathered in one device->host
    copy and walked on the host (_scalar_walk); the bonus is drawn on the device from the final residual,
    and the path read in one more sync. Trees with real q and siblings (sampled static trees) need the
    full residual vectors: on CUDA (sibling_tests None) _sibling_tests computes every test's values on the device
    first (3 syncs in all instead of one per node); on CPU, where a
    sync is free and _sibling_tests' passes over [T, V] are not, tree_rejection_sample's loop runs, with the same
    coins (as does a point-mass tree with a token twice under a node).
    """
    t, dev = flat.tokens.shape[0], flat.tokens.device
    coins = torch.rand((1, t), generator=generator, device=dev)
    par = flat.parents.clamp(min=0)
    cols = [flat.parents, flat.depths, flat.tokens, target_probs[par, flat.tokens], coins[0]]
    if draft_probs is not None:  # q normalised as tree_rejection_sample does
        cols.append(draft_probs[par, flat.tokens] / draft_probs.sum(-1).clamp_min(1e-30)[par])
    host = torch.stack([c.double() for c in cols]).tolist()  # [5 or 6, T]: ONE sync
    parents, depths = [int(v) for v in host[0]], [int(v) for v in host[1]]
    siblings = len(set(parents[1:])) < t - 1
    repeated = len({(a, int(x)) for a, x in zip(parents[1:], host[2][1:])}) < t - 1  # a token twice under a node
    if sibling_tests is None:
        sibling_tests = dev.type == "cuda"
    if draft_probs is not None and siblings and sibling_tests:  # residual vectors per rank on the device, then scalars
        r_at, q_at, final = _sibling_tests(flat.tokens, parents, target_probs, draft_probs)
        px, qx = torch.stack([r_at.double(), q_at.double()]).tolist()  # [2, T]: the second sync
        path, _ = _scalar_walk(parents, depths, px, qx, host[4], residual_px=True)
        last = path[-1]
        bonus = torch.multinomial(final[last][None], 1, generator=generator)[0, 0]
        return _read_path(flat, flat.visible[last], bonus)
    if repeated or (draft_probs is not None and siblings):  # the vector loop
        path, _, bonus = tree_rejection_sample(flat.tokens[None], flat.parents[None], flat.depths, target_probs[None],
                                               None if draft_probs is None else draft_probs[None], generator,
                                               coins=coins)
        last = path[0].max().reshape(1)  # [1]: the deepest accepted node (path ids ascend; -1 is padding)
        return _read_path(flat, flat.visible[last][0], bonus[0])
    path, rejected = _scalar_walk(parents, depths, host[3], host[5] if draft_probs is not None else None, host[4])
    last = path[-1]
    r = target_probs[last].float()  # [V]
    if rejected:  # the residual after the last node's rejected children
        if draft_probs is None:
            rest = r.index_fill(0, flat.tokens[rejected], 0.0)
        else:  # chains: one rejected child, drawn from q_last
            rest = (r - _normalised(draft_probs[last].float())).clamp_min(0)
        r = _rejected_residual(rest, r)
    bonus = torch.multinomial(r[None], 1, generator=generator)[0, 0]
    return _read_path(flat, flat.visible[last], bonus)  # the path = the last node's ancestors and itself
