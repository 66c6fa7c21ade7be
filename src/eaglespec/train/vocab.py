"""The draft vocabulary (contract 5): top-N target tokens by frequency over loss-masked tokens.

Draft ids are the chosen target ids sorted ascending: d2t[i] = id_i - i (an offset, so that
target_id = draft_id + d2t[draft_id]); t2d is a bool mask over the target vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

DEFAULT_DRAFT_VOCAB = 32000


def token_counts(samples: Iterable[tuple[torch.Tensor, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """[V] long counts of token ids at loss-masked positions over (ids, loss_mask) pairs."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in samples:
        ids = torch.as_tensor(ids)[torch.as_tensor(mask, dtype=torch.bool)]
        counts += torch.bincount(ids, minlength=vocab_size)[:vocab_size]
    return counts


def select_draft_vocab(counts: torch.Tensor, size: int | None = None) -> torch.Tensor:
    """The `size` most frequent ids (ties and unseen ids broken by lower id), sorted by id."""
    vocab = counts.numel()
    size = min(DEFAULT_DRAFT_VOCAB if size is None else size, vocab)
    if size <= 0:
        raise ValueError(f"draft vocabulary size must be positive, got {size}")
    # stable descending sort by count: equal counts keep ascending id order
    order = torch.sort(counts, descending=True, stable=True).indices
    return torch.sort(order[:size]).values


def grown_draft_ids(draft_ids: torch.Tensor, counts: torch.Tensor, size: int) -> torch.Tensor:
    """A draft vocabulary grown to `size` ids (capped at the vocabulary): every id of `draft_ids` kept, the most
    frequent others by `counts` [V] added (ties: the lower id), sorted by id."""
    boosted = counts.detach().cpu().long().clone()
    boosted[draft_ids.cpu()] = int(boosted.max()) + 1  # the kept ids first
    return select_draft_vocab(boosted, max(size, draft_ids.numel()))


def vocab_maps(draft_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [Vd] long offsets, t2d [V] bool) for draft ids sorted ascending."""
    draft_ids = draft_ids.long()
    if draft_ids.numel() > 1 and not bool((draft_ids[1:] > draft_ids[:-1]).all()):
        raise ValueError("draft ids must be strictly increasing")
    d2t = draft_ids - torch.arange(draft_ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t, t2d
