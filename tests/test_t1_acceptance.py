"""bench/t1_acceptance.py: the depth-1 acceptance curve of sampled siblings (recursive rejection, no replacement)."""

from __future__ import annotations

import pytest
import torch

from conftest import bench_module


def _curve(pd: list[float], q: list[float], n: int, rows: int = 128) -> torch.Tensor:
    t1 = bench_module("t1_acceptance")
    gen = torch.Generator().manual_seed(0)
    out = t1.rrs_depth1(torch.tensor([pd] * rows), torch.tensor([q] * rows), n, gen)
    assert out.shape == (rows, n)
    return out.mean(0)


def test_curve_is_cumulative_over_the_draw_order():
    """p a point mass on token 0, q uniform over 4 tokens: the draft is accepted once token 0 is drawn, so with j
    siblings the rate is j/4 (a per-sibling share, the classic bug, would read 1/4 for every j); a fifth sibling
    cannot be drawn (q has 4 tokens) and keeps the rate at 1."""
    curve = _curve([1.0, 0.0, 0.0, 0.0], [0.25] * 4, 5)
    assert curve.tolist() == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0], abs=0.04)


def test_curve_counts_mass_outside_the_draft_vocabulary():
    """Half of p lies outside the draft vocabulary (q = 0 there): one sibling drawing token 0 is accepted with
    min(1, p/q) = 0.5, and nothing else can be drawn. p = q on the vocabulary gives 1 at once."""
    assert _curve([0.5, 0.0, 0.0], [1.0, 0.0, 0.0], 3).tolist() == pytest.approx([0.5, 0.5, 0.5], abs=0.05)
    assert _curve([0.2, 0.3, 0.5], [0.2, 0.3, 0.5], 2).tolist() == pytest.approx([1.0, 1.0], abs=1e-6)
