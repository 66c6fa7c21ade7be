"""A Triton masked-attention kernel for the fast target's step (backends/fast.py) and the fused drafter's step
(draft/fused.py), in place of F.scaled_dot_product_attention with the grouped additive mask:

    masked_attention(q [1, Hkv, M, D], k / v [1, Hkv, span, D], allowed [B, span] bool, scale, kv_len)
        -> o [1, Hkv, M, D], M = B*G: query row t*G + r of KV head j is HF head j*G + r of token t (the
        grouped layout) and sees column c iff allowed[t, c] (and c < kv_len): the mask is read by row // G,
        never expanded
    masked_attention(q [N, Hkv, M, D], k / v [N, Hkv, span, D], allowed [N, B, span], scale, kv_len [N])
        -> o [N, Hkv, M, D]: N sequences at once (the batched target, backends/fast_batch.py), each over its
        own KV, mask rows and kv_len

Flash-attention style: program (sequence and KV head, block of BLOCK_M query rows) streams the columns in tiles of BLOCK_N,
scores and the online softmax in fp32 (exp2, the scale folded with log2(e)), the G query rows of a token
sharing the KV head's tiles. With `splits` > 1 (flash-decoding), program (head, block, s) takes the s-th share
of the column tiles and writes its unnormalised partial output and (max, sum) in fp32, and a second kernel
combines the shares per row. kv_len (a 1-element long tensor on the device: no host sync) ends the column loop
at min(span, kv_len): the tiles past it are never read, so whatever the cache holds there cannot matter. A row
with no allowed column gets zeros (SDPA with the finite additive mask would average over all columns; the step
never has one).

Numerics: fp32 inputs take IEEE fp32 dots (no TF32); bf16 / fp16 inputs take dots in the input dtype with fp32
accumulation (the probabilities rounded to the input dtype for the P @ V dot, as flash attention does). Not
bitwise SDPA's (another summation order and exp2): fp32 agrees to ~1e-6. The interpreter has no bf16
arithmetic: there a 16-bit call takes masked_attention_ref. The output is the transposed view of [1, M, Hkv,
D] memory (BMHK), the layout SDPA's CUDA kernels return for the step's query, so the step's reshape of it
stays a view.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from eaglespec.kernels import interpreted, jit, pdl, pdl_kwargs, pow2

_LOG2E = 1.4426950408889634
MAX_SPLITS = 16  # flash-decoding shares of the columns at most (the combine kernel holds them in one block)


# -- the plain-torch reference (the code of fast.py the kernel replaces) ---------------------------------------
def masked_attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                         scale: float | None = None, kv_len: torch.Tensor | None = None) -> torch.Tensor:
    """The SDPA call the kernel replaces: q [N, Hkv, M, D] (M = B*G), k / v [N, Hkv, span, D], allowed [B,
    span] (N = 1) or [N, B, span] bool (AND cols < kv_len [N] where given) -> [N, Hkv, M, D], row t*G + r of
    sequence n masked by allowed[n, t] as an additive mask (0 where allowed, the dtype's min elsewhere)."""
    allowed = allowed.reshape(q.shape[0], -1, allowed.shape[-1])  # [N, B, span]
    n, b, span = allowed.shape
    if kv_len is not None:
        allowed = allowed & (torch.arange(span, device=allowed.device) < kv_len.reshape(n, 1, 1))
    rows = allowed.repeat_interleave(q.shape[2] // b, dim=1)  # [N, M, span]
    mask = torch.zeros(rows.shape, dtype=q.dtype, device=q.device)
    mask.masked_fill_(~rows, torch.finfo(q.dtype).min)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=scale)


# -- the Triton kernels (plain functions here; _load() jits them on first use) --------------------------------
# Annotations are not evaluated (from __future__ import annotations): this module imports without triton.
def _tile(q, k_base, v_base, mask_ptr, tok, in_m, start, lo, hi, m_i, l_i, acc, k_s2, v_s2, mask_s0, qk_scale,
          D: tl.constexpr, DP: tl.constexpr, PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """The online softmax over columns start..start+BLOCK_N-1 (those outside [lo, hi) masked and not read):
    (running max m_i [BLOCK_M], sum l_i [BLOCK_M], output acc [BLOCK_M, DP]) -> the updated three. DP: D
    padded to a power of two >= 16 (the padding columns load as 0)."""
    d = tl.arange(0, DP)
    cols = start + tl.arange(0, BLOCK_N)
    in_n = (cols >= lo) & (cols < hi)
    in_nd = in_n[:, None] & (d < D)[None, :]
    k = tl.load(k_base + cols[:, None] * k_s2 + d[None, :], mask=in_nd, other=0.0)  # [BLOCK_N, DP]
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    ok = tl.load(mask_ptr + tok[:, None] * mask_s0 + cols[None, :], mask=in_m[:, None] & in_n[None, :], other=0) != 0
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.reduce(s, 1, _max))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no column allowed yet: keep everything 0, no NaN
    p = tl.exp2(s - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.reduce(p, 1, _add)
    v = tl.load(v_base + cols[:, None] * v_s2 + d[None, :], mask=in_nd, other=0.0)  # [BLOCK_N, DP]
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


def _attn_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, len_ptr, o_ptr, part_ptr, stat_ptr,
                 q_s0, q_s1, q_s2, k_s0, k_s1, k_s2, v_s0, v_s1, v_s2, o_s0, o_s1, o_s2, mask_sn, mask_s0, M, SPAN,
                 HKV, HEADS, qk_scale,
                 G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, HAS_LEN: tl.constexpr, SPLITS: tl.constexpr,
                 PRECISION: tl.constexpr, LOOP_SPAN: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program (head, m block, share): rows m*BLOCK_M.. of KV head `head` (of HKV = N sequences x HEADS) over its
    share of the columns below min(SPAN, kv_len), online softmax in base 2. SPLITS == 1: o = acc / l (0 where no
    column was allowed); else the partial acc -> part [share, head, row, DP] and (max, sum) -> stat [share, head,
    row, 2], fp32."""
    _dependents(USE_GDC)
    _wait(USE_GDC)  # q, the cache, the mask and kv_len are all written in the step
    head = tl.program_id(0).to(tl.int64)
    seq = head // HEADS  # the sequence, and its KV head j
    j = head % HEADS
    q_ptr += seq * q_s0
    k_ptr += seq * k_s0
    v_ptr += seq * v_s0
    mask_ptr += seq * mask_sn
    len_ptr += seq
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    share = tl.program_id(2)
    in_m = rows < M
    d = tl.arange(0, DP)
    in_md = in_m[:, None] & (d < D)[None, :]
    q = tl.load(q_ptr + j * q_s1 + rows[:, None] * q_s2 + d[None, :], mask=in_md, other=0.0)
    tok = rows // G
    n_end = SPAN
    if HAS_LEN:
        n_end = tl.minimum(tl.load(len_ptr).to(tl.int32), SPAN)
    lo = 0
    hi = n_end
    if SPLITS > 1:  # the share's tiles: ceil(tiles / SPLITS) each, the last ones may be short or empty
        per = ((n_end + BLOCK_N - 1) // BLOCK_N + SPLITS - 1) // SPLITS * BLOCK_N
        lo = share * per
        hi = tl.minimum(lo + per, n_end)
    k_base = k_ptr + j * k_s1
    v_base = v_ptr + j * v_s1
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, DP], 0.0, tl.float32)
    if LOOP_SPAN > 0:  # the interpreter (no loop bound held in a tensor): every tile, those outside [lo, hi)
        # fully masked
        for start in range(0, LOOP_SPAN, BLOCK_N):
            m_i, l_i, acc = _tile(q, k_base, v_base, mask_ptr, tok, in_m, start, lo, hi, m_i, l_i, acc, k_s2, v_s2,
                                  mask_s0, qk_scale, D, DP, PRECISION, BLOCK_N)
    else:
        for start in range(lo, hi, BLOCK_N):
            m_i, l_i, acc = _tile(q, k_base, v_base, mask_ptr, tok, in_m, start, lo, hi, m_i, l_i, acc, k_s2, v_s2,
                                  mask_s0, qk_scale, D, DP, PRECISION, BLOCK_N)
    if SPLITS == 1:
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        tl.store(o_ptr + seq * o_s0 + j * o_s1 + rows[:, None] * o_s2 + d[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=in_md)
    else:
        row_id = (share * HKV + head) * M + rows  # [BLOCK_M]: (share, head, row)
        tl.store(part_ptr + row_id[:, None] * DP + d[None, :], acc, mask=in_m[:, None])
        tl.store(stat_ptr + row_id * 2, m_i, mask=in_m)
        tl.store(stat_ptr + row_id * 2 + 1, l_i, mask=in_m)


def _combine_kernel(part_ptr, stat_ptr, o_ptr, o_s0, o_s1, o_s2, M, HKV, HEADS, SPLITS: tl.constexpr,
                    SP: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, USE_GDC: tl.constexpr = False):
    """Program (head, row): the SPLITS shares' partial outputs of the row combined -> o (0 where no share
    saw an allowed column)."""
    _dependents(USE_GDC)
    _wait(USE_GDC)
    head = tl.program_id(0).to(tl.int64)
    seq = head // HEADS
    j = head % HEADS
    row = tl.program_id(1)
    s = tl.arange(0, SP)
    in_s = s < SPLITS
    row_id = (s * HKV + head) * M + row  # [SP]
    m_s = tl.load(stat_ptr + row_id * 2, mask=in_s, other=float("-inf"))
    l_s = tl.load(stat_ptr + row_id * 2 + 1, mask=in_s, other=0.0)
    m = tl.reduce(m_s, 0, _max)
    m = tl.where(m == float("-inf"), 0.0, m)  # no share saw an allowed column: every weight 0, no NaN
    w = tl.exp2(m_s - m)  # [SP]; 0 for a share with no allowed column
    total = tl.reduce(w * l_s, 0, _add)
    d = tl.arange(0, DP)
    part = tl.load(part_ptr + row_id[:, None] * DP + d[None, :], mask=in_s[:, None], other=0.0)  # [SP, DP]
    out = tl.reduce(part * w[:, None], 0, _add) / tl.where(total > 0.0, total, 1.0)
    tl.store(o_ptr + seq * o_s0 + j * o_s1 + row * o_s2 + d, out.to(o_ptr.dtype.element_ty), mask=d < D)


_JITTED = ("_tile", "_attn_kernel", "_combine_kernel")


def _load() -> None:
    """Jit the kernels above (eaglespec.kernels.jit also puts triton, tl and the shared helpers here)."""
    global triton, tl, _add, _max, _dependents, _wait
    jit(globals(), _JITTED)


# -- the launcher ------------------------------------------------------------------------------------------
def default_config(m: int, span: int, hk: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, splits) for M query rows per KV head over `span` columns, hk KV heads: tiles of 16
    query rows (the smallest tl.dot takes) and 64 columns; span 256 in one share, longer spans in shares of
    down to one tile while the grid stays within 288 programs."""
    block_m, block_n = 16, 64
    programs = hk * -(-m // block_m)
    splits = 1
    if span > 256:
        while splits * 2 <= min(MAX_SPLITS, span // block_n) and programs * splits * 2 <= 288:
            splits *= 2
    return block_m, block_n, splits


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                     scale: float | None = None, kv_len: torch.Tensor | None = None, *,
                     block_m: int | None = None, block_n: int | None = None, splits: int | None = None,
                     num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """masked_attention_ref in one kernel (two with splits > 1). q [N, Hkv, M, D] (M = B*G; any strides with a
    contiguous last dim: the step's is a transposed view), k / v [N, Hkv, span, D] (views of the cache, last
    dim contiguous), allowed [B, span] (N = 1) or [N, B, span] bool (last dim contiguous), scale (None: D**-0.5,
    SDPA's default), kv_len [N] (or [] for N = 1) long on q's device: sequence n's columns >= kv_len[n] masked
    and never read -> o [N, Hkv, M, D] in q's dtype, the transposed view of [N, M, Hkv, D] memory. Any D (the
    tiles pad it to a power of two >= 16). block_m / block_n / splits / num_warps / num_stages override
    default_config and Triton's defaults."""
    _load()
    n, hk, m, d = q.shape
    span = k.shape[2]
    rows = allowed.reshape(n, -1, allowed.shape[-1]) if allowed.dim() == 2 and n == 1 else allowed  # [N, B, span]
    b = rows.shape[1] if rows.dim() == 3 else 0
    if k.shape != (n, hk, span, d) or v.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: same sequences, heads and D")
    if (rows.dim() != 3 or rows.shape[0] != n or b == 0 or m % b or rows.shape[2] != span
            or rows.dtype != torch.bool):
        raise ValueError(f"allowed {tuple(allowed.shape)} {allowed.dtype} for {n} x {m} query rows over {span} "
                         "columns")
    if not (k.dtype == v.dtype == q.dtype):
        raise ValueError(f"dtypes q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if kv_len is not None and kv_len.numel() != n:
        raise ValueError(f"kv_len of {kv_len.numel()} entries for {n} sequences")
    if interpreted() and q.dtype != torch.float32:  # the interpreter does no bf16 / fp16 arithmetic
        return masked_attention_ref(q, k, v, allowed, scale, kv_len)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    cfg = default_config(m, span, n * hk)
    block_m = block_m or cfg[0]
    block_n = block_n or cfg[1]
    splits = max(1, min(splits or cfg[2], MAX_SPLITS, -(-span // block_n)))
    scale = d ** -0.5 if scale is None else scale
    dp = max(16, pow2(d))  # the tiles' head dim (tl.dot takes >= 16)
    out = torch.empty(n, m, hk, d, dtype=q.dtype, device=q.device).transpose(1, 2)  # BMHK memory
    if splits > 1:
        part = torch.empty(splits, n * hk, m, dp, dtype=torch.float32, device=q.device)
        stat = torch.empty(splits, n * hk, m, 2, dtype=torch.float32, device=q.device)
    else:
        part = stat = out
    launch = {}
    if num_warps is not None:
        launch["num_warps"] = num_warps
    if num_stages is not None:
        launch["num_stages"] = num_stages
    grid = (n * hk, triton.cdiv(m, block_m), splits)
    gdc = pdl(q)
    _attn_kernel[grid](q, k, v, rows, rows if kv_len is None else kv_len, out, part, stat,
                       q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                       v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                       rows.stride(0), rows.stride(1), m, span, n * hk, hk, scale * _LOG2E,
                       G=m // b, D=d, DP=dp, HAS_LEN=kv_len is not None, SPLITS=splits,
                       PRECISION="ieee", LOOP_SPAN=span if interpreted() else 0, BLOCK_M=block_m, BLOCK_N=block_n,
                       **pdl_kwargs(gdc), **launch)
    if splits > 1:
        _combine_kernel[(n * hk, m)](part, stat, out, out.stride(0), out.stride(1), out.stride(2), m, n * hk, hk,
                                     SPLITS=splits, SP=pow2(splits), D=d, DP=dp, **pdl_kwargs(gdc))
    return out
