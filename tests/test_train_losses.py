"""Loss fixtures: EAGLE-1 weighting, HASS top-K without renormalisation, EAGLE-3 step weights."""

from __future__ import annotations

import math

import pytest
import torch

from eaglespec.train import losses


def test_eagle1_weighting():
    assert losses.eagle1_combine(0.6, 2.4) == pytest.approx(0.84)


def test_step_weights():
    assert losses.step_weights(7) == pytest.approx([0.8**s for s in range(7)])
    assert losses.step_weights(3)[2] == pytest.approx(0.64)


def test_topk_not_renormalised():
    p = torch.tensor([[0.5, 0.3, 0.1, 0.1]])  # top-2 covers 0.8 of the mass
    logits = torch.log(torch.tensor([[0.25, 0.25, 0.25, 0.25]]))
    got = losses.topk_distill_sum(logits, p, k=2).item()
    assert got == pytest.approx(-(0.5 + 0.3) * math.log(0.25))  # 0.8 * ln 4, not 1.0 * ln 4
    renormalised = -(0.5 / 0.8 + 0.3 / 0.8) * math.log(0.25)
    assert abs(got - renormalised) > 0.2


def test_soft_ce_matches_definition():
    p = torch.tensor([[0.7, 0.2, 0.1]])
    logits = torch.tensor([[2.0, 0.5, -1.0]])
    ref = -(p * torch.log_softmax(logits, -1)).sum()
    assert losses.soft_ce_sum(logits, p).item() == pytest.approx(ref.item())


def test_smooth_l1_and_noise():
    x = torch.zeros(4, 8)
    assert losses.smooth_l1_sum(x, x + 0.5).item() == pytest.approx(4 * 0.125)
    g = torch.Generator().manual_seed(0)
    n = losses.uniform_noise(x, g, 0.1)
    assert n.abs().max() <= 0.1 and n.abs().max() > 0.05
    n2 = losses.length_scaled_noise(torch.zeros(1024, 8), g, 0.2)  # 0.2 * 512/1024 wide
    assert n2.abs().max() <= 0.05 + 1e-6


def test_eagle3_trainer_weights_steps():
    from eaglespec.train.trainer import TrainConfig

    cfg = TrainConfig()
    assert (cfg.ttt_steps, cfg.ttt_decay, cfg.hass_steps, cfg.topk) == (7, 0.8, 3, 10)
