"""Draft-vocabulary coverage: how much of the target's text (and of its probability mass) a vocabulary holds.

An EAGLE-3 drafter proposes only ids of its draft vocabulary (d2t), so an answer token outside it is a
rejection whatever the drafter's states say, and under sampling no draft can be accepted with more than
1 - the target's mass outside the vocabulary. Vocabularies are [V] bool masks over the target vocabulary.
"""

from __future__ import annotations

import torch

from eaglespec.sampling import SamplingParams, process_logits
from eaglespec.train.vocab import grown_draft_ids


def id_mask(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """[vocab] bool, True at `ids`."""
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    return mask


def outside_share(answers: list[list[int]], in_vocab: torch.Tensor) -> float:
    """The share of answer tokens whose id is not marked in `in_vocab` [V] bool (0.0 without tokens)."""
    ids = torch.tensor([x for a in answers for x in a], dtype=torch.long)
    return float((~in_vocab[ids]).float().mean()) if ids.numel() else 0.0


def grown_masks(draft_ids: torch.Tensor, counts: torch.Tensor, sizes: list[int]) -> dict[int, torch.Tensor]:
    """{N: [V] bool mask of the draft vocabulary grown to N ids by token `counts` [V]} (grown_draft_ids)."""
    return {n: id_mask(grown_draft_ids(draft_ids, counts, n), counts.numel()) for n in sizes}


def outside_mass(probs: torch.Tensor, in_vocab: torch.Tensor) -> float:
    """The mean over rows of the mass outside `in_vocab`: probs [n, V], in_vocab [V] bool (0 if n = 0)."""
    return float(probs[:, ~in_vocab].sum(-1).mean()) if probs.shape[0] else 0.0


@torch.no_grad()
def answer_probs(target, prompt: list[int], answer: list[int], temperature: float) -> torch.Tensor:
    """[len(answer), V]: the target's processed distribution at `temperature` for each answer token,
    teacher-forced in one forward over prompt + answer (a backend with reset() / forward(ids).logits; its
    cache is left empty)."""
    ids = torch.tensor(prompt + answer, dtype=torch.long)
    target.reset()
    logits = target.forward(ids).logits  # [n, V]; row i predicts token i + 1
    target.reset()
    return process_logits(logits[len(prompt) - 1: len(ids) - 1], SamplingParams(temperature=temperature))
