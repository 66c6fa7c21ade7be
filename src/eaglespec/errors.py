"""User-facing errors: each carries one line that names the file, field or shape at fault."""

from __future__ import annotations


class EagleSpecError(ValueError):
    """Bad input (file, config field, tensor shape, flag). The CLI prints it as one line, exit 2."""


class CheckpointError(EagleSpecError):
    """A draft checkpoint that cannot be read as claimed."""

    def __init__(self, path: object, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path
