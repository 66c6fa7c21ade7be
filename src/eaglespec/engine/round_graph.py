"""The speculative round as one function of static buffers, captured once as a CUDA graph and replayed.

The same stages as SpeculativeEngine._eager_round, over a fast target and a StaticDraftRunner, with every shape
fixed so that one round is one graph replay and one host sync:

    state_in  [4 + P] long: n (catch-up rows), dlen (drafter rows committed), tlen (target rows committed),
              root, then the catch-up rows' next tokens [P] (x_{t+1}, contract 4); P = tree depth + 1
    feats_in  [P, F]: the target features of the rows the drafter has not consumed (the first n)

    1. draft: the drafter's catch-up over P rows (n live; padding rows write stale KV slots past dlen + n that the
       tree rows overwrite and no live row sees), then the tree (Proposer.grow over DeviceTreeRows)
    2. verify: the target's step over the tree rows at slots tlen.. (positions tlen + depth)
    3. accept: the greedy walk, or lossless rejection sampling with the random numbers drawn before the replay
       into static buffers (the drafter's race noise, the acceptance coins [T], the bonus's race noise [V])
    4. publish: the path's KV rows moved to slots tlen..tlen+P-1, the next round's state_out / feats_out, the ids,
       and a result row for the host (m, the bonus, the path, a dynamic tree's flags, the tree)

The host reads the result row in one copy, then copies state_out and feats_out into the inputs. On CPU the same
function runs eagerly over the same buffers (what the CPU tests check against HF generate).

Overlap: every launch queues, behind the replay, its result row's copy into pinned memory and the next round's
inputs, so a round can be queued behind another the host has not read. While the stream goes on, the host keeps
two rounds in flight: it reads round N (waiting for N only), then queues round N + 2 behind N + 1. Round N + 2 is
launched from upper bounds of its inputs (N + 1 accepts at most P rows; the graph reads the real values from
state_in), and only where it needs no capture and no growth of a KV or of the ids. Writes of an unused launch lie
past everything committed, so dropping one (after an EOS) changes nothing.
"""

from __future__ import annotations

import time
import warnings
from typing import NamedTuple

import torch

from eaglespec.backends.fast import FastTarget, capture_graph
from eaglespec.draft.fast import StaticDraftRunner, StaticKV
from eaglespec.draft.proposer import Proposer
from eaglespec.draft.tree_graph import DeviceTreeRows
from eaglespec.engine.state import GenerationResult, HostRead, RoundContext, RoundStats
from eaglespec.errors import EagleSpecError
from eaglespec.kernels import round_tail as round_kernels
from eaglespec.kernels import sampled as sampled_kernels
from eaglespec.kernels import tree as tree_kernels
from eaglespec.sampling import exponential_noise, process_logits, race_argmax
from eaglespec.telemetry import round_detail
from eaglespec.tree.core import DraftTree, FlatTree, TreeSpec, ancestry, check_dynamic_flags, static_layout
from eaglespec.verify import (
    greedy_path_end,
    path_first,
    point_mass_residual,
    point_mass_tests,
    sampled_path,
    sibling_table,
    sibling_table_of,
    sibling_tests,
)


def unusable_reason(target, proposer: Proposer | None, spec: TreeSpec) -> str | None:
    """Why rounds of this target, proposer and tree cannot run as round graphs (None: they can)."""
    if not isinstance(target, FastTarget):
        return "the target is not the fast backend"
    if target.compiled:
        return "the fast target is compiled (--compile)"
    if proposer is None or not spec.speculates:
        return "no drafter or no speculation"
    if not isinstance(proposer.runner, StaticDraftRunner):
        return "the drafter does not run on a StaticDraftRunner (draft graphs off)"
    if target.device != proposer.runner.device:
        return "the target and the drafter are on different devices"
    return None


class _Launch(NamedTuple):
    """A round queued on the device: its stream, its result row's copy to the host, its tree's logq [T]."""

    stream: int
    read: HostRead
    logq: torch.Tensor


class RoundGraphs:
    """The round graphs of one target and proposer: a RoundGraph per tree spec, made on first use.

    sampled: rounds under a sampling temperature replay too (else only greedy rounds do).
    overlap: keep up to two rounds launched ahead of the one the host reads.
    kernels: the round's bookkeeping in the Triton kernels (kernels/tree.py, sampled.py, round_tail.py) or in torch
    (None: as the proposer's growth, proposer.kernels)."""

    def __init__(self, target: FastTarget, proposer: Proposer, sampled: bool = True, overlap: bool = False,
                 kernels: bool | None = None):
        self.target, self.proposer = target, proposer
        self.sampled, self.overlap = sampled, overlap
        self.kernels = proposer.kernels if kernels is None else kernels
        self.by_spec: dict[TreeSpec, RoundGraph] = {}

    def get(self, spec: TreeSpec) -> RoundGraph:
        rg = self.by_spec.get(spec)
        if rg is None:
            rg = self.by_spec[spec] = RoundGraph(self.target, self.proposer, spec, self.sampled, self.overlap,
                                                 self.kernels)
        return rg

    def catch_up_rows(self, spec: TreeSpec) -> int:
        """The most pending rows a round of `spec` catches up on (P = depth + 1)."""
        return spec.depth + 1

    def can_run(self, ctx: RoundContext, ids: torch.Tensor, pending: torch.Tensor) -> bool:
        """Whether this round can replay: a graphable tree, greedy or sampled rounds allowed, no failed capture,
        and a state the static inputs hold (1..P pending rows, the drafter caught up to the target but them)."""
        if not ctx.spec.speculates or (ctx.sampling is not None and not self.sampled):
            return False
        rg = self.get(ctx.spec)
        return not rg.failed and (rg.holds(ids, pending) or rg.stageable(ids, pending))

    def replay(self, ctx: RoundContext, ids: torch.Tensor, pending: torch.Tensor, result: GenerationResult):
        """The round as one graph replay: (emitted, ids, pending) as SpeculativeEngine._eager_round returns, or
        None when the graph could not be captured (the engine runs the round stage by stage)."""
        return self.get(ctx.spec).round(ctx, ids, pending, result)


class RoundGraph:
    """Rounds of one engine and tree spec as one function (one CUDA graph per span pair and sampling setting on
    CUDA); see the module docstring."""

    def __init__(self, target: FastTarget, proposer: Proposer, spec: TreeSpec, sampled: bool = False,
                 overlap: bool = False, kernels: bool = False):
        self.target = target
        self.proposer = proposer
        self.overlap = overlap
        self.kernels = kernels  # the Triton kernels for the round's bookkeeping, or the torch code
        self.runner: StaticDraftRunner = self.proposer.runner
        dev = self.target.device
        self.device = dev
        self.spec = spec  # the tree these buffers are sized for
        self.P = spec.depth + 1  # rows a round can accept: the path (<= depth + 1 rows)
        self.R = self.proposer.tree_rows(self._draft_vocab())  # drafter rows of one tree after the catch-up
        self.T = self._tree_size()  # verified rows per round, at most (fixed per spec)
        feat = self.target.hidden_size * len(self.target.feature_layer_ids)  # [F] of the target's features
        self.state_in = torch.zeros(4 + self.P, dtype=torch.long, device=dev)
        self.state_out = torch.zeros_like(self.state_in)
        self.feats_in = torch.zeros(self.P, feat, dtype=self.target.dtype, device=dev)
        self.feats_out = torch.zeros_like(self.feats_in)
        self.ids = torch.zeros(0, dtype=torch.long, device=dev)  # every token so far (grown on demand)
        self.arange = torch.arange(self.P, device=dev)
        self.ahead = self.arange + 1  # [P]: row j's next row (j + 1)
        self.next_row = self.ahead.clamp(max=self.P - 1)  # [P]: its index into the path, in range
        self.no_flags = torch.zeros(4, dtype=torch.long, device=dev)  # a chain's or static tree's flags
        self.graphs: dict[tuple, tuple] = {}  # (span_d, span_t, sampling) -> (CUDA graph, outputs)
        # sampled rounds: the sibling table of a chain's or static tree's fixed layout (a dynamic tree's is built
        # every round) and the random inputs
        self.sampled = sampled
        self.kids = self.draft_noise = self.coins = self.race = None
        # a chain's or static tree's layout is fixed: its parents and ancestry mask [T, T] once, not every round
        parents = (list(range(-1, spec.depth)) if spec.kind == "chain"
                   else list(static_layout(spec.static_choices()).parents) if spec.kind == "static" else None)
        self.visible = None if parents is None else ancestry(torch.tensor(parents, device=dev), check=False)
        if self.sampled:
            self.kids = None if parents is None else sibling_table(parents, dev)  # [T, K]
            vd = self._draft_vocab()
            rows = spec.depth if spec.kind == "chain" else 1 + self.R  # Proposer.noise_rows when sampling
            self.draft_noise = torch.ones(rows, vd, device=dev) if rows else None
            self.coins = torch.zeros(self.T, device=dev)  # [T] uniform
            self.race = torch.ones(self.target.vocab_size, device=dev)  # [V] Exp(1): the bonus's draw
        self._pool = None
        self._cache_ptr = None
        self._flight: list[_Launch] = []  # overlap: rounds launched and not read yet (one stream), oldest first
        self._reads: list[HostRead | None] = [None] * 3  # their result rows' host copies, in turn
        self._next_read = 0
        self.failed = False
        self.n = self.dlen = self.tlen = 0  # host mirrors of state_in[0:3]

    # -- the round as a function of static buffers ------------------------------------------------
    def _draft_vocab(self) -> int:
        head = getattr(self.proposer.drafter, "lm_head", None)
        return head.weight.shape[0] if head is not None else self.target.vocab_size

    @torch.no_grad()  # the drafter's projection is a module call: no autograd graph inside a round
    def body(self, span_d: int, span_t: int, sampling=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One round over the static inputs (no host sync): greedy, or under `sampling` (the stream's SamplingConfig:
        its target processors; the proposer holds the draft ones) with the random inputs drawn (_draw). Writes
        state_out, feats_out and ids; returns the result row [6 + 2P + 3T] long (m, bonus, a dynamic tree's 4 flags,
        the path's rows and tokens padded to P, the tree's tokens, parents, depths) and the tree's logq [T]."""
        st, P, i = self.state_in, self.P, self.arange
        n, dlen, tlen = st[0], st[1], st[2]
        root, nxt = st[3:4], st[4:4 + P]
        runner, proposer = self.runner, self.proposer
        # 1. catch-up: rows dlen..dlen+P-1 (n live), causal, every committed row visible
        rel = runner.cols[:span_d] - dlen  # [span_d]
        vis = rel[None, :] <= i[:, None]  # [P, span_d]: committed (rel < 0) or causal (0 <= rel <= row)
        slots = dlen + i  # [P]: slots and positions
        cache = [StaticKV(k, v, slots, span_d) for k, v in zip(runner.k, runner.v)]
        state = proposer.drafter.project(self.feats_in)  # [P, H]
        logits, states = runner.forward(state, nxt, slots, cache, visible=vis)
        last = (n - 1).reshape(1)
        base = dlen + n  # drafter rows committed after the catch-up: the tree rows follow
        # 2. the tree
        tree, flags, keep = proposer.grow(root, logits.index_select(0, last)[0], states.index_select(0, last)[0],
                                           lambda part: DeviceTreeRows(runner, base, part, span_d),
                                           self.draft_noise if sampling is not None else None)
        # 3. verify
        if self.visible is None:  # a dynamic tree: no node deeper than the spec's depth
            if self.kernels:  # one kernel instead of ~11
                visible = tree_kernels.ancestry(tree.parents, self.spec.depth)  # [T, T]
            else:
                visible = ancestry(tree.parents, check=False, max_depth=self.spec.depth)  # [T, T]
        else:
            visible = self.visible
        tgt = self.target
        out_logits, feats = tgt.step(tree.tokens, tlen + tree.depths, visible, tlen, tgt.cols[:span_t])
        if sampling is None and self.kernels:  # 4. greedy acceptance, 1 kernel
            nxt = tree_kernels.argmax_keys(out_logits)  # the target's argmax as per-chunk keys, merged in accept_path
            best, bonus, m, order = tree_kernels.accept_path(tree.tokens, tree.parents, tree.depths, visible, nxt, P)
        else:
            if sampling is None:  # 4. greedy acceptance (verify.greedy_accept's path, without its host read)
                flat = FlatTree(tokens=tree.tokens, depths=tree.depths, parents=tree.parents, visible=visible)
                best, bonus = greedy_path_end(flat, out_logits)  # [1], [1]
                m = order = None  # from the path below
            else:  # 4. lossless rejection sampling (verify.sample_accept's recursion, as tensor ops)
                p = process_logits(out_logits, sampling.target)  # [T, V]
                kids = self.kids if self.kids is not None else sibling_table_of(tree.parents, self.spec.top_k)
                live = kids > 0 if keep is None else (kids > 0) & keep[kids]
                if tree.draft_probs is None:  # children drafted greedily (top-k): the point-mass scheme, q = 1
                    r_at, q_at = point_mass_tests(tree.tokens, kids, p, live)
                    best, m, order = self._walk(tree, kids, live, visible, r_at, q_at)
                    final = point_mass_residual(p, tree.tokens, kids, live, best)  # [1, V]
                else:  # children drawn from q: real q (on CUDA: sampled_kernels, K + 2 launches)
                    fast = self.kernels and sampled_kernels.fits(p.shape[1], kids.shape[1])
                    tests = sampled_kernels.sibling_tests if fast else sibling_tests
                    r_at, q_at, residuals = tests(tree.tokens, kids, p, tree.draft_probs, live)
                    best, m, order = self._walk(tree, kids, live, visible, r_at, q_at)
                    if fast:  # the residual of the one node where the walk ends
                        final = sampled_kernels.final_residual(p, tree.draft_probs, residuals, best)  # [1, V]
                    else:
                        final = residuals.index_select(0, best)  # [1, V]
                bonus = race_argmax(final, self.race[None])  # [1]
            if m is None:  # the path's length and order from its end (the torch walks)
                on_path = visible.index_select(0, best)[0]  # [T]
                m = on_path.sum()
                order = path_first(on_path)[:P]  # path rows first, in depth order
        # 5. commit: the path's KV rows to slots tlen..tlen+P-1; 6. the next round's inputs (x_{t+1} of each
        # accepted row: the next path token, the bonus after the last), the ids and the result row (one kernel)
        tail = round_kernels.round_tail if self.kernels else round_kernels.round_tail_ref
        result = tail(tgt.cache, self.ids, self.state_out, self.feats_out, feats, tree.tokens, tree.parents,
                      tree.depths, self.no_flags if flags is None else flags, m, bonus, order, tlen, base,
                      (i, self.ahead, self.next_row))
        return result, tree.logq

    def _walk(self, tree: DraftTree, kids: torch.Tensor, live: torch.Tensor, visible: torch.Tensor,
              r_at: torch.Tensor, q_at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """A sampled round's walk over the sibling tests: (best [1], m [], order [P]) in one kernel where the tree
        kernels run (tree_kernels.sampled_accept_path: in place of ~6 kernels per sibling rank), else (best, None,
        None) from verify.sampled_path (body then takes the path's length and order as a greedy round does)."""
        if (self.kernels and kids.shape[1] <= tree_kernels.MAX_K
                and kids.shape[0] <= tree_kernels.MAX_ROWS):
            return tree_kernels.sampled_accept_path(tree.parents, kids, live, r_at, q_at, self.coins, visible,
                                                    tree.depths, self.P)
        return sampled_path(visible, tree.depths, kids, r_at, q_at, self.coins, live), None, None

    # -- the host side ------------------------------------------------------------------------------
    def stageable(self, ids: torch.Tensor, pending: torch.Tensor) -> bool:
        """Whether the static inputs can hold this round state: 1..P pending rows, the drafter caught up to the
        target but them, and ids [tlen + 1]."""
        n, dlen, tlen = pending.shape[0], self.proposer.committed, self.target.committed_len
        return 1 <= n <= self.P and dlen + n == tlen and ids.shape[0] == tlen + 1

    def _stage(self, ids: torch.Tensor, pending: torch.Tensor) -> None:
        """Load the engine's round state (contract 7) into the static inputs (stageable(ids, pending) holds)."""
        n, dlen, tlen = pending.shape[0], self.proposer.committed, self.target.committed_len
        self._grow_ids(tlen + 1 + self.P)
        self.ids[: tlen + 1].copy_(ids)
        self.feats_in[:n].copy_(pending)
        self.state_in[4:4 + n].copy_(ids[dlen + 1: dlen + 1 + n])
        self.state_in[3:4].copy_(ids[-1:])
        self.state_in[0].fill_(n)
        self.state_in[1].fill_(dlen)
        self.state_in[2].fill_(tlen)
        self.n, self.dlen, self.tlen = n, dlen, tlen

    def _drop_graphs(self) -> None:
        """Forget the captured rounds and their pool (a pool whose graphs are all freed takes no new capture)."""
        self.graphs.clear()
        self._pool = None

    def _grow_ids(self, size: int) -> None:
        if self.ids.shape[0] < size:
            new = torch.zeros(max(size, 2 * self.ids.shape[0], 1024), dtype=torch.long, device=self.device)
            new[: self.ids.shape[0]].copy_(self.ids)
            self.ids = new
            self._drop_graphs()  # they write the old buffer

    def holds(self, ids: torch.Tensor, pending: torch.Tensor) -> bool:
        """The engine handed back what the last round returned: the static inputs hold this state already."""
        return (ids.data_ptr() == self.ids.data_ptr() and ids.shape[0] == self.tlen + 1
                and pending.data_ptr() == self.feats_in.data_ptr() and pending.shape[0] == self.n
                and self.proposer.committed == self.dlen and self.target.committed_len == self.tlen)

    def _key(self, span_d: int, span_t: int, sampling) -> tuple:
        """The captured graph's key: the spans and the sampling setting."""
        return span_d, span_t, None if sampling is None else (sampling.target, self.proposer.sampling)

    def _run(self, span_d: int, span_t: int, sampling, capture: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The round's body on CUDA: its graph replayed (captured first when `capture`; else None when it is not
        captured yet); eagerly elsewhere."""
        if self.device.type != "cuda":
            return self.body(span_d, span_t, sampling)
        if self.target.cache.data_ptr() != self._cache_ptr:  # the target's cache was reallocated
            if not capture:
                return None
            self._drop_graphs()
            self._cache_ptr = self.target.cache.data_ptr()
        key = self._key(span_d, span_t, sampling)
        if key not in self.graphs:
            if not capture:
                return None
            try:
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()
                self.graphs[key] = capture_graph(lambda: self.body(span_d, span_t, sampling), self.device,
                                                 self._pool)
            except Exception as exc:  # the per-phase path still works
                self.failed = True
                first = (str(exc).splitlines() or [""])[0]
                warnings.warn(f"round graph: capture failed ({type(exc).__name__}: {first}); the engine keeps "
                              "the per-phase rounds", RuntimeWarning, stacklevel=3)
                return None
        graph, out = self.graphs[key]
        graph.replay()
        return out

    def _launch(self, ctx: RoundContext, n: int, dlen: int, tlen: int, ahead: bool = False) -> _Launch | None:
        """Queue one round from inputs whose host mirrors are (n, dlen, tlen), then its result's copy to the host,
        its logq's copy and the next round's inputs (state_out / feats_out into state_in / feats_in): no host sync.
        None when the capture failed (self.failed: the engine runs rounds stage by stage).

        ahead: a round queued behind another one the host has not read (two in flight), from upper bounds of its
        inputs (n = P, tlen + P: the round before accepts at most P rows). It changes nothing the rounds in flight
        use: None (nothing queued) where it would grow the KV, the ids or need a capture."""
        P, sampling = self.P, ctx.sampling
        rows_d, rows_t = max(P, n + self.R), max(P, self.T)  # KV rows past dlen / tlen this round
        if ahead and (dlen + rows_d > self.runner.max_len or tlen + rows_t > self.target.max_len
                      or self.ids.shape[0] < tlen + 1 + P):
            return None
        if not ahead:
            self.runner.check_room(dlen + rows_d)
            self.target.reserve(tlen + rows_t)
            self._grow_ids(tlen + 1 + P)
        span_d, span_t = self.runner.span(dlen + rows_d), self.target.span(tlen + rows_t)
        if ahead and self.device.type == "cuda" and (self._key(span_d, span_t, sampling) not in self.graphs
                                                     or self.target.cache.data_ptr() != self._cache_ptr):
            return None
        if sampling is not None:  # the round's random numbers, into the graph's static inputs
            self._draw(ctx.generator)
        out = self._run(span_d, span_t, sampling, capture=not ahead)
        if out is None:
            return None
        res_t, logq = out
        i = self._next_read  # at most two launches in flight and the one being read: three buffers in turn
        self._next_read = (i + 1) % len(self._reads)
        read = self._reads[i]
        if read is None or read.buf.shape[0] != res_t.shape[0]:
            read = self._reads[i] = HostRead(self.device, res_t.shape[0])
        read.start(res_t)  # before the next round overwrites the row
        logq = logq.clone()
        self.state_in.copy_(self.state_out)  # the next round's inputs
        self.feats_in.copy_(self.feats_out)
        return _Launch(ctx.stream, read, logq)

    def _launch_next(self, ctx: RoundContext, flight: list[_Launch], emitted: list[int], done: int
                     ) -> list[_Launch]:
        """Overlap: top `flight` (the rounds launched and not read, after this one) up to two, while the stream
        goes on, so the GPU has the next round queued while the host reads one. The first from the mirrors (what
        this round left), the second from their bounds, and only while the round before it cannot end the
        stream by length. A launch that raises (no room left) launches nothing: the next round raises it."""
        try:
            if not flight and ctx.goes_on(emitted, done, 0):
                launch = self._launch(ctx, self.n, self.dlen, self.tlen)
                flight = [launch] if launch is not None else []
            if len(flight) == 1 and ctx.goes_on(emitted, done, self.P):
                launch = self._launch(ctx, self.P, self.dlen + self.n, self.tlen + self.P, ahead=True)
                flight = [*flight, launch] if launch is not None else flight
        except (EagleSpecError, RuntimeError):  # no room in the drafter's KV; out of memory growing the target's
            pass
        return flight

    def round(self, ctx: RoundContext, ids: torch.Tensor, pending: torch.Tensor, result: GenerationResult):
        """One round as a replay (RoundGraphs.can_run holds): (emitted, ids, pending), or None when the capture
        failed."""
        t0 = time.perf_counter()
        flight, self._flight = self._flight, []
        if not (flight and flight[0].stream == ctx.stream and self.holds(ids, pending)):
            if not self.holds(ids, pending):
                self._stage(ids, pending)
            launch = self._launch(ctx, self.n, self.dlen, self.tlen)  # nothing launched for this round
            if launch is None:
                return None
            flight = [launch]
        this, flight = flight[0], flight[1:]
        snap = this.read.copy()  # the round's one host sync: waits for this round, not the one behind it (copied
        vals = snap.tolist()  # before a launch reuses the buffer: the telemetry's tensors are slices of it)
        m, bonus, flags = vals[0], vals[1], vals[2:6]
        t1 = time.perf_counter()
        if any(flags):
            check_dynamic_flags(torch.tensor(flags))
        n, dlen, tlen, P = self.n, self.dlen, self.tlen, self.P
        self.proposer.committed = self.runner.length = dlen + n  # the catch-up's rows; the tree rows stay stale
        self.target.set_committed(tlen + m)
        self.n, self.dlen, self.tlen = m, dlen + n, tlen + m
        emitted = [*vals[6 + P:6 + P + m][1:], bonus]  # the path past the root, then the bonus
        if self.overlap:
            self._flight = self._launch_next(ctx, flight, emitted, len(result.token_ids))
        size, at = (len(vals) - 6 - 2 * P) // 3, 6 + 2 * P  # the tree's tokens, parents, depths from `at` on
        tree = DraftTree(tokens=snap[at:at + size], parents=snap[at + size:at + 2 * size],
                         depths=snap[at + 2 * size:], logq=this.logq, ordered=True)
        result.rounds.append(RoundStats(drafted=size - 1, accepted=m - 1, emitted=len(emitted), verify_s=t1 - t0,
                                        commit_s=time.perf_counter() - t1,
                                        detail=round_detail(tree, snap[6:6 + m])))  # the accepted rows
        return emitted, self.ids[: self.tlen + 1], self.feats_in[: self.n]

    def _draw(self, generator: torch.Generator | None) -> None:
        """A sampled round's random inputs: the drafter's race noise, the acceptance coins, the bonus's race noise."""
        if self.draft_noise is not None:
            self.proposer.draft_noise(self.draft_noise.shape[1], self.draft_noise)
        self.coins.uniform_(generator=generator)
        exponential_noise(self.race, generator)

    def _tree_size(self) -> int:
        """Rows of one verification, at most: the tree's nodes (fixed per spec under greedy drafting)."""
        spec = self.spec
        if spec.kind == "chain":
            return spec.depth + 1
        if spec.kind == "dynamic":
            return spec.budget + 1
        return len(spec.static_choices()) + 1
