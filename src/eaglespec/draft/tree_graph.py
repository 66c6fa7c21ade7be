"""One CUDA graph per draft tree: the whole growth after catch-up, replayed once per round.

Around the per-step draft graphs (draft/fast.py) a tree's growth is hundreds of small eager ops (top-k, gathers,
masks). Here the growth of a chain, an EAGLE-2 dynamic tree or a static tree (greedy: top-k children; sampled:
draws without replacement by an exponential race) is ONE function of static buffers (root [1], catch-up logits
[Vd], state [H], committed length `base` []) whose shapes and host ints never depend on the committed length.
Sampled growth reads Exp(1) noise ([k, Vd] for a chain, [1 + R, Vd] for a tree: row 0 the root's children, row
1 + r tree row r's) that the proposer draws into TreeGraph.noise before the replay; the eager Proposer races over
the same noise, so one seed gives the same trees.

    slots      base + r0 + arange(n) for tree rows r0..r0+n-1 (where the per-step path writes them)
    positions  base + depth - 1
    mask       [n, span]: committed columns (< base), the tree block through the [R, R] tree-row visibility,
               later columns hidden; span = committed + R rounded up to span_step: one graph per (tree, span)

The growth is the eager Proposer's (Proposer._grow over DeviceTreeRows) and each step the drafter's own forward
over StaticKV, with no host sync (tests/test_tree_graph.py counts them). A dynamic tree's validation flags and a
sampled static tree's keep mask (children outside q's support, pruned by finish_tree with one host read) are
outputs read after the replay. On CPU the function runs eagerly over the same buffers; on CUDA it is captured on
first use of each span. A capture that raises warns once and that tree falls back to the per-step path.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Protocol

import torch

from eaglespec.draft.fast import StaticDraftRunner, StaticKV
from eaglespec.kernels import step as K
from eaglespec.tree.core import DraftTree, check_dynamic_flags


class Rows(Protocol):
    """A tree-row runner: proposer.TreeRows (eager, host committed length) or DeviceTreeRows."""

    def inherit(self, r0: int, p0: int, slot: torch.Tensor) -> None: ...

    def run(self, states: torch.Tensor, tokens: torch.Tensor, depth: int, r0: int
            ) -> tuple[torch.Tensor, torch.Tensor]: ...


NewRows = Callable[[torch.Tensor], Rows]  # tree part [R, R] bool -> the rows runner of one tree
# (root [1], logits [Vd], state [H], new_rows, sampled chains' / static trees' noise [rows, Vd] or None)
#   -> (tree, dynamic trees' [4] flags or None, sampled static trees' [N] keep mask or None): Proposer._grow
Grow = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, NewRows, torch.Tensor | None],
                tuple[DraftTree, torch.Tensor | None, torch.Tensor | None]]


def keep_nodes(tree: DraftTree, keep: torch.Tensor) -> DraftTree:
    """The subtree of the nodes in `keep` [N] bool (ancestor-closed, root kept), renumbered in order.

    One host sync (the number of nodes kept)."""
    kept = keep.nonzero()[:, 0]  # [M] old node ids, in node order
    if kept.numel() == keep.numel():
        return tree
    new_id = torch.cumsum(keep.long(), 0) - 1  # old id -> new id (for kept nodes)
    parents = torch.where(tree.parents[kept] >= 0, new_id[tree.parents[kept].clamp(min=0)], -1)
    return DraftTree(tokens=tree.tokens[kept], parents=parents, depths=tree.depths[kept],
                     logq=None if tree.logq is None else tree.logq[kept],
                     draft_probs=None if tree.draft_probs is None else tree.draft_probs[kept], stats=tree.stats,
                     ordered=True)


def finish_tree(tree: DraftTree, flags: torch.Tensor | None, keep: torch.Tensor | None) -> DraftTree:
    """After a growth (Proposer._grow's outputs): check a dynamic tree's flags, prune a sampled static tree
    to `keep`. The host reads of a tree: never inside the growth."""
    if flags is not None:
        check_dynamic_flags(flags)
    return tree if keep is None else keep_nodes(tree, keep)


class MaskRows:
    """Tree rows whose visibility is `mask` [R, X] bool: row i = tree row i over the X KV columns."""

    mask: torch.Tensor

    def inherit(self, r0: int, p0: int, slot: torch.Tensor) -> None:
        """Tree rows r0..r0+n-1 also see what tree rows p0 + slot [n] see (their parents: the growth
        writes a row before running it). Two ops, whatever the depth."""
        self.mask[r0: r0 + slot.shape[0]].bitwise_or_(self.mask[p0:].index_select(0, slot))


class DeviceTreeRows(MaskRows):
    """proposer.TreeRows over a StaticDraftRunner's KV, the committed length a device tensor `base` [],
    attending over the first `span` KV slots (span >= base + R: the caller's contract).

    Built once per tree (inside the graph): the [R, span] mask and base + arange(R), which give every
    depth's mask rows, KV slots and positions as views (tree rows r0..r0+n-1 at slots base + r0 + i;
    depth d at position base + d - 1, d - 1 < R as every earlier depth ran at least one row)."""

    def __init__(self, runner: StaticDraftRunner, base: torch.Tensor, tree_part: torch.Tensor, span: int):
        r = tree_part.shape[0]
        self.runner, self.span = runner, span
        if not r:
            self.mask = tree_part.new_zeros(0, span)
        else:  # [R, span]: the committed columns, then the tree block; one kernel with the kernels
            mask_of = K.block_mask if runner.kernels else K.block_mask_ref
            self.mask = mask_of(tree_part, base, runner.cols[:span])
        self._at = base + runner.cols[:r]  # [R]: base + arange(R), the runner's arange (no kernel for it)

    def run(self, states: torch.Tensor, tokens: torch.Tensor, depth: int, r0: int
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tree rows r0..r0+n-1 -> (draft logits [n, Vd], states [n, H])."""
        n = tokens.shape[0]
        slots, positions = self._at[r0: r0 + n], self._at[depth - 1].expand(n)
        cache = [StaticKV(k, v, slots, self.span) for k, v in zip(self.runner.k, self.runner.v)]
        return self.runner.forward(states, tokens, positions, cache, visible=self.mask[r0: r0 + n])


class TreeGraph:
    """One tree policy's growth over static inputs (see module docstring); `grow` is Proposer._grow."""

    def __init__(self, runner: StaticDraftRunner, grow: Grow, rows: int, draft_vocab: int, noise_rows: int = 0):
        dev, dtype = runner.device, runner.dtype
        self.runner, self._grow, self.rows = runner, grow, rows
        self.root = torch.zeros(1, dtype=torch.long, device=dev)
        self.logits = torch.zeros(draft_vocab, dtype=dtype, device=dev)
        self.state = torch.zeros(runner.hidden_size, dtype=dtype, device=dev)
        self.base = torch.zeros((), dtype=torch.long, device=dev)  # the committed length
        # a sampled chain's / static tree's Exp(1) noise [noise_rows, Vd], filled by the proposer before run()
        self.noise = torch.ones(noise_rows, draft_vocab, device=dev) if noise_rows else None
        self.span = runner.span(rows)  # KV slots attended (set by run() from the committed length)
        # span -> (CUDA graph, the captured call's outputs): every span's graph reads the inputs above
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple]] = {}  # outputs: as grow()'s
        self.failed = False  # a capture raised: the proposer takes the per-step path

    def grow(self) -> tuple[DraftTree, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
        """The growth over the static buffers, attending over self.span slots: what a CUDA graph captures
        (no host sync). Returns the tree, a dynamic tree's [4] flags (else None), a sampled static tree's
        [N] keep mask (else None) and ids [3, N] long: the tree's tokens, parents and depths in one tensor
        (run() copies them out in one op)."""
        span = self.span
        tree, flags, keep = self._grow(self.root, self.logits, self.state,
                                       lambda part: DeviceTreeRows(self.runner, self.base, part, span), self.noise)
        return tree, flags, keep, torch.stack([tree.tokens, tree.parents, tree.depths])

    def run(self, root: int | torch.Tensor, logits: torch.Tensor, state: torch.Tensor, committed: int
            ) -> DraftTree | None:
        """The tree below `root` from the catch-up row's logits [Vd] / state [H], `committed` drafter rows
        live (and self.noise already drawn, for a sampled chain or static tree). None when the capture fails
        (warned once). The tree rows are left stale past `committed`."""
        self.runner.check_room(committed + self.rows)
        if isinstance(root, torch.Tensor):
            self.root.copy_(root.reshape(1))
        else:
            self.root.fill_(root)  # a fill: no host->device copy
        self.logits.copy_(logits)
        self.state.copy_(state)
        self.base.fill_(committed)
        self.span = self.runner.span(committed + self.rows)  # a host int: no sync
        if not self.runner.use_graphs:
            tree, flags, keep, ids = self.grow()
        else:
            if self.span not in self.graphs and not self._capture():
                return None
            graph, (tree, flags, keep, ids) = self.graphs[self.span]
            graph.replay()
        # the next replay rewrites the graph's outputs: the caller keeps its own tree
        tokens, parents, depths = ids.clone()  # [N] each
        q = None if tree.draft_probs is None else tree.draft_probs.clone()  # [N, V]: sampled chains, static trees
        out = DraftTree(tokens=tokens, parents=parents, depths=depths, logq=tree.logq.clone(), draft_probs=q,
                        stats=dict(tree.stats), ordered=True)
        return finish_tree(out, flags, keep)  # the host reads: a dynamic tree's flags, a sampled static tree's keep

    def _capture(self) -> bool:
        """Capture grow() at self.span (inputs staged: the warm-up writes the pending KV slots only)."""
        try:
            self.graphs[self.span] = self.runner.capture(self.grow)
        except Exception as exc:  # any failure: the per-step path still works
            self.failed = True
            first = (str(exc).splitlines() or [""])[0]
            warnings.warn(f"whole-tree draft graph: capture failed ({type(exc).__name__}: {first}); "
                          "this tree keeps the per-step draft graphs", RuntimeWarning, stacklevel=3)
            return False
        return True
