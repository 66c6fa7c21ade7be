"""The target-side contract every backend implements (generic HF, fast static-cache)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [T, V]
    features: torch.Tensor  # [T, n_ids * H]: the states entering the requested layers, concatenated


class TargetBackend(Protocol):
    """Committed prefix + one pending forward; see contract 7 (docs/contracts.md)."""

    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    committed_len: int

    def embedding(self) -> nn.Module: ...

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> TargetOutput:
        """Forward rows on top of the committed KV (positions committed_len + depth).

        tokens: [T]; depths: [T] (None = 0..T-1, a chain); visible: [T, T] bool ancestry among the
        new rows (None = causal). The rows stay pending until `commit`.
        """
        ...

    def commit(self, keep: torch.Tensor) -> None:
        """Publish pending rows `keep` ([m], in order) after the committed prefix; drop the rest."""
        ...

    def reset(self) -> None: ...
