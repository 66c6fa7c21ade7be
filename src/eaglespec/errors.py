"""User-facing errors: each carries one line that names the file, field or shape at fault."""

from __future__ import annotations

import os


class EagleSpecError(ValueError):
    """Bad input (file, config field, tensor shape, flag). The CLI prints it as one line, exit 2."""


class CheckpointError(EagleSpecError):
    """A draft checkpoint that cannot be read as claimed."""

    def __init__(self, path: object, message: str):
        super().__init__(f"{path}: {message}")
        self.path = path


def env_switch(name: str, unset: str, strip: bool = False) -> bool | None:
    """$name as a 0/1 switch: True for "1", False for "0", None when unset or empty; anything else is refused in
    one line (`unset` says what unset means). `strip`: surrounding whitespace is ignored."""
    env = os.environ.get(name, "")
    if strip:
        env = env.strip()
    if env not in ("", "0", "1"):
        raise EagleSpecError(f"{name}={env!r}: expected 0 or 1 (or unset: {unset})")
    return None if env == "" else env == "1"
