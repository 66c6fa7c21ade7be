"""The single rope-width resolver (contract 6, docs/contracts.md) and the rope theta lookup."""

from __future__ import annotations

import pytest
import torch

from eaglespec.checkpoint.rope import resolve_rope_theta, resolve_rotary_dim


@pytest.mark.parametrize(
    ("config", "head_dim", "expected"),
    [
        # precedence: explicit rotary_dim > partial_rotary_factor x head_dim > head_dim
        ({"rotary_dim": 32, "partial_rotary_factor": 0.25}, 128, 32),
        ({"partial_rotary_factor": 0.25}, 256, 64),  # Qwen3.5: 0.25 x 256
        ({}, 64, 64),
        # the factor under rope_parameters (transformers 5) or the older rope_scaling
        ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, 64, 32),
        ({"rope_scaling": {"partial_rotary_factor": 0.5}}, 64, 32),
        # both places, as the Qwen3.5-9B eagle3 config writes it
        ({"partial_rotary_factor": 0.25, "rope_parameters": {"partial_rotary_factor": 0.25}}, 256, 64),
        # top level wins over rope_parameters
        ({"partial_rotary_factor": 0.5, "rope_parameters": {"partial_rotary_factor": 0.25}}, 64, 32),
        # a malformed top-level factor falls through to a valid one under rope_parameters
        ({"partial_rotary_factor": 0, "rope_parameters": {"partial_rotary_factor": 0.5}}, 64, 32),
        # malformed factors mean the full width, never a wider-than-head rotation
        ({"partial_rotary_factor": 0}, 64, 64),
        ({"partial_rotary_factor": -0.5}, 64, 64),
        ({"partial_rotary_factor": 1.5}, 64, 64),
        ({"partial_rotary_factor": 2}, 64, 64),
        ({"partial_rotary_factor": "0.5"}, 64, 64),
        ({"partial_rotary_factor": True}, 64, 64),
        ({"partial_rotary_factor": None}, 64, 64),
        ({"partial_rotary_factor": 1.0}, 64, 64),
        # an explicit width wider than the head is ignored (then the factor, then the full width)
        ({"rotary_dim": 512}, 64, 64),
        ({"rotary_dim": 512, "partial_rotary_factor": 0.5}, 64, 32),
        ({"rotary_dim": 0}, 64, 64),
        # rope rotates pairs: odd widths round down to even; float error does not lose a pair
        ({"rotary_dim": 33}, 64, 32),
        ({"partial_rotary_factor": 0.3}, 10, 2),
        ({"partial_rotary_factor": 80 / 96}, 96, 80),
        ({"partial_rotary_factor": 2 / 3}, 96, 64),
    ],
)
def test_rotary_dim_resolution(config, head_dim, expected):
    width = resolve_rotary_dim(config, head_dim)
    assert width == expected
    assert 0 < width <= head_dim and width % 2 == 0


def test_rope_theta_lookup():
    assert resolve_rope_theta({"rope_theta": 1e6}) == 1e6
    assert resolve_rope_theta({"rope_parameters": {"rope_theta": 1e7}}) == 1e7
    assert resolve_rope_theta({"rope_theta": 5e5, "rope_parameters": {"rope_theta": 1e7}}) == 5e5
    assert resolve_rope_theta({}) == 10000.0  # SafeAILab's configs carry none: LLaMA's default
    assert resolve_rope_theta({"rope_theta": -1, "rope_parameters": {"rope_theta": 1e6}}) == 1e6


@pytest.mark.parametrize("scaling", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
    {"rope_type": "linear", "factor": 4.0},
])
def test_scaled_rope_matches_transformers(scaling):
    """Llama-3.1 drafters carry llama3 rope scaling: our inverse frequencies equal transformers'."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from eaglespec.draft.layers import Rotary

    cfg = LlamaConfig(hidden_size=512, num_attention_heads=4, max_position_embeddings=131072,
                      rope_theta=500000.0, rope_scaling=dict(scaling))  # 5.x maps these to rope_parameters
    ref, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](cfg, "cpu")
    ours = Rotary(128, 500000.0, scaling).inv_freq
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
    assert not torch.allclose(ours, Rotary(128, 500000.0).inv_freq)  # the scaling did something
