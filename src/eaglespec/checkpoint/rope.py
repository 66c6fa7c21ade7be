"""The single rope-width resolver (contract 6, docs/contracts.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _valid_factor(value: Any) -> float | None:
    """Return a partial-rotary factor in (0, 1], or None when absent or malformed."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0.0 < value <= 1.0 else None


def rope_parameters(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The rope sub-dict (`rope_parameters` in transformers 5, `rope_scaling` before), or {}."""
    for key in ("rope_parameters", "rope_scaling"):
        value = config.get(key)
        if isinstance(value, Mapping):
            return value
    return {}


def resolve_rotary_dim(config: Mapping[str, Any], head_dim: int) -> int:
    """Rotated width per head: explicit `rotary_dim` > `partial_rotary_factor` x head_dim > head_dim.

    The factor is read at top level first, then under `rope_parameters`. A malformed factor
    (<= 0, > 1, not a number) means the full width; the result is never wider than the head and
    is always even (rope rotates pairs).
    """
    explicit = config.get("rotary_dim")
    if isinstance(explicit, int) and not isinstance(explicit, bool) and 0 < explicit <= head_dim:
        return explicit - explicit % 2
    factor = _valid_factor(config.get("partial_rotary_factor"))
    if factor is None:
        factor = _valid_factor(rope_parameters(config).get("partial_rotary_factor"))
    if factor is None:
        return head_dim
    width = int(head_dim * factor + 1e-6)  # as transformers' int(head_dim * factor), robust to 3 * (1/3)
    width -= width % 2
    return max(2, min(head_dim, width))


def resolve_rope_theta(config: Mapping[str, Any], default: float = 10000.0) -> float:
    """rope_theta at top level, else under rope_parameters, else `default`."""
    for source in (config, rope_parameters(config)):
        theta = source.get("rope_theta")
        if isinstance(theta, int | float) and not isinstance(theta, bool) and theta > 0:
            return float(theta)
    return default
