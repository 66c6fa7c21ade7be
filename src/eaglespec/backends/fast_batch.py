"""Batched target backend for Llama-family models: HFBatchTarget's slots, rows and graphs, with FastTarget's layers.

The rows, KV slots, join / drop, commit and CUDA graphs are HFBatchTarget's (backends/hf_batch.py); the verify
forward and the prefill differ. Instead of the HF modules (some forty small kernels a layer at batch 1) they run the
fused weights of backends/fast.py (q/k/v and gate/up concatenated, o_proj's columns in the grouped head order) over all
B * W rows at once:

    norm, qkv     one GEMM over the [B * W, H] rows (Triton RMSNorm and skinny GEMMs where they apply)
    rope          the model's rotary table at each row's position, q and k at once
    KV write      k, v scattered into each row's slots of the [Bcap, Hkv, S, D] buffers (with the kernels, rope and
                  the KV write are one Triton kernel, kernels.step's rope_qk_kv_write_rows)
    attention     the G query heads of each KV head as G * W query rows of that head, over the first `span` slots
                  only (the longest row's slots rounded up to SPAN_STEP): with the kernels, kernels.attention's
                  masked_attention over every sequence at once (split over the slots, each row's stopping at its
                  last slot); else SDPA with the mask [B, 1, G * W, span]
    o, MLP        residuals accumulated in place; silu * up in one Triton kernel where it applies

A prefill chunk is the same pass over one sequence of n rows (eager), causal over the chunk, attending to its own
growing KV, with the logits of its last row only; join_prompts prefills whole prompts as new rows, all in one pass,
or, for a few prompts on CUDA, each through a staging row in chunks of JOIN_CHUNK tokens replayed as one CUDA graph
per span (join_chunked: an eager pass launches a few hundred kernels), its KV then copied into its row.
Features are the states entering the requested layers (contract 3), taken in the pass. Models the fast backend
cannot run (fast.unsupported_reason), and sliding-window models, keep HFBatchTarget.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from eaglespec.backends.fast import (
    SPAN_STEP,
    _add_linear,
    _is_silu,
    _rms,
    _rope,
    _text_config,
    capture_graph,
    fuse_layer,
    rope_table_for,
    round_span,
    unsupported_reason,
    weight_packers,
)
from eaglespec.backends.hf import sliding_window_of
from eaglespec.backends.hf_batch import BatchOutput, HFBatchTarget, Prefilled
from eaglespec.draft.layers import additive_mask
from eaglespec.errors import EagleSpecError
from eaglespec.kernels import attention, available, eager_attention, onednn
from eaglespec.tensors import to_device_all

JOIN_CHUNK = 128  # prompt tokens per graphed prefill replay of a joining prompt (join_chunked)
GRAPHED_JOINS = 4  # at most this many prompts joining together go through join_chunked; more in one eager pass


def batch_unsupported_reason(model: nn.Module) -> str | None:
    """Why FastBatchTarget cannot run `model` (None = it can)."""
    reason = unsupported_reason(model)
    if reason is None and sliding_window_of(_text_config(model))[0] is not None:
        reason = "the model has sliding-window attention layers"
    return reason


class FastBatchTarget(HFBatchTarget):
    """HFBatchTarget whose verify forward runs the fused layers (see the module docstring)."""

    name = "fast-batch"
    staging_rows = 1  # join_chunked's staging row

    def __init__(self, model: nn.Module, feature_layer_ids: tuple[int, ...] = (), graphs: bool | None = None,
                 kernels: bool = False, span_step: int = SPAN_STEP):
        reason = batch_unsupported_reason(model)
        if reason is not None:
            raise EagleSpecError(f"the fast batched backend cannot run this target: {reason} (use backend='hf')")
        super().__init__(model, feature_layer_ids, graphs)
        if kernels and not available(self.device):
            raise EagleSpecError("kernels=True needs triton and the target on CUDA (or TRITON_INTERPRET=1)")
        cfg = _text_config(model)
        attn = self.layers[0].self_attn
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.scaling = getattr(attn, "scaling", self.head_dim ** -0.5)
        self.eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        self.span_step = span_step
        inner = model.model
        self.embed_w, self.final_norm = inner.embed_tokens.weight, inner.norm.weight
        self._rotary = inner.rotary_emb
        head = model.get_output_embeddings()
        pack, pack_copy = weight_packers(model)
        self.lm_w, self.lm_b = pack_copy(head.weight), getattr(head, "bias", None)
        self.fused = [fuse_layer(layer, self.n_heads, self.n_kv, self.head_dim, pack, pack_copy)
                      for layer in self.layers]
        self._kernels = None
        if kernels:
            from eaglespec.kernels import step

            self._kernels = step
        self.rope_table = self.embed_w.new_empty(0, 2, 2, self.head_dim // 2)  # [S, 2, 2, D/2], grown with the slots
        self._stage_k: list[torch.Tensor] = []  # per layer [1, Hkv, S, D]: a joining prompt's KV (join_chunked)
        self._stage_v: list[torch.Tensor] = []
        self._join_graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, tuple, tuple]] = {}
        self._join_pool = None

    @property
    def graphs(self) -> int:
        """Verify graphs and join_chunked's prefill graphs captured and held."""
        return super().graphs + len(self._join_graphs)

    def span(self, n: int) -> int:
        """The slots a forward whose rows end below slot n attends over: n rounded up to span_step, within the
        buffers."""
        return round_span(n, self.span_step, self.slots)

    def _run(self, ids: torch.Tensor, q_pos: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor) -> BatchOutput:
        """The fused layers over ids [B, W] at positions q_pos [B, W], mask [B, 1, W, span] additive, writing the
        KV at slots [B, W] of the first B rows."""
        B = ids.shape[0]
        with eager_attention():  # a new span or batch is a new shape: no cuDNN attention plan per shape
            return self._layers(ids, q_pos, mask, slots, [k[:B] for k in self.keys], [v[:B] for v in self.values])

    @torch.no_grad()
    def prefill(self, state: Prefilled, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """HFBatchTarget.prefill through the fused layers: the chunk [n] attends causally over the state's KV and
        itself, and its KV extends the state's (per layer [1, Hkv, past + n, D]). Returns (the last row's logits
        [V], features [n, F])."""
        dev, n, past = self.device, tokens.shape[0], state.length
        total = past + n
        keys, values = [], []
        for i in range(self.num_layers):
            for held, grown in ((state.keys, keys), (state.values, values)):
                x = self.embed_w.new_empty(1, self.n_kv, total, self.head_dim)
                if past:
                    x[:, :, :past] = held[i]
                grown.append(x)
        slots = torch.arange(past, total, device=dev)[None]  # [1, n]
        seen = torch.ones(n, total, dtype=torch.bool, device=dev).tril(past)[None]  # [1, n, total]: causal
        with eager_attention():
            out = self._layers(tokens.to(dev)[None], slots, additive_mask(seen, self.dtype)[:, None], slots, keys,
                               values, last=torch.tensor([n - 1], device=dev))
        state.keys, state.values, state.length = keys, values, total
        return out.logits[0, -1], out.features[0]

    @torch.no_grad()
    def join_prompts(self, prompts: Sequence[Sequence[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """HFBatchTarget.join_prompts in one pass of the fused layers: the prompts as new rows [N, W] (padded to the
        longest, W), each causal over its own slots 0..W-1 (a padding row only sees slots of the same forward)."""
        if self.use_graphs and len(prompts) <= GRAPHED_JOINS:
            return [self.join_chunked(p) for p in prompts]
        dev, b0, lengths = self.device, self.batch, [len(p) for p in prompts]
        n, width = len(prompts), max(lengths)
        self._block = 0
        self._room(b0 + n, width)
        ids = torch.zeros(n, width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.as_tensor(p)
        pos = torch.arange(width, device=dev).expand(n, width)  # [N, W]: positions = slots
        seen = torch.ones(width, width, dtype=torch.bool, device=dev).tril().expand(n, width, width)
        with eager_attention():
            out = self._layers(ids.to(dev), pos, additive_mask(seen, self.dtype)[:, None], pos,
                               [k[b0: b0 + n] for k in self.keys], [v[b0: b0 + n] for v in self.values],
                               last=torch.tensor(lengths, device=dev) - 1)
        self.lengths += lengths
        return [(out.logits[i, 0], out.features[i, : m]) for i, m in enumerate(lengths)]

    @torch.no_grad()
    def join_chunked(self, prompt: Sequence[int], chunk: int = JOIN_CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill one prompt and join it as the next row: chunks of `chunk` tokens (the last padded) through a
        staging row, each causal over the prompt's slots so far (_stage_pass; on CUDA one graph per chunk span),
        then the prompt's KV copied into its row. Returns (the last row's logits [V], features [n, F])."""
        n, b = len(prompt), self.batch
        self._block = 0
        self._room(b + 1, -(-n // chunk) * chunk)  # the padded last chunk's slots too
        self._staging()
        feats = []
        for start in range(0, n, chunk):
            part = list(prompt[start: start + chunk])
            logits, features = self._stage_chunk(part, start, chunk)
            feats.append(features[0, : len(part)].clone())  # the outputs are rewritten by the next chunk
        for k, v, sk, sv in zip(self.keys, self.values, self._stage_k, self._stage_v):
            k[b, :, :n] = sk[0, :, :n]
            v[b, :, :n] = sv[0, :, :n]
        self.lengths.append(n)
        return logits[0, 0].clone(), torch.cat(feats)

    def _room(self, rows: int, slots: int) -> None:
        """_reserve for joining prompts: the layers' KV shape is the model's, so no prefilled state is needed."""
        none = [self.embed_w.new_empty(1, self.n_kv, 0, self.head_dim)] * self.num_layers
        self._reserve(rows, slots, Prefilled(none, none))

    def _staging(self) -> None:
        """The staging row's buffers with the batch buffers' slots (their prefill graphs dropped when they change)."""
        if self._stage_k and self._stage_k[0].shape[2] == self.slots:
            return
        self._join_graphs.clear()
        self._join_pool = None
        self._stage_k = [k.new_zeros(1, *k.shape[1:]) for k in self.keys]
        self._stage_v = [v.new_zeros(1, *v.shape[1:]) for v in self.values]

    def _stage_chunk(self, part: list[int], start: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk of a joining prompt (part, at positions start..) through the staging row: (logits [1, 1, V] of
        its last token, features [1, chunk, F]), replayed from its graph on CUDA."""
        ids, past, last = to_device_all(self.device, [part + [0] * (chunk - len(part))], [start], [len(part) - 1])
        span = round_span(start + chunk, self.span_step, self.slots)
        if not self.use_graphs:
            return self._stage_pass(ids, past, last, span)
        key = (chunk, span)
        if key not in self._join_graphs:
            if self._join_pool is None:
                self._join_pool = torch.cuda.graph_pool_handle()
            inputs = (ids.clone(), past.clone(), last.clone())  # the warm-up runs them: it writes this chunk's slots
            graph, out = capture_graph(lambda: self._stage_pass(*inputs, span), self.device, self._join_pool)
            self._join_graphs[key] = (graph, inputs, out)
        graph, inputs, out = self._join_graphs[key]
        for static, x in zip(inputs, (ids, past, last)):
            static.copy_(x)
        graph.replay()
        return out

    def _stage_pass(self, ids: torch.Tensor, past: torch.Tensor, last: torch.Tensor, span: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [1, C] at positions (= staging slots) past..past+C-1, each seeing the slots up to its own: the fused
        layers over the staging row's first `span` slots. Tensor ops only."""
        pos = past[:, None] + torch.arange(ids.shape[1], device=ids.device)  # [1, C]
        seen = torch.arange(span, device=ids.device) < pos[..., None] + 1  # [1, C, span]
        with eager_attention():
            out = self._layers(ids, pos, additive_mask(seen, self.dtype)[:, None], pos, self._stage_k, self._stage_v,
                               last=last)
        return out.logits, out.features

    def _layers(self, ids: torch.Tensor, q_pos: torch.Tensor, mask: torch.Tensor, slots: torch.Tensor,
                keys: list[torch.Tensor], values: list[torch.Tensor], last: torch.Tensor | None = None
                ) -> BatchOutput:
        """_run's pass (module docstring) over the caches keys / values (per layer [B, Hkv, >= span, D]);
        last [B]: the logits of row last[b] of each sequence only ([B, 1, V])."""
        B, W = ids.shape
        span = mask.shape[-1]
        hq, hk, d = self.n_heads, self.n_kv, self.head_dim
        g = hq // hk
        if self.rope_table.shape[0] < max(self.slots, span):  # every position is below the span
            self.rope_table = rope_table_for(self._rotary, max(self.slots, span), d, self.dtype, self.device)
        fused = self._kernels
        norm = _rms if fused is None else fused.rms_norm_weight
        use_triton = fused is not None
        if fused is None:
            grouped_mask = mask.expand(B, g, W, span).reshape(B, 1, g * W, span)  # row r * W + w: query row w
            rope = self.rope_table[q_pos.reshape(-1)][:, None]  # [B*W, 1, 2, 2, D/2]: broadcast over the heads
            index = slots[:, None, :, None].expand(B, hk, W, d)  # [B, Hkv, W, D]: each row's KV slots
        else:
            allowed = mask[:, 0] == 0  # [B, W, span] bool: the additive mask's open slots
            kv_len = slots[:, -1] + 1  # [B]: no row reads a slot past its block
            positions = q_pos.reshape(-1)  # [B*W]

        h = F.embedding(ids.reshape(-1), self.embed_w)  # [B*W, H]
        wanted = set(self.feature_layer_ids)
        feats: dict[int, torch.Tensor] = {}
        for i, w in enumerate(self.fused):
            if i in wanted:
                feats[i] = h
            qkv = onednn.linear(norm(h, w.in_norm, self.eps), w.qkv_w, w.qkv_b, kernels=use_triton)
            qk, v = qkv.view(B * W, hq + 2 * hk, d).split([hq + hk, hk], dim=1)
            if w.qk_norm is not None:  # Qwen3's q_norm and k_norm at once
                qk = _rms(qk, w.qk_norm, self.eps)
            k_cache, v_cache = keys[i], values[i]  # [B, Hkv, S, D]
            if fused is None:
                qk = _rope(qk, rope)  # [B*W, Hq + Hkv, D]
                k_cache.scatter_(2, index, qk[:, hq:].view(B, W, hk, d).transpose(1, 2))
                v_cache.scatter_(2, index, v.view(B, W, hk, d).transpose(1, 2))
                heads = qk[:, :hq].view(B, W, hk, g, d)  # HF head j * G + r of row w -> query row r * W + w of kv
                q = heads.permute(0, 2, 3, 1, 4).reshape(B, hk, g * W, d)  # head j
                o = F.scaled_dot_product_attention(q, k_cache[:, :, :span], v_cache[:, :, :span],
                                                   attn_mask=grouped_mask, scale=self.scaling)  # [B, Hkv, G*W, D]
                o = o.view(B, hk, g, W, d).permute(0, 3, 2, 1, 4)  # [B, W, G, Hkv, D]
            else:  # rope and the KV write in one kernel; q [B, Hkv, W*G, D] (query row w * G + r of kv head j, the
                # attention kernel's layout); out: a view of [B, W*G, Hkv, D]
                q = fused.rope_qk_kv_write_rows(qk, v, self.rope_table, positions, slots, k_cache, v_cache)
                o = attention.masked_attention(q, k_cache[:, :, :span], v_cache[:, :, :span], allowed, self.scaling,
                                               kv_len).transpose(1, 2)
            # -> [B*W, G*Hkv*D], columns (r, j, d): the order of the fused o_proj weight's columns
            o = o.reshape(B * W, hq * d)
            h = _add_linear(h, o, w.o_w, w.o_b, inplace=i not in wanted, kernels=use_triton)
            gate_up = onednn.linear(norm(h, w.post_norm, self.eps), w.gate_up_w, w.gate_up_b, kernels=use_triton)
            if fused is not None and _is_silu(w.act):
                act = fused.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                act = w.act(gate) * up
            h = _add_linear(h, act, w.down_w, w.down_b, inplace=True, kernels=use_triton)
        if self.num_layers in wanted:
            feats[self.num_layers] = h
        out = h if last is None else h.view(B, W, -1)[torch.arange(B, device=h.device), last]  # [B*W or B, H]
        logits = onednn.linear(norm(out, self.final_norm, self.eps), self.lm_w, self.lm_b, kernels=use_triton)
        if self.feature_layer_ids:
            features = torch.cat([feats[j] for j in self.feature_layer_ids], dim=-1).view(B, W, -1)
        else:
            features = h.new_zeros(B, W, 0)
        return BatchOutput(logits.view(B, W if last is None else 1, -1), features)
