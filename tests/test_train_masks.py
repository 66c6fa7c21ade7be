"""TTT / HASS masks checked as dependency graphs, with a dense-causal negative control."""

from __future__ import annotations

import pytest
import torch

from eaglespec.train.masks import step_visible


def expected_visible(segment: torch.Tensor, src: torch.Tensor, step: int) -> set[tuple[int, int, int, int]]:
    """{(query_step, query_row, key_step, key_row)} from the dependency graph, built node by node."""
    m = segment.numel()
    out = set()
    for r in range(m):
        prefix = {(0, j) for j in range(m) if segment[j] == segment[r] and src[j] <= src[r]}
        ancestors = {(j, r) for j in range(1, step)}
        for key in prefix | ancestors | {(step, r)}:
            out.add((step, r, *key))
    return out


def mask_edges(visible: torch.Tensor, step: int) -> set[tuple[int, int, int, int]]:
    m = visible.shape[0]
    return {(step, r, int(c) // m, int(c) % m) for r, c in visible.nonzero().tolist()}


def check(visible_fn, segment, src, steps):
    for s in range(steps):
        vis = visible_fn(segment, src, s)
        assert vis.shape == (segment.numel(), (s + 1) * segment.numel())
        if mask_edges(vis, s) != expected_visible(segment, src, s):
            return False
    return True


CASES = [
    (torch.zeros(5, dtype=torch.long), torch.arange(5)),
    (torch.tensor([0, 0, 0, 1, 1, 2]), torch.tensor([0, 1, 2, 4, 5, 7])),  # packed, with gaps in src
]


@pytest.mark.parametrize("segment,src", CASES)
def test_ttt_mask_is_the_dependency_graph(segment, src):
    assert check(step_visible, segment, src, steps=4)


def dense_causal(segment, src, step):
    """The classic bug: one causal mask over the concatenated rows of all steps."""
    m = segment.numel()
    n = (step + 1) * m
    full = torch.ones(n, n, dtype=torch.bool).tril()
    return full[step * m:]


@pytest.mark.parametrize("segment,src", CASES)
def test_dense_causal_negative_control_fails(segment, src):
    assert not check(dense_causal, segment, src, steps=3)


def test_step0_is_segment_causal():
    seg = torch.tensor([0, 0, 1])
    vis = step_visible(seg, torch.arange(3), 0)
    assert vis.tolist() == [[True, False, False], [True, True, False], [False, False, True]]
