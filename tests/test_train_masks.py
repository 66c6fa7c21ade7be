"""TTT / HASS masks checked as dependency graphs, with a dense-causal negative control."""

from __future__ import annotations

import pytest
import torch

from eaglespec.draft.layers import StepVisible, factored_attention
from eaglespec.train.masks import prefix_visible, step_visible


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


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (4, 4)])
@pytest.mark.parametrize("steps", [1, 3])
def test_factored_attention_equals_the_dense_mask(heads, kv_heads, steps):
    """factored_attention (a step's prefix block + each row's own earlier-step keys) equals SDPA over every key with
    step_visible's dense mask: outputs and gradients, packed segments with gaps, grouped queries (HF head order)."""
    segment, src = torch.tensor([0, 0, 0, 1, 1, 2, 2]), torch.tensor([0, 1, 2, 4, 5, 7, 8])
    m, d = segment.numel(), 8
    g = torch.Generator().manual_seed(steps * 10 + heads)
    q = torch.randn(2, heads, m, d, generator=g, requires_grad=True)
    k = torch.randn(2, kv_heads, (steps + 1) * m, d, generator=g, requires_grad=True)
    v = torch.randn(2, kv_heads, (steps + 1) * m, d, generator=g, requires_grad=True)
    prefix = prefix_visible(segment, src).expand(2, m, m)
    out = factored_attention(q, k, v, StepVisible(prefix, steps))
    rep = heads // kv_heads
    dense = step_visible(segment, src, steps)[None, None]  # [1, 1, M, (steps+1) M]
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                           attn_mask=dense)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    w = torch.randn(out.shape, generator=g)
    for a, b in zip(torch.autograd.grad((out * w).sum(), (q, k, v)), torch.autograd.grad((ref * w).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
