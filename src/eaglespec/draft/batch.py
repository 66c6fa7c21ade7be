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
                next_tokens: Sequence[torch.Tensor]) -> list[DraftTree]:
        """Greedy chains below roots[i] (each [1]) for batch rows `rows`, after catching each up on its pending
        features[i] [n_i, F] with next_tokens[i] [n_i]. Rows not named take part in no call."""
        logits, state = self._catch_up(rows, features, next_tokens)  # [R, Vd], [R, H]
        keep = self.valid.shape[1]
        try:
            drafts = self._chain(rows, logits, state)  # [R, k] target ids
        finally:
            for layer in self.cache:
                layer.crop(keep)
        return [chain_tree(root, d) for root, d in zip(roots, drafts)]

    def _run(self, rows: Sequence[int], state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             block: torch.Tensor, last: torch.Tensor, own: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter call: state [R, T, H], tokens / positions [R, T] for batch rows `rows`, block [R, T, T] bool
        visibility among the new rows; own [R, T, C] bool: which of the C slots after the row's committed ones
        (the chain rows so far) it sees. Every batch row gets T slots (rows not named: padding that sees itself).
        Returns the logits [R, Vd] and state [R, H] of each named row's new row `last` [R]."""
        B, T = self.batch, tokens.shape[1]
        idx = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        full_state = state.new_zeros(B, T, state.shape[-1]).index_copy(0, idx, state)
        full_tokens = tokens.new_zeros(B, T).index_copy(0, idx, tokens)
        full_pos = positions.new_zeros(B, T).index_copy(0, idx, positions)
        eye = torch.eye(T, dtype=torch.bool, device=self.device).expand(B, T, T)
        full_block = eye.clone().index_copy(0, idx, block)
        L = self.valid.shape[1]
        C = 0 if own is None else own.shape[-1]
        past = self.valid[:, None, :].expand(B, T, L)
        if own is not None:
            full_own = own.new_zeros(B, T, C).index_copy(0, idx, own)
            past = torch.cat([past, full_own], dim=2)
        visible = torch.cat([past, full_block], dim=2)  # [B, T, L + C + T]
        full_last = last.new_zeros(B).index_copy(0, idx, last)
        logits, states = self.drafter(full_state, full_tokens, full_pos, self.cache, visible=visible,
                                      logit_rows=full_last)  # logits [B, Vd], states [B, T, H]
        states = states[torch.arange(B, device=self.device), full_last]
        return logits.index_select(0, idx), states.index_select(0, idx)

    def _catch_up(self, rows, features, next_tokens) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each named row's verified rows (a ragged block, padded); (logits, state) of each one's last row."""
        dev, R = self.device, len(rows)
        counts = torch.tensor([f.shape[0] for f in features], device=dev)  # [R]
        W = int(counts.max())
        which = torch.repeat_interleave(torch.arange(R, device=dev), counts)  # every pending row's named row
        col = torch.cat([torch.arange(f.shape[0], device=dev) for f in features])  # and its place in the block
        proj = self.drafter.project(torch.cat(features).to(dev))  # [sum n, H]: one projection for all rows
        state = proj.new_zeros(R, W, proj.shape[-1]).index_put_((which, col), proj)
        tokens = torch.zeros(R, W, dtype=torch.long, device=dev).index_put_((which, col), torch.cat(next_tokens).to(dev))
        base = torch.tensor([self.committed[b] for b in rows], device=dev)
        positions = base[:, None] + torch.arange(W, device=dev)  # padding rows' positions are never seen
        real_rows = torch.arange(W, device=dev) < counts[:, None]  # [R, W]
        eye = torch.eye(W, dtype=torch.bool, device=dev)
        block = (torch.ones(W, W, dtype=torch.bool, device=dev).tril() & real_rows[:, None, :]) | eye  # [R, W, W]
        real = torch.zeros(self.batch, W, dtype=torch.bool, device=dev)
        real[torch.tensor(list(rows), device=dev)] = real_rows
        last = torch.tensor([f.shape[0] - 1 for f in features], device=dev)
        logits, state = self._run(rows, state, tokens, positions, block, last)
        self.valid = torch.cat([self.valid, real], dim=1)
        if 1 - self.valid.float().mean().item() >= HOLES:
            self._compact()
        for b, f in zip(rows, features):
            self.committed[b] += f.shape[0]
        return logits, state

    def _compact(self) -> None:
        """Gather each row's slots to the front, in order (L becomes the longest row's count)."""
        n = int(self.valid.sum(dim=1).max()) if self.batch else 0
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :n]  # [B, n]
        for layer in self.cache:
            B, H, _, D = layer.k.shape
            index = order[:, None, :, None].expand(B, H, n, D)
            layer.k, layer.v = layer.k.gather(2, index), layer.v.gather(2, index)
        self.valid = self.valid.gather(1, order)

    def _chain(self, rows, logits: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """k greedy drafts per named row (target ids [R, k]); drafter calls for depths 1..k-1."""
        dev, R, k = self.device, len(rows), self.depth
        base = torch.tensor([self.committed[b] for b in rows], device=dev)  # the root's drafter row + 1
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
