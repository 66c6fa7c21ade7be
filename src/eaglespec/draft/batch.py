"""Greedy chains for B sequences at once: one drafter call per step for every row (engine/batch.py).

The drafter's KV of all rows is one KVCache per layer, [B, Hkv, L, D], with valid [B, L] marking each row's slots
(a row that appended fewer rows in a ragged block leaves holes the mask hides), as backends/hf_batch.py does for
the target. A round per row, as the Proposer runs it (contract 4's index shift):

    catch_up   row b's pending features f_t with tokens x_{t+1}, t = committed_b .. committed_b + n_b - 1, at
               positions t: one call over a ragged block of max n_b rows; its slots stay
    chain      k greedy drafts below each root: the first from the catch-up's last row, then k - 1 calls of one row
               per batch row at position committed_b + d - 1, each seeing its row's KV and its own chain rows;
               the chain's slots are cut afterwards
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from eaglespec.draft.layers import KVCache
from eaglespec.tensors import to_device
from eaglespec.tree.core import DraftTree, chain_tree

HOLES = 0.5  # share of hole slots at which the KV is compacted


def supports_batched_chains(drafter: nn.Module | None) -> bool:
    """EAGLE-3 drafters take a leading batch dim (their training runs that way)."""
    return drafter is not None and getattr(drafter, "method", None) == "eagle3"


class BatchChains:
    """Drafter KV of B sequences and their greedy chains (see the module docstring)."""

    def __init__(self, drafter: nn.Module, depth: int):
        self.drafter, self.depth = drafter, depth
        self.cache: list[KVCache] = drafter.new_cache()
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # [B, L]
        self.committed: list[int] = []  # drafter rows per batch row

    @property
    def device(self) -> torch.device:
        return next(self.drafter.parameters()).device

    @property
    def batch(self) -> int:
        return len(self.committed)

    def join(self) -> int:
        """A new row with no drafter rows yet; returns its index."""
        for layer in self.cache:
            if layer.k is not None:
                layer.k = torch.cat([layer.k, layer.k.new_zeros(1, *layer.k.shape[1:])])
                layer.v = torch.cat([layer.v, layer.v.new_zeros(1, *layer.v.shape[1:])])
        self.valid = torch.cat([self.valid, self.valid.new_zeros(1, self.valid.shape[1])])
        self.committed.append(0)
        return self.batch - 1

    def drop(self, rows: Sequence[int]) -> None:
        """Remove rows (their KV freed); the rows after them move up, in order."""
        gone = set(rows)
        keep = [b for b in range(self.batch) if b not in gone]
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        for layer in self.cache:
            if layer.k is not None:
                layer.k, layer.v = layer.k.index_select(0, idx), layer.v.index_select(0, idx)
        self.valid = self.valid[idx]
        self.committed = [self.committed[b] for b in keep]

    @torch.no_grad()
    def propose(self, rows: Sequence[int], roots: Sequence[torch.Tensor], features: Sequence[torch.Tensor],
                next_tokens: Sequence[Sequence[int]], depth: int | None = None) -> list[DraftTree]:
        """Greedy chains of `depth` drafts (None: the chains' depth) below roots[i] (each [1]) for batch rows
        `rows`, after catching each up on its pending features[i] [n_i, F] with next_tokens[i] (n_i ids). Rows
        not named take part in no call."""
        drafts = self.draft(rows, features, next_tokens, depth)  # [R, k]
        return [chain_tree(root, d) for root, d in zip(roots, drafts)]

    @torch.no_grad()
    def draft(self, rows: Sequence[int], features: Sequence[torch.Tensor], next_tokens: Sequence[Sequence[int]],
              depth: int | None = None) -> torch.Tensor:
        """propose's drafts alone: the k = depth (None: the chains' depth) greedy drafts below each named row's
        root, target ids [R, k]."""
        k = self.depth if depth is None else depth
        if not 1 <= k <= self.depth:
            raise ValueError(f"a chain of {k} drafts: the chains draft 1 to {self.depth}")
        logits, state = self._catch_up(rows, features, next_tokens)  # [R, Vd], [R, H]
        keep = self.valid.shape[1]
        try:
            return self._chain(rows, logits, state, k)
        finally:
            for layer in self.cache:
                layer.crop(keep)

    def _run(self, rows: Sequence[int], state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             block: torch.Tensor, last: torch.Tensor, own: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter call: state [R, T, H], tokens / positions [R, T] for batch rows `rows`, block [R, T, T] bool
        visibility among the new rows; own [R, T, C] bool: which of the C slots after the row's committed ones
        (the chain rows so far) it sees. Every batch row gets T slots (rows not named: padding that sees itself).
        Returns the logits [R, Vd] and state [R, H] of each named row's new row `last` [R]."""
        B, T = self.batch, tokens.shape[1]
        L = self.valid.shape[1]
        if len(rows) < B:  # the rows not named are padding rows
            idx = to_device(list(rows), self.device)
            state = state.new_zeros(B, T, state.shape[-1]).index_copy(0, idx, state)
            tokens = tokens.new_zeros(B, T).index_copy(0, idx, tokens)
            positions = positions.new_zeros(B, T).index_copy(0, idx, positions)
            eye = torch.eye(T, dtype=torch.bool, device=self.device).expand(B, T, T)
            block = eye.clone().index_copy(0, idx, block)
            own = None if own is None else own.new_zeros(B, T, own.shape[-1]).index_copy(0, idx, own)
            last = last.new_zeros(B).index_copy(0, idx, last)
        past = self.valid[:, None, :].expand(B, T, L)
        if own is not None:
            past = torch.cat([past, own], dim=2)
        visible = torch.cat([past, block], dim=2)  # [B, T, L + C + T]
        logits, states = self.drafter(state, tokens, positions, self.cache, visible=visible,
                                      logit_rows=last)  # logits [B, Vd], states [B, T, H]
        states = states[torch.arange(B, device=self.device), last]
        if len(rows) < B:
            return logits.index_select(0, idx), states.index_select(0, idx)
        return logits, states

    def _catch_up(self, rows, features, next_tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each named row's verified rows (a ragged block, padded); (logits, state) of each one's last row.
        The indices are built on the host and copied over once each: no host sync."""
        dev, R = self.device, len(rows)
        counts = [f.shape[0] for f in features]
        W = max(counts)
        which = to_device([i for i, n in enumerate(counts) for _ in range(n)], dev)  # each row's named row
        col = to_device([j for n in counts for j in range(n)], dev)  # and its place in the block
        proj = self.drafter.project(torch.cat(features).to(dev))  # [sum n, H]: one projection for all rows
        state = proj.new_zeros(R, W, proj.shape[-1]).index_put_((which, col), proj)
        tokens = to_device([list(t) + [0] * (W - len(t)) for t in next_tokens], dev)
        positions = to_device([[self.committed[b] + j for j in range(W)] for b in rows], dev)
        real_rows = to_device([[j < n for j in range(W)] for n in counts], dev, torch.bool)  # [R, W]
        eye = torch.eye(W, dtype=torch.bool, device=dev)
        block = (torch.ones(W, W, dtype=torch.bool, device=dev).tril() & real_rows[:, None, :]) | eye  # [R, W, W]
        if len(rows) == self.batch:
            real = real_rows
        else:
            real = torch.zeros(self.batch, W, dtype=torch.bool, device=dev)
            real[to_device(list(rows), dev)] = real_rows
        last = to_device([n - 1 for n in counts], dev)
        logits, state = self._run(rows, state, tokens, positions, block, last)
        self.valid = torch.cat([self.valid, real], dim=1)
        for b, n in zip(rows, counts):
            self.committed[b] += n
        if self.batch and 1 - sum(self.committed) / (self.batch * self.valid.shape[1]) >= HOLES:
            self._compact()
        return logits, state

    def _compact(self) -> None:
        """Gather each row's slots to the front, in order (L becomes the longest row's count)."""
        n = max(self.committed, default=0)  # each row's valid slots are its committed drafter rows
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :n]  # [B, n]
        for layer in self.cache:
            B, H, _, D = layer.k.shape
            index = order[:, None, :, None].expand(B, H, n, D)
            layer.k, layer.v = layer.k.gather(2, index), layer.v.gather(2, index)
        self.valid = self.valid.gather(1, order)

    def _chain(self, rows, logits: torch.Tensor, state: torch.Tensor, k: int) -> torch.Tensor:
        """k greedy drafts per named row (target ids [R, k]); drafter calls for depths 1..k-1."""
        dev, R = self.device, len(rows)
        base = to_device([self.committed[b] for b in rows], dev)  # the root's drafter row + 1
        eye = torch.ones(R, 1, 1, dtype=torch.bool, device=dev)
        drafts = []
        for d in range(1, k + 1):
            draft = self.drafter.to_target_ids(logits.argmax(-1))  # [R]
            drafts.append(draft)
            if d == k:
                break
            own = torch.ones(R, 1, d - 1, dtype=torch.bool, device=dev) if d > 1 else None  # its chain rows
            logits, state = self._run(rows, state[:, None], draft[:, None], (base + d - 1)[:, None], eye,
                                      base.new_zeros(R), own)
        return torch.stack(drafts, dim=1)
