"""A round graph's tail in one Triton kernel (engine/round_graph.py, after the acceptance): the target's KV
commit, the next round's inputs and the result row the host reads.

The torch code (round_tail_ref) is ~16 small kernels: the path's tokens (an index), the commit (two index
adds, an index_select and an index_copy_ of the cache), the next rows' tokens (a compare, an index, a where),
state_out (an add and a cat), feats_out (an index_select), the ids (an add and an index_copy_), the flags'
cast and the result row (a cat). round_tail does all of it in one launch: one program per (layer, k/v, head)
block of the cache moves the path's P rows (every row read before any is written, as index_select's copy
does), and one more program writes the small outputs and feats_out. Only copies and integer arithmetic: the
outputs are bitwise the torch code's (cache and features are moved as raw bits).
"""

from __future__ import annotations

import torch

from eaglespec.kernels import jit, pdl, pdl_kwargs, pow2


def round_tail_ref(cache: torch.Tensor, ids: torch.Tensor, state_out: torch.Tensor, feats_out: torch.Tensor,
                   feats: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                   flags: torch.Tensor, m: torch.Tensor, bonus: torch.Tensor, order: torch.Tensor, tlen: torch.Tensor,
                   base: torch.Tensor, steps: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The tail in torch. cache [L, 2, Hkv, S, D]; ids [N] long; state_out [4 + P] long; feats_out [P, F];
    feats [T, F] (the verified rows' features); tokens / parents / depths [T] long; flags [4] (bool or long);
    m [] long (the path's rows); bonus [1]; order [P] (the path's rows in depth order, then other rows); tlen
    [], base [] long; steps: (arange [P], arange + 1, (arange + 1).clamp(max=P - 1)), kept by the caller.

    Writes the commit (cache slots tlen + j <- tlen + order[j], j < P), state_out (m, base, tlen + m, bonus,
    then the next token of each accepted row: the next path token, the bonus after the last), feats_out
    (feats[order]) and ids[tlen + 1 + j] (the next tokens); returns the result row [6 + 2P + 3T] long (m,
    bonus, flags, order, the path's tokens, tokens, parents, depths)."""
    i, ahead, next_row = steps
    path = tokens[order]  # [P] (past m: other rows)
    cache.index_copy_(3, tlen + i, cache.index_select(3, tlen + order))
    nxt = torch.where(ahead < m, path[next_row], bonus)  # [P]
    # (m, dlen, tlen, root, next tokens): one kernel; each write its own kernel, every kernel costs ~3 us
    torch.cat([m.reshape(1), base.reshape(1), (tlen + m).reshape(1), bonus, nxt], out=state_out)
    torch.index_select(feats, 0, order, out=feats_out)
    ids.index_copy_(0, tlen + ahead, nxt)  # ids[tlen + 1 + j] for the accepted rows j < m
    return torch.cat([m.reshape(1), bonus, flags.long(), order, path, tokens, parents, depths])


# -- the Triton kernel (a plain function here; _load() jits it on first use) ---------------------------------------
def _round_tail_kernel(cache, ids, state, feats_out, feats, tokens, parents, depths, flags, m_ptr, bonus_ptr, order_ptr,
                       tlen_ptr, base_ptr, result, block, feats_in_stride, feats_out_stride, F, T, G,
                       P: tl.constexpr, PB: tl.constexpr, D: tl.constexpr, DB: tl.constexpr, FB: tl.constexpr,
                       TB: tl.constexpr, USE_GDC: tl.constexpr = False):
    _dependents(USE_GDC)
    _wait(USE_GDC)  # every input is written by the round's earlier kernels: nothing to read before it
    g = tl.program_id(0)
    tlen = tl.load(tlen_ptr)
    j = tl.arange(0, PB)
    jm = j < P
    order = tl.load(order_ptr + j, mask=jm, other=0)
    if g < G:  # one (layer, k/v, head) block of the cache [S, D]: rows tlen + order[j] -> tlen + j
        d = tl.arange(0, DB)
        cell = jm[:, None] & (d < D)[None, :]
        head = cache + g.to(tl.int64) * block
        rows = tl.load(head + (tlen + order)[:, None] * D + d[None, :], mask=cell)
        tl.debug_barrier()  # every row read before any is written (a path row may be another's source)
        tl.store(head + (tlen + j)[:, None] * D + d[None, :], rows, mask=cell)
    else:  # the small outputs and feats_out
        m = tl.load(m_ptr)
        bonus = tl.load(bonus_ptr)
        path = tl.load(tokens + order, mask=jm, other=0)  # [PB]
        following = tl.load(tokens + tl.load(order_ptr + tl.minimum(j + 1, P - 1), mask=jm, other=0), mask=jm,
                            other=0)  # path[min(j + 1, P - 1)]
        nxt = tl.where(j + 1 < m, following, bonus)
        tl.store(state, m)
        tl.store(state + 1, tl.load(base_ptr))
        tl.store(state + 2, tlen + m)
        tl.store(state + 3, bonus)
        tl.store(state + 4 + j, nxt, mask=jm)
        tl.store(ids + tlen + 1 + j, nxt, mask=jm)
        tl.store(result, m)
        tl.store(result + 1, bonus)
        f4 = tl.arange(0, 4)
        tl.store(result + 2 + f4, tl.load(flags + f4).to(tl.int64))
        tl.store(result + 6 + j, order, mask=jm)
        tl.store(result + 6 + P + j, path, mask=jm)
        t = tl.arange(0, TB)
        tm = t < T
        tl.store(result + 6 + 2 * P + t, tl.load(tokens + t, mask=tm), mask=tm)
        tl.store(result + 6 + 2 * P + T + t, tl.load(parents + t, mask=tm), mask=tm)
        tl.store(result + 6 + 2 * P + 2 * T + t, tl.load(depths + t, mask=tm), mask=tm)
        for f0 in range(0, F, FB):
            f = f0 + tl.arange(0, FB)
            cell = jm[:, None] & (f < F)[None, :]
            x = tl.load(feats + order[:, None] * feats_in_stride + f[None, :], mask=cell)
            tl.store(feats_out + j[:, None] * feats_out_stride + f[None, :], x, mask=cell)


_JITTED = ("_round_tail_kernel",)


def _load() -> None:
    """Jit the kernel above (eaglespec.kernels.jit also puts triton, tl and the shared helpers here)."""
    global triton, tl, _dependents, _wait
    jit(globals(), _JITTED)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """x viewed as integers of its element size (a raw copy of any dtype)."""
    return x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


def round_tail(cache: torch.Tensor, ids: torch.Tensor, state_out: torch.Tensor, feats_out: torch.Tensor,
               feats: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
               flags: torch.Tensor, m: torch.Tensor, bonus: torch.Tensor, order: torch.Tensor, tlen: torch.Tensor,
               base: torch.Tensor, steps: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
               ) -> torch.Tensor:
    """round_tail_ref in one kernel (the same arguments; `steps` unused). cache [L, 2, Hkv, S, D] contiguous,
    feats / feats_out rows with unit-stride columns, of the cache's dtype or any other."""
    _load()
    p, t = order.numel(), tokens.numel()
    layers, two, hkv, slots, d = cache.shape
    if not cache.is_contiguous() or feats.stride(-1) != 1 or feats_out.stride(-1) != 1:
        raise ValueError("round_tail: the cache must be contiguous, the features' rows unit-stride")
    if state_out.numel() != 4 + p or feats_out.shape[0] != p or feats.shape[1] != feats_out.shape[1]:
        raise ValueError(f"round_tail: state_out {tuple(state_out.shape)}, feats_out {tuple(feats_out.shape)}, "
                         f"feats {tuple(feats.shape)} for P = {p}")
    result = torch.empty(6 + 2 * p + 3 * t, dtype=torch.long, device=tokens.device)
    g = layers * two * hkv
    flags = flags.view(torch.uint8) if flags.dtype == torch.bool else flags
    f = feats.shape[1]
    gdc = pdl(tokens)  # (g: the cache blocks)
    _round_tail_kernel[(g + 1,)](_bits(cache), ids, state_out, _bits(feats_out), _bits(feats), tokens.contiguous(),
                                 parents.contiguous(), depths.contiguous(), flags.contiguous(), m, bonus, order, tlen,
                                 base, result, slots * d, feats.stride(0), feats_out.stride(0), f, t, g, P=p,
                                 PB=max(2, pow2(p)), D=d, DB=max(16, pow2(d)), FB=min(1024, max(16, pow2(f))),
                                 TB=max(16, pow2(t)), num_warps=4, **pdl_kwargs(gdc))
    return result
