"""The target side: backends that prefill, verify tree rows, commit, and return aux features."""

from .base import TargetBackend, TargetOutput
from .hf import HFTarget

__all__ = ["HFTarget", "TargetBackend", "TargetOutput"]
