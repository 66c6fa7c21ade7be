"""The target side: backends that prefill, verify tree rows, commit, and return aux features."""

from eaglespec.backends.base import TargetBackend, TargetOutput
from eaglespec.backends.hf import HFTarget

__all__ = ["HFTarget", "TargetBackend", "TargetOutput"]
