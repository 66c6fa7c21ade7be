"""Triton kernels for a sampled round's sibling tests (round_graph.py step 4, children drawn from q): the values of
verify.sibling_tests in one kernel, and the bonus distribution at the node where the walk ends in one more.

Why: verify.sibling_tests keeps every parent's residual r and its q left as [T, V] fp32 arrays and updates them
once per sibling rank: ~260 torch ops over [61, 49152] per dynamic 7/10/60 round, ~1.5-2 ms on an H200, more than
the rest of the round. Yet only T scalars per tested node and ONE residual row (the node `best` where the walk
ends: race_argmax's input) are ever read. Per parent, the residual after rejecting its live children of ranks < i
has a closed form in two scalars (a, beta) and the few tokens removed so far:

    r_i(v) = a * max(0, p(v) - beta * q(v))   for v not removed (an earlier live sibling's token)
    r_i(x_s) = c_s                             for the removed tokens x_s (scalars)

since with q_i = q(v) / S_i (S_i: q's mass left) a rejection gives
max(0, a max(0, p - beta q) - q / S_i) = a max(0, p - (beta + 1 / (a S_i)) q) on the tokens not removed (q >= 0),
and max(0, c_s - 0) = c_s on the removed ones; normalising by the mass M divides a and every c_s by M, and the
token x_i then joins the removed ones with c_i = its residual value. Where M <= 1e-12 nothing changes but the
removal (as verify._rejected_residual keeps r). r_0 = p: a = 1, beta = 0, nothing removed. Keeping the ratio beta
(not a * beta) bounds it: a >= ~1 (each M <= 1, the residual summing to 1), so beta grows by at most
1 / S_i <= 1e30 per rank (S_i clamped as verify._normalised does; q = 0 off the removed tokens then).

    sibling_tests(tokens, kids, p, q, live) -> (r_at [T], q_at [T], Residuals): ONE kernel, one program per parent
        (grid [T]): a pass over q for S_0, then per live child in rank order one read-only pass over the row
        (p and q) for M and the next S (p, q: [T, V], never written). The node values r_at / q_at (what sampled_path
        reads) are scalars from (a, beta, S, the removed list) and the two entries p(x_i), q(x_i). Each parent's
        final state is left in Residuals: (a, beta) [T, 2] and its removed tokens / values [T, KP]. A parent with
        no live child does nothing (its final residual is p): only live children cost a pass. The parents run
        side by side; the one with the most live children (the root's top_k) sets the time: top_k + 1 passes over
        its two rows, in the order the recursion needs (the ranks cannot overlap: each pass needs the last's mass).
    final_residual(p, q, Residuals, best [1]) -> [1, V]: ONE kernel over V (grid over blocks of V, best read on the
        device): the normalised residual of node best, the same row (and scale) as verify.sibling_tests' third
        output at best, up to fp32 rounding.

Values: the same recursion in fp32, another summation order, and each entry computed from p and q in one step
instead of K rounded steps: equal within ~1e-6 relative where no cancellation hits (tests/test_sampled_kernels.py).
A mass within rounding of the 1e-12 threshold could be decided the other way (only where rejecting is that
unlikely). Non-live nodes and node 0 get r_at = q_at = 0 (sampled_path masks them). Zero host syncs, fixed grids:
graph-capturable.

Used where `wanted(device)` (tree_kernels.wanted: EAGLESPEC_TREE_KERNELS; and EAGLESPEC_SAMPLED_KERNELS=0 turns
just these off, the A/B switch) and `fits(vocab, k)`; otherwise round_graph keeps verify.sibling_tests. Kernels
call triton builtins only (target/kernels.py's _load says why); their reductions pass tl.standard's combine
functions (_sum_combine, _elementwise_max) to the builtin tl.reduce, as tl.sum / tl.max do: the interpreter
recognises them and reduces in numpy without calling them (with a combine function of ours it calls it once per
element, in Python: 3-8x slower tests), and compiled code inlines them. Written and tested under Triton's
interpreter (TRITON_INTERPRET=1) and compiled for sm_90 ahead of time (no GPU run yet); bench/sibling_check.py
times them against the torch path on a GPU.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from . import tree_kernels
from .errors import env_switch
from .target import kernels as K

SAMPLED_KERNELS_ENV = "EAGLESPEC_SAMPLED_KERNELS"  # "0": not these (unset, "" or "1": with the tree kernels)
MAX_K = 32  # the most children per node (the kernel unrolls a loop over ranks)
MAX_VOCAB = 1 << 24  # the widest row (offsets are int64; this only bounds the passes' cost)
_BLOCK = 4096  # sibling_tests: elements of a row per step of a pass
_FINAL_BLOCK = 1024  # final_residual: elements per program
_WARPS = 8


class Residuals(NamedTuple):
    """Every parent's residual once all its live children are rejected: a * max(0, p - beta q) off the removed
    tokens, their own values on them."""

    scale: torch.Tensor  # [T, 2] fp32: (a, beta)
    tokens: torch.Tensor  # [T, KP] long: the removed tokens (its live children's), -1 padded
    values: torch.Tensor  # [T, KP] fp32: the residual at each removed token


def wanted(device: torch.device | str) -> bool:
    """Whether a sampled round on `device` should use these kernels (see the module docstring); fits() too."""
    if env_switch(SAMPLED_KERNELS_ENV, "with the tree kernels") is False:
        return False
    return tree_kernels.wanted(device)


def fits(vocab: int, k: int) -> bool:
    """Whether sibling_tests takes rows of `vocab` probabilities and k sibling ranks."""
    return 0 < k <= MAX_K and 0 < vocab <= MAX_VOCAB


# -- the Triton kernels (plain functions here; _load() jits them on first use) --------------------------------
def _sum(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._sum_combine)  # tl.sum's reduction (see the module docstring)


def _top(x, axis: tl.constexpr):
    return tl.reduce(x, axis, tl.standard._elementwise_max)  # tl.max's


def _sibling_kernel(tok_ptr, kids_ptr, live_ptr, p_ptr, q_ptr, rq_ptr, scale_ptr, rtok_ptr, rval_ptr, V, T,
                    p_stride, q_stride, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr):
    """Program t: parent t's children kids[t, :K] in rank order (live[t, i]: tested; others leave the state as is).
    Writes r_at (rq[0]) and q_at (rq[1]) of its live children, and its final (a, beta), removed tokens and values."""
    t = tl.program_id(0).to(tl.int64)
    prow = p_ptr + t * p_stride
    qrow = q_ptr + t * q_stride
    slot = tl.arange(0, KP)
    lane = tl.arange(0, BLOCK)
    zero = tl.program_id(0) * 0
    a = zero.to(tl.float32) + 1.0  # r = a * max(0, p - beta q) off the removed tokens
    beta = zero.to(tl.float32)
    left = zero.to(tl.float32)  # S: q's mass off the removed tokens
    n = zero  # removed tokens so far
    rem = tl.full([KP], -1, tl.int64)
    val = tl.full([KP], 0.0, tl.float32)
    lv = tl.load(live_ptr + t * K + slot, mask=slot < K, other=0)
    if _top(lv.to(tl.int32), 0) > 0:  # a parent with no live child does nothing: r = p
        acc = tl.full([BLOCK], 0.0, tl.float32)  # S_0
        for v0 in range(0, V, BLOCK):
            v = v0 + lane
            acc += tl.load(qrow + v, mask=v < V, other=0.0).to(tl.float32)
        left = _sum(acc, 0)
        for i in tl.static_range(K):
            kid = tl.load(kids_ptr + t * K + i)
            on = tl.load(live_ptr + t * K + i) != 0
            x = tl.load(tok_ptr + kid)
            px = tl.load(prow + x).to(tl.float32)
            qx = tl.load(qrow + x).to(tl.float32)
            same = rem == x  # [KP]: x already removed (a token twice among live siblings: never drawn so)
            hit = _top(same.to(tl.int32), 0) > 0
            s = tl.maximum(left, 1e-30)  # verify._normalised's clamp
            r_x = tl.where(hit, _sum(tl.where(same, val, 0.0), 0), a * tl.maximum(px - beta * qx, 0.0))
            q_x = tl.where(hit, 0.0, qx / s)
            tl.store(rq_ptr + kid, tl.where(on, r_x, 0.0), mask=kid > 0)  # padding (kid 0, the root) writes nothing
            tl.store(rq_ptr + T + kid, tl.where(on, q_x, 0.0), mask=kid > 0)
            if on:  # rejected: r <- norm(max(0, r - q_i)), x leaves q
                beta2 = beta + 1.0 / (a * s)
                m_acc = tl.full([BLOCK], 0.0, tl.float32)
                s_acc = tl.full([BLOCK], 0.0, tl.float32)
                for v0 in range(0, V, BLOCK):
                    v = v0 + lane
                    inside = v < V
                    pv = tl.load(prow + v, mask=inside, other=0.0).to(tl.float32)
                    qv = tl.load(qrow + v, mask=inside, other=0.0).to(tl.float32)
                    gone = v < 0
                    if _top(((rem >= v0) & (rem < v0 + BLOCK)).to(tl.int32), 0) > 0:  # a removed token here
                        gone = _top((v[:, None] == rem[None, :]).to(tl.int32), 1) > 0
                    keep = inside & (gone == 0)
                    m_acc += tl.where(keep, tl.maximum(pv - beta2 * qv, 0.0), 0.0)
                    s_acc += tl.where(keep & (v != x), qv, 0.0)
                mass = a * _sum(m_acc, 0) + _sum(val, 0)
                ok = mass > 1e-12
                norm = tl.maximum(mass, 1e-30)
                a = tl.where(ok, a / norm, a)
                beta = tl.where(ok, beta2, beta)
                val = tl.where(ok, val / norm, val)
                left = _sum(s_acc, 0)
                add = (slot == n) & (hit == 0)
                rem = tl.where(add, x, rem)
                val = tl.where(add, a * tl.maximum(px - beta * qx, 0.0), val)
                n = n + tl.where(hit, 0, 1)
    tl.store(scale_ptr + 2 * t, a)
    tl.store(scale_ptr + 2 * t + 1, beta)
    tl.store(rtok_ptr + t * KP + slot, rem)
    tl.store(rval_ptr + t * KP + slot, val)


def _final_kernel(best_ptr, p_ptr, q_ptr, scale_ptr, rtok_ptr, rval_ptr, out_ptr, V, p_stride, q_stride,
                  KP: tl.constexpr, BLOCK: tl.constexpr):
    """Program j: out[j*BLOCK : (j+1)*BLOCK] = node best's final residual (a, beta and its removed tokens)."""
    b = tl.load(best_ptr).to(tl.int64)
    a = tl.load(scale_ptr + 2 * b)
    beta = tl.load(scale_ptr + 2 * b + 1)
    v = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = v < V
    pv = tl.load(p_ptr + b * p_stride + v, mask=inside, other=0.0).to(tl.float32)
    qv = tl.load(q_ptr + b * q_stride + v, mask=inside, other=0.0).to(tl.float32)
    slot = tl.arange(0, KP)
    rem = tl.load(rtok_ptr + b * KP + slot)
    val = tl.load(rval_ptr + b * KP + slot)
    same = v[:, None] == rem[None, :]  # [BLOCK, KP]
    hit = _top(same.to(tl.int32), 1) > 0
    c = _sum(tl.where(same, val[None, :], 0.0), 1)
    tl.store(out_ptr + v, tl.where(hit, c, a * tl.maximum(pv - beta * qv, 0.0)), mask=inside)


_JITTED = ("_sum", "_top", "_sibling_kernel", "_final_kernel")


@functools.cache
def _load() -> None:
    """Import triton and jit the kernels above (as target/kernels._load)."""
    global triton, tl
    import triton
    import triton.language as tl

    g = globals()
    for name in _JITTED:
        g[name] = triton.jit(g[name])


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


# -- the launchers -----------------------------------------------------------------------------------------
def sibling_tests(tokens: torch.Tensor, kids: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  live: torch.Tensor, block: int | None = None, num_warps: int = _WARPS
                  ) -> tuple[torch.Tensor, torch.Tensor, Residuals]:
    """verify.sibling_tests in one kernel: tokens [T] long, kids [T, K] long (sibling_table), target_probs /
    draft_probs [T, V] (any float dtype, rows contiguous; read only), live [T, K] bool (a live child has kid > 0)
    -> (r_at [T] fp32, q_at [T] fp32: 0 at non-live nodes and node 0, the Residuals final_residual reads)."""
    _load()
    t, k = kids.shape
    v = target_probs.shape[1]
    if not fits(v, k) or draft_probs.shape != target_probs.shape or target_probs.shape[0] != t:
        raise ValueError(f"sampled kernels: {tuple(kids.shape)} kids over p {tuple(target_probs.shape)}, q "
                         f"{tuple(draft_probs.shape)} (at most {MAX_K} ranks, rows of {MAX_VOCAB})")
    p, q = _rows(target_probs), _rows(draft_probs)
    dev = p.device
    kp = max(2, K._pow2(k))
    rq = torch.zeros(2, t, dtype=torch.float32, device=dev)  # [r_at; q_at]
    state = Residuals(torch.empty(t, 2, dtype=torch.float32, device=dev),
                      torch.empty(t, kp, dtype=torch.long, device=dev),
                      torch.empty(t, kp, dtype=torch.float32, device=dev))
    blk = min(block or _BLOCK, max(16, K._pow2(v)))
    _sibling_kernel[(t,)](tokens.contiguous(), kids.contiguous(), live.contiguous().view(torch.uint8), p, q, rq,
                          *state, v, t, p.stride(0), q.stride(0), K=k, KP=kp, BLOCK=blk, num_warps=num_warps)
    return rq[0], rq[1], state


def final_residual(target_probs: torch.Tensor, draft_probs: torch.Tensor, state: Residuals, best: torch.Tensor,
                   block: int = _FINAL_BLOCK) -> torch.Tensor:
    """The bonus distribution where the walk ends at node best [1] long (read on the device): verify.sibling_tests'
    third output row best, normalised as it is (p itself at a node with no live child). -> [1, V] fp32."""
    _load()
    p, q = _rows(target_probs), _rows(draft_probs)
    v = p.shape[1]
    out = torch.empty(1, v, dtype=torch.float32, device=p.device)
    blk = min(block, max(16, K._pow2(v)))
    _final_kernel[(triton.cdiv(v, blk),)](best, p, q, *state, out, v, p.stride(0), q.stride(0),
                                          KP=state.tokens.shape[1], BLOCK=blk, num_warps=4)
    return out
