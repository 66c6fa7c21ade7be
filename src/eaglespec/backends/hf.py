"""Generic target backend over any transformers causal LM (the reference and the fallback).

Tree rows are forwarded on top of a DynamicCache with positions committed + depth and a FLOAT
4-D additive mask [1, 1, T, past + T] (a bool 4-D mask is silently wrong under eager attention).
Aux features are captured by hooks on the decoder layers, so only the requested states are kept.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from eaglespec.backends.base import TargetOutput
from eaglespec.backends.capture import FeatureCapture, decoder_layers
from eaglespec.draft.layers import additive_mask
from eaglespec.kernels import eager_attention


def sliding_window_of(cfg) -> tuple[int | None, bool]:
    """(window, mixed): the sliding window of a config's sliding-attention layers, and whether full
    layers exist beside them (then the model takes a per-layer-type mask dict, as Gemma-3 and Qwen2)."""
    window = getattr(cfg, "sliding_window", None)
    if not window or getattr(cfg, "use_sliding_window", True) is False:
        return None, False
    types = getattr(cfg, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None, False
    return int(window), types is not None and "full_attention" in types


class HFModel:
    """A stock HF causal LM, frozen, with hooks that capture its aux features: what the HF backends share."""

    def __init__(self, model: nn.Module, feature_layer_ids: tuple[int, ...] = ()):
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.layers = decoder_layers(model)
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.num_layers = len(self.layers)
        self.hidden_size = cfg.hidden_size
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.capture = FeatureCapture(self.layers, feature_layer_ids)
        self.window, self.mixed_layers = sliding_window_of(cfg)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def embedding(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def feature_layer_ids(self) -> tuple[int, ...]:
        return self.capture.ids

    def set_feature_layers(self, ids: tuple[int, ...]) -> None:
        """Capture the states entering layers `ids` (contract 3, see backends/capture.py)."""
        self.capture.set(ids)

    def run_model(self, **inputs):
        """The model's forward, its attention under kernels.eager_attention: the KV length changes every call."""
        with eager_attention():
            return self.model(**inputs)


class HFTarget(HFModel):
    """Prefill / tree-verify / commit over a stock HF model with a DynamicCache."""

    name = "hf"

    def __init__(self, model: nn.Module, feature_layer_ids: tuple[int, ...] = ()):
        super().__init__(model, feature_layer_ids)
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        self.committed_len = 0
        self._pending = 0

    # -- the contract ---------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, depths: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> TargetOutput:
        self._drop_pending()
        t, past, dev = tokens.shape[0], self.committed_len, self.device
        if depths is None:
            depths = torch.arange(t, device=dev)
        if visible is None:
            visible = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        full = torch.cat([torch.ones(t, past, dtype=torch.bool, device=dev), visible.to(dev)], dim=1)  # [T, S]
        mask = additive_mask(full, self.dtype)[None, None]  # [1, 1, T, past + T]
        if self.window is not None:  # sliding layers: a key must also lie within the window
            q_pos = past + depths.to(dev)
            k_pos = torch.cat([torch.arange(past, device=dev), q_pos])
            windowed = additive_mask(full & (q_pos[:, None] - k_pos[None, :] < self.window), self.dtype)[None, None]
            mask = {"full_attention": mask, "sliding_attention": windowed} if self.mixed_layers else windowed
        self.capture.clear()
        out = self.run_model(input_ids=tokens.to(dev)[None], position_ids=(past + depths.to(dev))[None],
                             attention_mask=mask, use_cache=True, **{self._cache_kw: self.cache})
        self._pending = t
        feats = self.capture.take()  # [1, T, n*H] or None
        features = feats[0] if feats is not None else torch.empty(t, 0, device=dev, dtype=self.dtype)
        return TargetOutput(logits=out.logits[0], features=features)

    def _truncate(self, n: int) -> None:
        """Keep the first n cached rows of every layer (version-independent, unlike Cache.crop)."""
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[:, :, :n], layer.values[:, :, :n]

    def _drop_pending(self) -> None:
        if self._pending:
            self._truncate(self.committed_len)
            self._pending = 0

    @torch.no_grad()
    def commit(self, keep: torch.Tensor) -> None:
        base = self.committed_len
        keep = keep.to(self.device)
        m = keep.shape[0]
        if self._pending and m and not bool((keep == torch.arange(m, device=keep.device)).all()):
            idx = base + keep  # rows of the pending forward, gathered by their flattened-tree index
            for layer in self.cache.layers:
                layer.keys = torch.cat([layer.keys[:, :, :base], layer.keys[:, :, idx]], dim=2)
                layer.values = torch.cat([layer.values[:, :, :base], layer.values[:, :, idx]], dim=2)
        self.committed_len = base + m
        self._pending = 0
        self._truncate(self.committed_len)
