"""Static drafter rows for CUDA graphs: the drafting path when the target runs the fast backend on CUDA
(EngineConfig.draft_graphs). Capture and replay mirror backends/fast.py; the tree
growth after the catch-up runs as one CUDA graph per tree (draft/tree_graph.py; `tree_graphs=False`: one run()
per depth).

    KV       per drafter layer [1, Hkv, S, D], S = max_len + the largest bucket, rounded up to 64; slots
             0..length-1 hold the live rows where the eager KVCache would, so the proposer's masks are unchanged
    run      n rows -> slots length..length+n-1, padded to a bucket B (1, 2, 4, ..., 64); a bool mask
             [B, span] over the first span = length + B (rounded up to span_step, capped at S) slots: the
             caller's mask, padding rows see only their own slot; one step (and CUDA graph) per (bucket, span).
             Causal rows past the largest bucket run chunk by chunk through the same bucket steps; rows past it
             with a caller's mask run the same step eagerly at their exact size
    crop     length = n (stale slots stay masked until the next rows overwrite them)

The step is the drafter's own forward over `StaticKV` (a KVCache stand-in that writes by index into the static
buffers and returns their first `span` slots) or, by default on CUDA, draft/fused.py's step: the same layers in
fewer kernels. Masked slots add exp(finfo.min - max) = 0 to the softmax, so the rows equal the eager ones up to
float rounding (reduction order); the CPU tests get identical tree tokens and logq within 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from eaglespec.backends.fast import SPAN_STEP, capture_graph, round_span, smallest_bucket
from eaglespec.draft.eagle1 import Eagle1Drafter
from eaglespec.draft.fused import FusedEagle1Step, FusedEagle3Step, unfusable_reason
from eaglespec.draft.layers import Attention
from eaglespec.errors import EagleSpecError
from eaglespec.kernels import on_by_default

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
T = TypeVar("T")


class StaticKV:
    """KVCache stand-in over preallocated [1, Hkv, S, D] buffers: append writes the rows at `slots` [B]
    (all < span) and returns the first `span` slots, the ones the step attends over."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, span: int):
        self.k, self.v, self.slots, self.span = k, v, slots, span

    @property
    def length(self) -> int:
        return self.span  # the attended slots (the callers always pass a full [B, span] mask)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k.index_copy_(2, self.slots, k)  # k, v: [1, Hkv, B, D]
        self.v.index_copy_(2, self.slots, v)
        return self.k[:, :, : self.span], self.v[:, :, : self.span]  # [1, Hkv, span, D] views


@dataclass
class _Rows:
    """Static inputs/outputs of one bucket (and its CUDA graph once captured)."""

    state: torch.Tensor  # [B, H]
    tokens: torch.Tensor  # [B] long, target ids
    positions: torch.Tensor  # [B] long
    slots: torch.Tensor  # [B] long: KV slots written
    visible: torch.Tensor  # [B, span] bool
    cache: list[StaticKV]
    eye: torch.Tensor  # [B, B] bool constants for filling `visible`
    causal: torch.Tensor
    logits: torch.Tensor | None = None  # [B, Vd] (graph outputs)
    states: torch.Tensor | None = None  # [B, H]
    graph: object | None = None  # torch.cuda.CUDAGraph (None: the step runs eagerly)


class StaticDraftRunner:
    """Drafter-row runner over a static KV with fixed row buckets (see module docstring).

    Same interface as proposer.EagerRows: reset(), length, run(state, tokens, positions, visible),
    crop(n). A graph replay runs the same kernels on the same buffers as the eager step.
    span_step: steps attend over the first span(length + rows) KV slots (a multiple of span_step).
    fused: step with draft/fused.py's FusedEagle3Step or FusedEagle1Step, by the drafter's type (None: on CUDA
    when the drafter allows it). kernels: the Triton kernels in that step and in the tree rows' masks
    (draft/tree_graph.py), or the torch code (None: kernels.on_by_default(device)).
    """

    def __init__(self, drafter: nn.Module, max_len: int = 4096, buckets: tuple[int, ...] = DEFAULT_BUCKETS,
                 cuda_graphs: bool | None = None, tree_graphs: bool = True, span_step: int = SPAN_STEP,
                 fused: bool | None = None, kernels: bool | None = None):
        if max_len < 1:
            raise EagleSpecError(f"draft max_len must be >= 1, got {max_len}")
        if span_step < 1:
            raise EagleSpecError(f"span_step must be >= 1, got {span_step}")
        self.drafter = drafter
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.hidden_size = drafter.cfg.hidden_size
        attn = [m for m in drafter.modules() if isinstance(m, Attention)]
        if len(attn) != len(drafter.new_cache()):
            raise EagleSpecError(f"{type(drafter).__name__}: {len(attn)} attention modules for "
                                 f"{len(drafter.new_cache())} KV caches")
        self.buckets = tuple(sorted(buckets))
        self.max_len, self.span_step = max_len, span_step
        self.size = -(-(max_len + self.buckets[-1]) // 64) * 64  # room for padding rows; aligned mask rows
        self.k = [torch.zeros(1, a.kv_heads, self.size, a.head_dim, device=self.device, dtype=self.dtype)
                  for a in attn]
        self.v = [torch.zeros_like(k) for k in self.k]
        self.cols = torch.arange(self.size, device=self.device)
        self.kernels = on_by_default(self.device) if kernels is None else kernels
        reason = unfusable_reason(drafter)
        if fused and reason is not None:
            raise EagleSpecError(f"fused draft step: {reason}")
        if fused is None:
            fused = self.device.type == "cuda" and reason is None
        # the step: (state, tokens, positions, [StaticKV], visible) -> (logits, states)
        self.forward = drafter
        if fused:
            step = FusedEagle1Step if isinstance(drafter, Eagle1Drafter) else FusedEagle3Step
            self.forward = step(drafter, self.size, kernels=self.kernels)
        self.use_graphs = (self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        if self.use_graphs and self.device.type != "cuda":
            raise EagleSpecError("draft cuda_graphs=True needs the drafter on a CUDA device")
        self._graphs: dict[tuple[int, int], _Rows] = {}  # (bucket, span) -> its buffers / graph
        self._pool = None
        # whole-tree growth after catch-up as one function of static buffers (draft/tree_graph.py; one CUDA
        # graph per (tree spec, draft processors) on CUDA); False: every tree row goes through run()
        self.tree_graphs = tree_graphs
        self.trees: dict = {}  # (TreeSpec, SamplingParams | None) -> TreeGraph
        self.reset()

    def reset(self) -> None:
        self.length = 0  # drafter rows 0..length-1 are live in the static KV

    def crop(self, n: int) -> None:
        self.length = min(self.length, n)

    def span(self, n: int) -> int:
        """KV slots a step writing slots below n attends over: n rounded up to span_step, capped at the KV."""
        return round_span(n, self.span_step, self.size)

    # -- the step (graph-captured on CUDA) ------------------------------------------------------
    def _step(self, rows: _Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """The drafter's step over the static buffers: (logits [B, Vd], states [B, H])."""
        return self.forward(rows.state, rows.tokens, rows.positions, rows.cache, visible=rows.visible)

    def _buffers(self, b: int, span: int) -> _Rows:
        dev = self.device
        slots = self.cols[self.length: self.length + b].clone()  # warm-up/capture writes pending slots only
        visible = torch.zeros(b, span, dtype=torch.bool, device=dev)
        eye = torch.eye(b, dtype=torch.bool, device=dev)
        visible[:, self.length: self.length + b] = eye
        return _Rows(state=torch.zeros(b, self.hidden_size, device=dev, dtype=self.dtype),
                     tokens=torch.zeros(b, dtype=torch.long, device=dev),
                     positions=torch.full((b,), self.length, dtype=torch.long, device=dev),
                     slots=slots, visible=visible,
                     cache=[StaticKV(k, v, slots, span) for k, v in zip(self.k, self.v)],
                     eye=eye, causal=eye.new_ones(b, b).tril())

    def capture(self, fn: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
        """backends/fast.capture_graph on this runner's shared pool. Every graph's outputs are consumed right
        after its replay, before another graph of the pool replays."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return capture_graph(fn, self.device, self._pool)

    def _runner(self, b: int, span: int) -> _Rows:
        """Static buffers for bucket b attending over `span` slots, with its CUDA graph captured on first use."""
        rows = self._graphs.get((b, span))
        if rows is not None:
            return rows
        rows = self._buffers(b, span)
        if self.use_graphs:
            rows.graph, (rows.logits, rows.states) = self.capture(lambda: self._step(rows))
        self._graphs[(b, span)] = rows
        return rows

    def check_room(self, end: int) -> None:
        """Raise unless rows up to `end` (exclusive) fit in the static KV."""
        if end > self.max_len:
            raise EagleSpecError(f"the drafter needs {end} KV rows but its static KV holds max_len="
                                 f"{self.max_len} (prompt + generated tokens + draft tree rows): pass a larger "
                                 "draft_max_len, or run without draft_graphs")

    # -- the runner interface -------------------------------------------------------------------
    @torch.no_grad()
    def run(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
            visible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append n rows after the live ones. visible: [n, length+n] bool (None = causal).

        Returns (draft logits [n, Vd], states [n, H]); no host sync.
        """
        n, start = tokens.shape[0], self.length
        self.check_room(start + n)
        b = smallest_bucket(self.buckets, n)
        if b is None and visible is None:  # oversized causal rows (catch-up): the buckets' steps, chunk by chunk
            return self._run_chunked(state, tokens, positions)
        if b is None:  # oversized rows with a caller's mask: eager, exact size
            rows = self._buffers(n, self.span(start + n))
        else:  # the padding rows' slots start+n..start+b-1 lie inside the span too
            rows = self._runner(b, self.span(start + b))
        logits, states = self._run_rows(rows, state, tokens, positions, visible)
        return logits.clone(), states.clone()

    def _run_chunked(self, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """n causal rows past the largest bucket B: chunks of B rows (the last one smaller, in its bucket), each
        appended after the live rows, so each chunk's rows see every earlier row and the chunk's rows up to
        themselves, exactly the causal mask of one n-row step. Every chunk replays a captured bucket step: no
        eager step, no new shape (a catch-up after many plain steps of an adaptive stream, or a long prompt)."""
        n, big = tokens.shape[0], self.buckets[-1]
        logits = states = None
        for c0 in range(0, n, big):
            c1 = min(c0 + big, n)
            b = smallest_bucket(self.buckets, c1 - c0)
            rows = self._runner(b, self.span(self.length + b))  # the key run() gives c1 - c0 rows
            lg, st = self._run_rows(rows, state[c0:c1], tokens[c0:c1], positions[c0:c1], None)
            if logits is None:
                logits = lg.new_empty(n, lg.shape[-1])
                states = st.new_empty(n, st.shape[-1])
            logits[c0:c1].copy_(lg)  # copied before the next chunk's step overwrites a graph's outputs
            states[c0:c1].copy_(st)
        return logits, states

    def _run_rows(self, rows: _Rows, state: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                  visible: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The step over `rows`' buffers for n <= its bucket rows after the live ones: (logits [n, Vd], states
        [n, H]) as views of the step's outputs (a graph's static buffers: copy before its next replay)."""
        n, start = tokens.shape[0], self.length
        b = rows.tokens.shape[0]
        # padding rows keep stale (finite) inputs: their outputs are dropped, and the KV slots they write
        # (start+n..start+b-1) stay hidden from every live row until real rows overwrite them
        rows.state[:n].copy_(state)
        rows.tokens[:n].copy_(tokens)
        rows.positions[:n].copy_(positions)
        rows.slots.copy_(self.cols[start: start + b])
        vis = rows.visible
        vis.zero_()
        if visible is None:  # causal: every live row, then the new rows up to itself
            vis[:n, :start].fill_(True)
            vis[:n, start: start + n].copy_(rows.causal[:n, :n])
        else:
            vis[:n, : start + n].copy_(visible)
        vis[n:, start + n: start + b].copy_(rows.eye[n:, n:])  # padding rows see their own slot only
        if rows.graph is not None:
            rows.graph.replay()
            logits, states = rows.logits, rows.states
        else:
            logits, states = self._step(rows)
        self.length = start + n
        return logits[:n], states[:n]
