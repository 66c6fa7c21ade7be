"""The soft-row compiler (contract 4, docs/contracts.md).

Row t pairs the target feature f_t with the embedding of x_{t+1}; it is trained toward f_{t+1}
(EAGLE-1/HASS) and q_{t+2}, the target distribution computed from f_{t+1} (logits row t+1).
A row exists only when t and t+1 are valid tokens of the same segment (boundary-valid); it is
supervised when its source t is also in the loss mask. Unsupervised rows stay as attention context.

Training-time test / alignment step s (s = 0 .. R-1) unrolls row t once more per step: step s of
row t is drafter row t+s (position pos_t + s) fed x_{t+1+s} and trained toward f_{t+1+s} and
q_{t+2+s}; it is valid when t+1+s is in t's segment and supervised when its source t+s is in the
loss mask. Indices are planned first (every address provably in range and in-segment), then
gathered: no out-of-range or cross-segment address is ever read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowPlan:
    src: torch.Tensor  # [M] long: source position t of each row (boundary-valid rows only, in order)
    segment: torch.Tensor  # [M] long: segment id of each row
    position: torch.Tensor  # [M] long: drafter position of the row at step 0 (per-segment position of t)
    next_index: torch.Tensor  # [R, M] long: address of x_{t+1+s} / f_{t+1+s} / logits row t+1+s (always safe)
    valid: torch.Tensor  # [R, M] bool: t+1+s lies in t's segment (step 0: all True)
    supervised: torch.Tensor  # [R, M] bool: valid and source t+s in the loss mask

    @property
    def num_rows(self) -> int:
        return int(self.src.numel())

    @property
    def steps(self) -> int:
        return int(self.next_index.shape[0])

    def to(self, device: torch.device | str) -> RowPlan:
        return RowPlan(*(getattr(self, f).to(device) for f in
                         ("src", "segment", "position", "next_index", "valid", "supervised")))


def _runs(valid: torch.Tensor, segment: torch.Tensor) -> torch.Tensor:
    """[N] run id: consecutive tokens with the same segment and validity share a run."""
    change = torch.ones_like(valid)
    change[1:] = (segment[1:] != segment[:-1]) | (valid[1:] != valid[:-1])
    return torch.cumsum(change.long(), 0)


def compile_rows(valid: torch.Tensor, segment: torch.Tensor, loss_mask: torch.Tensor,
                 position: torch.Tensor | None = None, steps: int = 1) -> RowPlan:
    """Plan the rows of one packed sequence.

    valid/loss_mask: [N] bool; segment: [N] long; position: [N] per-segment positions (default 0..N-1).
    """
    n = valid.shape[0]
    dev = valid.device
    valid, loss_mask = valid.bool(), loss_mask.bool()
    if position is None:
        position = torch.arange(n, device=dev)
    run = _runs(valid, segment)
    t = torch.arange(n, device=dev)

    def in_run(offset: int) -> torch.Tensor:
        """[N] bool: t + offset < N, is valid, and shares t's run (hence t's segment)."""
        ok = torch.zeros(n, dtype=torch.bool, device=dev)
        if offset < n:
            ok[: n - offset] = valid[: n - offset] & (run[offset:] == run[: n - offset])
        return ok

    src = t[in_run(1)]  # boundary-valid rows
    m = src.numel()
    next_index = torch.empty(steps, m, dtype=torch.long, device=dev)
    ok = torch.empty(steps, m, dtype=torch.bool, device=dev)
    sup = torch.empty(steps, m, dtype=torch.bool, device=dev)
    for s in range(steps):
        ok[s] = in_run(1 + s)[src]
        next_index[s] = torch.where(ok[s], src + 1 + s, src + 1)  # invalid steps point at a safe slot
        source = torch.where(ok[s], src + s, src)  # t+s < t+1+s, same run when ok
        sup[s] = ok[s] & loss_mask[source]
    return RowPlan(src=src, segment=segment[src], position=position[src], next_index=next_index,
                   valid=ok, supervised=sup)
