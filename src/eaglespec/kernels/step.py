"""Triton kernels of a decoder layer's step (backends/fast.py's FastTarget(fused_kernels=True) and
draft/fused.py's steps with kernels=True): each does in one launch what the torch code does in several, with
its rounding.

    rms_norm_weight   HF's LlamaRMSNorm: round(round(x * rsqrt(mean(x^2) + eps)) * w), statistics in fp32
    rope_qk_kv_write  rope of q and k from the rope table, q written in the grouped layout [B, G, Hkv, D] the
                      attention reads, k and v written into the KV cache at slots base..base+B-1
    rope_qk_kv_write_rows
                      the same over B sequences of W rows each (backends/fast_batch.py): q in the layout
                      [B, Hkv, W * G, D], k and v into each sequence's cache rows at its own slots [B, W]
    silu_mul          round(round(silu(gate)) * up)
    eagle3_input      the EAGLE-3 drafter's layer input: the embedding rows (cast to the state's dtype), both
                      RMSNorms and the concatenation
    block_mask        a step's [B, span] attention mask: every committed slot below `base`, then the [B, B]
                      block of the pending rows

Elementwise parts (rope, the KV write, silu with libdevice's expf and an IEEE division, the products)
reproduce torch's CUDA arithmetic bitwise: every value the torch code stores in the model's dtype is rounded
to it (eaglespec.kernels' `_round`) and launches pass enable_fp_fusion=False (no FMA contraction). A
reduction's order and rsqrt's last bit differ from torch's own kernels, so an RMSNorm may differ by an ulp.
Under the interpreter silu takes numpy's exp (no libdevice there). Each kernel's `*_ref` is the torch code it
replaces.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eaglespec.kernels import interpreted, jit, pdl, pdl_kwargs, pow2


# -- plain-torch references (the code of backends/fast.py each kernel replaces) ---------------------------
def rms_norm_weight_ref(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * F.rms_norm(x): normalised in fp32, cast back, scaled in x's dtype."""
    return w * F.rms_norm(x, (x.shape[-1],), eps=eps)


def rope_qk_kv_write_ref(qk: torch.Tensor, v: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                         base: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """The rope and KV write in torch: returns q [B, G, Hkv, D] contiguous, q[t, r, j] = rotated HF head j*G +
    r of token t; writes k and v into the caches at base + 0..B-1. The rope with table [S, 2, 2, D/2]
    (backends/fast.py's _rope_table): output half i = x_1 * table[i, 0] + x_2 * table[i, 1], HF's x * cos +
    rotate_half(x) * sin."""
    b, hk, d = v.shape
    hq = qk.shape[1] - hk
    pairs = qk.transpose(0, 1).unflatten(-1, (1, 2, d // 2)) * table[positions]  # [Hq + Hkv, B, 2, 2, D/2]
    heads = pairs.sum(dim=-2).flatten(-2)  # [Hq + Hkv, B, D]
    slots = base + torch.arange(b, device=qk.device)
    k_cache.index_copy_(1, slots, heads[hq:])
    v_cache.index_copy_(1, slots, v.transpose(0, 1))
    return heads[:hq].unflatten(0, (hk, hq // hk)).permute(2, 1, 0, 3).contiguous()  # [B, G, Hkv, D]


def rope_qk_kv_write_rows_ref(qk: torch.Tensor, v: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                              slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """The batched rope and KV write in torch: qk [B*W, Hq + Hkv, D], v [B*W, Hkv, D] (row b*W + w: row w of
    sequence b), positions [B*W], slots [B, W], caches [B, Hkv, S, D]. Returns q [B, Hkv, W*G, D] contiguous,
    q[b, j, w*G + r] = rotated HF head j*G + r of row w of sequence b; writes k and v at each row's slot."""
    B, W = slots.shape
    hk, d = v.shape[1], v.shape[2]
    hq = qk.shape[1] - hk
    pairs = qk.unflatten(-1, (1, 2, d // 2)) * table[positions][:, None]  # [B*W, Hq + Hkv, 2, 2, D/2]
    heads = pairs.sum(dim=-2).flatten(-2)  # [B*W, Hq + Hkv, D]
    index = slots[:, None, :, None].expand(B, hk, W, d)
    k_cache.scatter_(2, index, heads[:, hq:].view(B, W, hk, d).transpose(1, 2))
    v_cache.scatter_(2, index, v.view(B, W, hk, d).transpose(1, 2))
    q = heads[:, :hq].view(B, W, hk, hq // hk, d)  # [B, W, Hkv, G, D]
    return q.permute(0, 2, 1, 3, 4).reshape(B, hk, W * (hq // hk), d)


def silu_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """F.silu(gate) * up for gate_up = [gate | up] on the last dim."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def block_mask_ref(visible: torch.Tensor, base: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """visible [B, B] bool (B >= 1), base [] long, cols [span] = 0..span-1 -> [B, span] bool: slot x is seen
    by row r when x < base (committed) or x - base < B and visible[r, x - base] (the pending block)."""
    b = visible.shape[0]
    rel = cols - base  # [span]: slot index relative to the first pending slot
    return (visible[:, rel.clamp(0, b - 1)] & (rel < b)) | (rel < 0)


def eagle3_input_ref(tokens: torch.Tensor, embed_w: torch.Tensor, state: torch.Tensor, in_norm: torch.Tensor,
                     hidden_norm: torch.Tensor, eps: float) -> torch.Tensor:
    """cat([in_norm * rms(embed(tokens)), hidden_norm * rms(state)], -1) [B, 2H], the embedding rows cast to
    state's dtype first (Eagle3Drafter.embed's cast of the target's embedding)."""
    e = F.embedding(tokens, embed_w).to(state.dtype)
    return torch.cat([rms_norm_weight_ref(e, in_norm, eps), rms_norm_weight_ref(state, hidden_norm, eps)], dim=-1)


# -- the Triton kernels (plain functions here; _load() jits them on first use) --------------------------------
# Annotations are not evaluated (from __future__ import annotations): this module imports without triton.
def _rms_norm_weight_kernel(x_ptr, w_ptr, out_ptr, x_row_stride, eps, N: tl.constexpr, BLOCK: tl.constexpr,
                            USE_GDC: tl.constexpr = False):
    """One program per row: out = round(round(x * rsqrt(mean(x^2) + eps)) * w), statistics in fp32."""
    dtype = out_ptr.dtype.element_ty
    _dependents(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < N
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)  # a weight: before the wait
    _wait(USE_GDC)
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, _rms_weight(x, w, eps, N, dtype).to(dtype), mask=inside)


def _rms_weight(x, w, eps, N: tl.constexpr, dtype: tl.constexpr):
    """fp32 row x (zeros past N), weight w -> round(round(x * rsqrt(mean(x^2) + eps)) * w) as fp32 values."""
    mean_sq = tl.reduce(x * x, 0, _add) / N
    y = _round(x * tl.math.rsqrt(mean_sq + eps), dtype)  # F.rms_norm's output, in x's dtype
    return _round(y * w, dtype)


def _eagle3_input_kernel(tok_ptr, emb_ptr, state_ptr, in_w_ptr, hid_w_ptr, out_ptr, tok_stride, emb_row_stride,
                         state_row_stride, eps, N: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program (row, half): half 0 -> out[row, :N] = in_norm-RMSNorm of the embedding row tokens[row] (rounded
    to out's dtype first: the cast), half 1 -> out[row, N:] = hidden_norm-RMSNorm of state[row]."""
    dtype = out_ptr.dtype.element_ty
    _dependents(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    half = tl.program_id(1)
    cols = tl.arange(0, BLOCK)
    inside = cols < N
    if half == 0:
        w = tl.load(in_w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        _wait(USE_GDC)
        tok = tl.load(tok_ptr + row * tok_stride).to(tl.int64)
        x = _round(tl.load(emb_ptr + tok * emb_row_stride + cols, mask=inside, other=0.0).to(tl.float32), dtype)
    else:
        w = tl.load(hid_w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        _wait(USE_GDC)
        x = tl.load(state_ptr + row * state_row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    out = _rms_weight(x, w, eps, N, dtype)
    tl.store(out_ptr + row * (2 * N) + half * N + cols, out.to(dtype), mask=inside)


def _rope_kv_kernel(qk_ptr, v_ptr, table_ptr, pos_ptr, base_ptr, q_ptr, kc_ptr, vc_ptr,
                    qk_s0, qk_s1, v_s0, v_s1, kc_s0, kc_s1, vc_s0, vc_s1, kc_sb, vc_sb, W,
                    HQ: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, HALF: tl.constexpr, BLOCK: tl.constexpr,
                    ROWS: tl.constexpr = False, USE_GDC: tl.constexpr = False):
    """Program (t, h): head h of token t. h < HQ: rotated q -> q[t, h % G, h // G] (q [B, G, Hkv, D]: HF head
    j*G + r at [t, r, j]); h < HQ + HKV: rotated k -> k cache [h - HQ, base + t]; else v -> v cache [h - HQ -
    HKV, base + t]. Rope: output half i = round(round(x_1 * table[i, 0]) + round(x_2 * table[i, 1])).
    ROWS: token t is row w = t % W of sequence b = t // W, written at slot base_ptr[t] of cache row b (strides
    kc_sb, vc_sb), its q heads into q [B, Hkv, W*G, D] at [b, h // G, w*G + h % G]."""
    dtype = q_ptr.dtype.element_ty
    _dependents(USE_GDC)
    _wait(USE_GDC)  # positions and base are written by the round before this step: nothing to read before it
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    i = tl.arange(0, BLOCK)
    inside = i < HALF
    if ROWS:
        b = t // W
        slot = tl.load(base_ptr + t)
        kc_ptr += b * kc_sb
        vc_ptr += b * vc_sb
    else:
        slot = tl.load(base_ptr) + t
    if h < HQ + HKV:
        src = qk_ptr + t * qk_s0 + h * qk_s1
        x1 = tl.load(src + i, mask=inside, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF + i, mask=inside, other=0.0).to(tl.float32)
        row = table_ptr + tl.load(pos_ptr + t) * (4 * HALF)  # table [S, 2, 2, HALF], contiguous
        c1 = tl.load(row + i, mask=inside, other=0.0).to(tl.float32)
        ns1 = tl.load(row + HALF + i, mask=inside, other=0.0).to(tl.float32)
        s2 = tl.load(row + 2 * HALF + i, mask=inside, other=0.0).to(tl.float32)
        c2 = tl.load(row + 3 * HALF + i, mask=inside, other=0.0).to(tl.float32)
        o1 = _round(_round(x1 * c1, dtype) + _round(x2 * ns1, dtype), dtype)
        o2 = _round(_round(x1 * s2, dtype) + _round(x2 * c2, dtype), dtype)
        if h < HQ:
            if ROWS:
                dst = q_ptr + ((b * HKV + h // G) * W * G + (t % W) * G + h % G) * (2 * HALF)
            else:
                dst = q_ptr + ((t * G + h % G) * HKV + h // G) * (2 * HALF)
        else:
            dst = kc_ptr + (h - HQ) * kc_s0 + slot * kc_s1
        tl.store(dst + i, o1.to(dtype), mask=inside)
        tl.store(dst + HALF + i, o2.to(dtype), mask=inside)
    else:
        src = v_ptr + t * v_s0 + (h - HQ - HKV) * v_s1
        dst = vc_ptr + (h - HQ - HKV) * vc_s0 + slot * vc_s1
        tl.store(dst + i, tl.load(src + i, mask=inside), mask=inside)
        tl.store(dst + HALF + i, tl.load(src + HALF + i, mask=inside), mask=inside)


def _silu_mul_kernel(gu_ptr, out_ptr, gu_row_stride, N, PRECISE_EXP: tl.constexpr, BLOCK: tl.constexpr,
                     USE_GDC: tl.constexpr = False):
    """Program (row, block): out = round(round(g / (1 + exp(-g))) * up), torch's silu then product."""
    dtype = out_ptr.dtype.element_ty
    _dependents(USE_GDC)
    _wait(USE_GDC)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < N
    g = tl.load(gu_ptr + row * gu_row_stride + cols, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * gu_row_stride + N + cols, mask=inside, other=0.0).to(tl.float32)
    if PRECISE_EXP:  # CUDA's expf, as torch's silu kernel (tl.exp is the approximate ex2-based one)
        e = libdevice.exp(-g)
    else:  # the interpreter has no libdevice: numpy's exp
        e = tl.exp(-g)
    silu = _round(tl.math.div_rn(g, 1.0 + e), dtype)
    tl.store(out_ptr + row * N + cols, _round(silu * up, dtype).to(dtype), mask=inside)


def _block_mask_kernel(vis_ptr, base_ptr, out_ptr, B, X, XB: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Row r, slots XB * program(1) ..: (rel < 0) | (0 <= rel < B and visible[r, rel]), rel = slot - base."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    r = tl.program_id(0)
    x = tl.program_id(1) * XB + tl.arange(0, XB)
    rel = x - tl.load(base_ptr)
    block = (rel >= 0) & (rel < B)
    v = tl.load(vis_ptr + r * B + tl.maximum(rel, 0), mask=block & (x < X), other=0)
    tl.store(out_ptr + r * X + x, ((rel < 0) | (block & (v != 0))).to(tl.uint8), mask=x < X)


_JITTED = ("_rms_weight", "_rms_norm_weight_kernel", "_eagle3_input_kernel", "_rope_kv_kernel",
           "_silu_mul_kernel", "_block_mask_kernel")


def _load() -> None:
    """Jit the kernels above (eaglespec.kernels.jit also puts triton, tl and the shared helpers here)."""
    global triton, tl, libdevice, _add, _round, _dependents, _wait
    jit(globals(), _JITTED)


# -- the launchers -----------------------------------------------------------------------------------------
def rms_norm_weight(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., N], w [N] -> [..., N] in x's dtype: rms_norm_weight_ref in one kernel."""
    _load()
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    g = pdl(x)
    _rms_norm_weight_kernel[(x2.shape[0],)](x2, w, out, x2.stride(0), eps, N=n, BLOCK=pow2(n), **pdl_kwargs(g),
                                            enable_fp_fusion=False)
    return out


def eagle3_input(tokens: torch.Tensor, embed_w: torch.Tensor, state: torch.Tensor, in_norm: torch.Tensor,
                 hidden_norm: torch.Tensor, eps: float) -> torch.Tensor:
    """eagle3_input_ref in one kernel: tokens [B] long (in range: not checked), embed_w [V, H] (any float
    dtype, last dim contiguous), state [B, H], in_norm / hidden_norm [H] contiguous -> x [B, 2H] in state's
    dtype, x[:, :H] the normalised embeddings, x[:, H:] the normalised state."""
    _load()
    b, n = state.shape
    if embed_w.dim() != 2 or embed_w.shape[1] != n or embed_w.stride(1) != 1:
        raise ValueError(f"embedding weight {tuple(embed_w.shape)} (strides {embed_w.stride()}) for hidden size {n}")
    if not (in_norm.is_contiguous() and hidden_norm.is_contiguous() and in_norm.numel() == hidden_norm.numel() == n):
        raise ValueError(f"norm weights {tuple(in_norm.shape)}, {tuple(hidden_norm.shape)} for hidden size {n}")
    if tokens.shape != (b,):
        raise ValueError(f"tokens {tuple(tokens.shape)} for {b} state rows")
    if state.stride(-1) != 1:
        state = state.contiguous()
    out = torch.empty(b, 2 * n, dtype=state.dtype, device=state.device)
    g = pdl(state)
    _eagle3_input_kernel[(b, 2)](tokens, embed_w, state, in_norm, hidden_norm, out, tokens.stride(0),
                                 embed_w.stride(0), state.stride(0), eps, N=n, BLOCK=pow2(n), **pdl_kwargs(g),
                                 enable_fp_fusion=False)
    return out


def rope_qk_kv_write(qk: torch.Tensor, v: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                     base: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """rope_qk_kv_write_ref in one kernel. qk [B, Hq + Hkv, D] and v [B, Hkv, D] (any strides but a contiguous
    last dim: views of the qkv projection), table [S, 2, 2, D/2] contiguous, positions [B] long, base [] long,
    k_cache / v_cache [Hkv, S', D] (last dim contiguous) -> q [B, G, Hkv, D] contiguous, rotated, HF head j*G
    + r of token t at q[t, r, j]; rotated k and v written into the caches at slots base + 0..B-1."""
    _load()
    _check_rope_args(qk, v, table, k_cache, v_cache)
    b, hqk, d = qk.shape
    hk = v.shape[1]
    hq = hqk - hk
    q = torch.empty(b, hq // hk, hk, d, dtype=qk.dtype, device=qk.device)
    g = pdl(qk)
    _rope_kv_kernel[(b, hqk + hk)](qk, v, table, positions, base, q, k_cache, v_cache,
                                   qk.stride(0), qk.stride(1), v.stride(0), v.stride(1),
                                   k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
                                   0, 0, 1, HQ=hq, HKV=hk, G=hq // hk, HALF=d // 2, BLOCK=pow2(d // 2),
                                   **pdl_kwargs(g), enable_fp_fusion=False)
    return q


def _check_rope_args(qk: torch.Tensor, v: torch.Tensor, table: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor) -> None:
    d, hk = qk.shape[-1], v.shape[1]
    if d % 2 or table.shape[-1] * 2 != d or not table.is_contiguous():
        raise ValueError(f"rope table {tuple(table.shape)} (contiguous: {table.is_contiguous()}) for head_dim {d}")
    if qk.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("rope_qk_kv_write needs a contiguous last dim in qk, v and the caches")
    if (qk.shape[1] - hk) % hk:
        raise ValueError(f"{qk.shape[1] - hk} query heads for {hk} kv heads")


def rope_qk_kv_write_rows(qk: torch.Tensor, v: torch.Tensor, table: torch.Tensor, positions: torch.Tensor,
                          slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """rope_qk_kv_write_rows_ref in one kernel: qk [B*W, Hq + Hkv, D] and v [B*W, Hkv, D] (last dim contiguous),
    positions [B*W] long, slots [B, W] long, caches [B, Hkv, S, D] (last dim contiguous) -> q [B, Hkv, W*G, D]."""
    _load()
    _check_rope_args(qk, v, table, k_cache, v_cache)
    rows, hqk, d = qk.shape
    B, W = slots.shape
    hk = v.shape[1]
    hq = hqk - hk
    q = torch.empty(B, hk, W * (hq // hk), d, dtype=qk.dtype, device=qk.device)
    slots = slots.contiguous()
    g = pdl(qk)
    _rope_kv_kernel[(rows, hqk + hk)](qk, v, table, positions, slots, q, k_cache, v_cache,
                                      qk.stride(0), qk.stride(1), v.stride(0), v.stride(1),
                                      k_cache.stride(1), k_cache.stride(2), v_cache.stride(1), v_cache.stride(2),
                                      k_cache.stride(0), v_cache.stride(0), W, HQ=hq, HKV=hk, G=hq // hk,
                                      HALF=d // 2, BLOCK=pow2(d // 2), ROWS=True, **pdl_kwargs(g),
                                      enable_fp_fusion=False)
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [R, 2I] (last dim contiguous) -> silu(gate) * up [R, I]: silu_mul_ref in one kernel."""
    _load()
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    out = torch.empty(rows, n, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, pow2(n))
    g = pdl(gate_up)
    _silu_mul_kernel[(rows, -(-n // block))](gate_up, out, gate_up.stride(0), n, PRECISE_EXP=not interpreted(),
                                             BLOCK=block, **pdl_kwargs(g), enable_fp_fusion=False)
    return out


def block_mask(visible: torch.Tensor, base: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """block_mask_ref in one kernel: visible [B, B] bool, base [] long, cols [span] (only its length is read;
    base + B <= span) -> [B, span] bool."""
    _load()
    b, span = visible.shape[0], cols.shape[0]
    out = torch.empty(b, span, dtype=torch.bool, device=visible.device)
    xb = min(1024, pow2(span))
    g = pdl(visible)
    _block_mask_kernel[(b, -(-span // xb))](visible.contiguous().view(torch.uint8), base.reshape(1),
                                            out.view(torch.uint8), b, span, XB=xb, **pdl_kwargs(g))
    return out
