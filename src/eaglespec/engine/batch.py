"""Continuous batching: many sequences advance together, one speculative round for all of them per step.

Each step (BatchEngine.step):
    1. leave    cancelled requests give their batch row back (their KV freed at once; the last rows move into the
                freed places, rows.compaction)
    2. join     waiting requests are prefilled, at most `prefill_chunk` prompt tokens per step while other rows
                decode, and join the batch (up to `max_batch` rows, and while the rows' prompts plus max_new_tokens
                stay within `max_tokens`: a bound on the KV the batch may come to hold); prompts that go in whole
                join together, in one target forward; a joined request's first token is emitted, and its drafter
                runs over its prompt's features (all but the last, which its first round takes)
    3. round    every live row drafts its own tree (chains or greedy static trees of all rows in one drafter call
                per step, draft/batch.py, a sampled row's chain drawn from its own random stream; dynamic trees
                and sampled rows under a static tree through their own proposer: drafter KV, sampling, random
                stream), one target forward verifies all the trees (backends/hf_batch.py and fast_batch.py: ragged
                rows, per-row positions, ancestry mask and KV slots), then acceptance and publish per row, as the
                one-sequence engine does; where every row verifies a chain (or its root alone), acceptance of every
                row, greedy or sampled, is one pass read in one host sync, and the round leaves every row's
                accepted features and next tokens on the device (the carry) for the next to draft from
    4. finish   rows that reached EOS or max_new_tokens leave

A row's round depends on its own state only: its tokens equal what the one-sequence engine emits for it alone,
and a sampled row draws from its own generator, so its tokens do not depend on its batch companions.
Speculation that fits the batch: a round drafts while the live batch is at most `speculate_up_to` rows; above it
every row takes a plain step (one tree row), and its drafter catches up on those rows at its next drafted round.
With `adaptive`, a DepthPlan (engine/plan.py) chooses each round's depth for the live batch's size: plain steps or
chains of 1..k drafts (the batched chains), else plain steps or drafted trees, whichever has the most expected tokens
per second from round times measured once per batch-size bucket (`calibrate`, which the engine builder runs) and the
tokens per round the drafter has been emitting; every depth is lossless. `adaptive` None (the engine's default
through EngineConfig) plans only rounds whose rows are all greedy: a sampled row's draws then never depend on its
companions' outcomes or on timing, so its tokens stay a function of its seed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from eaglespec.backends.hf_batch import HFBatchTarget, Prefilled
from eaglespec.draft.batch import BatchDrafts, RowSampling, supports_batched_drafts
from eaglespec.draft.proposer import Proposer
from eaglespec.engine.loop import attach_drafter
from eaglespec.engine.plan import DepthPlan, drafter_prior
from eaglespec.engine.state import GenerationResult, RoundStats
from eaglespec.engine.timing import median, random_tokens, sync
from eaglespec.errors import EagleSpecError
from eaglespec.sampling import SamplingConfig, SamplingParams, process_logits, sample
from eaglespec.tensors import to_device
from eaglespec.tree.core import DraftTree, TreeSpec, chain_tree, flatten, stack_flat
from eaglespec.verify import (
    greedy_accept_rows,
    greedy_chain_walk,
    read_chains,
    sample_accept,
    sample_accept_chains,
)

PREFILL_TOKENS = 16384  # the most padded prompt tokens that join in one target forward


@dataclass(eq=False)
class BatchRequest:
    """One sequence: what to generate, and its state while it runs. `result` fills as it goes."""

    prompt_ids: list[int]
    max_new_tokens: int = 128
    eos_token_ids: Sequence[int] = ()
    sampling: SamplingConfig | None = None  # None or temperature 0: greedy
    spec: TreeSpec | None = None  # None: the engine's tree
    result: GenerationResult = field(init=False)
    cancelled: bool = False
    done: bool = False
    # running state (the engine's)
    prefilled: Prefilled | None = field(default=None, repr=False)
    tokens: list[int] = field(default_factory=list, repr=False)  # the prompt and every token emitted: the last is the root
    pending: list[torch.Tensor] = field(default_factory=list, repr=False)  # [n_i, F] parts: the features the
    # drafter has not consumed, in order (concatenated when it drafts: a plain round adds a view, no copy)
    proposer: Proposer | None = field(default=None, repr=False)  # its own drafter rows (None: none, or batched)
    runner: Any = field(default=None, repr=False)  # its proposer's row runner lent by the engine's pool (None: none,
    # or eager rows)
    chained: bool = False  # drafts the engine's chain or static tree with the other chained rows, in one drafter call
    # per step (a sampled row: chains, BatchDrafts.samples)
    generator: torch.Generator | None = field(default=None, repr=False)
    started: float = 0.0

    def __post_init__(self):
        if not self.prompt_ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        self.result = GenerationResult(list(self.prompt_ids), [])
        self.eos = frozenset(int(t) for t in self.eos_token_ids)
        if self.sampling is not None and self.sampling.greedy:
            self.sampling = None

    @property
    def room(self) -> int:
        return self.max_new_tokens - len(self.result.token_ids)


@dataclass
class _Carry:
    """What a chained round left pending for every live row, on the device: row b's drafter has not consumed
    features[b, :counts[b]], whose next tokens (x_{t+1}, contract 4) are ids[b, :counts[b]] (the tokens row b
    emitted that round). The round after drafts from it directly; anything else first settles it into the rows'
    pending parts."""

    features: torch.Tensor  # [B, W, F]
    ids: torch.Tensor  # [B, W] long
    counts: list[int]

    def keep(self, rows: list[int]) -> _Carry | None:
        """The carry of the kept batch rows, in order (None for none)."""
        if not rows:
            return None
        idx = to_device(rows, self.ids.device)
        return _Carry(self.features.index_select(0, idx), self.ids.index_select(0, idx),
                      [self.counts[b] for b in rows])


class BatchEngine:
    """Speculative decoding of many sequences at once over an HFBatchTarget (see the module docstring)."""

    def __init__(self, target: HFBatchTarget, drafter: nn.Module | None = None, spec: TreeSpec | None = None, *,
                 max_batch: int = 8, prefill_chunk: int = 512, speculate_up_to: int | None = None,
                 adaptive: bool | None = False, max_tokens: int | None = None, kernels: bool | None = None,
                 draft_runner: Callable[[nn.Module], Any] | None = None, kv_budget: int | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
        self.target, self.drafter = target, drafter
        self.spec = spec or TreeSpec()
        self.max_batch, self.prefill_chunk = max_batch, prefill_chunk
        self.max_tokens = max_tokens  # None: no bound beyond max_batch
        self.kv_budget = kv_budget  # bytes the target's and the batched drafts' KV buffers may come to (None: any)
        self.speculate_up_to = speculate_up_to
        self.adaptive = adaptive  # True: every round planned; None: rounds of greedy rows only; False: none
        self.plan: DepthPlan | None = None  # the depth per batch size (adaptive; calibrate() makes it)
        self._forced: int | None = None  # calibrate's depth for every round
        self.kernels = kernels
        # the row runner of a request with its own proposer (dynamic trees, sampled rows): e.g. functools.partial(
        # StaticDraftRunner, max_len=...), whose static KV and CUDA graphs stay with the engine for the requests to
        # come (a pool of idle runners, at most one per live row); None: eager rows (proposer.EagerRows)
        self.draft_runner = draft_runner
        self._idle_runners: list[Any] = []
        if drafter is not None:
            attach_drafter(target, drafter)
        # chains or greedy static trees of every row in one drafter call per step (draft/batch.py), where the
        # drafter allows it; `chains`: they are chains (the plan's depths are their lengths)
        self.drafts = (BatchDrafts(drafter, self.spec, kernels=kernels) if supports_batched_drafts(drafter, self.spec)
                       else None)
        self.chains = self.drafts is not None and self.spec.kind == "chain"
        self.waiting: deque[BatchRequest] = deque()
        self.live: list[BatchRequest] = []  # live[b] is the target's batch row b
        self._carry: _Carry | None = None  # every live row's pending features after a chained round
        # host wall seconds the steps have spent joining requests (prefill, the drafter's catch-up, first tokens)
        # and in rounds, since the engine was built
        self.seconds = {"join": 0.0, "round": 0.0}
        self.rounds = 0  # rounds run since the engine was built (each advances every live row)
        self.target.reset()

    # -- the queue ------------------------------------------------------------------------------
    def submit(self, request: BatchRequest) -> BatchRequest:
        """Queue a request; it joins the batch at a later step. A request whose KV alone exceeds kv_budget is an
        EagleSpecError naming both sizes."""
        if self.kv_budget is not None and (need := self.kv_bytes([request])) > self.kv_budget:
            raise EagleSpecError(f"a prompt of {len(request.prompt_ids)} tokens with max_new_tokens "
                                 f"{request.max_new_tokens} needs {need / 2**20:.1f} MiB of KV, more than the "
                                 f"{self.kv_budget / 2**20:.1f} MiB the batch may hold: send a shorter prompt or "
                                 "fewer new tokens")
        request.started = time.perf_counter()
        self.waiting.append(request)
        return request

    def cancel(self, request: BatchRequest) -> None:
        """Stop a request at the next step (its batch row freed then)."""
        request.cancelled = True

    def abort(self) -> None:
        """Drop every request (after a failed step): the live and waiting ones end as "error", the KV is freed."""
        for r in [*self.live, *self.waiting]:
            self._close(r, "error")
        self.live, self.waiting, self._carry = [], deque(), None
        self.target.reset()
        if self.drafts is not None:
            self.drafts = BatchDrafts(self.drafter, self.spec, kernels=self.kernels)

    def _clear(self, reason: str) -> None:
        """End every request as `reason`, freeing their rows in the target and the batched drafts."""
        self._drop(list(range(len(self.live))), reason)
        for r in self.waiting:
            self._close(r, reason)
        self.waiting = deque()

    @property
    def idle(self) -> bool:
        return not self.live and not self.waiting

    def generate(self, requests: Iterable[BatchRequest]) -> list[GenerationResult]:
        """Run requests to the end, batched; results in the order given."""
        reqs = [self.submit(r) for r in requests]
        while not all(r.done for r in reqs):
            self.step()
        return [r.result for r in reqs]

    def calibrate(self, buckets: Sequence[int] | None = None, steps: int = 3, prompt_len: int = 64, seed: int = 0
                  ) -> DepthPlan:
        """Measure one round's wall time at each batch-size bucket (default 1, 2, 4, ... and max_batch) and each
        depth of the plan (chains: 0..k drafts; else 0 and the tree) on random prompts of `prompt_len` tokens: the
        median of `steps` rounds after an untimed one (a new shape's capture, the drafter's catch-up). Sets and
        returns self.plan, its prior from the drafter's acceptance profile. Needs an idle engine with a drafter."""
        if self.drafter is None:
            raise EagleSpecError("calibrate needs a drafter: plain batched decoding has one depth")
        if not self.idle:
            raise EagleSpecError("calibrate needs an idle engine (no live or waiting requests)")
        if buckets is None:
            buckets = sorted({1 << i for i in range(self.max_batch.bit_length())} | {self.max_batch})
        depths = range(self.spec.depth + 1) if self.chains else range(2)
        gen = torch.Generator().manual_seed(seed)
        room = (1 + steps) * len(depths) * (self.spec.depth + 1) + 1  # no calibration row finishes while timed
        seconds: dict[int, dict[int, float]] = {}
        try:
            for batch in buckets:
                for _ in range(batch):
                    prompt = random_tokens(prompt_len, self.target.vocab_size, gen, torch.device("cpu"))
                    self.submit(BatchRequest(prompt.tolist(), room))
                while len(self.live) < batch:
                    self.step()
                seconds[batch] = {}
                for depth in depths:
                    self._forced = depth
                    times = []
                    for _ in range(1 + steps):
                        sync(self.device)
                        t0 = time.perf_counter()
                        self.step()
                        sync(self.device)
                        times.append(time.perf_counter() - t0)
                    seconds[batch][depth] = median(times[1:])
                self._clear("cancelled")  # the buffers and captured graphs stay for the requests to come
        except BaseException:
            self.abort()
            raise
        finally:
            self._forced = None
        self.plan = DepthPlan(seconds, drafter_prior(self.drafter, self.spec, self.chains))
        return self.plan

    # -- one step -------------------------------------------------------------------------------
    def step(self) -> list[tuple[BatchRequest, list[int]]]:
        """Leave, join, one round for every live row, finish. Returns (request, tokens it emitted this step) for
        every request that emitted; a request is finished when its `done` is set."""
        self._leave()
        t0 = time.perf_counter()
        events = self._join()
        t1 = time.perf_counter()
        if self.live:
            events += self._round()
            self.rounds += 1
        self.seconds["join"] += t1 - t0
        self.seconds["round"] += time.perf_counter() - t1
        self._finish()
        return events

    def _leave(self) -> None:
        """Cancelled requests leave the queue and the batch."""
        for r in [r for r in self.waiting if r.cancelled]:
            self.waiting.remove(r)
            self._close(r, "cancelled")
        self._drop([b for b, r in enumerate(self.live) if r.cancelled], "cancelled")

    def _join(self) -> list[tuple[BatchRequest, list[int]]]:
        """Prefill waiting requests, in order, while the batch has room: `prefill_chunk` prompt tokens a step when
        rows are decoding, whole prompts when none is. Prompts that go in whole this step join together (one target
        forward per PREFILL_TOKENS padded tokens); a prompt longer than the step's budget waits for the next step
        when it fits a whole one, and goes chunk by chunk when it is longer than prefill_chunk. A request whose
        prompt is in joins the batch and emits its first token."""
        events: list[tuple[BatchRequest, list[int]]] = []
        budget = self.prefill_chunk if self.live else None
        whole: list[BatchRequest] = []  # requests whose whole prompt goes in this step, in order
        while self.waiting and len(self.live) + len(whole) < self.max_batch and (budget is None or budget > 0):
            r = self.waiting[0]
            if not self._fits(r, whole):
                break
            if r.prefilled is None:
                self._start(r)
            n = len(r.prompt_ids) - r.prefilled.length
            if r.prefilled.length == 0 and (budget is None or n <= budget):
                whole.append(self.waiting.popleft())
                budget = None if budget is None else budget - n
                continue
            if r.prefilled.length == 0 and n <= self.prefill_chunk:
                break  # it goes in whole at the next step (whole prompts join in one forward, a split one in two)
            events += self._join_whole(whole)  # they join before r: the rows stay in arrival order
            whole = []
            take = n if budget is None else min(n, budget)
            chunk = torch.tensor(r.prompt_ids[r.prefilled.length: r.prefilled.length + take], device=self.device)
            logits, feats = self.target.prefill(r.prefilled, chunk)
            r.pending.append(feats)
            if budget is not None:
                budget -= take
            if r.prefilled.length < len(r.prompt_ids):
                break  # the rest of this prompt in the next step
            self.waiting.popleft()
            events.append((r, self._enter(r, logits)))
        return events + self._join_whole(whole)

    def _join_whole(self, reqs: list[BatchRequest]) -> list[tuple[BatchRequest, list[int]]]:
        """Prefill whole prompts as new rows, in groups of at most PREFILL_TOKENS padded tokens (a longer prompt
        alone), each group in one target call; each request emits its first token and stays if it goes on."""
        events: list[tuple[BatchRequest, list[int]]] = []
        group: list[BatchRequest] = []
        for r in reqs:
            if group and (len(group) + 1) * max(len(x.prompt_ids) for x in [*group, r]) > PREFILL_TOKENS:
                events += self._enter_group(group)
                group = []
            group.append(r)
        if group:
            events += self._enter_group(group)
        return events

    def _enter_group(self, group: list[BatchRequest]) -> list[tuple[BatchRequest, list[int]]]:
        """Join the group's prompts as the next rows (one target call), then emit each one's first token; rows that
        are already done leave again."""
        first_row = self.target.batch
        outs = self.target.join_prompts([r.prompt_ids for r in group])
        events, done, going = [], [], []
        for i, (r, (logits, feats)) in enumerate(zip(group, outs)):
            r.prefilled, r.pending = None, [feats]
            events.append((r, self._first(r, logits)))
            if self._over(r):
                done.append(i)
                self._close(r, None)
            else:
                going.append(r)
        if done:  # the rows that go on stay the last rows, in the target's new order
            going = [group[b - first_row] for b in self.target.drop([first_row + i for i in done])[first_row:]]
        self._admit(going)
        return events

    def _fits(self, r: BatchRequest, joining: Sequence[BatchRequest] = ()) -> bool:
        """Whether r may join beside the live and joining rows: under max_tokens (their prompts plus
        max_new_tokens) and under kv_budget (the KV buffers their longest row sizes; submit refused a request that
        does not fit alone). A request alone always may."""
        rows = [*self.live, *joining]
        if not rows:
            return True
        if self.kv_budget is not None and self.kv_bytes([*rows, r]) > self.kv_budget:
            return False
        if self.max_tokens is None:
            return True
        held = sum(len(x.prompt_ids) + x.max_new_tokens for x in rows)
        return held + len(r.prompt_ids) + r.max_new_tokens <= self.max_tokens

    def kv_bytes(self, reqs: Sequence[BatchRequest]) -> int:
        """Bytes of KV the target and the batched drafts hold with `reqs` as the batch's rows: every row has the
        slots of the longest one (its prompt, max_new_tokens and a tree's rows), as their buffers grow."""
        slots = max(len(r.prompt_ids) + r.max_new_tokens + (r.spec or self.spec).max_nodes for r in reqs)
        held = self.target.kv_bytes(len(reqs), slots)
        return held + (self.drafts.kv_bytes(len(reqs), slots) if self.drafts is not None else 0)

    def _start(self, r: BatchRequest) -> None:
        """The request's prefill state, random stream and proposer."""
        r.prefilled = Prefilled()
        r.generator = r.sampling.generator(self.device) if r.sampling is not None else None
        spec = r.spec or self.spec
        r.chained = self.drafts is not None and spec == self.spec and (r.sampling is None or self.drafts.samples)
        if self.drafter is not None and not r.chained:
            r.runner = self._lend_runner(r, spec)
            r.proposer = Proposer(self.drafter, spec, runner=r.runner, kernels=self.kernels)
            r.proposer.sampling = r.sampling.draft_params if r.sampling is not None else None
            r.proposer.generator = r.generator

    def _lend_runner(self, r: BatchRequest, spec: TreeSpec) -> Any:
        """An idle row runner from the pool (a new one when none is idle) for r's proposer, if r's prompt, new tokens
        and tree rows fit its KV; else None (r's proposer runs eager rows)."""
        if self.draft_runner is None:
            return None
        runner = self._idle_runners.pop() if self._idle_runners else self.draft_runner(self.drafter)
        tree = Proposer(self.drafter, spec, kernels=False).tree_rows(self.drafter.cfg.draft_vocab_size)
        if len(r.prompt_ids) + r.max_new_tokens + tree > runner.max_len:
            self._idle_runners.append(runner)
            return None
        return runner

    def _first(self, r: BatchRequest, logits: torch.Tensor) -> list[int]:
        """Emit r's first token from its prompt's last logits [V] (none when max_new_tokens is 0)."""
        if r.max_new_tokens <= 0:
            return []
        if r.sampling is None:
            root = logits.argmax(-1, keepdim=True)
        else:
            root = sample(process_logits(logits, r.sampling.target), r.generator).reshape(1)
        r.tokens = list(r.prompt_ids)
        return self._emit(r, [int(root)])

    def _over(self, r: BatchRequest) -> bool:
        """Whether r has stopped (EOS) or reached max_new_tokens."""
        return r.result.finish_reason == "stop" or r.room <= 0

    def _enter(self, r: BatchRequest, logits: torch.Tensor) -> list[int]:
        """The first token from the prompt's last logits [V]; the request joins the batch with the prompt's KV
        when it goes on after that token, else it is done."""
        first = self._first(r, logits)
        if self._over(r):
            self._close(r, None)
        else:
            self.target.join(r.prefilled)
            r.prefilled = None  # the KV now lives in the batch cache
            self._admit([r])
        return first

    def _admit(self, reqs: list[BatchRequest]) -> None:
        """reqs, whose KV the target has just joined as its last rows, become the last live rows. Their drafter
        catches up on every prompt feature but the last now, the chained rows in one call: the round that drafts
        from a prompt takes that one row, not the prompt."""
        self._settle()
        if self.drafts is not None:
            first = self.drafts.batch
            for _ in reqs:
                self.drafts.join()
            heads = [self._split_pending(r) if r.chained else r.pending[0][:0] for r in reqs]
            self.drafts.catch_up(range(first, first + len(reqs)), heads,
                                 [self._next_ids(r, 0, h) for r, h in zip(reqs, heads)])
        for r in reqs:
            if r.proposer is not None and r.proposer.spec.speculates:
                head = self._split_pending(r)
                if head.shape[0]:
                    r.proposer.catch_up(head, torch.tensor(self._next_ids(r, 0, head), device=self.device))
        self.live.extend(reqs)

    def _split_pending(self, r: BatchRequest) -> torch.Tensor:
        """Row r's pending features but the last [n - 1, F]; the last stays pending."""
        feats = self._take_pending(r)
        r.pending = [feats[-1:]]
        return feats[:-1]

    # -- the round ------------------------------------------------------------------------------
    def _round(self) -> list[tuple[BatchRequest, list[int]]]:
        """One round for every live row: draft per row, one batched verify, accept and publish per row."""
        t0 = time.perf_counter()
        plan = self._plan()
        depth = self._depth(plan)  # the chained rows' drafts this round; 0: a plain step for every row
        drafting = depth > 0
        shapes = {self._shape(r, drafting) for r in self.live}
        if shapes == {"chain"} or shapes == {"plain"}:
            events, accepted = self._chain_round(depth if shapes == {"chain"} else 0, t0)
            if plan is not None:
                plan.record(depth, [m for r, m in zip(self.live, accepted) if r.sampling is None], chain=self.chains)
            return events
        self._settle()
        trees = self._draft_all(depth)
        flats = [flatten(t) for t in trees]
        rows = stack_flat(flats)  # [B, W]: every tree padded to the widest
        t1 = time.perf_counter()
        out = self.target.forward(rows.tokens, rows.depths, rows.visible)
        accs = greedy_accept_rows(rows, out.logits)  # every row's greedy walk, one host sync
        for b, (r, tree, flat) in enumerate(zip(self.live, trees, flats)):
            if r.sampling is not None:  # lossless rejection sampling with the row's own processors and generator
                p = process_logits(out.logits[b, : flat.tokens.shape[0]], r.sampling.target)  # [T_b, V]
                accs[b] = sample_accept(flat, p, tree.draft_probs, r.generator)
        t2 = time.perf_counter()
        self.target.commit([a.rows for a in accs])
        events = []
        for b, (r, tree, acc) in enumerate(zip(self.live, trees, accs)):
            if r.proposer is not None or r.chained:  # the accepted rows' features reseed the drafter
                r.pending.append(out.features[b].index_select(0, acc.rows))
            r.result.rounds.append(RoundStats(drafted=tree.size - 1, accepted=acc.accepted, emitted=0,
                                              draft_s=t1 - t0, verify_s=t2 - t1))
            emitted = self._emit(r, [*acc.tokens[1:], acc.bonus])
            r.result.rounds[-1].emitted = len(emitted)
            events.append((r, emitted))
        t3 = time.perf_counter()
        for r in self.live:
            r.result.rounds[-1].commit_s = t3 - t2
        if plan is not None:
            plan.record(depth, [a.accepted for r, a in zip(self.live, accs) if r.sampling is None], chain=False)
        return events

    def _shape(self, r: BatchRequest, drafting: bool) -> str:
        """What row r verifies this round: "chain" (the engine's greedy chain, drafted with the other chained
        rows), "plain" (its root alone) or "tree" (the engine's static tree, or its own proposer's)."""
        if not drafting:
            return "plain"
        if r.chained:
            return "chain" if self.chains else "tree"
        return "tree" if r.proposer is not None and r.proposer.spec.speculates else "plain"

    def _chain_round(self, depth: int, t0: float) -> tuple[list[tuple[BatchRequest, list[int]]], list[int]]:
        """A round where every row verifies the same shape: a chain of k = depth drafts of the engine's chains, or
        (depth 0) its root alone. Drafts, verify, acceptance and commit are [B, k + 1] tensors, read in one host
        sync; each row's accepted prefix is already in place in the target's KV. Returns the events and each row's
        accepted drafts."""
        dev, live = self.device, self.live
        B = len(live)
        tokens = self._roots(live)[:, None]  # [B, 1]
        q: dict[int, torch.Tensor] = {}  # the sampled rows' draft distributions [k + 1, V], by batch row
        if depth > 0:
            groups = self.drafts.sampled_rows(range(B), self._row_sampling(live), depth)
            if self._carry is not None:  # the last round's accepted rows, as it left them on the device
                carry, self._carry = self._carry, None
                drafts = self.drafts.draft_block(carry.features, carry.ids, carry.counts, depth, groups)  # [B, k]
            else:
                pending = [self._take_pending(r) for r in live]
                nxt = [self._next_ids(r, c, p) for r, c, p in zip(live, self.drafts.committed, pending)]
                drafts = self.drafts.draft(range(B), pending, nxt, depth, groups)  # [B, k]
            q = self.drafts.row_probs(groups)
            tokens = torch.cat([tokens, drafts], dim=1)
        else:
            self._settle()  # a plain step: every row's features stay pending
        W = tokens.shape[1]
        depths = torch.arange(W, device=dev).expand(B, W)
        visible = torch.ones(W, W, dtype=torch.bool, device=dev).tril().expand(B, W, W)
        t1 = time.perf_counter()
        out = self.target.forward(tokens, depths, visible)
        accepted, emitted = greedy_chain_walk(tokens, out.logits)  # [B], [B, W]
        self._sample_chains(tokens, out.logits, q, accepted, emitted)
        accs = read_chains(accepted, emitted)  # (accepted, emitted tokens) per row, one host sync
        t2 = time.perf_counter()
        self.target.commit_prefixes([m + 1 for m, _ in accs])
        features = out.features.clone() if self.drafter is not None else None  # outlives the next forward
        if features is not None and depth > 0:  # every row's drafter consumed what was pending: the accepted rows'
            # features reseed it, left on the device for the next round
            ids = to_device([e + [0] * (W - len(e)) for _, e in accs], dev)  # [B, W]: x_{t+1} of each row
            self._carry = _Carry(features, ids, [m + 1 for m, _ in accs])
        elif features is not None:
            for r, (m, _), part in zip(live, accs, features):
                r.pending.append(part[: m + 1])
        events = []
        for r, (m, emit) in zip(live, accs):
            emitted = self._emit(r, emit)
            r.result.rounds.append(RoundStats(drafted=W - 1, accepted=m, emitted=len(emitted), draft_s=t1 - t0,
                                              verify_s=t2 - t1))
            events.append((r, emitted))
        t3 = time.perf_counter()
        for r in live:
            r.result.rounds[-1].commit_s = t3 - t2
        return events, [m for m, _ in accs]

    def _sample_chains(self, tokens: torch.Tensor, logits: torch.Tensor, q: dict[int, torch.Tensor],
                       accepted: torch.Tensor, emitted: torch.Tensor) -> None:
        """Overwrite the sampled rows' accepted [B] and emitted [B, W] (greedy_chain_walk's) by lossless rejection
        sampling of their chains tokens [B, W] under logits [B, W, V]: rows with the same target processors and
        scheme (q rows or point mass) at once, each row's coins and bonus drawn from its own generator in
        sample_accept's order, so that it emits what it emits alone. No host sync."""
        groups: dict[tuple[SamplingParams, bool], list[int]] = {}
        for b, r in enumerate(self.live):
            if r.sampling is not None:
                groups.setdefault((r.sampling.target, b in q), []).append(b)
        W = tokens.shape[1]
        for (params, has_q), rows in groups.items():
            gens = [self.live[b].generator for b in rows]
            idx = to_device(rows, self.device)
            coins = torch.cat([torch.rand((1, W), generator=g, device=self.device) for g in gens])  # [n, W]
            draft_probs = torch.stack([q[b] for b in rows]) if has_q else None
            m, residual = sample_accept_chains(tokens[idx], process_logits(logits[idx], params), draft_probs, coins)
            bonus = torch.cat([torch.multinomial(residual[i: i + 1], 1, generator=g) for i, g in enumerate(gens)])
            row = torch.cat([tokens[idx, 1:], bonus], dim=1).scatter(1, m[:, None], bonus)  # drafts 1..m, the bonus
            accepted.index_copy_(0, idx, m)
            emitted.index_copy_(0, idx, row)

    def _row_sampling(self, reqs: Sequence[BatchRequest]) -> list[RowSampling | None]:
        """Each request's draft processors and generator for the batched drafts (None: a greedy row)."""
        return [None if r.sampling is None else RowSampling(r.sampling.draft_params, r.generator) for r in reqs]

    def _plan(self) -> DepthPlan | None:
        """The depth plan when it decides this round (adaptive, with a drafter, within speculate_up_to), else None."""
        if self.plan is None or self.adaptive is False or not self._speculates() or self._forced is not None:
            return None
        if self.adaptive is None and any(r.sampling is not None for r in self.live):
            return None
        return self.plan

    def _speculates(self) -> bool:
        """Whether this round may draft: the live batch is within speculate_up_to."""
        return self.speculate_up_to is None or len(self.live) <= self.speculate_up_to

    def _depth(self, plan: DepthPlan | None) -> int:
        """The chained rows' drafts this round (calibrate's, the plan's, else the engine's depth); 0: a plain step
        for every row. Rows with their own proposer draft their tree when it is > 0."""
        if self._forced is not None:
            return self._forced
        if plan is not None:
            return plan.depth(len(self.live))
        if not self._speculates():
            return 0
        return self.spec.depth if self.chains else 1

    def _draft_all(self, depth: int) -> list[DraftTree]:
        """Every live row's tree: the chained rows' chains of `depth` drafts or static trees in one drafter call per
        step, the others' row by row (their own trees when depth > 0, else the root alone)."""
        rows = [b for b, r in enumerate(self.live) if r.chained and depth > 0]
        chained = set(rows)
        trees = [None if b in chained else self._draft(r, depth > 0) for b, r in enumerate(self.live)]
        if rows:
            reqs = [self.live[b] for b in rows]
            pending = [self._take_pending(r) for r in reqs]
            nxt = [self._next_ids(r, self.drafts.committed[b], p) for b, r, p in zip(rows, reqs, pending)]
            drafted = self.drafts.propose(rows, self._roots(reqs), pending, nxt, depth, self._row_sampling(reqs))
            for b, tree in zip(rows, drafted):
                trees[b] = tree
        return trees

    def _draft(self, r: BatchRequest, drafting: bool) -> DraftTree:
        """Row r's tree: its proposer catches up on the rows it has not consumed and grows the tree below the
        root; without drafting, the root alone (a plain step: its features stay pending)."""
        root = self._root(r)
        if not drafting or r.proposer is None or not r.proposer.spec.speculates:
            return chain_tree(root, root.new_zeros(0))
        pending = self._take_pending(r)
        next_tokens = torch.tensor(self._next_ids(r, r.proposer.committed, pending), device=self.device)
        return r.proposer.propose(root, pending, next_tokens)

    def _settle(self) -> None:
        """The carry's rows become each live row's last pending part (before the batch changes, or a round that
        does not draft every row from it)."""
        carry, self._carry = self._carry, None
        if carry is not None:
            for r, part, n in zip(self.live, carry.features, carry.counts):
                r.pending.append(part[:n])

    def pending(self, b: int) -> int:
        """Feature rows of batch row b that its drafter has not consumed."""
        held = self._carry.counts[b] if self._carry is not None else 0
        return held + sum(part.shape[0] for part in self.live[b].pending)

    @staticmethod
    def _take_pending(r: BatchRequest) -> torch.Tensor:
        """Row r's pending features as one [n, F] tensor; none are pending afterwards."""
        parts, r.pending = r.pending, []
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    @staticmethod
    def _next_ids(r: BatchRequest, committed: int, features: torch.Tensor) -> list[int]:
        """The token after each of r's pending feature rows f_t, t = committed.. (x_{t+1}, contract 4)."""
        return r.tokens[committed + 1: committed + 1 + features.shape[0]]

    def _root(self, r: BatchRequest) -> torch.Tensor:
        """Row r's last token [1]: the root of its next tree."""
        return torch.tensor(r.tokens[-1:], device=self.device)

    def _roots(self, reqs: Sequence[BatchRequest]) -> torch.Tensor:
        """The rows' last tokens [R] (the roots of their next trees), in one copy."""
        return to_device([r.tokens[-1] for r in reqs], self.device)

    # -- finishing ------------------------------------------------------------------------------
    def _emit(self, r: BatchRequest, tokens: list[int]) -> list[int]:
        """Cut tokens as HF generate stops (at the first EOS, kept, or at max_new_tokens) and record them."""
        out = tokens[: r.room]
        for i, tok in enumerate(out):
            if tok in r.eos:
                out = out[: i + 1]
                r.result.finish_reason = "stop"
                break
        r.result.token_ids.extend(out)
        r.tokens.extend(out)
        return out

    def _finish(self) -> None:
        """Rows that stopped or reached max_new_tokens leave the batch."""
        self._drop([b for b, r in enumerate(self.live) if self._over(r)], None)

    def _drop(self, rows: list[int], reason: str | None) -> None:
        """The live rows `rows` end (as `reason`) and leave: their rows freed in the target and the batched drafts,
        the live rows and the carry in the target's new order (rows.compaction)."""
        if not rows:
            return
        order = self.target.drop(rows)
        if self.drafts is not None:
            self.drafts.drop(rows)
        if self._carry is not None:
            self._carry = self._carry.keep(order)
        for b in rows:
            self._close(self.live[b], reason)
        self.live = [self.live[b] for b in order]

    def _close(self, r: BatchRequest, reason: str | None) -> None:
        if reason is not None:
            r.result.finish_reason = reason
        r.result.seconds = time.perf_counter() - r.started
        r.result.backend = self.target.name
        r.done = True
        if r.runner is not None:
            self._idle_runners.append(r.runner)
        r.proposer = r.prefilled = r.runner = None
        r.pending = []
        r.tokens = []

    @property
    def graphs(self) -> int:
        """CUDA graphs captured and held: the target's verify graphs and the batched drafts'."""
        return self.target.graphs + (self.drafts.graphs if self.drafts is not None else 0)

    @property
    def device(self) -> torch.device:
        return self.target.device
