"""The proposer: keeps the drafter's KV in step with the verified prefix and grows draft trees.

Index shift (DESIGN.md contract 4): drafter row t pairs the target feature f_t with the
embedding of token x_{t+1}, sits at position t, and predicts x_{t+2}. With the target committed
through row n-1 and the pending root token x_n, the last catch-up row is t = n-1; a draft node
at depth d (token y_d at sequence position n+d) is the drafter row n+d-1.
"""

from __future__ import annotations

import torch
from torch import nn

from ..tree import DraftTree, TreeSpec, chain_tree


class Proposer:
    def __init__(self, drafter: nn.Module, spec: TreeSpec):
        self.drafter = drafter
        self.spec = spec
        self.reset()

    def reset(self) -> None:
        self.cache = self.drafter.new_cache()
        self.committed = 0  # drafter rows 0..committed-1 are in its KV

    @property
    def device(self) -> torch.device:
        return next(self.drafter.parameters()).device

    @torch.no_grad()
    def catch_up(self, features: torch.Tensor, next_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append drafter rows for newly verified target features.

        features: [m, F] = f_t for t = committed..committed+m-1; next_tokens: [m] = x_{t+1}.
        Returns (draft logits [Vd], state [H]) of the last row: it predicts the first draft token.
        """
        m = features.shape[0]
        positions = torch.arange(self.committed, self.committed + m, device=self.device)
        state = self.drafter.project(features.to(self.device))
        logits, states = self.drafter(state, next_tokens.to(self.device), positions, self.cache)
        self.committed += m
        return logits[-1], states[-1]

    def _discard_tree_rows(self) -> None:
        for layer in self.cache:
            layer.crop(self.committed)

    @torch.no_grad()
    def propose(self, root: int, features: torch.Tensor, next_tokens: torch.Tensor) -> DraftTree:
        """Catch up on verified rows, then grow the tree below `root` (the pending token)."""
        logits, state = self.catch_up(features, next_tokens)
        try:
            if self.spec.kind == "chain":
                return self._chain(root, logits, state)
            raise NotImplementedError(f"tree kind {self.spec.kind!r}")
        finally:
            self._discard_tree_rows()

    def _chain(self, root: int, logits: torch.Tensor, state: torch.Tensor) -> DraftTree:
        """Greedy chain of spec.depth tokens: one drafter row per depth, causal over the chain."""
        k = self.spec.depth
        drafts = torch.empty(k, dtype=torch.long, device=self.device)
        for d in range(1, k + 1):
            token = self.drafter.to_target_ids(logits.argmax(-1, keepdim=True))  # [1]
            drafts[d - 1] = token[0]
            if d == k:
                break
            position = torch.tensor([self.committed + d - 1], device=self.device)
            out, st = self.drafter(state[None], token, position, self.cache)
            logits, state = out[0], st[0]
        return chain_tree(root, drafts)
