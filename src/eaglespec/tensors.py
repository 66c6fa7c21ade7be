"""Host data onto the device without waiting for the work queued before."""

from __future__ import annotations

import torch


def to_device(data, device: torch.device, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """torch.tensor(data) on `device`. On CUDA through pinned memory, so the copy queues behind the stream's work
    instead of waiting for it (a copy from pageable memory blocks the host until the stream reaches it)."""
    t = torch.tensor(data, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
