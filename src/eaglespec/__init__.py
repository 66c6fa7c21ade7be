"""eaglespec: EAGLE speculative decoding for Hugging Face causal LMs."""

from eaglespec.api import EagleSpec, Output
from eaglespec.engine.loop import GenerationResult, SpeculativeEngine
from eaglespec.errors import CheckpointError, EagleSpecError
from eaglespec.tree.core import TreeSpec

__all__ = ["CheckpointError", "EagleSpec", "EagleSpecError", "GenerationResult", "Output", "SpeculativeEngine",
           "TreeSpec"]
__version__ = "0.1.0"
