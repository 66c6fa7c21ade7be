"""Attention masks for the training-time test (EAGLE-3) and HASS alignment.

Keys are laid out step by step: [step-0 rows (M) ; step-1 rows (M) ; ... ; step-s rows (M)].
Step-0 rows come from target features: they are the "target prefix" every later row may see.
A query at step s anchored at row r sees: the step-0 rows of its segment up to r (its target
prefix), its own draft ancestors (rows r of steps 1..s-1) and itself; nothing else. This is the
visibility a draft node at depth s has at inference time (committed rows + its tree ancestors).
"""

from __future__ import annotations

import torch


def prefix_visible(segment: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """[(P,) M, M] bool: step-0 row j is visible from anchor r iff same segment and src_j <= src_r."""
    return (segment[..., :, None] == segment[..., None, :]) & (src[..., None, :] <= src[..., :, None])


def step_visible(segment: torch.Tensor, src: torch.Tensor, step: int,
                 prefix: torch.Tensor | None = None) -> torch.Tensor:
    """[(P,) M, (step+1)*M] bool: visibility of the step-`step` queries over all keys so far."""
    m = segment.shape[-1]
    if prefix is None:
        prefix = prefix_visible(segment, src)
    if step == 0:
        return prefix
    eye = torch.eye(m, dtype=torch.bool, device=segment.device).expand_as(prefix)
    return torch.cat([prefix] + [eye] * step, dim=-1)
