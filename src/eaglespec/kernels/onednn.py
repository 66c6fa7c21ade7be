"""y = x @ W.T + b for inference on CPU through oneDNN (PyTorch's mkldnn backend) instead of the BLAS behind
F.linear, and through the skinny Triton GEMM (skinny.py) for few-row CUDA inference where that applies.

`linear` takes the oneDNN op only where it applies (CPU, fp32 input and weight, a contiguous weight, no
autograd needed, not inside torch.compile) and where a one-time probe found it working and equal to F.linear;
the two differ by float summation order only (fp32 rounding). `pack` puts a weight into oneDNN's blocked
layout once (an opaque CPU tensor that `linear` / `project` take, a copy), in which a few rows cost about what
one does: what a chain's or a small tree's verification needs.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from eaglespec.kernels import skinny

PACK_ROWS = 8  # the row count oneDNN's blocked layout is chosen for (it serves any count)


def _onednn(x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2d, weight, bias, "none", [], "")


def _probe(pack: bool) -> bool:
    """The oneDNN linear (on a packed weight when `pack`) runs and matches F.linear on a small input."""
    try:
        g = torch.Generator().manual_seed(0)
        x, w, b = torch.randn(3, 40, generator=g), torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
        weight = _pack(w) if pack else w
        return all(torch.allclose(_onednn(x, weight, bias), F.linear(x, w, bias), rtol=1e-4, atol=1e-5)
                   for bias in (None, b))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


@functools.cache
def available() -> bool:
    """The oneDNN linear exists here, runs, and matches F.linear on a probe (read once per process)."""
    return torch.backends.mkldnn.is_available() and _probe(pack=False)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_ROWS)


def packing_available() -> bool:
    """`available`, and a packed probe runs and matches F.linear (read once)."""
    return available() and _packed_probe()


@functools.cache
def _packed_probe() -> bool:
    return _probe(pack=True)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] in oneDNN's blocked layout (a packed copy, the same values) where `linear` would take
    the oneDNN op for it (CPU, fp32, 2-d) and packing is available; else the weight itself. For inference
    only: a packed weight has no autograd and no F.linear fallback, so use it only where `applies` holds for
    the input."""
    if (weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.dim() != 2
            or torch.compiler.is_compiling() or not packing_available()):
        return weight
    return _pack(weight)


def affordable(nbytes: int, meminfo: str = "/proc/meminfo") -> bool:
    """Can `nbytes` more be held? False when they exceed half of the memory the OS reports available
    (MemAvailable); True where that is unknown. For packed copies that add to a model's weights."""
    try:
        with open(meminfo) as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return True
    return nbytes <= kib * 1024 // 2


def applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Would `linear` take the oneDNN op for these tensors? (A packed weight: whenever x is a CPU fp32
    input.)"""
    if weight.is_mkldnn:
        return x.device.type == "cpu" and x.dtype == torch.float32
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and weight.dim() == 2 and weight.is_contiguous()
            and not (torch.is_grad_enabled()
                     and (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)))
            and not torch.compiler.is_compiling() and available())


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The oneDNN op for x [..., in] (the caller checked `applies`) -> [..., out]."""
    return _onednn(x.reshape(-1, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           kernels: bool = True) -> torch.Tensor:
    """F.linear(x, weight, bias): x [..., in], weight [out, in], bias [out] -> [..., out]; oneDNN where it
    applies, the skinny Triton GEMM where `kernels` and it applies (few-row CUDA inference)."""
    if applies(x, weight, bias):
        return project(x, weight, bias)
    if kernels and skinny.applies(x, weight):
        return skinny.linear(x, weight, bias)
    return F.linear(x, weight, bias)


def apply(module: nn.Module, x: torch.Tensor, kernels: bool = True) -> torch.Tensor:
    """module(x), through `linear` (with `kernels`) when the module is a plain nn.Linear without hooks (a
    subclass may compute otherwise; a hook must see the call)."""
    if type(module) is nn.Linear and not (module._forward_hooks or module._forward_pre_hooks):
        return linear(x, module.weight, module.bias, kernels)
    return module(x)
