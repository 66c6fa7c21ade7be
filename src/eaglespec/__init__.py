"""eaglespec: EAGLE speculative decoding for Hugging Face causal LMs."""

from .api import EagleSpec, Output
from .engine import GenerationResult, SpeculativeEngine
from .errors import CheckpointError, EagleSpecError
from .tree import TreeSpec

__all__ = ["CheckpointError", "EagleSpec", "EagleSpecError", "GenerationResult", "Output", "SpeculativeEngine",
           "TreeSpec"]
__version__ = "0.1.0"
