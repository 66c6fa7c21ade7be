"""Batched target backend over any transformers causal LM: B sequences of different lengths, each with its own
committed prefix, verified together in one forward (engine/batch.py runs the rounds).

KV layout: per layer k, v [B, Hkv, L, D] with a physical length L shared by every row. Sequence b's committed KV
sits in the slots where valid[b] is True, at the positions pos[b]; the other slots are holes that the mask hides
(a hidden key adds exp(-inf) = 0, so a row's output depends on its own KV and tree rows only).

    forward(rows)   every row's tree (ragged: padded to the widest, W rows) as a block of W slots after L; a padding
                    row sees itself only (a row that sees no key would give NaN states in the next layer)
    commit(keeps)   each row's kept rows move to the front of its block, the block is cut after the longest keep:
                    a row that kept fewer leaves holes
    compact         once holes fill HOLES of the slots, each row's slots are gathered to the front, in order

A sequence joins through `prefill` (its prompt alone, in chunks, into a cache of its own) and `join` (that cache
becomes a new batch row); `drop` removes rows. Tree rows sit at positions committed + depth, as in HFTarget.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from eaglespec.backends.capture import FeatureCapture, decoder_layers
from eaglespec.backends.hf import sliding_window_of
from eaglespec.draft.layers import additive_mask

HOLES = 0.5  # share of hole slots at which the batch cache is compacted


@dataclass
class BatchOutput:
    logits: torch.Tensor  # [B, W, V]
    features: torch.Tensor  # [B, W, F]


@dataclass
class Prefilled:
    """A joining sequence's prompt KV (its own batch-1 cache), filled chunk by chunk."""

    keys: list[torch.Tensor] = field(default_factory=list)  # per layer [1, Hkv, n, D]
    values: list[torch.Tensor] = field(default_factory=list)
    length: int = 0


class HFBatchTarget:
    """Ragged batched verify / commit over a stock HF model (any causal LM taking a 4-D float mask)."""

    name = "hf-batch"

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
        self.reset()

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
        self.capture.set(ids)

    def reset(self) -> None:
        """No rows."""
        dev = self.device
        self.keys: list[torch.Tensor] = []  # per layer [B, Hkv, L, D]; empty until the first join
        self.values: list[torch.Tensor] = []
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=dev)  # [B, L]
        self.pos = torch.zeros(0, 0, dtype=torch.long, device=dev)  # [B, L]: each slot's position
        self.lengths: list[int] = []  # committed tokens per row
        self._block = 0  # W: the pending block's width (0: nothing pending)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    # -- joining and leaving --------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, state: Prefilled, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward a prompt chunk [n] causally after the `state.length` tokens already in `state`, and keep its KV
        there. Returns (logits [n, V], features [n, F])."""
        from transformers import DynamicCache

        dev, n, past = self.device, tokens.shape[0], state.length
        cache = DynamicCache()
        for i, (k, v) in enumerate(zip(state.keys, state.values)):
            cache.update(k, v, i)
        self.capture.clear()
        out = self.model(input_ids=tokens.to(dev)[None], position_ids=torch.arange(past, past + n, device=dev)[None],
                         use_cache=True, **{self._cache_kw: cache})
        state.keys = [layer.keys for layer in cache.layers]
        state.values = [layer.values for layer in cache.layers]
        state.length = past + n
        feats = self.capture.take()
        features = feats[0] if feats is not None else torch.empty(n, 0, device=dev, dtype=self.dtype)
        return out.logits[0], features

    def join(self, state: Prefilled) -> int:
        """Add a prefilled sequence as the last row; returns its row index."""
        self._drop_block()
        n, dev = state.length, self.device
        width = max(self.valid.shape[1], n)
        if not self.keys:
            self.keys = [k.new_zeros(0, *k.shape[1:2], width, k.shape[-1]) for k in state.keys]
            self.values = [v.new_zeros(0, *v.shape[1:2], width, v.shape[-1]) for v in state.values]
        self.keys = [torch.cat([_pad(a, width), _pad(b, width)]) for a, b in zip(self.keys, state.keys)]
        self.values = [torch.cat([_pad(a, width), _pad(b, width)]) for a, b in zip(self.values, state.values)]
        row_valid = torch.zeros(1, width, dtype=torch.bool, device=dev)
        row_valid[0, :n] = True
        row_pos = torch.zeros(1, width, dtype=torch.long, device=dev)
        row_pos[0, :n] = torch.arange(n, device=dev)
        self.valid = torch.cat([_pad(self.valid, width, dim=1), row_valid])
        self.pos = torch.cat([_pad(self.pos, width, dim=1), row_pos])
        self.lengths.append(n)
        return self.batch - 1

    def drop(self, rows: Sequence[int]) -> None:
        """Remove batch rows (their KV freed); the rows after them move up, in order."""
        self._drop_block()
        gone = set(rows)
        keep = [b for b in range(self.batch) if b not in gone]
        idx = torch.tensor(keep, dtype=torch.long, device=self.device)
        self.keys = [k.index_select(0, idx) for k in self.keys]
        self.values = [v.index_select(0, idx) for v in self.values]
        self.valid, self.pos = self.valid[idx], self.pos[idx]
        self.lengths = [self.lengths[b] for b in keep]
        self._trim()

    # -- the round ------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, tokens: Sequence[torch.Tensor], depths: Sequence[torch.Tensor],
                visible: Sequence[torch.Tensor]) -> BatchOutput:
        """Every row's tree rows on top of its committed KV: tokens[b] [T_b], depths[b] [T_b], visible[b] [T_b, T_b]
        bool ancestry. Returns logits and features [B, W, ...] (row b's first T_b are its tree's); they stay
        pending until `commit`."""
        from transformers import DynamicCache

        self._drop_block()
        dev, B, L = self.device, self.batch, self.valid.shape[1]
        W = max(t.shape[0] for t in tokens)
        ids = torch.zeros(B, W, dtype=torch.long, device=dev)
        block_pos = torch.tensor(self.lengths, device=dev)[:, None].expand(B, W).clone()  # padding rows: committed
        block_vis = torch.eye(W, dtype=torch.bool, device=dev).repeat(B, 1, 1)  # [B, W, W]: padding sees itself
        for b, (tok, dep, vis) in enumerate(zip(tokens, depths, visible)):
            t = tok.shape[0]
            ids[b, :t] = tok.to(dev)
            block_pos[b, :t] += dep.to(dev)
            block_vis[b, :t, :t] = vis.to(dev)
        past_vis = self.valid[:, None, :].expand(B, W, L)  # [B, W, L]
        full = torch.cat([past_vis, block_vis], dim=2)  # [B, W, L + W]
        mask = additive_mask(full, self.dtype)[:, None]  # [B, 1, W, L + W]
        if self.window is not None:  # sliding layers: a key must also lie within the window
            k_pos = torch.cat([self.pos, block_pos], dim=1)  # [B, L + W]
            near = block_pos[:, :, None] - k_pos[:, None, :] < self.window
            windowed = additive_mask(full & near, self.dtype)[:, None]
            mask = {"full_attention": mask, "sliding_attention": windowed} if self.mixed_layers else windowed
        cache = DynamicCache()
        for i, (k, v) in enumerate(zip(self.keys, self.values)):
            cache.update(k, v, i)
        self.capture.clear()
        out = self.model(input_ids=ids, position_ids=block_pos, attention_mask=mask, use_cache=True,
                         **{self._cache_kw: cache})
        self.keys = [layer.keys for layer in cache.layers]
        self.values = [layer.values for layer in cache.layers]
        self._block = W
        feats = self.capture.take()
        features = feats if feats is not None else torch.empty(B, W, 0, device=dev, dtype=self.dtype)
        return BatchOutput(out.logits, features)

    @torch.no_grad()
    def commit(self, keeps: Sequence[torch.Tensor]) -> None:
        """Publish each row's kept pending rows keeps[b] ([m_b], a root path in depth order) after its committed
        prefix; drop the rest of the block."""
        dev, B, L = self.device, self.batch, self.valid.shape[1]
        M = max(k.shape[0] for k in keeps)
        idx = torch.zeros(B, M, dtype=torch.long, device=dev)
        kept = torch.zeros(B, M, dtype=torch.bool, device=dev)
        for b, keep in enumerate(keeps):
            idx[b, : keep.shape[0]] = keep.to(dev)
            kept[b, : keep.shape[0]] = True
        self.keys = [_gather_block(k, L, idx) for k in self.keys]
        self.values = [_gather_block(v, L, idx) for v in self.values]
        base = torch.tensor(self.lengths, device=dev)[:, None]
        self.valid = torch.cat([self.valid, kept], dim=1)
        self.pos = torch.cat([self.pos, base + torch.arange(M, device=dev)], dim=1)
        self.lengths = [n + k.shape[0] for n, k in zip(self.lengths, keeps)]
        self._block = 0
        if self.valid.numel() and 1 - self.valid.float().mean().item() >= HOLES:
            self.compact()

    def compact(self) -> None:
        """Gather each row's committed slots to the front, in order: L becomes the longest row's length."""
        self._drop_block()
        n = max(self.lengths, default=0)
        order = torch.argsort((~self.valid).to(torch.int8), dim=1, stable=True)[:, :n]  # [B, n]
        self.keys = [_gather_slots(k, order) for k in self.keys]
        self.values = [_gather_slots(v, order) for v in self.values]
        self.valid = self.valid.gather(1, order)
        self.pos = self.pos.gather(1, order)

    # -- internals ------------------------------------------------------------------------------
    def _drop_block(self) -> None:
        """Forget an uncommitted block (the next forward replaces it)."""
        if self._block:
            L = self.valid.shape[1]
            self.keys = [k[:, :, :L] for k in self.keys]
            self.values = [v[:, :, :L] for v in self.values]
            self._block = 0

    def _trim(self) -> None:
        """Cut trailing slots no row uses."""
        used = self.valid.any(dim=0).nonzero()
        L = int(used[-1]) + 1 if used.numel() else 0
        if self.valid.shape[1] > L:
            self.keys = [k[:, :, :L] for k in self.keys]
            self.values = [v[:, :, :L] for v in self.values]
            self.valid, self.pos = self.valid[:, :L], self.pos[:, :L]


def _pad(x: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    """x zero-padded (False for bool) at the end of `dim` to `width`."""
    extra = width - x.shape[dim]
    if extra <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _gather_block(x: torch.Tensor, L: int, idx: torch.Tensor) -> torch.Tensor:
    """x [B, H, L + W, D]: the committed slots, then the block's rows idx [B, M] per batch row."""
    B, H, _, D = x.shape
    rows = x[:, :, L:].gather(2, idx[:, None, :, None].expand(B, H, idx.shape[1], D))
    return torch.cat([x[:, :, :L], rows], dim=2)


def _gather_slots(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """x [B, H, L, D] -> [B, H, n, D]: slots order [B, n] per batch row."""
    B, H, _, D = x.shape
    return x.gather(2, order[:, None, :, None].expand(B, H, order.shape[1], D))
