"""The EAGLE-3 and EAGLE-1 drafters' steps with fewer kernels, for the static draft runner (draft/fast.py) on CUDA.

A drafter step of a few rows is launch-bound. These steps compute the drafter's layers the way backends/fast.py's
step does. FusedEagle3Step:

    x = cat([norm(embed(tokens)), norm(state)])               # one Triton kernel (kernels), else 4
    qkv = x @ [Wq; Wk; Wv].T                                  # one GEMM
    q, KV write = rope(q, k) from a cos/sin table, v          # one Triton kernel (kernels), else 2 + 2
    o = SDPA(q as [Hkv, B*G] rows, the unrepeated KV span)    # no repeat_interleave copies of the KV
    h = residual + o @ Wo'.T; out = h + down(silu(gate) * up) # residuals in the GEMMs (addmm), silu * up fused
    logits = lm_head(norm(out))

FusedEagle1Step: x = fc(cat([embed(tokens), state])) (one GEMM with fc's bias), then per layer the same block on
qkv = (layer 0: x, else norm(x)) @ [Wq; Wk; Wv].T, residuals accumulated in place into x (the caller's state is
only read), then logits = the target's lm_head(x) and the next state x.

The rope table holds Rotary.cos_sin's per-step values for every slot position, so the rope is bitwise the
module's. The attention uses backends/fast.py's grouped layout (o_proj's columns permuted once,
fast._grouped_o_weight). What differs from the drafter's forward: the residuals round once instead of twice and
the concatenated projections, permuted o_proj and grouped attention may accumulate in another order. Drafts are
only proposals checked by the target, so this can move which token is proposed at a near-tie, never what is
emitted; q is the one the sampler uses. The weights are copied (concatenated) at construction: build it after
loading, for inference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eaglespec.backends.fast import (
    _add_linear,
    _cat_bias,
    _grouped_mask,
    _grouped_o_weight,
    _grouped_output,
    _grouped_queries,
    _rms,
    _rope_table,
)
from eaglespec.draft.eagle1 import Eagle1Drafter
from eaglespec.draft.eagle3 import Eagle3Drafter
from eaglespec.draft.layers import MLP, Attention
from eaglespec.kernels import attention as A
from eaglespec.kernels import available, onednn
from eaglespec.kernels import step as K


def _cat_linear(*mods: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenated weights and biases (backends/fast._cat_bias) of linears that read the same input, detached."""
    bias = _cat_bias(*mods)
    return torch.cat([m.weight for m in mods]).detach(), None if bias is None else bias.detach()


def _detached(mod: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    return mod.weight.detach(), None if mod.bias is None else mod.bias.detach()


def _attention_reason(at: Attention) -> str | None:
    if at.rotary.rotary_dim != at.head_dim:
        return f"partial rotary ({at.rotary.rotary_dim} of {at.head_dim})"
    if at.head_dim % 2 or at.heads % at.kv_heads:
        return f"heads {at.heads} / kv heads {at.kv_heads} / head_dim {at.head_dim}"
    return None


def unfusable_reason(drafter: nn.Module) -> str | None:
    """Why neither FusedEagle3Step nor FusedEagle1Step can run `drafter` (None = one of them can)."""
    if isinstance(drafter, Eagle3Drafter):
        return _attention_reason(drafter.midlayer.self_attn)
    if isinstance(drafter, Eagle1Drafter):
        if not drafter._target_head:
            return "the EAGLE-1 drafter has no target lm_head (call set_target_head)"
        for layer in drafter.layers:
            reason = _attention_reason(layer.self_attn)
            if reason is not None:
                return reason
        return None
    return f"{type(drafter).__name__} is not an EAGLE-3 or EAGLE-1 drafter"


@dataclass
class _Block:
    """One decoder layer's attention and MLP weights, q/k/v and gate/up concatenated, o_proj's columns grouped."""

    hq: int
    hk: int
    d: int
    qkv_w: torch.Tensor  # [(Hq + 2 Hkv) D, in]
    qkv_b: torch.Tensor | None
    table: torch.Tensor  # [S, 2, 2, D/2]: the rope for every KV slot position
    o_w: torch.Tensor  # [H, Hq*D], columns in the grouped (r, j, d) order
    o_b: torch.Tensor | None
    post_norm: torch.Tensor  # [H]
    gate_up_w: torch.Tensor  # [2I, H]
    gate_up_b: torch.Tensor | None
    down_w: torch.Tensor  # [H, I]
    down_b: torch.Tensor | None

    @classmethod
    def of(cls, at: Attention, post_norm: nn.Module, mlp: MLP, max_positions: int) -> _Block:
        qkv_w, qkv_b = _cat_linear(at.q_proj, at.k_proj, at.v_proj)
        gate_up_w, gate_up_b = _cat_linear(mlp.gate_proj, mlp.up_proj)
        positions = torch.arange(max_positions, device=qkv_w.device)
        cos, sin = at.rotary.cos_sin(positions, qkv_w.dtype)  # [S, D]: Rotary's per-step values, for every slot
        return cls(hq=at.heads, hk=at.kv_heads, d=at.head_dim, qkv_w=qkv_w, qkv_b=qkv_b,
                   table=_rope_table(cos, sin).contiguous(),
                   o_w=_grouped_o_weight(at.o_proj.weight, at.kv_heads, at.head_dim),
                   o_b=None if at.o_proj.bias is None else at.o_proj.bias.detach(),
                   post_norm=post_norm.weight.detach(), gate_up_w=gate_up_w, gate_up_b=gate_up_b,
                   down_w=mlp.down_proj.weight.detach(),
                   down_b=None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach())


class _FusedStep:
    """What the fused steps share: the switches, the norms and one decoder layer's attention + MLP (`_layer`)."""

    def _setup(self, weight: torch.Tensor, eps: float, kernels: bool) -> None:
        """weight: any of the drafter's weights (device, dtype)."""
        self.eps = eps
        self._open = torch.zeros((), device=weight.device, dtype=weight.dtype)
        self._shut = torch.full((), torch.finfo(weight.dtype).min, device=weight.device, dtype=weight.dtype)
        self.kernels = kernels
        # kernels/attention.py with the kernels: the attention reads the [B, span] bool mask itself (_mask)
        self.attn = A if kernels else None
        if kernels and not available(weight.device):
            raise ValueError("kernels=True needs triton and a CUDA drafter (or TRITON_INTERPRET=1)")

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return K.rms_norm_weight(x, w, self.eps) if self.kernels else _rms(x, w, self.eps)

    def _norm_linear(self, x: torch.Tensor, norm_w: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
        """F.linear(norm(x), weight, bias)."""
        return onednn.linear(self._norm(x, norm_w), weight, bias, kernels=self.kernels)

    def _mask(self, visible: torch.Tensor, blk: _Block) -> torch.Tensor:
        """visible [B, span] bool -> the additive mask [1, 1, B*G, span] of the grouped query rows (visible itself
        for the attention kernel, which reads it by row)."""
        if self.attn is not None:
            return visible
        return _grouped_mask(visible, blk.hq // blk.hk, self._open, self._shut)

    def _layer(self, blk: _Block, qkv: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor, kv,
               mask: torch.Tensor, inplace: bool) -> torch.Tensor:
        """qkv [B, (Hq + 2 Hkv) D] (the layer's projected input), residual [B, H], positions [B], kv a StaticKV
        (consecutive slots), mask [1, 1, B*G, span] (_mask: the [B, span] bool visible with the attention kernel)
        -> the layer's output [B, H]. inplace: the attention's residual accumulates into `residual` (only for one
        nothing else holds; the MLP's always into the step's own h)."""
        b, hq, hk, d = qkv.shape[0], blk.hq, blk.hk, blk.d
        span = kv.span
        qk, v = qkv.view(b, hq + 2 * hk, d).split([hq + hk, hk], dim=1)
        rope = K.rope_qk_kv_write if self.kernels else K.rope_qk_kv_write_ref
        kc, vc = kv.k[0], kv.v[0]  # [Hkv, S, D]
        q = rope(qk, v, blk.table, positions, kv.slots[0], kc, vc)  # [B, G, Hkv, D]; k, v written at the slots
        # GQA over the unrepeated KV: head j*G + r of token t -> kv head j, query row t*G + r (as backends/fast.py)
        if self.attn is None:
            o = F.scaled_dot_product_attention(_grouped_queries(q), kc[None, :, :span], vc[None, :, :span],
                                               attn_mask=mask)  # [1, Hkv, B*G, D]
        else:  # mask: the [B, span] bool visible (_mask)
            o = self.attn.masked_attention(_grouped_queries(q), kc[None, :, :span], vc[None, :, :span], mask)
        o = _grouped_output(o, b)  # [B, Hq*D], columns (r, j, d)
        return self._output(blk, o, residual, inplace)

    def _output(self, blk: _Block, o: torch.Tensor, residual: torch.Tensor, inplace: bool) -> torch.Tensor:
        """The layer's output [N, H] from the attention's o [N, Hq*D] (columns (r, j, d)): o_proj onto the
        residual, then the MLP's residual (into the step's own h)."""
        h = _add_linear(residual, o, blk.o_w, blk.o_b, inplace=inplace, kernels=self.kernels)
        gate_up = self._norm_linear(h, blk.post_norm, blk.gate_up_w, blk.gate_up_b)  # [N, 2I]
        if self.kernels:
            act = K.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        return _add_linear(h, act, blk.down_w, blk.down_b, inplace=True, kernels=self.kernels)  # [N, H]


class FusedEagle3Step(_FusedStep):
    """Callable like Eagle3Drafter.forward(state, tokens, positions, cache, visible) for StaticKV caches whose
    `slots` are consecutive (both users: StaticDraftRunner.run and tree_graph.DeviceTreeRows) and `visible`
    a full [B, span] bool mask. Positions must be below `max_positions`."""

    def __init__(self, drafter: Eagle3Drafter, max_positions: int, kernels: bool = False):
        reason = unfusable_reason(drafter) if isinstance(drafter, Eagle3Drafter) else "not an EAGLE-3 drafter"
        if reason is not None:
            raise ValueError(f"cannot fuse this drafter's step: {reason}")
        layer = drafter.midlayer
        self.drafter = drafter
        self.norm_before_residual, self.norm_output = drafter.cfg.norm_before_residual, drafter.cfg.norm_output
        self.in_norm, self.hidden_norm = layer.input_layernorm.weight.detach(), layer.hidden_norm.weight.detach()
        self.final_norm = drafter.norm.weight.detach()
        self.block = _Block.of(layer.self_attn, layer.post_attention_layernorm, layer.mlp, max_positions)
        self.lm_w = drafter.lm_head.weight.detach()
        self._setup(self.block.qkv_w, layer.input_layernorm.eps, kernels)
        self.dtype = drafter.fc.weight.dtype  # the model dtype (drafter.embed casts the target's embedding to it)
        # eagle3_input's normalised halves are in state's dtype; the torch path's `w * rms(x)` promotes to the
        # weights' dtype: the one kernel only where they agree
        self._fusable_input = self.in_norm.dtype == self.hidden_norm.dtype == self.dtype

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
        blk = self.block
        x, residual = self._input(state, tokens)  # [B, 2H], [B, H]
        qkv = onednn.linear(x, blk.qkv_w, blk.qkv_b, kernels=self.kernels)  # [B, (Hq + 2 Hkv) D]
        # out of place: the residual may be the caller's state (or a view of x)
        out = self._layer(blk, qkv, residual, positions, cache[0], self._mask(visible, blk), inplace=False)
        normed = self._norm(out, self.final_norm)
        return onednn.linear(normed, self.lm_w, kernels=self.kernels), (normed if self.norm_output else out)


class FusedBatchEagle3Step(FusedEagle3Step):
    """FusedEagle3Step over B sequences at once, callable like Eagle3Drafter.forward with a leading batch dim (as
    draft/batch.py calls it): state [B, T, H], tokens and positions [B, T], cache [SlotKV] (per row buffers [B, Hkv,
    S, D], the rows' slots [B, T]), visible [B, T, S] bool, logit_rows [B] or None. The rope and KV write at each
    row's slots is one kernel (kernels.step.rope_qk_kv_write_rows), the attention reads each row's own mask
    (kernels.attention.masked_attention, up to the row's last slot). Positions must be below `max_positions`."""

    def __call__(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache: list,
                 visible: torch.Tensor, logit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits over the draft vocab [B, T, Vd], or [B, Vd] of row logit_rows[b] of each sequence; the next
        states [B, T, H])."""
        blk, (B, T, H) = self.block, state.shape
        kv = cache[0]
        x, residual = self._input(state.reshape(B * T, H), tokens.reshape(B * T))  # [B*T, 2H], [B*T, H]
        qkv = onednn.linear(x, blk.qkv_w, blk.qkv_b, kernels=self.kernels)  # [B*T, (Hq + 2 Hkv) D]
        qk, v = qkv.view(B * T, blk.hq + 2 * blk.hk, blk.d).split([blk.hq + blk.hk, blk.hk], dim=1)
        rope = K.rope_qk_kv_write_rows if self.kernels else K.rope_qk_kv_write_rows_ref
        q = rope(qk, v, blk.table, positions.reshape(B * T), kv.slots, kv.k, kv.v)  # [B, Hkv, T*G, D]
        attend = A.masked_attention if self.kernels else A.masked_attention_ref
        kv_len = kv.slots.amax(dim=1) + 1  # [B]: no row sees a slot past the last one written
        o = attend(q, kv.k, kv.v, visible, None, kv_len).transpose(1, 2)  # [B, T*G, Hkv, D]
        out = self._output(blk, o.reshape(B * T, blk.hq * blk.d), residual, inplace=False)  # [B*T, H]
        normed = self._norm(out, self.final_norm)
        head_in = normed.view(B, T, H)
        if logit_rows is not None:
            head_in = head_in[torch.arange(B, device=state.device), logit_rows]  # [B, H]
        logits = onednn.linear(head_in, self.lm_w, kernels=self.kernels)
        return logits, (normed if self.norm_output else out).view(B, T, H)


class FusedEagle1Step(_FusedStep):
    """Callable like Eagle1Drafter.forward(state, tokens, positions, cache, visible) (HASS drafters too) for one
    StaticKV per layer, their `slots` consecutive, and `visible` a full [B, span] bool mask. Positions must be
    below `max_positions`. The drafter must be wired to its target (set_target_head, an embedding)."""

    def __init__(self, drafter: Eagle1Drafter, max_positions: int, kernels: bool = False):
        reason = unfusable_reason(drafter) if isinstance(drafter, Eagle1Drafter) else "not an EAGLE-1 drafter"
        if reason is not None:
            raise ValueError(f"cannot fuse this drafter's step: {reason}")
        self.drafter = drafter
        self.fc_w, self.fc_b = _detached(drafter.fc)  # [H, 2H], [H]
        # layer 0 has no input norm (None): its qkv reads x itself
        self.in_norms = [None if layer.input_layernorm is None else layer.input_layernorm.weight.detach()
                         for layer in drafter.layers]
        self.blocks = [_Block.of(layer.self_attn, layer.post_attention_layernorm, layer.mlp, max_positions)
                       for layer in drafter.layers]
        self.lm_head = drafter._head()[1]  # the target's (a module: a bias or a tied weight as the drafter's)
        self._setup(self.fc_w, drafter.layers[0].post_attention_layernorm.eps, kernels)

    def __call__(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache: list,
                 visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """state [B, H], tokens [B] target ids, positions [B], cache [StaticKV per layer], visible [B, span] bool
        -> (logits over the target vocab [B, V], next state [B, H])."""
        x = torch.cat([self.drafter.embed(tokens), state], dim=-1)
        x = onednn.linear(x, self.fc_w, self.fc_b, kernels=self.kernels)  # [B, H]: ours
        mask = self._mask(visible, self.blocks[0])  # every layer has the same heads (one config): one mask per step
        for in_norm, blk, kv in zip(self.in_norms, self.blocks, cache):
            if in_norm is None:
                qkv = onednn.linear(x, blk.qkv_w, blk.qkv_b, kernels=self.kernels)  # [B, (Hq + 2 Hkv) D]
            else:
                qkv = self._norm_linear(x, in_norm, blk.qkv_w, blk.qkv_b)
            x = self._layer(blk, qkv, x, positions, kv, mask, inplace=True)  # x: the step's own, not the caller's
        lm_head = self.lm_head
        return onednn.apply(lm_head, x.to(lm_head.weight.dtype), kernels=self.kernels), x
