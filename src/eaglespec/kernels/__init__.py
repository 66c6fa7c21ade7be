"""Triton kernels of the fast path, and the oneDNN projections of the CPU path (onednn.py).

    step.py        the per-layer kernels of the fast target's and the fused drafter's steps
    attention.py   masked GQA attention over a static KV cache
    skinny.py      the GEMM of few-row projections
    tree.py        a draft tree's growth and a greedy round's acceptance
    sampled.py     a sampled round's sibling tests
    round_tail.py  a round graph's commit and next inputs

Each module holds its kernels as plain functions that its `_load()` jits on first use through `jit` below (the
package imports without triton), and beside each kernel a plain-torch reference (`*_ref`). Whether a component
runs the kernels is its caller's choice (a `kernels: bool` argument; `on_by_default(device)` where none is
given). `available(device)` says whether they can run at all: on CUDA, or anywhere under Triton's interpreter
(TRITON_INTERPRET=1, triton's own variable: the CPU tests).

Rounding: the kernels compute in fp32 and round every intermediate that the torch code stores in the model's
dtype to that dtype (`_round`, round to nearest even), so the final cast to the dtype is exact and the result
is the torch code's wherever the arithmetic is elementwise. bf16 is rounded with integer bit operations, not a
cast, because the interpreter stores bf16 as uint16 and truncates fp32 -> bf16 casts.

The kernels call triton's builtins only (tl.full, tl.reduce with the combine functions put in their
namespace), never its jitted library functions (tl.sum, tl.zeros, tl.cdiv): those are jitted when triton is
first imported, in the mode TRITON_INTERPRET had then, and a compiled one cannot run under the interpreter.
The combine functions are triton.language.standard's own: compiled they are the same `a + b` / max / min, and
the interpreter reduces them in numpy instead of calling them once per element.

PDL (programmatic dependent launch, sm90+): a kernel taking USE_GDC lets the next kernel launch first thing
(`_dependents`) and, before it reads anything another kernel of the graph writes, waits for the kernels before
it (`_wait`); its launcher passes `**pdl_kwargs(pdl(tensor))`. Only weights and constant tables may be read
before the wait, and nothing is stored: PDL changes no value.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable

import torch


def eager_attention():
    """A context in which torch's SDPA picks any backend but cuDNN's: for attention whose shapes change from call to
    call (prompts, drafter KV, training batches), since cuDNN's builds and caches an execution plan for every new
    shape, tens of milliseconds each on an H100."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def interpreted() -> bool:
    """Triton's interpreter is on (TRITON_INTERPRET=1): kernels run in numpy, on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def _importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def available(device: torch.device | str) -> bool:
    """The kernels can run on `device`: triton imports, and `device` is CUDA or the interpreter is on."""
    return (torch.device(device).type == "cuda" or interpreted()) and _importable()


def on_by_default(device: torch.device | str) -> bool:
    """The `kernels` default of a component on `device`: on CUDA where triton imports and its interpreter is off
    (the interpreter is for tests on CPU tensors, which ask for the kernels explicitly)."""
    return torch.device(device).type == "cuda" and not interpreted() and available(device)


@functools.cache
def _hopper_or_later(index: int) -> bool:
    """CUDA device `index` has griddepcontrol (compute capability >= 9) and this Triton has PDL (gdc_wait)."""
    try:
        from triton.language.extra import cuda
    except ImportError:
        return False
    return hasattr(cuda, "gdc_wait") and torch.cuda.get_device_capability(index)[0] >= 9


def pdl(t: torch.Tensor) -> bool:
    """Launch with PDL on t's device: a CUDA device of compute capability 9 or more, a Triton with PDL, not
    the interpreter."""
    if not t.is_cuda or interpreted():
        return False
    return _hopper_or_later(t.device.index if t.device.index is not None else torch.cuda.current_device())


def pdl_kwargs(on: bool) -> dict[str, bool]:
    """A launch's PDL keywords: USE_GDC and launch_pdl when `on`, none otherwise (USE_GDC defaults to False,
    and a Triton without PDL refuses the launch_pdl keyword even when it is False)."""
    return {"USE_GDC": True, "launch_pdl": True} if on else {}


def pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


# -- the shared device functions (plain functions here; jit() jits them into every kernel module) ---------
# Annotations are not evaluated (from __future__ import annotations): this module imports without triton.
def _round(x, dtype: tl.constexpr):
    """fp32 x -> the fp32 value of x rounded to dtype (nearest even)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif dtype == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


def _dependents(USE_GDC: tl.constexpr):
    """PDL: the next kernel may launch now; it waits in its own _wait() for this one to finish."""
    if USE_GDC:
        tl.extra.cuda.gdc_launch_dependents()


def _wait(USE_GDC: tl.constexpr):
    """PDL: wait until the kernels before this one have finished and their writes show."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()


_HELPERS = ("_round", "_dependents", "_wait")
_PLAIN: dict[str, dict] = {}  # module name -> its plain functions (what jit() jits, in either mode)
_MODE: dict[str, bool] = {}  # module name -> interpreted() when its functions were last jitted


def jit(namespace: dict, names: Iterable[str], do_not_specialize: dict[str, list[str]] | None = None) -> None:
    """Import triton and jit the functions `names` of a kernel module in its namespace (its globals(), where
    its kernels look each other up), putting there too triton, triton.language as tl, libdevice, the shared
    helpers (_round, _dependents, _wait) and the reductions' combine functions (_add, _max, _min). Done once
    per module, and again after TRITON_INTERPRET changed (a function jitted in one mode cannot run in the
    other). do_not_specialize: triton.jit's argument, by function name."""
    global tl
    mode, module = interpreted(), namespace["__name__"]
    if _MODE.get(module) == mode:
        return
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    shared = globals()
    if _MODE.get(__name__) != mode:  # the shared helpers first (they run in this namespace, with its tl)
        for name, fn in _PLAIN.setdefault(__name__, {name: shared[name] for name in _HELPERS}).items():
            shared[name] = triton.jit(fn)
        _MODE[__name__] = mode
    plain = _PLAIN.setdefault(module, {name: namespace[name] for name in names})
    namespace.update(triton=triton, tl=tl, libdevice=libdevice, _add=tl.standard._sum_combine,
                     _max=tl.standard._elementwise_max, _min=tl.standard._elementwise_min,
                     **{name: shared[name] for name in _HELPERS})
    for name, fn in plain.items():
        namespace[name] = triton.jit(fn, do_not_specialize=(do_not_specialize or {}).get(name))
    _MODE[module] = mode
