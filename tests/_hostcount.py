"""HostCounter: host syncs, host->device copies and dispatched aten ops of a block of torch code.

A sync-free growth is the tests' CPU proxy for CUDA-graph capturability. A host sync is an op whose result the
host must wait for: a scalar read (.item(), Tensor.tolist), nonzero, masked_select, repeat_interleave without
output_size, or indexing by a bool mask; a host->device copy is a tensor built from host data (lift_fresh).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
            "aten.repeat_interleave.Tensor"}
MASK_INDEX_OPS = {"aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default",
                  "aten._index_put_impl_.default"}


class HostCounter(TorchDispatchMode):
    """Counts dispatched aten ops, host syncs and host->device copies (as the module docstring defines them)."""

    def __init__(self):
        super().__init__()
        self.ops = self.syncs = self.h2d = self.inside = 0
        self.names: dict[str, int] = {}
        self.in_drafter = False  # toggled by forward hooks on the drafter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        self.ops += 1
        self.inside += self.in_drafter
        if name in SYNC_OPS and not (name == "aten.repeat_interleave.Tensor" and kwargs.get("output_size")):
            self._sync(name)
        elif name in MASK_INDEX_OPS and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool
                                            for i in (args[1] if len(args) > 1 else ())):
            self._sync(name + "[bool]")
        elif name == "aten.lift_fresh.default":
            self.h2d += 1
        return func(*args, **kwargs)

    def _sync(self, name: str) -> None:
        self.syncs += 1
        self.names[name] = self.names.get(name, 0) + 1

    def __enter__(self):
        counter, tolist = self, torch.Tensor.tolist
        self._tolist = tolist

        def counted_tolist(t, *a, **k):
            counter._sync("Tensor.tolist")
            return tolist(t, *a, **k)

        torch.Tensor.tolist = counted_tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)
