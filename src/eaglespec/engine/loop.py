"""The generation loop: prefill, then rounds of draft -> verify -> accept -> publish.

State between rounds (contract 7, docs/contracts.md): `ids` holds every emitted token; the target has committed KV
and features for ids[:-1]; ids[-1] (the bonus / frontier token) is emitted but not yet in the target's KV: it is
the root row of the next verification forward. `pending` holds the target features the drafter has not consumed.

A round runs as one replay of a captured CUDA graph (engine/round_graph.py) when the engine has round graphs and
they can run this round (`RoundGraphs.can_run`), else stage by stage (`SpeculativeEngine._eager_round`): the same
stages over the same state either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from eaglespec.backends.base import TargetBackend, TargetOutput
from eaglespec.draft.proposer import Proposer, shifted_tokens
from eaglespec.engine.gate import SpeculationGate
from eaglespec.engine.round_graph import RoundGraphs, unusable_reason
from eaglespec.engine.state import GenerationResult, HostRead, RoundContext, RoundStats
from eaglespec.sampling import SamplingConfig, process_logits, sample
from eaglespec.telemetry import round_detail
from eaglespec.tree.core import DraftTree, TreeSpec, flatten
from eaglespec.verify import greedy_accept, sample_accept


def prefill(target: TargetBackend, prompt: torch.Tensor, chunked: bool = False) -> TargetOutput:
    """Forward and commit the prompt [n] on a freshly reset target. Returns logits [1, V] of the last row (they
    give the first token) and features [n, F] of every row (the drafter's first pending features).

    chunked=False, a target without `buckets` (HFTarget), or a prompt within the largest bucket: one forward of
    the n rows, then commit them all (a FastTarget runs a prompt past its largest bucket as one eager pass at its
    exact size: launch-bound on a GPU). chunked=True on a FastTarget with buckets and n > the largest bucket c:
    chunks of c rows (the last one shorter), each a plain causal forward then a commit of all its rows, so each
    chunk attends to the committed prefix plus its own causal block and runs as a captured bucket step: the same
    logits and features as the one pass up to float rounding, and the same committed KV.
    """
    n = prompt.numel()
    size = max(getattr(target, "buckets", None) or (0,))
    if not chunked or size < 1 or n <= size:
        out = target.forward(prompt)
        target.commit(torch.arange(n, device=prompt.device))
        return TargetOutput(logits=out.logits[-1:], features=out.features)
    feats, keep = [], torch.arange(size, device=prompt.device)
    for start in range(0, n, size):
        out = target.forward(prompt[start:start + size])
        target.commit(keep[: out.logits.shape[0]])
        feats.append(out.features)
    return TargetOutput(logits=out.logits[-1:], features=torch.cat(feats))


class _PlainRows:
    """Constant row tensors of a plain-decoding round (one tree-less row per round)."""

    def __init__(self, device: torch.device):
        self.rows = torch.zeros(1, dtype=torch.long, device=device)  # the kept (and accepted) row
        self.parents = torch.full((1,), -1, dtype=torch.long, device=device)
        self.depths = torch.zeros(1, dtype=torch.long, device=device)


class _Queue:
    """Contract 7's state of an adaptive stream between rounds, with plain steps' outputs kept as lists: ids =
    cat(ids parts) (every token, the last the root), pending features = cat(feature parts) (the rows the drafter
    has not consumed). A plain step appends one part to each; the next drafted round joins them once."""

    def __init__(self, ids: torch.Tensor, feats: torch.Tensor):
        self.ids, self.feats = [ids], [feats]
        self.root = ids[-1:]  # [1]: the next round's root row

    def push(self, token: torch.Tensor, feats: torch.Tensor) -> None:
        self.ids.append(token)
        self.feats.append(feats)
        self.root = token

    def joined(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids [N+1], pending features [n, F]), as the non-adaptive loop holds them."""
        if len(self.ids) == 1:
            return self.ids[0], self.feats[0]
        return torch.cat(self.ids), torch.cat(self.feats)


class SpeculativeEngine:
    """Speculative decoding (greedy, or lossless sampling) of one sequence with a target backend and an optional
    drafter. engine/build.py builds one from an EngineConfig; nothing changes it after construction.

    draft_runner: makes the runner of the drafter's rows, once the drafter is attached to the target (None: eager
    rows; e.g. functools.partial(StaticDraftRunner, max_len=...): static KV and CUDA graphs).
    round_graphs: replay a whole round as one graph (engine/round_graph.py) where the round allows it.
    kernels: the Triton kernels for tree growth, acceptance and the round's tail (None: on CUDA where triton imports).
    overlap: queue the next round (or plain step) before the host reads this one's tokens.
    chunked_prefill: prefill a prompt longer than the fast target's largest bucket in chunks of that bucket.
    adaptive: per round, draft or take a plain step, whichever has cost less time per token (engine/gate.py).
    """

    def __init__(self, target: TargetBackend, drafter: nn.Module | None = None, spec: TreeSpec | None = None,
                 sampling: SamplingConfig | None = None, *, draft_runner: Callable[[nn.Module], Any] | None = None,
                 round_graphs: bool = False, kernels: bool | None = None, adaptive: bool = False, overlap: bool = False,
                 chunked_prefill: bool = False):
        self.target = target
        self.spec = spec or TreeSpec()
        self.drafter = drafter
        self.proposer: Proposer | None = None
        if drafter is not None:
            attach_drafter(target, drafter)
            runner = draft_runner(drafter) if draft_runner is not None else None
            self.proposer = Proposer(drafter, self.spec, runner, kernels=kernels)
        self.sampling = sampling  # None or temperature 0: the exact greedy path
        self.adaptive = adaptive
        self.overlap = overlap
        self.chunked_prefill = chunked_prefill
        self.graphs: RoundGraphs | None = None
        inner = getattr(target, "inner", target)  # a wrapper (e.g. bench's synchronizing proxy) exposes `inner`
        if round_graphs and unusable_reason(inner, self.proposer, self.spec) is None:
            self.graphs = RoundGraphs(inner, self.proposer, overlap=overlap, kernels=kernels)
        self.gate: SpeculationGate | None = None  # the last stream's gate (adaptive), readable after it
        self._ctx: RoundContext | None = None  # the current stream() call's RoundContext
        self._streams = 0
        self._stop: tuple[frozenset[int], int] = (frozenset(), 0)  # the stream's EOS ids and max_new_tokens
        self._plain_ahead: tuple[torch.Tensor, TargetOutput] | None = None  # (root, its forward), launched ahead
        self._host_read: HostRead | None = None  # the plain step's token, read past the step launched ahead

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int = 128, eos_token_ids: Sequence[int] = (),
               result: GenerationResult | None = None, sampling: SamplingConfig | None = None,
               spec: TreeSpec | None = None) -> Iterator[list[int]]:
        """Yield the tokens emitted by each round (the first yield is the prefill's token). `sampling` and `spec`
        override the engine's for this call."""
        if not prompt_ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        result = result if result is not None else GenerationResult(list(prompt_ids), [])
        result.backend = self.target.name
        eos = frozenset(eos_token_ids)
        start = time.perf_counter()
        target, dev = self.target, getattr(self.target, "device", torch.device("cpu"))
        spec = spec or self.spec
        self._begin(spec, sampling, dev)
        self._stop, self._plain_ahead = (eos, max_new_tokens), None
        if max_new_tokens <= 0:
            result.seconds = time.perf_counter() - start
            return

        # prefill: commit the prompt; its last logits give the first token (the first root)
        prompt = torch.tensor(list(prompt_ids), dtype=torch.long, device=dev)
        out = prefill(target, prompt, self.chunked_prefill)
        root = self._next_token(out.logits[-1])  # [1] on the device: the next round's root row
        first = int(root)
        result.token_ids.append(first)
        yield [first]
        if first in eos:
            result.finish_reason = "stop"
        speculating = self.proposer is not None and spec.speculates
        plain_rows = _PlainRows(dev)
        if speculating:  # every token on the device, and the features the drafter has not consumed yet
            ids, pending = torch.cat([prompt, root]), out.features
            if self.graphs is not None:  # the drafter's prefill, so that the first round fits a round graph
                pending = self._draft_prefill(ids, pending, self.graphs.catch_up_rows(spec))
        gate = self.gate = SpeculationGate() if self.adaptive and speculating else None
        if gate is not None:  # plain steps queue their tokens and features in lists, joined at the next draft
            queue = _Queue(ids, pending)
        while result.finish_reason != "stop" and len(result.token_ids) < max_new_tokens:
            if gate is not None:
                drafting, t0 = gate.draft(), time.perf_counter()
                if drafting:
                    emitted, ids, pending = self._round(*queue.joined(), result)
                    queue = _Queue(ids, pending)
                else:
                    emitted = self._undrafted_round(queue, plain_rows, result)
                gate.record(drafting, len(emitted), time.perf_counter() - t0)
            elif speculating:
                emitted, ids, pending = self._round(ids, pending, result)
            else:
                emitted, root, _ = self._plain_round(root, plain_rows, result, ahead=self.overlap)
            emitted = self._cut(emitted, eos, max_new_tokens - len(result.token_ids), result)
            result.token_ids.extend(emitted)
            result.rounds[-1].emitted = len(emitted)
            yield emitted
        result.seconds = time.perf_counter() - start

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 128, eos_token_ids: Sequence[int] = (),
                 sampling: SamplingConfig | None = None, spec: TreeSpec | None = None) -> GenerationResult:
        result = GenerationResult(list(prompt_ids), [])
        for _ in self.stream(prompt_ids, max_new_tokens, eos_token_ids, result, sampling, spec):
            pass
        return result

    # -- one stream's state ------------------------------------------------------------------------
    def _begin(self, spec: TreeSpec, sampling: SamplingConfig | None, dev: torch.device) -> None:
        """Reset the target and the proposer and set this stream's RoundContext: the tree, the processors in
        force and a freshly seeded generator."""
        self.target.reset()
        cfg = sampling if sampling is not None else self.sampling
        cfg = None if cfg is None or cfg.greedy else cfg
        generator = cfg.generator(dev) if cfg is not None else None
        if self.proposer is not None:
            self.proposer.spec = spec
            self.proposer.sampling = cfg.draft_params if cfg is not None else None
            self.proposer.generator = generator
            self.proposer.reset()
        self._streams += 1
        self._ctx = RoundContext(self._streams, spec, cfg, generator, self._goes_on)

    def _goes_on(self, emitted: list[int], done: int, then: int = 0) -> bool:
        """Whether the stream goes on to another round after `done` tokens, this round's `emitted` (not yet among
        them) and `then` more: no adaptive gate (its next round may be a plain step), no EOS among them, and room
        left. What may launch the next round ahead (overlap)."""
        eos, max_new_tokens = self._stop
        room = max_new_tokens - done
        return self.gate is None and len(emitted) + then < room and eos.isdisjoint(emitted)

    def _next_token(self, logits: torch.Tensor) -> torch.Tensor:
        """The token after one row's logits [V], as a [1] device tensor (no host sync): argmax, or a sample of the
        processed target distribution."""
        ctx = self._ctx
        if ctx.sampling is None:
            return logits.argmax(-1, keepdim=True)
        return sample(process_logits(logits, ctx.sampling.target), ctx.generator).reshape(1)

    @staticmethod
    def _cut(emitted: list[int], eos: frozenset[int], room: int, result: GenerationResult) -> list[int]:
        """Stop exactly as HF generate does: at the first EOS (kept) or at max_new_tokens."""
        for i, tok in enumerate(emitted[:room]):
            if tok in eos:
                result.finish_reason = "stop"
                return emitted[: i + 1]
        return emitted[:room]

    # -- plain steps -------------------------------------------------------------------------------
    def _plain_round(self, root: torch.Tensor, rows: _PlainRows, result: GenerationResult, ahead: bool = False
                     ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Plain decoding, no tree: the root [1] -> one forward -> the next token (one host sync). Returns
        ([token], the token [1] on the device, the root's features [1, F]).

        ahead (overlap): the next token's forward is launched before the host reads the token, unless this token
        is the stream's last by length; the next call with that token as its root takes it instead of launching
        its own. An EOS found by the read leaves the launched step unused (the next stream resets the target)."""
        t0 = time.perf_counter()
        launched, self._plain_ahead = self._plain_ahead, None
        if launched is not None and launched[0] is root:
            out = launched[1]
        else:
            out = self.target.forward(root)
        nxt = self._next_token(out.logits[-1])  # [1]: the next round's root, still on the device
        self.target.commit(rows.rows)
        if ahead and len(result.token_ids) + 1 < self._stop[1]:
            if self._host_read is None:
                self._host_read = HostRead(nxt.device)
            self._host_read.start(nxt)  # queued before the next step, so reading it waits for this step only
            self._plain_ahead = (nxt, self.target.forward(nxt))
            token = self._host_read.wait()
        else:
            token = int(nxt)
        t1 = time.perf_counter()
        detail = round_detail(DraftTree(tokens=root, parents=rows.parents, depths=rows.depths), rows.rows)
        result.rounds.append(RoundStats(drafted=0, accepted=0, emitted=1, verify_s=t1 - t0,
                                        commit_s=time.perf_counter() - t1, detail=detail))
        return [token], nxt, out.features

    def _undrafted_round(self, queue: _Queue, rows: _PlainRows, result: GenerationResult) -> list[int]:
        """A plain step inside a speculative stream (the gate chose it): the root alone -> the next token, with
        the token and the root's features queued for the drafter's next catch-up."""
        emitted, nxt, feats = self._plain_round(queue.root, rows, result)
        queue.push(nxt, feats)
        return emitted

    def _draft_prefill(self, ids: torch.Tensor, pending: torch.Tensor, keep: int) -> torch.Tensor:
        """Catch the drafter up on all but the last `keep` pending rows [n, F] (after the prefill: the prompt's);
        returns the rows left pending. The drafter's rows and KV are the ones the first round's catch-up would
        compute, in two calls instead of one (proposer.committed + the pending rows = the target's committed
        length)."""
        n = pending.shape[0] - keep
        if n <= 0:
            return pending
        self.proposer.catch_up(pending[:n], shifted_tokens(ids, self.proposer.committed, n))
        return pending[n:]

    # -- the speculative round ---------------------------------------------------------------------
    def _round(self, ids: torch.Tensor, pending: torch.Tensor, result: GenerationResult):
        """One speculative round: a replay of the round graph where one can run it, else stage by stage. Returns
        (emitted tokens, ids, pending) after the round."""
        graphs, ctx = self.graphs, self._ctx
        if graphs is not None and graphs.can_run(ctx, ids, pending):
            out = graphs.replay(ctx, ids, pending, result)
            if out is not None:  # None: the capture failed (warned once); this round runs stage by stage
                return out
        return self._eager_round(ids, pending, result)

    def _eager_round(self, ids: torch.Tensor, pending: torch.Tensor, result: GenerationResult):
        """One speculative round, stage by stage. ids [N+1]: every token so far (the last is the root) on the
        device; pending [n, F]: target features the drafter has not consumed yet (the last n rows)."""
        target, ctx = self.target, self._ctx
        root = result.token_ids[-1]  # ids[-1]: emitted, not yet in the target's KV (the tree's root row)
        t0 = time.perf_counter()
        # 1. draft: catch the drafter up on the verified rows, then grow the tree below the root
        next_tokens = shifted_tokens(ids, self.proposer.committed, pending.shape[0])  # x_{t+1}, contract 4
        tree: DraftTree = self.proposer.propose(root, pending, next_tokens)
        flat = flatten(tree)
        t1 = time.perf_counter()
        # 2. verify: one target forward over the tree rows, each seeing its ancestors only
        out = target.forward(flat.tokens, flat.depths, flat.visible)
        # 3. accept: the greedy walk, or lossless rejection sampling (real q where the tree records draft_probs)
        if ctx.sampling is None:
            acc = greedy_accept(flat, out.logits)
        else:
            p = process_logits(out.logits, ctx.sampling.target)  # [T, V]
            acc = sample_accept(flat, p, tree.draft_probs, ctx.generator)
        t2 = time.perf_counter()
        # 4. publish (contract 7): commit the accepted rows' KV, gathered by the flatten map, never by token
        # equality; their features reseed the drafter; the bonus token is the next root
        target.commit(acc.rows)
        pending = out.features[acc.rows]
        ids = torch.cat([ids, acc.path_tokens[1:], acc.bonus_token])  # on the device: no host->device copy
        emitted = [*acc.tokens[1:], acc.bonus]  # read in acceptance's single host sync
        t3 = time.perf_counter()
        result.rounds.append(RoundStats(drafted=tree.size - 1, accepted=acc.accepted, emitted=len(emitted),
                                        draft_s=t1 - t0, verify_s=t2 - t1, commit_s=t3 - t2,
                                        detail=round_detail(tree, acc.rows)))
        return emitted, ids, pending


def attach_drafter(target: TargetBackend, drafter: torch.nn.Module) -> None:
    """Give the drafter what it shares with the target (the embedding; EAGLE-1: the final norm and lm_head) and
    make the target capture the drafter's aux features."""
    if hasattr(drafter, "set_target_embedding") and getattr(drafter, "embed_tokens", None) is None:
        drafter.set_target_embedding(target.embedding())
    if hasattr(drafter, "set_target_head"):  # EAGLE-1: the target's final norm + lm_head
        from eaglespec.draft.eagle1 import target_head

        drafter.set_target_head(*target_head(target), num_layers=target.num_layers)
    target.set_feature_layers(tuple(drafter.feature_layer_ids))
