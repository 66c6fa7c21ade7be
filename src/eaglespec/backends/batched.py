"""Batched generation for data (regenerate, synth-prompts): many prompts at once over a static KV cache.

HF `generate` is slow at large batch: its DynamicCache concatenates every layer's keys and values each step, and
under a padding mask SDPA gets the kv heads repeated for every query head. Here, for Llama-family models
(fast.unsupported_reason):

    cache     per layer k, v [B, Hkv, S, D], S = prompt width + max_new_tokens, written in place
    prefill   left-padded prompts in row chunks; position ids as HF's (valid-token count - 1); a padding row
              attends to itself only (a row with no visible key would give NaN keys in the next layer)
    step      one token a row; attention over the slots written so far, the G query heads of a kv head as G query
              rows of that head (no repeated kv); the HF modules' own norms, projections, rope and MLP
    finished  rows that emitted a stop id leave the batch (the cache compacted) once a quarter of them has ended

Greedy output is token-for-token HF `generate`'s in fp32 (tests/test_batched.py); sampling draws from the same
processed distribution (sampling.process_logits), with its own random stream.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from eaglespec.backends.capture import decoder_layers
from eaglespec.backends.fast import unsupported_reason
from eaglespec.errors import EagleSpecError
from eaglespec.sampling import SamplingParams, process_logits, sample

DECODERS = ("hf", "static", "auto")  # regenerate's and synth-prompts' --decoder
PREFILL_ELEMENTS = 1 << 26  # mask elements (rows x query rows x keys) per prefill chunk
COMPACT_AT = 0.25  # share of the live rows that have finished before they leave the batch


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [B, P] long, valid [B, P] bool), right-aligned (left padding, as HF generate wants)."""
    width = max(len(t) for t in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    valid = torch.zeros(len(prompts), width, dtype=torch.bool)
    for i, t in enumerate(prompts):
        ids[i, width - len(t):] = torch.tensor(list(t), dtype=torch.long)
        valid[i, width - len(t):] = True
    return ids, valid


class BatchedDecoder:
    """Static-cache batched decoding over a HF Llama-family causal LM's own modules (weights shared, not copied)."""

    def __init__(self, model: nn.Module):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(reason)
        self.model = model
        self.decoder = model.get_decoder()
        self.layers = decoder_layers(model)
        self.lm_head = model.get_output_embeddings()
        attn = self.layers[0].self_attn
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.groups = cfg.num_attention_heads // self.kv_heads
        self.apply_rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb  # the model's own

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def _layer(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: list[torch.Tensor],
               slot: int, mask: torch.Tensor) -> torch.Tensor:
        """x [B, Q, H] at cache slots slot..slot+Q-1 -> the layer's output [B, Q, H]; writes k, v into the cache.
        mask [B, 1, G*Q or 1, slot+Q] bool (True = visible)."""
        layer = self.layers[i]
        attn = layer.self_attn
        b, q_len, _ = x.shape
        d, hkv, g = self.head_dim, self.kv_heads, self.groups
        h = layer.input_layernorm(x)
        q = attn.q_proj(h).view(b, q_len, hkv * g, d)
        k = attn.k_proj(h).view(b, q_len, hkv, d)
        v = attn.v_proj(h).view(b, q_len, hkv, d)
        if hasattr(attn, "q_norm"):  # Qwen3
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = self.apply_rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)  # [B, H, Q, D]
        k_cache, v_cache = cache[2 * i], cache[2 * i + 1]  # [B, Hkv, S, D]
        k_cache[:, :, slot:slot + q_len] = k
        v_cache[:, :, slot:slot + q_len] = v.transpose(1, 2)
        span = slot + q_len
        qg = q.reshape(b, hkv, g * q_len, d)  # query head j*G + r -> row r*Q + t of kv head j
        out = F.scaled_dot_product_attention(qg, k_cache[:, :, :span], v_cache[:, :, :span], attn_mask=mask,
                                             scale=attn.scaling)  # [B, Hkv, G*Q, D]
        out = out.view(b, hkv * g, q_len, d).transpose(1, 2).reshape(b, q_len, hkv * g * d)
        x = x + attn.o_proj(out)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cache: list[torch.Tensor], slot: int,
                 mask: torch.Tensor) -> torch.Tensor:
        """ids, positions [B, Q] -> the last position's logits [B, V] (float32)."""
        x = self.decoder.embed_tokens(ids)
        cos, sin = self.decoder.rotary_emb(x, positions)
        for i in range(len(self.layers)):
            x = self._layer(i, x, cos, sin, cache, slot, mask)
        return self.lm_head(self.decoder.norm(x[:, -1])).float()

    def _prefill(self, ids: torch.Tensor, valid: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        """Left-padded prompts ids, valid [B, P] -> the next-token logits [B, V]; fills cache slots 0..P-1."""
        b, p = ids.shape
        positions = (valid.long().cumsum(-1) - 1).masked_fill(~valid, 1)  # HF generate's position ids
        causal = torch.ones(p, p, dtype=torch.bool, device=ids.device).tril()
        eye = torch.eye(p, dtype=torch.bool, device=ids.device)
        rows = max(1, PREFILL_ELEMENTS // (self.groups * p * p))
        logits = []
        for r in range(0, b, rows):
            part = slice(r, r + rows)
            vis = (causal & valid[part, None, :]) | eye  # [b', P, P]: a padding row sees itself only
            mask = vis[:, None, None].expand(-1, 1, self.groups, p, p).reshape(-1, 1, self.groups * p, p)
            chunk = [c[part] for c in cache]  # views: the layers write into the batch's cache
            logits.append(self._forward(ids[part], positions[part], chunk, 0, mask))
        return torch.cat(logits)

    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, params: SamplingParams,
                 stop_ids: Sequence[int], pad_id: int, generator: torch.Generator | None = None) -> list[list[int]]:
        """Each prompt's new tokens, a stop id included where one ended it (as HF generate's rows up to padding)."""
        dev, dtype = self.device, self.lm_head.weight.dtype
        ids, valid = (t.to(dev) for t in left_pad(prompts, pad_id))
        b, p = ids.shape
        span = p + max_new_tokens
        cache = [torch.zeros(b, self.kv_heads, span, self.head_dim, dtype=dtype, device=dev)
                 for _ in range(2 * len(self.layers))]
        keys = torch.zeros(b, span, dtype=torch.bool, device=dev)  # visible cache slots per row
        keys[:, :p] = valid
        logits = self._prefill(ids, valid, cache)
        length = valid.sum(-1)  # [B] the next position of each row
        stops = torch.tensor(sorted(set(stop_ids)), dtype=torch.long, device=dev)
        rows = torch.arange(b, device=dev)  # original row of each live row
        out = torch.full((b, max_new_tokens), -1, dtype=torch.long, device=dev)
        ended = torch.zeros(b, dtype=torch.bool, device=dev)  # live rows that have emitted a stop id
        for t in range(max_new_tokens):
            nxt = logits.argmax(-1) if params.greedy else sample(process_logits(logits, params), generator)  # [B']
            out[rows, t] = nxt
            ended |= torch.isin(nxt, stops)
            if t == max_new_tokens - 1:
                break
            done = int(ended.sum())  # the one host sync of a step
            if done == len(rows):
                break
            if done >= COMPACT_AT * len(rows):
                live = (~ended).nonzero().squeeze(1)
                rows, nxt, length, keys, ended = rows[live], nxt[live], length[live], keys[live], ended[live]
                for i, c in enumerate(cache):  # one layer at a time: the old tensor is freed before the next copy
                    cache[i] = c.index_select(0, live)
            slot = p + t
            keys[:, slot] = True
            mask = keys[:, None, None, :slot + 1]  # [B', 1, 1, slot+1]: every query row of a kv head alike
            logits = self._forward(nxt[:, None], length[:, None], cache, slot, mask)
            length = length + 1
        stop_set, result = set(stop_ids), []
        for row in out.tolist():
            new = []
            for tok in row:
                if tok < 0:  # the row left the batch after its stop id
                    break
                new.append(tok)
                if tok in stop_set:
                    break
            result.append(new)
        return result


def check_decoder(choice: str) -> None:
    if choice not in DECODERS:
        raise EagleSpecError(f"--decoder {choice!r}: expected one of {', '.join(DECODERS)}")


def make_decoder(model: nn.Module, choice: str) -> BatchedDecoder | None:
    """--decoder: "hf" -> None (HF generate); "static" -> a BatchedDecoder, or one line saying why the model cannot
    have one; "auto" -> a BatchedDecoder where the model allows it, else None."""
    check_decoder(choice)
    if choice == "hf":
        return None
    reason = unsupported_reason(model)
    if reason is not None:
        if choice == "static":
            raise EagleSpecError(f"--decoder static: {reason}")
        return None
    return BatchedDecoder(model)
