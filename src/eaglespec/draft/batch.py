"""Chains and static trees for B sequences at once: one drafter call per step for every row (engine/batch.py).

The drafter's KV of all rows sits in slot buffers per layer, [Bcap, Hkv, S, D], as backends/hf_batch.py keeps the
target's: row b's committed drafter rows in its slots 0..n_b-1 (slot s holds position s), the live rows first, in
the target's order. A step writes its rows after a row's committed ones and sees the slots below its own: no holes,
nothing to cut afterwards (a slot past n_b is hidden until a later step overwrites it). A round per row, as the
Proposer runs it (contract 4's index shift):

    catch_up   row b's pending features f_t with tokens x_{t+1}, t = n_b .. n_b + m_b - 1, at positions t: one call
               over a ragged block of W = max m_b rows (a shorter row's padding rows write slots that stay hidden);
               n_b += m_b
    chain      k drafts below each root: the first from the catch-up's last row, then k - 1 calls of one row per
               batch row at position n_b + d - 1, each seeing its row's committed slots and its own chain rows;
               greedy rows take the argmax, sampled rows (RowSampling) draw from their processed draft distribution
               q by the exponential race over Exp(1) noise [k, Vd] drawn from the row's own generator before the
               draft, as the Proposer's sampled chain does, and their q rows go to the tree for rejection sampling
    static     the spec's static tree (the Proposer's StaticPlan, the same for every row): the root's children are
               the catch-up row's top ranks; then one call per depth over every row's expanded nodes of that depth
               (tree row r at slot n_b + r, position n_b + depth - 1), each seeing its row's committed slots and its
               ancestors' tree rows; their children are their top ranks

On CUDA each drafter step runs draft/fused.py's FusedBatchEagle3Step (its fused layers, per-row slots and masks). The
whole draft (catch-up and growth) is one function of static inputs; on CUDA it replays as one CUDA graph per
(batch bucket, W, S, k), W padded to a power of two (at least MIN_BLOCK) up to GRAPH_ROWS (a longer catch-up runs
eagerly). Sampled rows draft chains here (`samples`); a draft with sampled rows runs eagerly (their processors and
noise differ per row). Under a static tree they draft on their own proposers. A joining prompt's features go in
before its first round (catch_up: the joining rows alone, eagerly, nothing drafted), so that a round's block stays
narrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from eaglespec.backends.fast import capture_graph
from eaglespec.draft.fused import FusedBatchEagle3Step, unfusable_reason
from eaglespec.draft.layers import Attention
from eaglespec.draft.proposer import StaticPlan, to_target_probs
from eaglespec.kernels import on_by_default
from eaglespec.rows import compaction, grown, grown_bytes, move_rows
from eaglespec.sampling import SamplingParams, exponential_noise, process_logits, race_argmax
from eaglespec.tensors import to_device, to_device_all
from eaglespec.tree.core import DraftTree, TreeSpec, ancestry, chain_tree, draft_topk, static_layout

GRAPH_ROWS = 16  # the widest catch-up block drafted through a CUDA graph
MIN_BLOCK = 4  # a graphed catch-up block's fewest rows (blocks are padded to a power of two)
MIN_SLOTS = 64


def supports_batched_drafts(drafter: nn.Module | None, spec: TreeSpec) -> bool:
    """Whether BatchDrafts drafts `spec` for `drafter`: a drafting chain or static tree, from an EAGLE-3 drafter
    (they take a leading batch dim: their training runs that way)."""
    return (drafter is not None and getattr(drafter, "method", None) == "eagle3" and spec.speculates
            and spec.kind in ("chain", "static"))


class SlotKV:
    """The drafter attention's KVCache stand-in over slot buffers [B, Hkv, S, D]: append writes the new rows
    [B, Hkv, T, D] at `slots` [B, T] and returns the whole buffers (the caller's mask [B, T, S] says what each row
    sees)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor):
        self.k, self.v, self.slots = k, v, slots

    @property
    def length(self) -> int:
        return self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.slots[:, None, :, None].expand_as(k)
        self.k.scatter_(2, index, k)
        self.v.scatter_(2, index, v)
        return self.k, self.v


@dataclass
class _Inputs:
    """One draft's inputs, [Bp] rows (static buffers when graphed)."""

    features: torch.Tensor  # [Bp, W, F]: each row's pending features, zero-padded
    tokens: torch.Tensor  # [Bp, W] long: x_{t+1} for each feature row
    base: torch.Tensor  # [Bp] long: the row's committed drafter rows n_b
    last: torch.Tensor  # [Bp] long: m_b - 1, the row's last catch-up row (0 for a row not drafting)


@dataclass
class RowSampling:
    """A sampled row's draft processors and its own random stream (SamplingConfig.draft_params, its generator)."""

    params: SamplingParams
    generator: torch.Generator | None


@dataclass
class SampledRows:
    """Sampled block rows with the same draft processors: their noise [n, k, Vd] and, per depth, q [n, Vd]."""

    rows: list[int]
    index: torch.Tensor  # [n] long: the block rows
    params: SamplingParams
    noise: torch.Tensor
    probs: list[torch.Tensor] = field(default_factory=list)

    def draw(self, logits: torch.Tensor, ids: torch.Tensor, d: int) -> torch.Tensor:
        """The group's rows of ids [Bp] replaced by their draws at depth d (0-based) from logits [Bp, Vd]."""
        q = process_logits(logits[self.index], self.params)  # [n, Vd]
        self.probs.append(q)
        return ids.index_put((self.index,), race_argmax(q, self.noise[:, d]))


@dataclass
class _Graph:
    inputs: _Inputs
    graph: torch.cuda.CUDAGraph
    drafts: torch.Tensor  # [Bp, k] (rewritten by every replay)


class BatchDrafts:
    """Drafter KV of B sequences and their chains (greedy or sampled) or greedy static trees (see the module
    docstring)."""

    def __init__(self, drafter: nn.Module, spec: TreeSpec, graphs: bool | None = None, fused: bool | None = None,
                 kernels: bool | None = None):
        if not supports_batched_drafts(drafter, spec):
            raise ValueError(f"batched drafts are EAGLE-3 chains and static trees, not {spec.kind}")
        self.drafter, self.spec = drafter, spec
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        # the drafter's steps through draft/fused.py's FusedBatchEagle3Step (None: on CUDA where it can), with the
        # Triton kernels (None: where they run by default)
        reason = unfusable_reason(drafter)
        if fused and reason is not None:
            raise ValueError(f"fused batched drafts: {reason}")
        self.fused = (self.device.type == "cuda" and reason is None) if fused is None else fused
        self.kernels = on_by_default(self.device) if kernels is None else kernels
        self._step: nn.Module | FusedBatchEagle3Step = drafter  # the fused step is built with the slot buffers
        self.plan = None if spec.kind == "chain" else StaticPlan.build(static_layout(spec.static_choices()), False,
                                                                        self.device)
        self.visible = None if self.plan is None else ancestry(self.plan.parents)  # [N, N]: every static tree's
        # drafts per row: a chain's k at most, a static tree's nodes below the root
        self.depth = spec.depth if self.plan is None else self.plan.parents.shape[0] - 1
        self.attn = [m for m in drafter.modules() if isinstance(m, Attention)]
        self.k: list[torch.Tensor] = []  # per layer [Bcap, Hkv, S, D]; allocated at the first draft
        self.v: list[torch.Tensor] = []
        self.committed: list[int] = []  # drafter rows per batch row
        self.use_graphs = self.device.type == "cuda" if graphs is None else graphs and self.device.type == "cuda"
        self._graphs: dict[tuple[int, int, int, int], _Graph] = {}
        self._pool = None

    @property
    def batch(self) -> int:
        return len(self.committed)

    @property
    def graphs(self) -> int:
        """Draft graphs captured and held (one per batch bucket, block rows, slots and depth met)."""
        return len(self._graphs)

    @property
    def samples(self) -> bool:
        """Whether sampled rows draft here: chains (a draft with sampled rows runs eagerly, without CUDA graphs)."""
        return self.plan is None

    @property
    def slots(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def kv_bytes(self, rows: int, slots: int) -> int:
        """Bytes the slot buffers hold once they have room for `rows` rows of `slots` slots (_reserve's growth),
        counting the present ones as well when they must grow."""
        per = sum(2 * a.kv_heads * a.head_dim for a in self.attn) * self.dtype.itemsize
        cap = (self.k[0].shape[0], self.slots) if self.k else (0, 0)
        return grown_bytes(cap, (rows, slots), MIN_SLOTS, per)

    def join(self) -> int:
        """A new row with no drafter rows yet; returns its index."""
        self.committed.append(0)
        return self.batch - 1

    def drop(self, rows: Sequence[int]) -> list[int]:
        """Remove rows (their slots freed): rows.compaction's order, as the batched target's; returns it."""
        order = compaction(self.batch, rows)
        move_rows([*self.k, *self.v], order)
        self.committed = [self.committed[b] for b in order]
        return order

    @torch.no_grad()
    def propose(self, rows: Sequence[int], roots: torch.Tensor, features: Sequence[torch.Tensor],
                next_tokens: Sequence[Sequence[int]], depth: int | None = None,
                sampling: Sequence[RowSampling | None] | None = None) -> list[DraftTree]:
        """The trees below roots [R] (target ids) for batch rows `rows`, after catching each up on its pending
        features[i] [n_i, F] with next_tokens[i] (n_i ids): chains of `depth` drafts (None: the spec's depth), or
        the static tree. sampling[i]: row i's draft processors and generator (None, or greedy processors: it
        drafts greedily); a sampled row's chain carries its q rows (draft_probs [k + 1, V], the last node's
        zero)."""
        groups = self.sampled_rows(rows, sampling, depth)
        drafts = self.draft(rows, features, next_tokens, depth, groups)  # [R, k]
        tokens = torch.cat([roots.to(drafts.device)[:, None], drafts], dim=1)  # [R, 1 + k]: each tree's nodes
        if self.plan is not None:
            return [DraftTree(tokens=t, parents=self.plan.parents, depths=self.plan.depths, ordered=True,
                              visible=self.visible) for t in tokens]
        trees = [chain_tree(t[:1], t[1:]) for t in tokens]
        place = {b: i for i, b in enumerate(rows)}
        for b, q in self.row_probs(groups).items():
            trees[place[b]].draft_probs = q  # [k + 1, V]
        return trees

    def row_probs(self, groups: list[SampledRows] | None) -> dict[int, torch.Tensor]:
        """Each sampled row's q rows after a draft with `groups`, by batch row: [k + 1, V] over the target vocab, the
        last node's zero (it has no child)."""
        out = {}
        for g in groups or ():
            probs = torch.stack(g.probs, dim=1)  # [n, k, Vd]
            probs = torch.cat([probs, probs.new_zeros(probs.shape[0], 1, probs.shape[-1])], dim=1)
            out.update(zip(g.rows, to_target_probs(self.drafter, probs)))
        return out

    def sampled_rows(self, rows: Sequence[int], sampling: Sequence[RowSampling | None] | None,
                     depth: int | None = None) -> list[SampledRows] | None:
        """The sampled rows among `rows` (sampling[i]: row i's, None for a greedy row) grouped by draft processors,
        each row's noise [k, Vd] for a chain of `depth` drafts drawn now from its own generator (one call, as the
        Proposer's draft_noise); None when no row samples."""
        k = self._drafts(depth)
        by_params: dict[SamplingParams, list[tuple[int, torch.Tensor]]] = {}
        for b, rs in zip(rows, sampling or ()):
            if rs is None or rs.params.greedy:
                continue
            noise = torch.empty(k, self.drafter.cfg.draft_vocab_size, dtype=torch.float32, device=self.device)
            by_params.setdefault(rs.params, []).append((b, exponential_noise(noise, rs.generator)))
        if not by_params:
            return None
        if not self.samples:
            raise ValueError("sampled rows draft batched chains, not static trees")
        return [SampledRows([b for b, _ in members], to_device([b for b, _ in members], self.device), params,
                            torch.stack([n for _, n in members])) for params, members in by_params.items()]

    @torch.no_grad()
    def draft(self, rows: Sequence[int], features: Sequence[torch.Tensor], next_tokens: Sequence[Sequence[int]],
              depth: int | None = None, groups: list[SampledRows] | None = None) -> torch.Tensor:
        """propose's drafts alone, target ids [R, k] for the named rows: a chain's k = depth (None: the spec's
        depth) drafts (greedy, or drawn for the sampled rows of `groups`), or the static tree's nodes below the root
        in node order (k = self.depth). Rows not named draft nothing (their slots past n_b are scratch)."""
        k = self._drafts(depth)
        rows = list(rows)
        counts = [f.shape[0] for f in features]
        Bp, W, graphed = self._block(max(counts))
        self._reserve(Bp, max(self.committed) + W + k)  # a static tree's rows are fewer than its nodes
        inputs = self._inputs(Bp, rows, features, next_tokens, W, self.committed)
        drafts = self._run(inputs, k, graphed, groups)
        for b, n in zip(rows, counts):
            self.committed[b] += n
        if rows == list(range(len(rows))):  # the first rows, in order (every live row, as a round drafts)
            return drafts[: len(rows)]
        return drafts[to_device(rows, self.device)]

    @torch.no_grad()
    def draft_block(self, features: torch.Tensor, next_tokens: torch.Tensor, counts: Sequence[int],
                    depth: int | None = None, groups: list[SampledRows] | None = None) -> torch.Tensor:
        """draft for every batch row from a block already on the device: row b's pending features are
        features[b, :counts[b]] ([B, w, F] in all) with next_tokens[b, :counts[b]] ([B, w] ids); the rest of each
        row is ignored. Returns the drafts [B, k] (drawn for the sampled rows of `groups`)."""
        k = self._drafts(depth)
        B, w = next_tokens.shape
        if len(counts) != B or self.batch != B or not all(1 <= n <= w for n in counts):
            raise ValueError(f"draft_block takes every batch row ({self.batch}) with 1..{w} rows each, not {counts}")
        Bp, W, graphed = self._block(w)
        self._reserve(Bp, max(self.committed) + W + k)
        if (Bp, W) != (B, w):
            padded, ids = features.new_zeros(Bp, W, features.shape[-1]), next_tokens.new_zeros(Bp, W)
            padded[:B, :w], ids[:B, :w] = features, next_tokens
            features, next_tokens = padded, ids
        pad = [0] * (Bp - B)
        base, last = to_device_all(self.device, [*self.committed, *pad], [n - 1 for n in counts] + pad)
        inputs = _Inputs(features, next_tokens, base, last)
        drafts = self._run(inputs, k, graphed, groups)
        self.committed = [c + n for c, n in zip(self.committed, counts)]
        return drafts[:B]

    def _drafts(self, depth: int | None) -> int:
        """k, the drafts per row below the root: a chain's `depth` (None: the spec's), a static tree's nodes."""
        k = self.depth if depth is None or self.plan is not None else depth
        if not 1 <= k <= self.depth:
            raise ValueError(f"a chain of {k} drafts: the chains draft 1 to {self.depth}")
        return k

    def _block(self, W: int) -> tuple[int, int, bool]:
        """(Bp, W, graphed) of a draft over every batch row whose catch-up block is W rows wide: through a CUDA graph
        when W <= GRAPH_ROWS, the batch then padded to a power of two and the block to one of at least MIN_BLOCK rows
        (few graphs whatever is pending)."""
        B = self.batch
        graphed = self.use_graphs and W <= GRAPH_ROWS
        if not graphed:
            return B, W, False
        return 1 << (B - 1).bit_length(), max(MIN_BLOCK, 1 << (W - 1).bit_length()), True

    def _run(self, inputs: _Inputs, k: int, graphed: bool, groups: list[SampledRows] | None = None) -> torch.Tensor:
        """The drafts [Bp, k] from a draft's inputs: the graph's replay, or the eager draft (always with sampled rows,
        `groups`: their processors and noise differ per row)."""
        return self._replay(inputs, k) if graphed and not groups else self._draft(inputs, k, groups)

    @torch.no_grad()
    def catch_up(self, rows: range, features: Sequence[torch.Tensor], next_tokens: Sequence[Sequence[int]]) -> None:
        """Run the features[i] [n_i, F] of the consecutive batch rows `rows` (with next_tokens[i], n_i ids) through
        the drafter, writing their KV after each row's committed ones; nothing is drafted. Eager, over these rows
        only: a joining prompt's features, all but the last (the round that drafts from it takes that one)."""
        counts = [f.shape[0] for f in features]
        W = max(counts, default=0)
        if W == 0:
            return
        if len(rows) != len(features) or rows.step != 1 or not 0 <= rows.start <= rows.stop <= self.batch:
            raise ValueError(f"catch_up takes consecutive batch rows with their features, not {rows}")
        base = self.committed[rows.start: rows.stop]
        self._reserve(rows.stop, max(base) + W)
        inputs = self._inputs(len(rows), range(len(rows)), features, next_tokens, W, base)
        self._catch_up(inputs, rows.start)
        for b, n in zip(rows, counts):
            self.committed[b] += n

    def _inputs(self, Bp: int, rows: Sequence[int], features: Sequence[torch.Tensor],
                next_tokens: Sequence[Sequence[int]], W: int, base: Sequence[int]) -> _Inputs:
        """The padded inputs of a draft over Bp block rows (`rows` of them take features; base: the block rows'
        committed drafter rows), built on the host and copied over in one copy: no host sync."""
        dev = self.device
        counts = [f.shape[0] for f in features]
        tokens, last = [[0] * W for _ in range(Bp)], [0] * Bp
        for b, t, n in zip(rows, next_tokens, counts):
            tokens[b][:n], last[b] = list(t), max(n - 1, 0)
        base = list(base) + [0] * (Bp - len(base))
        which = [b for b, n in zip(rows, counts) for _ in range(n)]  # each feature's batch row
        col = [j for n in counts for j in range(n)]  # and its place in the block
        which, col, tokens, base, last = to_device_all(dev, which, col, tokens, base, last)
        feats = torch.cat(features).to(dev)
        padded = feats.new_zeros(Bp, W, feats.shape[-1]).index_put_((which, col), feats)
        return _Inputs(padded, tokens, base, last)

    def _catch_up(self, s: _Inputs, first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The block's features through the drafter over slot-buffer rows first..first+Bp-1: (the logits [Bp, Vd]
        and state [Bp, H] of each row's last block row). Tensor ops only."""
        Bp, W = s.tokens.shape
        cols = torch.arange(self.slots, device=self.device)
        slots = s.base[:, None] + torch.arange(W, device=self.device)  # [Bp, W]: slot = position
        visible = cols < slots[..., None] + 1  # [Bp, W, S]: the committed slots, then the block up to itself
        cache = [SlotKV(kb[first: first + Bp], vb[first: first + Bp], slots) for kb, vb in zip(self.k, self.v)]
        logits, states = self._step(self.drafter.project(s.features), s.tokens, slots, cache, visible=visible,
                                    logit_rows=s.last)  # [Bp, Vd], [Bp, W, H]
        return logits, states[torch.arange(Bp, device=self.device), s.last]

    def _draft(self, s: _Inputs, k: int, groups: list[SampledRows] | None = None) -> torch.Tensor:
        """Catch-up and growth over the slot buffers' first Bp rows: drafts [Bp, k] (target ids); the rows of
        `groups` draw theirs (each group keeps its q rows). Tensor ops only."""
        Bp = s.tokens.shape[0]
        cols = torch.arange(self.slots, device=self.device)
        logits, state = self._catch_up(s)  # [Bp, Vd], [Bp, H]
        root = s.base + s.last + 1  # the root's drafter row + 1: committed after the catch-up
        if self.plan is not None:
            return self._static(logits, state, root, cols)
        zero = torch.zeros_like(s.last)
        drafts = []
        for d in range(1, k + 1):
            ids = logits.argmax(-1)  # [Bp]
            for g in groups or ():
                ids = g.draw(logits, ids, d - 1)
            draft = self.drafter.to_target_ids(ids)
            drafts.append(draft)
            if d == k:
                break
            slot = (root + d - 1)[:, None]  # [Bp, 1]
            cache = [SlotKV(kb[:Bp], vb[:Bp], slot) for kb, vb in zip(self.k, self.v)]
            logits, states = self._step(state[:, None], draft[:, None], slot, cache,
                                        visible=cols < slot[..., None] + 1, logit_rows=zero)
            state = states[:, 0]
        return torch.stack(drafts, dim=1)

    def _static(self, logits: torch.Tensor, state: torch.Tensor, root: torch.Tensor, cols: torch.Tensor
                ) -> torch.Tensor:
        """The static tree below every row's root from the catch-up's logits [Bp, Vd] and state [Bp, H]; root [Bp]
        = the committed drafter rows. Returns the nodes below the root [Bp, N - 1] (target ids), as the
        Proposer's greedy static growth: children by rank of the softmax, one drafter call per depth."""
        plan, Bp = self.plan, root.shape[0]
        R = plan.tree_visible.shape[0]
        if plan.n_ranks > logits.shape[-1]:
            raise ValueError(f"static tree rank {plan.n_ranks - 1} exceeds the draft vocabulary")
        _, top = draft_topk(torch.softmax(logits[:, None], dim=-1, dtype=torch.float32), plan.n_ranks)  # [Bp, 1, R]
        states = state[:, None]  # [Bp, e, H]: the expanded nodes of the previous depth
        rel = cols - root[:, None]  # [Bp, S]: slot relative to the first tree row
        tree_slot = (rel >= 0) & (rel < R)
        committed = rel < 0
        tokens = []
        for d, level in enumerate(plan.levels, start=1):
            tokens.append(self.drafter.to_target_ids(top[:, level.slot, level.rank]))  # [Bp, m]
            if level.expand is None:  # leaves only: the deepest level
                break
            r0, e = level.rows
            slots = root[:, None] + r0 + torch.arange(e, device=self.device)  # [Bp, e]: tree rows r0..r0+e-1
            sees = plan.tree_visible[r0: r0 + e][:, rel.clamp(0, R - 1)].transpose(0, 1)  # [Bp, e, S]
            visible = committed[:, None] | (sees & tree_slot[:, None])
            positions = (root + d - 1)[:, None].expand(Bp, e)
            cache = [SlotKV(kb[:Bp], vb[:Bp], slots) for kb, vb in zip(self.k, self.v)]
            out, states = self._step(states[:, level.expand_slot], tokens[-1][:, level.expand], positions, cache,
                                     visible=visible)  # [Bp, e, Vd], [Bp, e, H]
            _, top = draft_topk(torch.softmax(out, dim=-1, dtype=torch.float32), plan.n_ranks)  # [Bp, e, R]
        return torch.cat(tokens, dim=1)

    def _replay(self, s: _Inputs, k: int) -> torch.Tensor:
        """_draft as a CUDA graph per (Bp, W, S, k), captured on first use with this draft's inputs in place (the
        warm-up writes only slots past each row's committed ones)."""
        key = (s.tokens.shape[0], s.tokens.shape[1], self.slots, k)
        g = self._graphs.get(key)
        if g is None:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph, drafts = capture_graph(lambda: self._draft(s, k), self.device, self._pool)
            g = self._graphs[key] = _Graph(s, graph, drafts)  # this draft's inputs become the static ones
        else:
            for name in ("features", "tokens", "base", "last"):
                getattr(g.inputs, name).copy_(getattr(s, name))
        g.graph.replay()
        return g.drafts.clone()

    def _reserve(self, rows: int, slots: int) -> None:
        """Room for `rows` rows of `slots` slots each: the buffers grow (doubling) and keep what they hold."""
        cap_rows, cap_slots = (self.k[0].shape[0], self.slots) if self.k else (0, 0)
        if rows <= cap_rows and slots <= cap_slots:
            return
        new_rows, new_slots = grown(cap_rows, rows, 1), grown(cap_slots, slots, MIN_SLOTS)
        self._graphs.clear()  # captured against the old buffers
        self._pool = None
        if self.fused:  # its rope table covers every slot position
            self._step = FusedBatchEagle3Step(self.drafter, new_slots, kernels=self.kernels)
        for buffers in (self.k, self.v):
            for i, a in enumerate(self.attn):
                buffer = torch.zeros(new_rows, a.kv_heads, new_slots, a.head_dim, device=self.device,
                                     dtype=self.dtype)
                if i < len(buffers):
                    buffer[:cap_rows, :, :cap_slots] = buffers[i]
                    buffers[i] = buffer
                else:
                    buffers.append(buffer)
