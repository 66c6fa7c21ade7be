"""Acceptance: which drafted rows the target agrees with, and the bonus token."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import FlatTree


@dataclass
class Acceptance:
    rows: torch.Tensor  # [m+1] flattened-row indices of the accepted path, root first
    bonus: int  # the target's token after the last accepted row
    accepted: int  # m: draft tokens accepted


def greedy_accept(flat: FlatTree, logits: torch.Tensor) -> Acceptance:
    """Longest root path whose every token equals the target's argmax at its parent row."""
    target_next = logits.argmax(dim=-1)  # [T]
    match = flat.tokens == target_next[flat.parents.clamp(min=0)]
    match[0] = True  # the root is already emitted
    ok = ~(flat.visible & ~match[None, :]).any(dim=-1)  # every ancestor-or-self matches
    best = int(torch.where(ok, flat.depths, -1).argmax())  # deepest; siblings never both match
    rows = flat.visible[best].nonzero().flatten()
    return Acceptance(rows=rows, bonus=int(target_next[best]), accepted=rows.numel() - 1)
