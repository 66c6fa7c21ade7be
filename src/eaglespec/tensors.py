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


def to_device_all(device: torch.device, *data, dtype: torch.dtype = torch.long) -> list[torch.Tensor]:
    """[to_device(d, device, dtype) for d in data] in one host-to-device copy: the tensors are views of one
    buffer (rectangular nested lists, each any shape)."""
    hosts = [torch.tensor(d, dtype=dtype) for d in data]
    if device.type != "cuda":
        return [h.to(device) for h in hosts]
    flat = torch.cat([h.reshape(-1) for h in hosts]).pin_memory().to(device, non_blocking=True)
    return [part.view(h.shape) for part, h in zip(flat.split([h.numel() for h in hosts]), hosts)]
