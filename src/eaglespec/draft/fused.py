"""The EAGLE-3 drafter's step with fewer kernels, for the static draft runner (draft/fast.py) on CUDA.

Eagle3Drafter.forward over a StaticKV (draft/eagle3.py) launches ~47 kernels per step on CUDA, and a step
is launch-bound: 0.22 ms in a CUDA graph on an H200 whether it drafts 1 row or 10 (bench/RESULTS.md, session
6), 7 of them per depth-6 tree. This step computes the same layer the way target/fast.py's step does:

    x = cat([norm(embed(tokens)), norm(state)])               # one Triton kernel (kernels), else 4
    qkv = x @ [Wq; Wk; Wv].T                                  # one GEMM
    q, KV write = rope(q, k) from a cos/sin table, v          # one Triton kernel (kernels), else 2 + 2
    o = SDPA(q as [Hkv, B*G] rows, the unrepeated KV span)    # no repeat_interleave copies of the KV
    h = residual + o @ Wo'.T; out = h + down(silu(gate) * up) # residuals in the GEMMs (addmm), silu * up fused
    logits = lm_head(norm(out))

The table holds, for every KV slot position, the values Rotary.cos_sin computes per step (same fp32 products
and cos/sin, then the dtype cast), so the rope is bitwise the module's (target/fast._rope's sign flip is
exact). The attention is target/fast.py's grouped layout: q [B, G, Hkv, D] viewed as the query rows t*G + r of
each kv head, the output's [B, Hq*D] view (no copy where the SDPA output is in BMHK memory) in (r, j, d) column
order, and Wo' o_proj's weight with its columns permuted once to that order (fast._grouped_o_weight). What
differs: the residuals round once instead of twice (target/fast._add_linear), the concatenated projection, the
permuted o_proj and the grouped attention may accumulate in another order. Drafts are only proposals checked by
the target, so this moves which token is proposed at a near-tie, never what is emitted, and q is the one the
sampler uses. The weights are copied (concatenated) at construction: build it after loading, for inference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..target import gemm_kernels as G
from ..target import kernels as K
from ..target.fast import (
    _add_linear,
    _cat_bias,
    _grouped_mask,
    _grouped_o_weight,
    _grouped_output,
    _grouped_queries,
    _rms,
    _rope_table,
)
from .eagle3 import Eagle3Drafter


def _cat_linear(*mods: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenated weights and biases (target/fast._cat_bias) of linears that read the same input, detached."""
    bias = _cat_bias(*mods)
    return torch.cat([m.weight for m in mods]).detach(), None if bias is None else bias.detach()


def unfusable_reason(drafter: nn.Module) -> str | None:
    """Why FusedEagle3Step cannot run `drafter` (None = it can)."""
    if not isinstance(drafter, Eagle3Drafter):
        return f"{type(drafter).__name__} is not an EAGLE-3 drafter"
    at = drafter.midlayer.self_attn
    if at.rotary.rotary_dim != at.head_dim:
        return f"partial rotary ({at.rotary.rotary_dim} of {at.head_dim})"
    if at.head_dim % 2 or at.heads % at.kv_heads:
        return f"heads {at.heads} / kv heads {at.kv_heads} / head_dim {at.head_dim}"
    return None


class FusedEagle3Step:
    """Callable like Eagle3Drafter.forward(state, tokens, positions, cache, visible) for StaticKV caches whose
    `slots` are consecutive (both users: StaticDraftRunner.run and tree_graph.DeviceTreeRows) and `visible`
    a full [B, span] bool mask. Positions must be below `max_positions`."""

    def __init__(self, drafter: Eagle3Drafter, max_positions: int, kernels: bool = False, gemm: bool | None = None):
        reason = unfusable_reason(drafter)
        if reason is not None:
            raise ValueError(f"cannot fuse this drafter's step: {reason}")
        layer, at, mlp = drafter.midlayer, drafter.midlayer.self_attn, drafter.midlayer.mlp
        self.drafter = drafter
        self.norm_before_residual, self.norm_output = drafter.cfg.norm_before_residual, drafter.cfg.norm_output
        self.eps = layer.input_layernorm.eps
        self.in_norm, self.hidden_norm = layer.input_layernorm.weight.detach(), layer.hidden_norm.weight.detach()
        self.post_norm, self.final_norm = layer.post_attention_layernorm.weight.detach(), drafter.norm.weight.detach()
        self.hq, self.hk, self.d = at.heads, at.kv_heads, at.head_dim
        self.qkv_w, self.qkv_b = _cat_linear(at.q_proj, at.k_proj, at.v_proj)
        self.o_w = _grouped_o_weight(at.o_proj.weight, self.hk, self.d)  # columns in the grouped (r, j) order
        self.o_b = None if at.o_proj.bias is None else at.o_proj.bias.detach()
        self.gate_up_w, self.gate_up_b = _cat_linear(mlp.gate_proj, mlp.up_proj)
        self.down_w = mlp.down_proj.weight.detach()
        self.down_b = None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach()
        self.lm_w = drafter.lm_head.weight.detach()
        w = self.qkv_w
        positions = torch.arange(max_positions, device=w.device)
        cos, sin = at.rotary.cos_sin(positions, w.dtype)  # [S, D]: Rotary's per-step values, for every slot
        self.table = _rope_table(cos, sin).contiguous()  # [S, 2, 2, D/2]
        self._open = torch.zeros((), device=w.device, dtype=w.dtype)
        self._shut = torch.full((), torch.finfo(w.dtype).min, device=w.device, dtype=w.dtype)
        self.kernels = kernels
        # target/gemm_kernels.py with the kernels (None: $EAGLESPEC_GEMM_KERNELS): post-norm + gate_up, the MLP tail
        # (silu * up, down, residual) and final norm + lm_head, one kernel each
        self.gemm = G if kernels and (G.wanted() if gemm is None else gemm) else None
        self.dtype = drafter.fc.weight.dtype  # the model dtype (drafter.embed casts the target's embedding to it)
        # eagle3_input's normalised halves are in state's dtype; the torch path's `w * rms(x)` promotes to the
        # weights' dtype: the one kernel only where they agree
        self._fusable_input = self.in_norm.dtype == self.hidden_norm.dtype == self.dtype
        if kernels and not K.available(w.device):
            raise ValueError("kernels=True needs triton and a CUDA drafter (or TRITON_INTERPRET=1)")

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return K.rms_norm_weight(x, w, self.eps) if self.kernels else _rms(x, w, self.eps)

    def _embedding_weight(self, state: torch.Tensor) -> torch.Tensor | None:
        """The weight drafter.embed gathers from, where K.eagle3_input can do that lookup (and the cast of the
        target's embedding to the model dtype): a plain nn.Embedding (no max_norm, no subclass: Gemma's scaled
        one) on state's device, the drafter's own one in the model dtype; None: the drafter.embed path."""
        d = self.drafter
        if d.embed_tokens is not None:
            emb = d.embed_tokens
        elif d._target_embed:
            emb = d._target_embed[0]
        else:
            return None
        if type(emb) is not nn.Embedding or emb.max_norm is not None:
            return None
        w = emb.weight
        if w.device != state.device or not w.is_floating_point() or w.stride(-1) != 1:
            return None
        if d.embed_tokens is not None and w.dtype != state.dtype:  # embed_tokens(tokens) is not cast
            return None
        return w.detach()

    def _input(self, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x = cat([in_norm * rms(embed(tokens)), hidden_norm * rms(state)]) [B, 2H] and the residual (the
        normalised state with norm_before_residual, else state). kernels=True: one kernel (K.eagle3_input) where
        the embedding allows it, else the embedding (+ its cast), two RMSNorms and the cat: 4 kernels (5)."""
        h = state.shape[-1]
        if self.kernels and self._fusable_input and state.dtype == self.dtype and state.dim() == 2:
            w = self._embedding_weight(state)
            if w is not None:
                x = K.eagle3_input(tokens, w, state, self.in_norm, self.hidden_norm, self.eps)
                return x, (x[:, h:] if self.norm_before_residual else state)
        if self.norm_before_residual:
            hidden = residual = self._norm(state, self.hidden_norm)
        else:
            residual, hidden = state, self._norm(state, self.hidden_norm)
        return torch.cat([self._norm(self.drafter.embed(tokens), self.in_norm), hidden], dim=-1), residual

    def __call__(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache: list,
                 visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """state [B, H], tokens [B] target ids, positions [B], cache [StaticKV], visible [B, span] bool ->
        (logits over the draft vocab [B, Vd], next state [B, H])."""
        b, hq, hk, d = tokens.shape[0], self.hq, self.hk, self.d
        g = hq // hk
        kv = cache[0]
        span = kv.span
        x, residual = self._input(state, tokens)  # [B, 2H], [B, H]
        qkv = F.linear(x, self.qkv_w, self.qkv_b)  # [B, (Hq + 2 Hkv) D]
        qk, v = qkv.view(b, hq + 2 * hk, d).split([hq + hk, hk], dim=1)
        rope = K.rope_qk_kv_write if self.kernels else K.rope_qk_kv_write_ref
        kc, vc = kv.k[0], kv.v[0]  # [Hkv, S, D]
        q = rope(qk, v, self.table, positions, kv.slots[0], kc, vc)  # [B, G, Hkv, D]; k, v written at the slots
        # GQA over the unrepeated KV: head j*G + r of token t -> kv head j, query row t*G + r (as target/fast.py)
        mask = _grouped_mask(visible, g, self._open, self._shut)  # [1, 1, B*G, span]
        o = F.scaled_dot_product_attention(_grouped_queries(q), kc[None, :, :span], vc[None, :, :span],
                                           attn_mask=mask)  # [1, Hkv, B*G, D]
        o = _grouped_output(o, b)  # [B, Hq*D], columns (r, j, d)
        h = _add_linear(residual, o, self.o_w, self.o_b)  # out of place: residual may be the caller's state
        gemm = self.gemm
        if gemm is not None:
            gate_up = gemm.rms_norm_linear(h, self.post_norm, self.eps, self.gate_up_w, self.gate_up_b)  # [B, 2I]
        else:
            gate_up = F.linear(self._norm(h, self.post_norm), self.gate_up_w, self.gate_up_b)  # [B, 2I]
        if gemm is not None and self.down_b is None:
            out = gemm.silu_mul_linear_(h, gate_up, self.down_w)  # [B, H]: h += silu(gate) * up @ down.T
        else:
            if self.kernels:
                act = K.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                act = F.silu(gate) * up
            out = _add_linear(h, act, self.down_w, self.down_b, inplace=True)  # [B, H]
        if gemm is not None and not self.norm_output:  # the normed output is not a result: norm + lm_head at once
            return gemm.rms_norm_linear(out, self.final_norm, self.eps, self.lm_w), out
        normed = self._norm(out, self.final_norm)
        return F.linear(normed, self.lm_w), (normed if self.norm_output else out)
