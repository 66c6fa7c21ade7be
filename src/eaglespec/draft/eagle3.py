"""The EAGLE-3 drafter, op for op as vLLM's llama_eagle3.py and the published checkpoints.

    g = fc(cat(aux_a, aux_b, aux_c))                       # first step only; later steps reuse the state
    e = input_layernorm(embed(token))                      # the TARGET's embedding unless carried
    residual = g ; g = hidden_norm(g)                      # (swapped when norm_before_residual)
    h = residual + o_proj(attn(qkv(cat([e, g]))))          # embedding FIRST, q/k/v from 2*hidden
    out = h + mlp(post_attention_layernorm(h))
    logits = lm_head(norm(out))                            # over the draft vocabulary
    state = out (pre-norm; the normed output when norm_output)
"""

from __future__ import annotations

import torch
from torch import nn

from eaglespec.checkpoint.config import DraftConfig
from eaglespec.draft.layers import MLP, Attention, KVCache, RMSNorm, TargetEmbedding
from eaglespec.kernels import onednn


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        h = cfg.hidden_size
        self.norm_before_residual = cfg.norm_before_residual
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Attention(2 * h, h, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                   cfg.rotary_dim or cfg.head_dim, cfg.rope_theta, cfg.attention_bias,
                                   cfg.extra.get("rope_scaling"))
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size, cfg.mlp_bias)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: KVCache, visible: torch.Tensor | None) -> torch.Tensor:
        if self.norm_before_residual:
            hidden = self.hidden_norm(hidden)
            residual = hidden
        else:
            residual = hidden
            hidden = self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)  # [T, 2H], embedding first
        h = residual + self.self_attn(x, positions, cache, visible)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Drafter(TargetEmbedding, nn.Module):
    """One-layer EAGLE-3 draft model with its own KV cache (see module docstring)."""

    method = "eagle3"

    def __init__(self, cfg: DraftConfig, own_embedding: bool = False):
        super().__init__()
        if cfg.num_hidden_layers != 1:
            raise ValueError(f"EAGLE-3 drafters with {cfg.num_hidden_layers} layers are not supported (1 expected)")
        self.cfg = cfg
        n_aux, h = len(cfg.aux_layer_ids) or 3, cfg.hidden_size
        fc_in = n_aux * cfg.target_hidden_size
        self.input_norm = RMSNorm(fc_in, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.fc_norm = (nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(n_aux))
                        if cfg.fc_norm else None)
        self.fc = nn.Linear(fc_in, h, bias=False)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if own_embedding else None
        self.midlayer = Eagle3Layer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(cfg.vocab_size, dtype=torch.bool) if cfg.draft_vocab_size == cfg.vocab_size
                             else torch.zeros(cfg.vocab_size, dtype=torch.bool))

    # -- wiring ---------------------------------------------------------------------------------
    @property
    def feature_layer_ids(self) -> tuple[int, ...]:
        return self.cfg.aux_layer_ids

    def new_cache(self) -> list[KVCache]:
        return [KVCache()]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Contract 5: target_id = draft_id + d2t[draft_id], as one gather from target_id_table()."""
        return self.target_id_table()[draft_ids]

    def target_id_table(self) -> torch.Tensor:
        """[Vd] long: arange + d2t, every draft id's target id (made on first use, again whenever d2t is moved or
        written: a tree's draft rounds map ids once per depth)."""
        d2t = self.d2t
        key = (d2t.data_ptr(), 0 if d2t.is_inference() else d2t._version, d2t.device)  # (no version counter)
        if getattr(self, "_target_ids_key", None) != key:
            table = torch.arange(d2t.shape[0], device=d2t.device) + d2t  # [Vd]
            if d2t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                return table  # made inside a CUDA-graph capture it holds nothing until a replay: no cache
            self._target_ids, self._target_ids_key = table, key
        return self._target_ids

    # -- math -----------------------------------------------------------------------------------
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target aux features [T, n_aux * H_target] -> initial draft state g [T, H]."""
        features = features.to(self.fc.weight.dtype)
        if self.fc_norm is not None:
            parts = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(p) for norm, p in zip(self.fc_norm, parts)], dim=-1)
        if self.input_norm is not None:
            features = self.input_norm(features)
        return onednn.apply(self.fc, features)

    def forward(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                cache: list[KVCache], visible: torch.Tensor | None = None,
                logit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """state: [T, H] (projected features or a previous state); tokens: [T] target ids.

        Returns (logits over the draft vocab [T, Vd], next recurrent state [T, H]). With a leading batch dim and
        logit_rows [B] (one row of each sequence), the logits are those rows' only: [B, Vd].
        """
        out = self.midlayer(self.embed(tokens), state, positions, cache[0], visible)
        normed = self.norm(out)
        head_in = normed if logit_rows is None else normed[torch.arange(normed.shape[0], device=normed.device),
                                                            logit_rows]
        logits = onednn.apply(self.lm_head, head_in)
        return logits, (normed if self.cfg.norm_output else out)
