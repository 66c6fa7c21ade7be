"""Batched target backend over any transformers causal LM: B sequences of different lengths, each with its own
committed prefix, verified together in one forward (engine/batch.py runs the rounds).

KV slots per sequence: per layer k, v [Bcap, Hkv, S, D] (views of one [L, 2, Bcap, Hkv, S, D] tensor where the
layers' shapes agree), allocated once and grown by doubling; the live rows are the first B, and row b's committed
KV sits in its slots 0..n_b-1 (slot s holds position s). The model's attention layers write into them through
SlotCache.update, in place:

    forward(rows)   every row's tree (ragged: padded to the widest, W rows) written at slots n_b .. n_b + W - 1;
                    the mask [B, 1, W, S] shows row b's committed slots and its tree's ancestry; a padding row sees
                    itself only (a row that sees no key would give NaN states in the next layer)
    commit(keeps)   row b's kept rows (a root path, in depth order) move to slots n_b .. n_b + m_b - 1 (commit_prefixes:
                    a chain's accepted prefix, already in place)
    join / drop     a prefilled sequence's KV is copied into the next free row; a dropped row's place goes to a row
                    from the end (rows.compaction: one row copied per hole), the callers' rows following the order

A slot the mask hides adds exp(-inf) = 0 to the attention, so a row's output depends on its own KV and tree only.
Tree rows sit at positions committed + depth, as in HFTarget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from eaglespec.backends.hf import HFModel
from eaglespec.backends.hf_attention import grouped_attention
from eaglespec.draft.layers import additive_mask
from eaglespec.rows import compaction, grown, grown_bytes, move_rows
from eaglespec.tensors import to_device

MIN_SLOTS = 64  # the fewest slots the KV buffers hold once allocated


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


class SlotCache:
    """What a HF model's attention layers call `update` on: the live rows' keys and values [B, Hkv, S, D] per layer,
    this forward's rows written at `slots` [B, W], in place."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], slots: torch.Tensor):
        self.keys, self.values, self.slots = keys, values, slots

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        index = self.slots[:, None, :, None].expand_as(key_states)  # [B, Hkv, W, D]
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k.scatter_(2, index, key_states)
        v.scatter_(2, index, value_states)
        return k, v


class HFBatchTarget(HFModel):
    """Ragged batched verify / commit over a stock HF model (any causal LM taking a 4-D float mask)."""

    name = "hf-batch"

    def __init__(self, model: nn.Module, feature_layer_ids: tuple[int, ...] = (), graphs: bool | None = None):
        super().__init__(model, feature_layer_ids)
        # CUDA graphs of the verify forward, one per (batch bucket, rows, slots): on CUDA unless told otherwise; not
        # for sliding-window models (their mask is a per-layer-type dict)
        on_cuda = self.device.type == "cuda"
        self.use_graphs = (on_cuda if graphs is None else graphs and on_cuda) and self.window is None
        self._graphs: dict[tuple[int, int, int], _Graph] = {}
        self._pool = None
        self.reset()

    def reset(self) -> None:
        """No rows (the slot buffers are kept for the next ones)."""
        self.lengths: list[int] = []  # committed tokens per live row
        self._block = 0  # W: the pending block's width (0: nothing pending)
        if not hasattr(self, "keys"):
            self.keys: list[torch.Tensor] = []  # per layer [Bcap, Hkv, S, D]; allocated at the first join
            self.values: list[torch.Tensor] = []
            # every layer's k and v as one [L, 2, Bcap, Hkv, S, D] tensor (keys[i] = kv[i, 0], values[i] = kv[i, 1])
            # where the layers' KV shapes agree, so that a leave or a commit moves the rows of all of them at once
            self._kv: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def graphs(self) -> int:
        """Verify graphs captured and held (one per batch bucket, tree rows and span met)."""
        return sum(g.graph is not None for g in self._graphs.values())

    @property
    def slots(self) -> int:
        """S: the slots each row has."""
        return self.keys[0].shape[2] if self.keys else 0

    # -- joining and leaving --------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, state: Prefilled, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward a prompt chunk [n] causally after the `state.length` tokens already in `state`, and keep its KV
        there. Returns (the last row's logits [V], features [n, F])."""
        from transformers import DynamicCache

        dev, n, past = self.device, tokens.shape[0], state.length
        cache = DynamicCache()
        for i, (k, v) in enumerate(zip(state.keys, state.values)):
            cache.update(k, v, i)
        self.capture.clear()
        out = self.run_model(input_ids=tokens.to(dev)[None], position_ids=torch.arange(past, past + n, device=dev)[None],
                             use_cache=True, **{self._cache_kw: cache})
        state.keys = [layer.keys for layer in cache.layers]
        state.values = [layer.values for layer in cache.layers]
        state.length = past + n
        feats = self.capture.take()
        features = feats[0] if feats is not None else torch.empty(n, 0, device=dev, dtype=self.dtype)
        return out.logits[0, -1], features

    def join(self, state: Prefilled) -> int:
        """Copy a prefilled sequence's KV into the next row; returns its row index."""
        self._block = 0
        b, n = self.batch, state.length
        self._reserve(b + 1, n, state)
        for k, v, pk, pv in zip(self.keys, self.values, state.keys, state.values):
            k[b, :, :n] = pk[0]
            v[b, :, :n] = pv[0]
        self.lengths.append(n)
        return b

    def join_prompts(self, prompts: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Prefill whole prompts and join them as the next rows, in order: per prompt (the last row's logits [V],
        features [n, F])."""
        out = []
        for prompt in prompts:
            state = Prefilled()
            out.append(self.prefill(state, torch.tensor(list(prompt), device=self.device)))
            self.join(state)
        return out

    def drop(self, rows: Sequence[int]) -> list[int]:
        """Remove rows (their slots freed): rows.compaction's order, which the caller's rows follow; returns it."""
        self._block = 0
        order = compaction(self.batch, rows)
        move_rows(self._buffers(self.batch), order, dim=-4)  # [..., B, Hkv, S, D]
        self.lengths = [self.lengths[b] for b in order]
        return order

    # -- the round ------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, visible: torch.Tensor) -> BatchOutput:
        """Every row's tree rows on top of its committed KV: tokens [B, W], depths [B, W], visible [B, W, W] bool
        ancestry (tree.core.stack_flat: trees padded to W rows by rows that see themselves only). Returns logits
        and features [B, W, ...]; they stay pending until `commit`."""
        dev, (B, W) = self.device, tokens.shape
        self._reserve(B, max(self.lengths) + W)
        S = self.span(max(self.lengths) + W)
        length = to_device(self.lengths, dev)  # [B]
        self._block = W
        if self.use_graphs:
            return self._replay(tokens.to(dev), length, depths.to(dev), visible.to(dev), S)
        return self._verify(tokens.to(dev), length, depths.to(dev), visible.to(dev), S)

    def _verify(self, ids: torch.Tensor, length: torch.Tensor, block_depth: torch.Tensor, block_vis: torch.Tensor,
                S: int) -> BatchOutput:
        """The block ids [B, W] at depths [B, W] with ancestry [B, W, W] after each row's `length` [B] committed
        slots: its slots, positions and mask [B, 1, W, S] over the first S slots, then _run. Tensor ops only."""
        dev, (B, W) = ids.device, ids.shape
        slots = length[:, None] + torch.arange(W, device=dev)  # [B, W]: where the block's rows are written
        q_pos = length[:, None] + block_depth  # [B, W]
        seen = (torch.arange(S, device=dev) < length[:, None])[:, None, :].expand(B, W, S).clone()  # committed
        seen.scatter_(2, slots[:, None, :].expand(B, W, W), block_vis)  # [B, W, S]
        mask = additive_mask(seen, self.dtype)[:, None]  # [B, 1, W, S]: S = the slots the forward attends over
        if self.window is not None:  # sliding layers: a key must also lie within the window
            k_pos = torch.arange(S, device=dev).expand(B, S).clone().scatter_(1, slots, q_pos)  # [B, S]
            near = q_pos[:, :, None] - k_pos[:, None, :] < self.window
            windowed = additive_mask(seen & near, self.dtype)[:, None]
            mask = {"full_attention": mask, "sliding_attention": windowed} if self.mixed_layers else windowed
        return self._run(ids, q_pos, mask, slots)

    def _run(self, ids: torch.Tensor, q_pos: torch.Tensor, mask, slots: torch.Tensor) -> BatchOutput:
        """The model over ids [B, W] at positions q_pos, writing its KV at slots [B, W] of the first B rows."""
        B, W = ids.shape
        cache = SlotCache([k[:B] for k in self.keys], [v[:B] for v in self.values], slots)
        self.capture.clear()
        with grouped_attention(self.model):  # the KV read as it is, not copied per query head
            out = self.run_model(input_ids=ids, position_ids=q_pos, attention_mask=mask, use_cache=True,
                                 **{self._cache_kw: cache})
        feats = self.capture.take()
        features = feats if feats is not None else out.logits.new_zeros(B, W, 0)
        return BatchOutput(out.logits, features)

    def _replay(self, ids: torch.Tensor, length: torch.Tensor, depth: torch.Tensor, vis: torch.Tensor, S: int
                ) -> BatchOutput:
        """_verify as a CUDA graph of the batch padded to a power of two (padding rows: free rows of the buffers,
        with no committed slots, each row seeing itself only), captured on first use."""
        B, W = ids.shape
        Bp = 1 << (B - 1).bit_length()
        self._reserve(Bp, self.slots)
        key = (Bp, W, S)
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = _Graph(self, Bp, W, S)
        graph.ids[:B], graph.length[:B], graph.depth[:B], graph.vis[:B] = ids, length, depth, vis
        if Bp > B:
            graph.ids[B:], graph.length[B:], graph.depth[B:], graph.vis[B:] = 0, 0, 0, graph.pad_vis
        if graph.graph is None:
            graph.capture(self)
        graph.graph.replay()
        return BatchOutput(graph.out.logits[:B], graph.out.features[:B])

    @torch.no_grad()
    def commit(self, keeps: Sequence[torch.Tensor]) -> None:
        """Publish each row's kept pending rows keeps[b] ([m_b], a root path in depth order) after its committed
        prefix; drop the rest of the block."""
        dev, B = self.device, self.batch
        length = to_device(self.lengths, dev)[:, None]
        kept = pad_sequence([k.to(dev) for k in keeps], batch_first=True, padding_value=-1)  # [B, M]
        dst = length + torch.arange(kept.shape[1], device=dev)  # [B, M]
        src = torch.where(kept >= 0, length + kept, dst)  # a padding entry copies a slot onto itself
        for x in self._buffers(B):
            _move(x, src, dst)
        self.lengths = [n + k.shape[0] for n, k in zip(self.lengths, keeps)]
        self._block = 0

    def commit_prefixes(self, counts: Sequence[int]) -> None:
        """commit where row b keeps the first counts[b] rows of its block (a chain's accepted prefix): they already
        sit at slots n_b .. n_b + counts[b] - 1, so nothing moves."""
        self.lengths = [n + c for n, c in zip(self.lengths, counts)]
        self._block = 0

    # -- memory ---------------------------------------------------------------------------------
    staging_rows = 0  # rows of KV kept beside the batch's, with its slots

    def slot_bytes(self) -> int:
        """Bytes one slot of one row takes: every layer's key and value (from the model's config before the first
        join)."""
        if self.keys:
            return sum(x.shape[1] * x.shape[3] * x.element_size() for x in (*self.keys, *self.values))
        cfg = self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") else self.model.config
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return self.num_layers * 2 * kv * dim * self.dtype.itemsize

    def kv_bytes(self, rows: int, slots: int) -> int:
        """Bytes the KV buffers hold once they have room for `rows` rows of `slots` slots (_reserve's growth from
        the present capacity), counting the present buffers as well when they must grow (both are held while the
        rows are copied over)."""
        cap = (self.keys[0].shape[0], self.slots) if self.keys else (0, 0)
        return grown_bytes(cap, (rows, slots), MIN_SLOTS, self.slot_bytes(), self.staging_rows)

    # -- internals ------------------------------------------------------------------------------
    def span(self, n: int) -> int:
        """The slots a forward whose rows end below slot n attends over: all of them (the model's attention reads
        the whole cache that SlotCache.update returns)."""
        return self.slots

    def _reserve(self, rows: int, slots: int, like: Prefilled | None = None) -> None:
        """Room for `rows` rows of `slots` slots each: the buffers grow (doubling) and keep what they hold."""
        if not self.keys:
            if like is None:
                return
            self.keys = [k.new_zeros(1, k.shape[1], 0, k.shape[3]) for k in like.keys]
            self.values = [v.new_zeros(1, v.shape[1], 0, v.shape[3]) for v in like.values]
        cap_rows, cap_slots = self.keys[0].shape[0], self.slots
        if rows <= cap_rows and slots <= cap_slots:
            return
        new_rows, new_slots = grown(cap_rows, rows, 1), grown(cap_slots, slots, MIN_SLOTS)
        self._graphs.clear()  # captured against the old buffers
        self._pool = None  # a pool whose graphs are all freed cannot take a new capture
        live, old = self.batch, list(zip(self.keys, self.values))
        k0 = self.keys[0]
        if self._stackable():
            self._kv = k0.new_zeros(len(old), 2, new_rows, k0.shape[1], new_slots, k0.shape[3])
            self.keys = [self._kv[i, 0] for i in range(len(old))]
            self.values = [self._kv[i, 1] for i in range(len(old))]
        else:
            self._kv = None
            self.keys = [k.new_zeros(new_rows, k.shape[1], new_slots, k.shape[3]) for k, _ in old]
            self.values = [v.new_zeros(new_rows, v.shape[1], new_slots, v.shape[3]) for _, v in old]
        for (k, v), nk, nv in zip(old, self.keys, self.values):
            nk[:live, :, :cap_slots] = k[:live]
            nv[:live, :, :cap_slots] = v[:live]

    def _stackable(self) -> bool:
        """Whether every layer's k and v have one shape (Hkv, D) and dtype: then they are stored as one tensor."""
        return len({(x.shape[1], x.shape[3], x.dtype) for x in (*self.keys, *self.values)}) == 1

    def _buffers(self, rows: int) -> list[torch.Tensor]:
        """The first `rows` rows of the KV buffers, as few tensors as they are stored in ([L, 2, rows, Hkv, S, D], or
        each layer's k and v [rows, Hkv, S, D])."""
        if self._kv is not None:
            return [self._kv[:, :, :rows]]
        return [x[:rows] for x in (*self.keys, *self.values)]


def _move(x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """x [..., B, H, S, D]: slots src [B, M] copied to slots dst [B, M] of the same row (every src >= its dst)."""
    *lead, B, H, _, D = x.shape
    ones = [1] * len(lead)
    index = src.view(*ones, B, 1, -1, 1).expand(*lead, B, H, src.shape[1], D)
    rows = x.gather(-2, index)
    x.scatter_(-2, dst.view(*ones, B, 1, -1, 1).expand(*lead, B, H, dst.shape[1], D), rows)


class _Graph:
    """One captured HFBatchTarget._verify at (rows Bp, tree rows W, attended slots S): static inputs and outputs."""

    def __init__(self, target: HFBatchTarget, Bp: int, W: int, S: int):
        dev = target.device
        self.S = S
        self.ids = torch.zeros(Bp, W, dtype=torch.long, device=dev)
        self.length = torch.zeros(Bp, dtype=torch.long, device=dev)
        self.depth = torch.zeros(Bp, W, dtype=torch.long, device=dev)
        self.pad_vis = torch.eye(W, dtype=torch.bool, device=dev)  # [W, W]: a padding row sees itself
        self.vis = self.pad_vis.expand(Bp, W, W).clone()
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: BatchOutput | None = None

    def capture(self, target: HFBatchTarget) -> None:
        """Warm up on a side stream (library workspaces), then capture. Call with this step's inputs in place: the
        warm-up runs them for real (rewriting a slot gives the same values), padding rows write free rows."""
        if target._pool is None:
            target._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                target._verify(self.ids, self.length, self.depth, self.vis, self.S)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=target._pool):
            self.out = target._verify(self.ids, self.length, self.depth, self.vis, self.S)
