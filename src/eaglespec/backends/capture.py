"""Aux-feature capture by hooks on decoder layers (contract 3, docs/contracts.md; owned here).

Id j is the hidden state ENTERING decoder layer j (= HF hidden_states[j] for j < L); id L is the
last layer's output BEFORE the final norm (HF's hidden_states[L] is after it). Only the requested
states are kept: nothing else is materialised.
"""

from __future__ import annotations

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder layer list of a HF causal LM (model.model.layers for Llama-like models)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    for attr in ("layers", "h", "blocks"):
        layers = getattr(decoder, attr, None)
        if isinstance(layers, nn.ModuleList):
            return layers
    raise TypeError(f"cannot find the decoder layers of {type(model).__name__}")


class FeatureCapture:
    """Forward hooks that record the states entering layers `ids` during a model forward."""

    def __init__(self, layers: nn.ModuleList, ids: tuple[int, ...] = ()):
        self.layers = layers
        self.ids: tuple[int, ...] = ()
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks: list = []
        self.set(ids)

    def set(self, ids: tuple[int, ...]) -> None:
        """(Re)install hooks for `ids`; raises ValueError for an id outside 0..L."""
        n = len(self.layers)
        ids = tuple(int(j) for j in ids)
        for j in ids:
            if not 0 <= j <= n:
                raise ValueError(f"feature layer id {j} is out of range for a {n}-layer target (0..{n})")
        self.close()
        for j in sorted(set(ids)):
            if j < n:
                self._hooks.append(self.layers[j].register_forward_pre_hook(self._pre(j), with_kwargs=True))
            else:
                self._hooks.append(self.layers[n - 1].register_forward_hook(self._post(j)))
        self.ids = ids

    def _pre(self, j: int):
        def hook(_module, args, kwargs):
            self._captured[j] = args[0] if args else kwargs["hidden_states"]
        return hook

    def _post(self, j: int):
        def hook(_module, _args, output):
            self._captured[j] = output[0] if isinstance(output, tuple | list) else output
        return hook

    def clear(self) -> None:
        self._captured.clear()

    def take(self) -> torch.Tensor | None:
        """The captured states concatenated on the last dim ([..., len(ids) * H]), then forgotten."""
        if not self.ids:
            self._captured.clear()
            return None
        feats = torch.cat([self._captured[j] for j in self.ids], dim=-1)
        self._captured.clear()
        return feats

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
