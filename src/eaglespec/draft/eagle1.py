"""The EAGLE-1 drafter, op for op as SafeAILab's EAGLE-1/2 `cnets.Model` and its checkpoints.

    f = target_norm(h_L)                                   # the feature: the target's last hidden state
                                                           # AFTER its final norm (SafeAILab `outputs[0]`)
    x = fc(cat([embed(token), f]))                         # fc: 2d -> d WITH bias; the embedding FIRST
    for each layer i:                                      # layers.0 has NO input_layernorm (identity);
        x = x + o_proj(attn(input_layernorm_i(x)))         # layers i >= 1 have one
        x = x + mlp(post_attention_layernorm(x))
    logits = target_lm_head(x)                             # the TARGET's lm_head, no norm in between
    state = x                                              # the predicted next feature, fed back as f

Inside eaglespec the target backend captures feature id L (the last layer's output, pre final
norm); `project` applies the target's final norm to it, which gives exactly the post-norm hidden
state SafeAILab trains on. A trainer must regress `state` onto target_norm(h_L) of the next row.
Checkpoint tensors: fc.weight, fc.bias, layers.{i}.self_attn.{q,k,v,o}_proj.weight,
layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.post_attention_layernorm.weight,
layers.{i>=1}.input_layernorm.weight and (SafeAILab writes it) embed_tokens.weight.
"""

from __future__ import annotations

import torch
from torch import nn

from eaglespec.checkpoint.config import DraftConfig
from eaglespec.draft.layers import MLP, Attention, KVCache, RMSNorm, TargetEmbedding
from eaglespec.kernels import onednn


class Eagle1Layer(nn.Module):
    """A Llama decoder layer whose input_layernorm is absent when index == 0."""

    def __init__(self, cfg: DraftConfig, index: int):
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps) if index != 0 else None
        self.self_attn = Attention(h, h, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
                                   cfg.rotary_dim or cfg.head_dim, cfg.rope_theta, cfg.attention_bias,
                                   cfg.extra.get("rope_scaling"))
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = MLP(h, cfg.intermediate_size, cfg.mlp_bias)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                visible: torch.Tensor | None) -> torch.Tensor:
        h = x if self.input_layernorm is None else self.input_layernorm(x)
        x = x + self.self_attn(h, positions, cache, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


def target_head(target) -> tuple[nn.Module, nn.Module]:
    """(final norm, lm_head) of a target backend over a HF causal LM (`target.model`)."""
    model = getattr(target, "model", target)
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for attr in ("norm", "final_layernorm", "ln_f"):
        norm = getattr(decoder, attr, None)
        if isinstance(norm, nn.Module):
            return norm, model.get_output_embeddings()
    raise TypeError(f"cannot find the final norm of {type(model).__name__}")


class Eagle1Drafter(TargetEmbedding, nn.Module):
    """EAGLE-1 draft model with its own KV cache; same interface as Eagle3Drafter."""

    method = "eagle1"

    def __init__(self, cfg: DraftConfig, own_embedding: bool = False):
        super().__init__()
        if cfg.hidden_size != cfg.target_hidden_size:
            raise ValueError(f"EAGLE-1 drafter hidden size {cfg.hidden_size} must equal the target's "
                             f"{cfg.target_hidden_size}")
        if cfg.draft_vocab_size != cfg.vocab_size:
            raise ValueError("EAGLE-1 drafters use the target's lm_head: draft_vocab_size must equal vocab_size")
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if own_embedding else None
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layers = nn.ModuleList(Eagle1Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        # references, not submodules (never saved or trained): the target's final norm and lm_head
        self._target_head: list[nn.Module] = []
        self._num_target_layers: int | None = None

    # -- wiring ---------------------------------------------------------------------------------
    def set_target_head(self, norm: nn.Module, lm_head: nn.Module, num_layers: int | None = None) -> None:
        """The target's final norm and lm_head (and layer count, for feature_layer_ids)."""
        self._target_head = [norm, lm_head]
        if num_layers is not None:
            self._num_target_layers = num_layers

    @property
    def feature_layer_ids(self) -> tuple[int, ...]:
        """(L,): the last layer's output (pre final norm; `project` applies the norm)."""
        if self.cfg.aux_layer_ids:
            return tuple(self.cfg.aux_layer_ids)
        if self._num_target_layers is None:
            raise RuntimeError("EAGLE-1 drafter: the target's layer count is unknown (call set_target_head)")
        return (self._num_target_layers,)

    def _head(self) -> tuple[nn.Module, nn.Module]:
        if not self._target_head:
            raise RuntimeError("EAGLE-1 drafter needs the target's final norm and lm_head: call set_target_head")
        return self._target_head[0], self._target_head[1]

    def new_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """EAGLE-1 drafts over the full target vocabulary: the identity."""
        return draft_ids

    def target_id_table(self) -> None:
        """No table: draft ids are target ids (tree_kernels take None as the identity)."""
        return None

    def export_state(self) -> dict[str, torch.Tensor]:
        """Tensors as SafeAILab writes them: embed_tokens.weight included (its loader is strict)."""
        state = dict(self.state_dict())
        if "embed_tokens.weight" not in state and self._target_embed:
            state["embed_tokens.weight"] = self._target_embed[0].weight.detach()
        return state

    # -- math -----------------------------------------------------------------------------------
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features h_L [T, H] (pre final norm) -> f = target_norm(h_L) [T, H]."""
        norm, _ = self._head()
        return norm(features).to(self.fc.weight.dtype)

    def forward(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                cache: list[KVCache], visible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """state: [T, H] (projected features or a previous output); tokens: [T] target ids.

        Returns (logits over the target vocab [T, V], predicted next feature [T, H]).
        """
        _, lm_head = self._head()
        x = onednn.apply(self.fc, torch.cat([self.embed(tokens), state], dim=-1))  # [T, 2H] -> [T, H], embedding first
        for layer, layer_cache in zip(self.layers, cache):
            x = layer(x, positions, layer_cache, visible)
        logits = onednn.apply(lm_head, x.to(lm_head.weight.dtype))
        return logits, x
