"""Triton kernels for a greedy dynamic tree's bookkeeping (Proposer._dynamic, tree._grow, tree.select_nodes): fewer,
cheaper kernels per depth inside the whole-tree CUDA graph (draft/tree_graph.py).

Why: a profiled dynamic 7/10/60 round on the H200 (bench/RESULTS.md, session 13) is 672 kernels in ~2.6 ms, each
costing ~3.8 us (run + gap) whatever its size; per depth the children of the newest nodes took a softmax, two
torch.topk stages (gatherTopK + bitonic sort each: ~12 us of device time per topk), a chunk-offset add and a gather,
the log value a clamp and a log, and the next expansion's pick a stable radix sort. Here:

    children(logits [n, Vd], k)  -> (conf [n, k] fp32, tok [n, k] long, log conf [n, k] fp32): ONE kernel, one
                                    program per row: the softmax's max and sum, then k rounds of argmax (ties to
                                    the lower id), conf = exp(x - max) / sum, log conf = log(max(conf, 1e-12))
    rank_top(v [M], k, desc)     -> (values [k], indices [k] long): ONE kernel, the first k of a stable sort of v
                                    (descending: ties to the lower index, as sort(descending=True, stable=True);
                                    ascending likewise), by ranks: rank(i) = #{j: v_j before v_i}, written at rank

Values: children's conf is the softmax's within fp32 rounding (another summation order and exp), not bitwise; the
order of exactly tied logits is by lower id (torch.topk's tie order is unspecified). Drafts are proposals checked
by the target: this can move which token is proposed at a near-tie, never what is emitted. Every path that must
build the same tree (the eager proposer, the whole-tree graph) calls the same function on the same device.
rank_top is exact (comparisons only).

Used where `wanted(device)`: EAGLESPEC_TREE_KERNELS=1 (triton must be importable; on CPU also TRITON_INTERPRET=1),
=0 never, unset: on CUDA where triton imports. Rows wider than MAX_VOCAB take the torch path (one program holds a
row in registers). Kernels call triton builtins only (target/kernels.py's _load says why).
"""

from __future__ import annotations

import functools

import torch

from .errors import env_switch
from .target import kernels as K

TREE_KERNELS_ENV = "EAGLESPEC_TREE_KERNELS"  # "1" on, "0" off, unset or "": on where available on CUDA
MAX_VOCAB = 65536  # children(): the widest draft vocab one program reads whole
_RANK_TILE = 64  # rank_top: at most this many rows per program, and columns per step


def wanted(device: torch.device | str) -> bool:
    """Whether the tree bookkeeping on `device` should use these kernels (see the module docstring)."""
    env = env_switch(TREE_KERNELS_ENV, "on where available on CUDA")
    if env is None:
        return torch.device(device).type == "cuda" and K.available(device)
    if env and not K.available(device):
        raise ValueError(f"{TREE_KERNELS_ENV}=1 needs triton and a CUDA device (or TRITON_INTERPRET=1)")
    return env


def fits(vocab: int) -> bool:
    return 0 < vocab <= MAX_VOCAB


# -- plain-torch references (the code each kernel replaces) --------------------------------------------------
def children_ref(logits: torch.Tensor, k: int, floor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """softmax(logits) in fp32, its top-k (values sorted descending, ids), and log(max(values, floor))."""
    conf, tok = torch.softmax(logits, dim=-1, dtype=torch.float32).topk(k, dim=-1)
    return conf, tok, conf.clamp(min=floor).log()


def rank_top_ref(v: torch.Tensor, k: int, descending: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of v.sort(descending, stable=True): (values [k], indices [k])."""
    vals, idx = v.sort(descending=descending, stable=True)
    return vals[:k], idx[:k]


# -- the Triton kernels (plain functions here; _load() jits them on first use) --------------------------------
def _max(a, b):
    return tl.maximum(a, b)


def _min(a, b):
    return tl.minimum(a, b)


def _add(a, b):
    return a + b


def _children_kernel(x_ptr, conf_ptr, tok_ptr, logc_ptr, x_row_stride, V, floor, K: tl.constexpr,
                     BLOCK: tl.constexpr):
    """One program per row of x [n, V]: softmax statistics, then K rounds of (largest logit left, lowest id)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < V
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
    m = tl.reduce(x, 0, _max)
    s = tl.reduce(tl.where(inside, tl.exp(x - m), 0.0), 0, _add)
    alive = inside
    for j in tl.static_range(K):
        left = tl.where(alive, x, float("-inf"))
        best = tl.reduce(left, 0, _max)
        pick = tl.reduce(tl.where(alive & (left == best), cols, BLOCK), 0, _min)
        pick = tl.minimum(pick, V - 1)  # a NaN row matches nothing: stay in range (its conf flags it)
        conf = tl.exp(best - m) / s
        tl.store(conf_ptr + row * K + j, conf)
        tl.store(tok_ptr + row * K + j, pick.to(tl.int64))
        tl.store(logc_ptr + row * K + j, tl.log(tl.maximum(conf, floor)))
        alive = alive & (cols != pick)


def _rank_top_kernel(v_ptr, vals_ptr, idx_ptr, M, K, DESC: tl.constexpr, TILE: tl.constexpr):
    """Program p ranks v[p*TILE : (p+1)*TILE] against all of v; rank < K is written at its rank."""
    i = tl.program_id(0) * TILE + tl.arange(0, TILE)
    in_i = i < M
    vi = tl.load(v_ptr + i, mask=in_i, other=0)
    rank = tl.zeros([TILE], dtype=tl.int32)
    for j0 in range(0, M, TILE):
        j = j0 + tl.arange(0, TILE)
        vj = tl.load(v_ptr + j, mask=j < M, other=0)
        if DESC:
            ahead = vj[None, :] > vi[:, None]
        else:
            ahead = vj[None, :] < vi[:, None]
        ahead = ahead | ((vj[None, :] == vi[:, None]) & (j[None, :] < i[:, None]))
        ahead = ahead & (j < M)[None, :]
        rank += tl.reduce(ahead.to(tl.int32), 1, _add)
    keep = in_i & (rank < K)
    tl.store(vals_ptr + rank, vi, mask=keep)
    tl.store(idx_ptr + rank, i.to(tl.int64), mask=keep)


_JITTED = ("_max", "_min", "_add", "_children_kernel", "_rank_top_kernel")


@functools.cache
def _load() -> None:
    """Import triton and jit the kernels above (as target/kernels._load)."""
    global triton, tl
    import triton
    import triton.language as tl

    g = globals()
    for name in _JITTED:
        g[name] = triton.jit(g[name])


# -- the launchers -----------------------------------------------------------------------------------------
def children(logits: torch.Tensor, k: int, floor: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """children_ref in one kernel: logits [n, V] (V <= MAX_VOCAB, k <= V) -> conf [n, k] fp32 descending,
    tok [n, k] long, log conf [n, k] fp32."""
    _load()
    n, v = logits.shape
    if not fits(v) or not 0 < k <= v:
        raise ValueError(f"tree kernels: top-{k} of rows of {v} (at most {MAX_VOCAB})")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    conf = torch.empty(n, k, dtype=torch.float32, device=dev)
    tok = torch.empty(n, k, dtype=torch.long, device=dev)
    logc = torch.empty(n, k, dtype=torch.float32, device=dev)
    block = K._pow2(v)
    _children_kernel[(n,)](logits, conf, tok, logc, logits.stride(0), v, floor, K=k, BLOCK=block,
                           num_warps=16 if block >= 8192 else 8 if block >= 2048 else 4)
    return conf, tok, logc


def rank_top(v: torch.Tensor, k: int, descending: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """rank_top_ref in one kernel: v [M] (any real dtype, contiguous), 0 < k <= M -> (values [k], indices [k])."""
    _load()
    m = v.numel()
    if v.dim() != 1 or not 0 < k <= m:
        raise ValueError(f"tree kernels: the first {k} of {tuple(v.shape)}")
    v = v.contiguous()
    vals = torch.empty(k, dtype=v.dtype, device=v.device)
    idx = torch.empty(k, dtype=torch.long, device=v.device)
    tile = min(_RANK_TILE, max(16, K._pow2(m)))
    _rank_top_kernel[(triton.cdiv(m, tile),)](v, vals, idx, m, k, DESC=descending, TILE=tile)
    return vals, idx
