"""Layers shared by the drafters: RMSNorm, partial rope, attention with its own KV cache, MLP."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from eaglespec.kernels import eager_attention, onednn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Llama's rounding (fp32 statistics and product, one cast to x's dtype, then the weight), with the first
        part as F.rms_norm: one fused kernel on CUDA instead of six (bitwise equal on CPU, tests/test_fast_backend.py)."""
        return self.weight * F.rms_norm(x, (x.shape[-1],), eps=self.eps)


class Rotary(nn.Module):
    """Neox-style rope over the first `rotary_dim` dims of each head (the rest pass through).

    `scaling` is the config's rope_scaling / rope_parameters dict: rope_type "default", "linear"
    (positions / factor) or "llama3" (Llama-3.1's frequency-dependent rescaling), as transformers.
    """

    def __init__(self, rotary_dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        self.register_buffer("inv_freq", scaled_inv_freq(inv_freq, scaling or {}), persistent=False)
        self.rotary_dim = rotary_dim

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq  # [(B,) T, rot/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [(B,) T, rot]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [B, H, T, D]; cos/sin: [T, rot] or [B, 1, T, rot]."""
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        rot = rot * cos + self._rotate_half(rot) * sin
        return torch.cat([rot, rest], dim=-1) if rest.shape[-1] else rot


def scaled_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Apply rope scaling to the base inverse frequencies (types: default, linear, llama3)."""
    kind = scaling.get("rope_type", scaling.get("type", "default")) or "default"
    if kind == "default":
        return inv_freq
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_type {kind!r} is not supported (default, linear, llama3)")


class KVCache:
    """One layer's keys/values, [B, H_kv, S, D] (B = 1 at inference), grown by appending, cut by `crop`."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None:
            self.k, self.v = k, v
        else:
            self.k = torch.cat([self.k, k], dim=2)
            self.v = torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, n: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[:, :, :n], self.v[:, :, :n]


class StepVisible(NamedTuple):
    """A training-time-test step's visibility, factored (train/masks.step_visible's layout): the keys are a prefix
    block of M rows followed by one block of M per earlier step; the query of row r sees prefix[r] in the first
    block and row r alone in every later block (its own draft ancestors and itself). Attention then scores M + steps
    keys per query instead of (steps + 1) * M, and no [M, (steps + 1) M] mask is built."""

    prefix: torch.Tensor  # [(B,) M, M] bool
    steps: int  # the later blocks (the TTT / HASS step index)


def factored_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: StepVisible) -> torch.Tensor:
    """Softmax attention over StepVisible's keys, exactly: q [B, H, M, D]; k, v [B, Hkv, (steps + 1) M, D] (grouped
    queries: head h reads kv head h // (H / Hkv)) -> [B, H, M, D]."""
    b, h, m, d = q.shape
    hk, s = k.shape[1], visible.steps
    g = h // hk
    qg = q.view(b, hk, g, m, d) / math.sqrt(d)  # the scale on the small side
    prefix = visible.prefix if visible.prefix.dim() == 3 else visible.prefix[None]  # [B, M, M]
    scores = qg @ k[:, :, None, :m].transpose(-1, -2)  # [B, Hkv, G, M, M]: the prefix block
    scores.masked_fill_(~prefix[:, None, None], float("-inf"))  # in place: the matmul's backward needs no output
    kd, vd = k[:, :, m:].view(b, hk, s, m, d), v[:, :, m:].view(b, hk, s, m, d)  # the later blocks' rows
    own = torch.einsum("bjgmd,bjsmd->bjgms", qg, kd)  # [B, Hkv, G, M, s]: row r's own key in each later block
    probs = torch.softmax(torch.cat([scores, own], -1), -1)  # accumulates in fp32 (autocast: fp32 out)
    out = probs[..., :m] @ v[:, :, None, :m]  # [B, Hkv, G, M, D]
    out = out + torch.einsum("bjgms,bjsmd->bjgmd", probs[..., m:], vd)
    return out.reshape(b, h, m, d).to(q.dtype)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool visibility [.., T, S] -> float additive mask (0 visible, finfo.min hidden)."""
    zero = torch.zeros((), dtype=dtype, device=visible.device)
    return torch.where(visible, zero, torch.finfo(dtype).min)


def causal_visible(num_new: int, past: int, device: torch.device) -> torch.Tensor:
    """[T, past+T] bool: every new row sees the whole past and the new rows up to itself."""
    rows = torch.arange(num_new, device=device)[:, None]
    cols = torch.arange(past + num_new, device=device)[None, :]
    return cols <= rows + past


def gqa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                  scale: float | None = None) -> torch.Tensor:
    """SDPA of q [B, H, T, D] over k, v [B, Hkv, S, D] (H a multiple of Hkv: query head h reads KV head h // G)
    with the additive mask [B or 1, 1, T, S] -> [B, H, T, D], without copying the KV per query head: the G query
    heads of each KV head are folded into its query rows (row g * T + t: head kv * G + g, query t) and the mask
    repeated along them."""
    B, H, T, D = q.shape
    hkv = k.shape[1]
    if hkv == H:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    g = H // hkv
    rows = mask.expand(mask.shape[0], g, T, mask.shape[-1]).reshape(mask.shape[0], 1, g * T, mask.shape[-1])
    out = F.scaled_dot_product_attention(q.reshape(B, hkv, g * T, D), k, v, attn_mask=rows, scale=scale)
    return out.reshape(B, H, T, D)  # CUDA kernels may return strided rows: reshape, not view


class Attention(nn.Module):
    def __init__(self, in_dim: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                 rotary_dim: int, theta: float, bias: bool = False, rope_scaling: dict | None = None):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(in_dim, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(in_dim, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=bias)
        self.rotary = Rotary(rotary_dim, theta, rope_scaling)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                visible: torch.Tensor | StepVisible | None) -> torch.Tensor:
        """x: [T, in]; positions: [T]; visible: [T, S_past+T] bool (None = causal).

        Training may pass a leading batch dim (independent sequences): x [B, T, in], positions
        [B, T], visible [B, T, S]; the cache then holds [B, H_kv, S, D]. It may also pass a StepVisible
        (a training-time-test step's keys, attended to by factored_attention).
        """
        batched = x.dim() == 3
        b, t = (x.shape[0], x.shape[1]) if batched else (1, x.shape[0])
        q = onednn.apply(self.q_proj, x).view(b, t, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = onednn.apply(self.k_proj, x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = onednn.apply(self.v_proj, x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary.cos_sin(positions, q.dtype)
        if batched:
            cos, sin = cos[:, None], sin[:, None]  # [B, 1, T, rot]
        q, k = self.rotary.apply(q, cos, sin), self.rotary.apply(k, cos, sin)
        past = cache.length
        k_all, v_all = cache.append(k, v)  # [B, Hkv, S, D]
        if isinstance(visible, StepVisible):
            if visible.steps:
                out = factored_attention(q, k_all, v_all, visible).transpose(1, 2).reshape(b, t, -1)
                return onednn.apply(self.o_proj, out if batched else out[0])
            visible = visible.prefix
        if visible is None:
            visible = causal_visible(t, past, x.device)
        mask = additive_mask(visible, q.dtype)
        with eager_attention():  # the KV grows every call: no cuDNN plan per length
            out = gqa_attention(q, k_all, v_all, mask[:, None] if batched else mask[None, None])
        out = out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return onednn.apply(self.o_proj, out if batched else out[0])


class TargetEmbedding:
    """Token embedding for a drafter: its own `embed_tokens` when the checkpoint carries one, else the
    TARGET's embedding, held as a reference (not a submodule: never saved or trained)."""

    _target_embed: tuple[nn.Module, ...] = ()

    def set_target_embedding(self, embed: nn.Module) -> None:
        self._target_embed = (embed,)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is not None:
            return self.embed_tokens(tokens)
        if not self._target_embed:
            raise RuntimeError(f"{self.method} drafter has no embedding: call set_target_embedding(target embedding)")
        return self._target_embed[0](tokens).to(self.fc.weight.dtype)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn.apply(self.down_proj, F.silu(onednn.apply(self.gate_proj, x)) * onednn.apply(self.up_proj, x))
