"""Training objectives. Every reduction is a masked SUM in fp32; the trainer divides by the number
of supervised rows of the whole (global, accumulated) batch so that gradient accumulation and data
parallelism give the same update as one big batch.

EAGLE-1: L = 1.0 * SmoothL1(feature) + 0.1 * soft CE (target distribution), masked means.
HASS:    EAGLE-1 terms + top-K distillation over the target's top-K set, NOT renormalised.
EAGLE-3: soft CE against the target distribution restricted to the draft vocabulary, per TTT step,
         weighted 0.8^s; rows whose target argmax is outside the draft vocabulary are masked out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EAGLE1_W_REG = 1.0
EAGLE1_W_CLS = 0.1


def step_weights(steps: int, decay: float = 0.8) -> list[float]:
    """TTT step weights decay**s, s = 0 .. steps-1 (EAGLE-3: 1, 0.8, 0.64, ...)."""
    return [decay**s for s in range(steps)]


def eagle1_combine(l_reg: torch.Tensor | float, l_cls: torch.Tensor | float,
                   w_reg: float = EAGLE1_W_REG, w_cls: float = EAGLE1_W_CLS):
    """EAGLE-1 total: w_reg * L_reg + w_cls * L_cls (1.0 and 0.1 in the paper)."""
    return w_reg * l_reg + w_cls * l_cls


def soft_ce_sum(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """sum over rows of -sum_v p(v) log softmax(logits)(v); logits [M, V], probs [M, V]; fp32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -(target_probs.float() * logp).sum()


def topk_distill_sum(logits: torch.Tensor, target_probs: torch.Tensor, k: int = 10) -> torch.Tensor:
    """HASS top-K distillation: -sum_{v in topK(p)} p(v) log q(v), summed over rows.

    The target's top-K probabilities are used as they are (NOT renormalised to sum to 1), and q is
    the draft's full softmax: the mass the target puts outside its top-K simply drops out.
    """
    logp = F.log_softmax(logits.float(), dim=-1)
    p, idx = target_probs.float().topk(min(k, target_probs.shape[-1]), dim=-1)
    return -(p * logp.gather(-1, idx)).sum()


def smooth_l1_sum(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """SmoothL1 (beta 1) averaged over the feature dim, summed over rows (EAGLE-1's regression)."""
    return F.smooth_l1_loss(pred.float(), target.float(), reduction="none").mean(-1).sum()


def uniform_noise(x: torch.Tensor, generator: torch.Generator | None, scale: float = 0.1,
                  length: torch.Tensor | int | None = None) -> torch.Tensor:
    """EAGLE-1 paper feature noise: U(-scale, scale) (`length` is ignored)."""
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    return x + ((u - 0.5) * 2 * scale).to(x.dtype)


def length_scaled_noise(x: torch.Tensor, generator: torch.Generator | None, scale: float = 0.2,
                        length: torch.Tensor | int | None = None) -> torch.Tensor:
    """SafeAILab EAGLE-1 code's variant: U(-scale/2, scale/2) * 512 / seq_len.

    length: the sequence length of each row ([M] tensor, for packed rows) or one int; default x.shape[0].
    """
    u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    if length is None:
        length = x.shape[0]
    if torch.is_tensor(length):
        length = length.clamp(min=1).float()[:, None]
    else:
        length = max(1, int(length))
    return x + ((u - 0.5) * scale * 512 / length).to(x.dtype)


NOISE = {"uniform": uniform_noise, "length-scaled": length_scaled_noise, "none": None}
