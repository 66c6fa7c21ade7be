"""Triton kernels for a sampled round's sibling tests (engine/round_graph.py, children drawn from q): the
values of verify.sibling_tests in K + 1 launches parallel over the vocab, and the bonus distribution at the
node where the walk ends in one more.

verify.sibling_tests keeps every parent's residual r and its q as [T, V] arrays and updates them once per
sibling rank, yet only T scalars per tested node and ONE residual row (the node `best` where the walk ends)
are ever read. Per parent, the residual after rejecting its live children of ranks < i has a closed form in
two scalars (a, beta) and the few tokens removed so far:

    r_i(v) = a * max(0, p(v) - beta * q(v))   for v not removed (an earlier live sibling's token)
    r_i(x_s) = c_s                             for the removed tokens x_s (scalars)

since with q_i = q(v) / S_i (S_i: q's mass left) a rejection gives max(0, a max(0, p - beta q) - q / S_i) = a
max(0, p - (beta + 1 / (a S_i)) q) on the tokens not removed (q >= 0), and max(0, c_s - 0) = c_s on the
removed ones; normalising by the mass M divides a and every c_s by M, and the token x_i then joins the removed
ones with c_i = its residual value. Where M <= 1e-12 nothing changes but the removal (as verify keeps r). r_0
= p: a = 1, beta = 0, nothing removed. Keeping the ratio beta (not a * beta) bounds it: a >= ~1, so beta grows
by at most 1 / S_i <= 1e30 per rank (S_i clamped as verify does).

So a parent's state after rank i needs only two sums over its row: M_i = a * sum_v max(0, p - beta' q) (v not
removed) + sum_s c_s, and S_{i+1} = sum of q off the removed tokens and x_i. Both split over chunks of the row
(grid [T, S], S = cdiv(V, CHUNK)); the ranks run in order, one launch each (each needs the last one's sums):

    launch 0, grid [T, S]: pS[0, t, c] = sum of q over chunk c of row t (rows with a live child only).
    launch 1 + i (i = 0..K-1), grid [T, S]: program (t, 0) of every parent t with a live child takes t's state
        before rank i (a, beta, S_i, removed tokens and values) one recursion step (_step) from the state rank
        i - 1's launch stored and that rank's partial sums (_carried), and stores it for the next launch;
        where live[t, i], every program (t, c) takes the same state, then over chunk c (not removed):
        pM[i, t, c] = sum max(0, p - beta' q), beta' = beta + 1 / (a max(S_i, 1e-30)), and
        pS[i + 1, t, c] = sum of q off x_i. Program c = 0 writes child i's r_at / q_at (from the state and
        p(x_i), q(x_i)).
    final_residual, grid over blocks of V: node best's state after all K ranks (one step from the last
        launch's store, read on the device), then its row.

    sibling_tests(tokens, kids, p, q, live) -> (r_at [T], q_at [T], Residuals): the K + 1 launches above.
    final_residual(p, q, Residuals, best [1]) -> [1, V]: verify.sibling_tests' third output at best (the same
        row and scale, p itself at a node without live child).

Values: the same recursion in fp32, another summation order, and each entry computed from p and q in one step
instead of K rounded steps: equal within ~1e-6 relative where no cancellation hits, and (up to rounding)
independent of CHUNK. A mass within rounding of the 1e-12 threshold could be decided the other way (only where
rejecting is that unlikely). Non-live nodes and node 0 get r_at = q_at = 0. Only entries that are read are
written. No host sync, fixed grids: graph-capturable. The reductions are written out in the kernels rather
than in jitted helpers (_partials, _step and _carried aside): the interpreter pays for every call of a jitted
function.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from eaglespec.kernels import jit, pdl, pdl_kwargs, pow2

MAX_K = 32  # the most children per node (one launch per rank)
MAX_VOCAB = 1 << 24  # the widest row (offsets are int64; this bounds S, the chunks per row)
_CHUNK = 2048  # sibling_tests: elements of a row per program (S = cdiv(V, CHUNK) programs per row and rank)
_WARPS = 4
_FINAL_BLOCK = 1024  # final_residual: elements per program
_SUMS = 4096  # the most partial sums _partials() adds in one step (over its KP ranks)


class Residuals(NamedTuple):
    """What final_residual needs to rebuild any node's residual once all its live children are rejected
    (_carried()): the partial sums of every live rank, the states the rank launches stored and the tree they
    belong to."""

    tokens: torch.Tensor  # [T] long: each node's token (sibling_tests' input)
    kids: torch.Tensor  # [T, K] long: the sibling table (sibling_tests' input)
    live: torch.Tensor  # [T, K] uint8: the live children
    left: torch.Tensor  # pS [K + 1, T, S] fp32: [j, t, c] q's mass over chunk c of row t off the tokens removed
    #                     before rank j (pS[0]: all of it; pS[j + 1]: written by rank j's launch where live)
    mass: torch.Tensor  # pM [K, T, S] fp32: [j, t, c] sum over chunk c of row t, off the tokens removed before
    #                     rank j, of max(0, p - beta' q) with rank j's beta' (written by rank j's launch where live)
    states: torch.Tensor  # [K, T, 3 + KP] fp32, [R, t] = parent t's (a, beta, S_R, removed tokens' values [KP])
    #                     after its ranks < R (written by rank R's launch, program c = 0, where t has a live child)
    removed: torch.Tensor  # [K, T, KP] long, [R, t] = those removed tokens (-1 padded)


def fits(vocab: int, k: int) -> bool:
    """Whether sibling_tests takes rows of `vocab` probabilities and k sibling ranks."""
    return 0 < k <= MAX_K and 0 < vocab <= MAX_VOCAB


# -- the Triton kernels (plain functions here; _load() jits them on first use) --------------------------------
def _partials(ptr, stride, S, use, KP: tl.constexpr, SB: tl.constexpr):
    """[KP] fp32: row j's sum of ptr[j * stride + 0:S] where use[j] ([KP] bool), else 0 (nothing read)."""
    slot = tl.arange(0, KP)
    acc = tl.full([KP, SB], 0.0, tl.float32)
    n = tl.where(use, S, 0)[:, None]  # (a mask `(c < S) & use` with a 0-d use trips the interpreter)
    for c0 in range(0, S, SB):
        c = c0 + tl.arange(0, SB)[None, :]
        acc += tl.load(ptr + slot[:, None] * stride + c, mask=c < n, other=0.0)
    return tl.reduce(acc, 1, tl.standard._sum_combine)


def _step(a, beta, left, n, rem, val, slot, on, x, px, qx, mass_j, left_j):
    """One rank j of the recursion (the module docstring): the state after ranks < j (a, beta, S_j = left, n
    removed tokens rem / their values val) -> after ranks <= j, given whether rank j is live (on), its token
    x, p(x), q(x), and its row sums mass_j (pM[j, t] summed) and left_j (pS[j + 1, t] summed). Not live:
    unchanged."""
    hit = tl.reduce((rem == x).to(tl.int32), 0, tl.standard._elementwise_max) > 0  # x already removed
    beta2 = beta + 1.0 / (a * tl.maximum(left, 1e-30))  # verify._normalised's clamp
    mass = a * mass_j + tl.reduce(val, 0, tl.standard._sum_combine)  # M off the removed tokens, and on them
    ok = on & (mass > 1e-12)  # rejected: r <- norm(max(0, r - q_j)), x leaves q
    norm = tl.maximum(mass, 1e-30)
    a = tl.where(ok, a / norm, a)
    beta = tl.where(ok, beta2, beta)
    val = tl.where(ok, val / norm, val)
    left = tl.where(on, left_j, left)
    add = (slot == n) & (hit == 0) & on
    rem = tl.where(add, x, rem)
    val = tl.where(add, a * tl.maximum(px - beta * qx, 0.0), val)
    n = n + tl.where(on & (hit == 0), 1, 0)
    return a, beta, left, n, rem, val


def _carried(t, R, tok_ptr, kids_ptr, live_ptr, prow, qrow, ps_ptr, pm_ptr, st_ptr, rm_ptr, T, S, K: tl.constexpr,
             KP: tl.constexpr, SB: tl.constexpr):
    """Parent t's residual after rejecting its live children of ranks < R: (a, beta, S_R (q's mass left),
    removed tokens [KP] (-1 padded, in removal order), their values [KP]), one step of the recursion (_step)
    from the state after ranks < R - 1 that launch R - 1 stored (st / rm [R - 1, t]) and rank R - 1's row
    sums. R = 0, or no live child: the start (a = 1, beta = 0, S_0 = q's mass, nothing removed)."""
    slot = tl.arange(0, KP)
    lv = tl.load(live_ptr + t * K + slot, mask=slot < K, other=0) != 0  # [KP]
    any_live = tl.reduce(lv.to(tl.int32), 0, tl.standard._elementwise_max) > 0
    r = t * 0 + R  # R as a tensor (a Python int under the interpreter; a constexpr K from _final_kernel)
    back = any_live & (r > 0)  # a stored state to start from
    j = tl.maximum(r - 1, 0)
    row = (j * T + t) * (3 + KP)
    a = tl.load(st_ptr + row, mask=back, other=1.0)
    beta = tl.load(st_ptr + row + 1, mask=back, other=0.0)
    start = tl.reduce(_partials(ps_ptr + t * S, T * S, S, (slot == 0) & any_live & (r == 0), KP, SB), 0,
                      tl.standard._sum_combine)  # S_0 (pS[0] is written where any_live)
    left = tl.where(back, tl.load(st_ptr + row + 2, mask=back, other=0.0), start)
    backs = (tl.full([KP], 0, tl.int32) + back.to(tl.int32)) > 0  # [KP] (a 0-d mask broadcast trips the interpreter)
    val = tl.load(st_ptr + row + 3 + slot, mask=backs, other=0.0)  # [KP]
    rem = tl.load(rm_ptr + (j * T + t) * KP + slot, mask=backs, other=-1)  # [KP]
    n = tl.reduce((rem >= 0).to(tl.int32), 0, tl.standard._sum_combine)
    on = back & (tl.load(live_ptr + t * K + j) != 0)  # rank R - 1, live: the one step
    x = tl.load(tok_ptr + tl.load(kids_ptr + t * K + j))
    px = tl.load(prow + x, mask=on, other=0.0).to(tl.float32)
    qx = tl.load(qrow + x, mask=on, other=0.0).to(tl.float32)
    use = (slot == j) & on
    mass_j = tl.reduce(_partials(pm_ptr + t * S, T * S, S, use, KP, SB), 0, tl.standard._sum_combine)
    left_j = tl.reduce(_partials(ps_ptr + (T + t) * S, T * S, S, use, KP, SB), 0, tl.standard._sum_combine)
    a, beta, left, n, rem, val = _step(a, beta, left, n, rem, val, slot, on, x, px, qx, mass_j, left_j)
    return a, beta, left, rem, val


def _left_kernel(live_ptr, q_ptr, ps_ptr, V, S, q_stride, K: tl.constexpr, KP: tl.constexpr, CHUNK: tl.constexpr,
                 USE_GDC: tl.constexpr = False):
    """Program (t, c): pS[0, t, c] = q's mass over chunk c of row t, where parent t has a live child."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    slot = tl.arange(0, KP)
    lv = tl.load(live_ptr + t * K + slot, mask=slot < K, other=0)
    if tl.reduce(lv.to(tl.int32), 0, tl.standard._elementwise_max) > 0:
        v = c.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
        qv = tl.load(q_ptr + t * q_stride + v, mask=v < V, other=0.0).to(tl.float32)
        tl.store(ps_ptr + t * S + c, tl.reduce(qv, 0, tl.standard._sum_combine))


def _rank_kernel(R, tok_ptr, kids_ptr, live_ptr, p_ptr, q_ptr, rq_ptr, ps_ptr, pm_ptr, st_ptr, rm_ptr, V, T, S,
                 p_stride, q_stride, K: tl.constexpr, KP: tl.constexpr, CHUNK: tl.constexpr, SB: tl.constexpr,
                 USE_GDC: tl.constexpr = False):
    """Program (t, c), where parent t's child of rank R is live: pM[R, t, c] and pS[R + 1, t, c] (the module
    docstring); program c = 0 also writes that child's r_at (rq[0]) and q_at (rq[1]), and, for every parent
    with a live child, stores its state before rank R (_carried) for launch R + 1."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    slot = tl.arange(0, KP)
    live_r = tl.load(live_ptr + t * K + R) != 0
    lv = tl.load(live_ptr + t * K + slot, mask=slot < K, other=0)
    hold = (c == 0) & (tl.reduce(lv.to(tl.int32), 0, tl.standard._elementwise_max) > 0)  # this program stores
    if live_r | hold:
        prow = p_ptr + t * p_stride
        qrow = q_ptr + t * q_stride
        a, beta, left, rem, val = _carried(t, R, tok_ptr, kids_ptr, live_ptr, prow, qrow, ps_ptr, pm_ptr, st_ptr,
                                           rm_ptr, T, S, K, KP, SB)
        if hold:
            row = (R * T + t) * (3 + KP)
            tl.store(st_ptr + row, a)
            tl.store(st_ptr + row + 1, beta)
            tl.store(st_ptr + row + 2, left)
            tl.store(st_ptr + row + 3 + slot, val)
            tl.store(rm_ptr + (R * T + t) * KP + slot, rem)
        if live_r:
            kid = tl.load(kids_ptr + t * K + R)
            x = tl.load(tok_ptr + kid)
            s = tl.maximum(left, 1e-30)
            beta2 = beta + 1.0 / (a * s)
            v = c.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
            inside = v < V
            pv = tl.load(prow + v, mask=inside, other=0.0).to(tl.float32)
            qv = tl.load(qrow + v, mask=inside, other=0.0).to(tl.float32)
            keep = inside
            for j in range(0, R):  # off the removed tokens (at most R; -1 pads)
                keep = keep & (v != tl.reduce(tl.where(slot == j, rem, -1), 0, tl.standard._elementwise_max))
            m = tl.reduce(tl.where(keep, tl.maximum(pv - beta2 * qv, 0.0), 0.0), 0, tl.standard._sum_combine)
            sq = tl.reduce(tl.where(keep & (v != x), qv, 0.0), 0, tl.standard._sum_combine)
            tl.store(pm_ptr + (R * T + t) * S + c, m)
            tl.store(ps_ptr + ((R + 1) * T + t) * S + c, sq)
            if c == 0:
                px = tl.load(prow + x).to(tl.float32)
                qx = tl.load(qrow + x).to(tl.float32)
                same = rem == x  # [KP]: x already removed (a token twice among live siblings: never drawn so)
                hit = tl.reduce(same.to(tl.int32), 0, tl.standard._elementwise_max) > 0
                c_x = tl.reduce(tl.where(same, val, 0.0), 0, tl.standard._sum_combine)
                r_x = tl.where(hit, c_x, a * tl.maximum(px - beta * qx, 0.0))
                q_x = tl.where(hit, 0.0, qx / s)
                tl.store(rq_ptr + kid, r_x, mask=kid > 0)  # (a live child is no root: kid > 0)
                tl.store(rq_ptr + T + kid, q_x, mask=kid > 0)


def _final_kernel(best_ptr, tok_ptr, kids_ptr, live_ptr, p_ptr, q_ptr, ps_ptr, pm_ptr, st_ptr, rm_ptr, out_ptr, V, T,
                  S, p_stride, q_stride, K: tl.constexpr, KP: tl.constexpr, SB: tl.constexpr, BLOCK: tl.constexpr,
                  USE_GDC: tl.constexpr = False):
    """Program j: out[j*BLOCK : (j+1)*BLOCK] = node best's final residual (the state after all K ranks: one
    step from what the last rank launch stored)."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    b = tl.load(best_ptr).to(tl.int64)
    prow = p_ptr + b * p_stride
    qrow = q_ptr + b * q_stride
    a, beta, _, rem, val = _carried(b, K, tok_ptr, kids_ptr, live_ptr, prow, qrow, ps_ptr, pm_ptr, st_ptr, rm_ptr,
                                    T, S, K, KP, SB)
    v = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = v < V
    pv = tl.load(prow + v, mask=inside, other=0.0).to(tl.float32)
    qv = tl.load(qrow + v, mask=inside, other=0.0).to(tl.float32)
    same = v[:, None] == rem[None, :]  # [BLOCK, KP]
    hit = tl.reduce(same.to(tl.int32), 1, tl.standard._elementwise_max) > 0
    c = tl.reduce(tl.where(same, val[None, :], 0.0), 1, tl.standard._sum_combine)
    tl.store(out_ptr + v, tl.where(hit, c, a * tl.maximum(pv - beta * qv, 0.0)), mask=inside)


_JITTED = ("_partials", "_step", "_carried", "_left_kernel", "_rank_kernel", "_final_kernel")


def _load() -> None:
    """Jit the kernels above (eaglespec.kernels.jit also puts triton, tl and the shared helpers here); the
    rank R is not specialised on (one compiled _rank_kernel for every rank)."""
    global triton, tl, _dependents, _wait
    jit(globals(), _JITTED, do_not_specialize={"_rank_kernel": ["R"]})


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _sums(s: int, kp: int) -> int:
    """_partials' step over S: a [KP, SB] tile of at most _SUMS partial sums."""
    return min(max(16, pow2(s)), max(16, _SUMS // kp))


# -- the launchers -----------------------------------------------------------------------------------------
def sibling_tests(tokens: torch.Tensor, kids: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  live: torch.Tensor, chunk: int | None = None, num_warps: int = _WARPS
                  ) -> tuple[torch.Tensor, torch.Tensor, Residuals]:
    """verify.sibling_tests in K + 1 launches: tokens [T] long, kids [T, K] long (sibling_table), target_probs
    / draft_probs [T, V] (any float dtype, rows contiguous; read only), live [T, K] bool (a live child has kid
    > 0) -> (r_at [T] fp32, q_at [T] fp32: 0 at non-live nodes and node 0, the Residuals final_residual
    reads). chunk: elements of a row per program (a power of 2, at most the row's; default _CHUNK)."""
    _load()
    t, k = kids.shape
    v = target_probs.shape[1]
    if not fits(v, k) or draft_probs.shape != target_probs.shape or target_probs.shape[0] != t:
        raise ValueError(f"sampled kernels: {tuple(kids.shape)} kids over p {tuple(target_probs.shape)}, q "
                         f"{tuple(draft_probs.shape)} (at most {MAX_K} ranks, rows of {MAX_VOCAB})")
    p, q = _rows(target_probs), _rows(draft_probs)
    dev = p.device
    kp = max(2, pow2(k))
    ck = min(pow2(chunk or _CHUNK), max(16, pow2(v)))
    s = triton.cdiv(v, ck)
    rq = torch.zeros(2, t, dtype=torch.float32, device=dev)  # [r_at; q_at]
    state = Residuals(tokens.contiguous(), kids.contiguous(), live.contiguous().view(torch.uint8),
                      torch.empty(k + 1, t, s, dtype=torch.float32, device=dev),
                      torch.empty(k, t, s, dtype=torch.float32, device=dev),
                      torch.empty(k, t, 3 + kp, dtype=torch.float32, device=dev),
                      torch.empty(k, t, kp, dtype=torch.long, device=dev))
    g = pdl(p)
    _left_kernel[(t, s)](state.live, q, state.left, v, s, q.stride(0), K=k, KP=kp, CHUNK=ck, num_warps=num_warps,
                         **pdl_kwargs(g))
    for i in range(k):
        _rank_kernel[(t, s)](i, state.tokens, state.kids, state.live, p, q, rq, state.left, state.mass, state.states,
                             state.removed, v, t, s, p.stride(0), q.stride(0), K=k, KP=kp, CHUNK=ck, SB=_sums(s, kp),
                             num_warps=num_warps, **pdl_kwargs(g))
    return rq[0], rq[1], state


def final_residual(target_probs: torch.Tensor, draft_probs: torch.Tensor, state: Residuals, best: torch.Tensor,
                   block: int = _FINAL_BLOCK) -> torch.Tensor:
    """The bonus distribution where the walk ends at node best [1] long (read on the device):
    verify.sibling_tests' third output row best, normalised as it is (p itself at a node with no live child).
    -> [1, V] fp32."""
    _load()
    p, q = _rows(target_probs), _rows(draft_probs)
    t, v = p.shape
    k, s = state.kids.shape[1], state.left.shape[2]
    kp = max(2, pow2(k))
    out = torch.empty(1, v, dtype=torch.float32, device=p.device)
    blk = min(block, max(16, pow2(v)))
    g = pdl(p)
    _final_kernel[(triton.cdiv(v, blk),)](best, state.tokens, state.kids, state.live, p, q, state.left, state.mass,
                                          state.states, state.removed, out, v, t, s, p.stride(0), q.stride(0),
                                          K=k, KP=kp, SB=_sums(s, kp), BLOCK=blk, num_warps=4, **pdl_kwargs(g))
    return out
