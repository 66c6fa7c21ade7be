"""HostOps: the non-view aten ops dispatched outside a drafter's forward, by name (a CPU proxy for the kernels
a whole-tree CUDA graph replays around the drafter steps), for the tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from torch import nn

from _hostcount import HostCounter

T = TypeVar("T")


class HostOps(HostCounter):
    """HostCounter that also counts, by name, the ops outside the drafter that are not views (no kernel)."""

    def __init__(self):
        super().__init__()
        self.kernels: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.in_drafter and not func.is_view:
            self.kernels[str(func)] += 1
        return super().__torch_dispatch__(func, types, args, kwargs)


def count_host_ops(drafter: nn.Module, fn: Callable[[], T]) -> tuple[T, HostOps]:
    """fn() under a HostOps whose in_drafter flag follows the drafter's forward (hooks)."""
    with HostOps() as c:
        hooks = [drafter.register_forward_pre_hook(lambda *_: setattr(c, "in_drafter", True)),
                 drafter.register_forward_hook(lambda *_: setattr(c, "in_drafter", False))]
        try:
            out = fn()
        finally:
            for h in hooks:
                h.remove()
    return out, c
