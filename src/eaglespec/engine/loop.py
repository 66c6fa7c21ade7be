"""The generation loop: prefill, then rounds of draft -> verify -> accept -> publish -> reseed.

State between rounds (DESIGN.md contract 7): `ids` holds every emitted token; the target has
committed KV and features for ids[:-1]; ids[-1] (the bonus / frontier token) is emitted but
append-required: it is the root row of the next verification forward.

Switches read from the environment:
    EAGLESPEC_CHUNKED_PREFILL  "1": a prompt longer than a FastTarget's largest bucket is prefilled in chunks of
                               that bucket (captured steps) instead of one eager pass; "0": one pass; unset: on
                               for CUDA (see `chunked_prefill_wanted`; read when the engine is built)
    EAGLESPEC_OVERLAP          "1": launch the next round (or plain step) before the host reads this one's tokens,
                               so the host's work per round runs while the GPU computes; "0": one round at a time;
                               unset: on for a fast target on CUDA (see `overlap_wanted`); round graphs keep
                               two rounds in flight unless EAGLESPEC_TWO_IN_FLIGHT=0 (round_graph.py)
    EAGLESPEC_DRAFT_PREFILL    "0": an engine with round graphs runs each stream's first round by phases (the
                               drafter catches up on the whole prompt there); "1" or unset: the drafter's prefill
                               takes all but the prompt's last P rows first, so the first round is a round graph
                               too (`_draft_prefill`; read at each stream's start)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from eaglespec.backends.base import TargetBackend, TargetOutput
from eaglespec.draft.proposer import Proposer, shifted_tokens
from eaglespec.engine.gate import SpeculationGate
from eaglespec.errors import env_switch
from eaglespec.sampling import SamplingConfig, process_logits, sample
from eaglespec.telemetry import round_detail
from eaglespec.tree.core import DraftTree, TreeSpec, flatten
from eaglespec.verify import greedy_accept, sample_accept

CHUNKED_PREFILL_ENV = "EAGLESPEC_CHUNKED_PREFILL"  # "1" on, "0" off, unset or "": on for CUDA
OVERLAP_ENV = "EAGLESPEC_OVERLAP"  # "1" on, "0" off, unset or "": on for a fast target on CUDA
DRAFT_PREFILL_ENV = "EAGLESPEC_DRAFT_PREFILL"  # "0" off, "1" or unset: on where the engine has round graphs


def _switch(name: str, unset: str, default: bool) -> bool:
    """$name as errors.env_switch reads it ("1", "0"; anything else refused in one line), else `default`."""
    flag = env_switch(name, unset, strip=True)
    return default if flag is None else flag


def chunked_prefill_wanted(device: torch.device | str = "cpu") -> bool:
    """$EAGLESPEC_CHUNKED_PREFILL: "1" -> True, "0" -> False, "" or unset -> whether `device` is CUDA. Measured on
    an H200 (session 12, HumanEval 164, bf16): plain decoding 801 -> 837 tok/s, the dynamic tree 1988 -> 2121. On
    CPU a padded last chunk costs more than the one pass saves."""
    return _switch(CHUNKED_PREFILL_ENV, "on for CUDA", torch.device(device).type == "cuda")


def overlap_wanted(device: torch.device | str, fast: bool = True) -> bool:
    """$EAGLESPEC_OVERLAP: "1" -> True, "0" -> False, "" or unset -> a fast target (`fast`) on a CUDA `device`,
    where a round's kernels run while the host works; anything else is refused in one line. Overlap launches the
    next round (or plain step) before the host reads this one's tokens: on CPU every op runs as it is called, so
    there it would only add a wasted step at the end of a stream."""
    return _switch(OVERLAP_ENV, "on for a fast target on CUDA", fast and torch.device(device).type == "cuda")


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


@dataclass
class RoundStats:
    drafted: int  # draft tokens verified this round
    accepted: int  # draft tokens accepted
    emitted: int  # tokens emitted (accepted + bonus, cut at EOS / max_new_tokens)
    draft_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    detail: dict = field(default_factory=dict)  # telemetry (metrics.round_detail): tree + accepted rows


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    token_ids: list[int]  # new tokens only
    rounds: list[RoundStats] = field(default_factory=list)
    seconds: float = 0.0
    backend: str = ""
    finish_reason: str = "length"

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target verification forward (prefill excluded)."""
        verifications = len(self.rounds)
        return (len(self.token_ids) - 1) / verifications if verifications else 0.0

    def stats(self) -> dict:
        n = len(self.token_ids)
        return {
            "tau": round(self.tau, 4),
            "rounds": len(self.rounds),
            "drafted": sum(r.drafted for r in self.rounds),
            "accepted": sum(r.accepted for r in self.rounds),
            "new_tokens": n,
            "seconds": round(self.seconds, 4),
            "tokens_per_second": round(n / self.seconds, 2) if self.seconds > 0 else 0.0,
            "backend": self.backend,
        }


class _PlainRows:
    """Constant row tensors of a plain-decoding round (one tree-less row per round)."""

    def __init__(self, device: torch.device):
        self.rows = torch.zeros(1, dtype=torch.long, device=device)  # the kept (and accepted) row
        self.parents = torch.full((1,), -1, dtype=torch.long, device=device)
        self.depths = torch.zeros(1, dtype=torch.long, device=device)


class HostRead:
    """A [size] long device tensor read to the host without waiting for work queued after it: on CUDA an async copy
    into pinned memory and an event (a plain .item() or .tolist() would wait for the whole stream, the step or
    round launched ahead too)."""

    def __init__(self, device: torch.device, size: int = 1):
        self.cuda = device.type == "cuda"
        self.buf = torch.zeros(size, dtype=torch.long, pin_memory=self.cuda)
        self.event = torch.cuda.Event() if self.cuda else None

    def start(self, value: torch.Tensor) -> None:
        """Queue the copy of value [size] (call before queueing more work)."""
        self.buf.copy_(value, non_blocking=self.cuda)
        if self.event is not None:
            self.event.record()

    def values(self) -> list[int]:
        """The copied values, once the copy is done (waits for the work queued before start(), no more)."""
        if self.event is not None:
            self.event.synchronize()
        return self.buf.tolist()

    def copy(self) -> torch.Tensor:
        """The copied values as a host tensor of their own (waits as values() does), for slices that must outlive
        the buffer's next copy: one clone instead of a torch.tensor(list) per slice (~16 us each on a CPU)."""
        if self.event is not None:
            self.event.synchronize()
        return self.buf.clone()

    def wait(self) -> int:
        return self.values()[0]


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
    """Speculative decoding (greedy, or lossless sampling) of one sequence with a target backend and an
    optional drafter."""

    def __init__(self, target: TargetBackend, drafter: nn.Module | None = None, spec: TreeSpec | None = None,
                 sampling: SamplingConfig | None = None, adaptive: bool = False):
        self.target = target
        # gate.py: per round, draft or take a plain step, whichever has cost less per token lately (a new gate
        # per stream; None: always draft). The last stream's gate stays readable in self.gate.
        self.adaptive = adaptive
        self.gate: SpeculationGate | None = None
        self.sampling = sampling  # None or temperature 0: the exact greedy path
        self._sampling: SamplingConfig | None = None  # in force for the current stream() call
        self._generator: torch.Generator | None = None
        self.spec = spec or TreeSpec()
        self.drafter = drafter
        self.proposer = Proposer(drafter, self.spec) if drafter is not None else None
        self.round_graph = None  # round_graph.RoundGraph (enable_round_graphs): greedy rounds as one CUDA graph
        device = getattr(target, "device", "cpu")
        self.chunked_prefill = chunked_prefill_wanted(device)  # $EAGLESPEC_CHUNKED_PREFILL: see prefill()
        # $EAGLESPEC_OVERLAP: a round (round graphs) or plain step launched ahead, before the host reads the tokens
        # of the one before it; it is used only by the next call of the same stream (_stream, _continues)
        self.overlap = overlap_wanted(device, getattr(target, "buckets", None) is not None)
        self._stream = 0  # counts stream() calls: what a round launched ahead belongs to
        self._stop: tuple[frozenset[int], int] = (frozenset(), 0)  # the stream's EOS ids and max_new_tokens
        self._plain_ahead: tuple[torch.Tensor, TargetOutput] | None = None  # (root, its forward), launched ahead
        self._host_read: HostRead | None = None  # the plain step's token, read past the step launched ahead
        if drafter is not None:
            if hasattr(drafter, "set_target_embedding") and getattr(drafter, "embed_tokens", None) is None:
                drafter.set_target_embedding(target.embedding())
            if hasattr(drafter, "set_target_head"):  # EAGLE-1: the target's final norm + lm_head
                from eaglespec.draft.eagle1 import target_head

                drafter.set_target_head(*target_head(target), num_layers=target.num_layers)
            target.set_feature_layers(tuple(drafter.feature_layer_ids))

    @property
    def speculating(self) -> bool:
        return self.proposer is not None and self.spec.speculates

    def stream(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
               eos_token_ids: Sequence[int] = (), result: GenerationResult | None = None,
               sampling: SamplingConfig | None = None) -> Iterator[list[int]]:
        """Yield the tokens emitted by each round (the first yield is the prefill's token)."""
        if not prompt_ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        result = result if result is not None else GenerationResult(list(prompt_ids), [])
        result.backend = self.target.name
        eos = set(eos_token_ids)
        self._stream += 1
        self._stop, self._plain_ahead = (frozenset(eos), max_new_tokens), None
        start = time.perf_counter()
        target, dev = self.target, getattr(self.target, "device", torch.device("cpu"))
        target.reset()
        if self.proposer is not None:
            self.proposer.reset()
        self._begin_sampling(sampling, dev)
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
        speculating = self.speculating
        plain_rows = _PlainRows(dev)
        if speculating:  # every token on the device, and the features the drafter has not consumed yet
            ids, pending_feats = torch.cat([prompt, root]), out.features
            if self.round_graph is not None and _switch(DRAFT_PREFILL_ENV, "on with round graphs", True):
                # the drafter's prefill: the first round fits a round graph
                pending_feats = self._draft_prefill(ids, pending_feats, self.round_graph.get().P)
        gate = self.gate = SpeculationGate() if self.adaptive and speculating else None
        if gate is not None:  # plain steps queue their tokens and features in lists, joined at the next draft
            queue = _Queue(ids, pending_feats)
        while result.finish_reason != "stop" and len(result.token_ids) < max_new_tokens:
            if gate is not None:
                drafting, t0 = gate.draft(), time.perf_counter()
                if drafting:
                    emitted, ids, pending_feats = self._round(*queue.joined(), result)
                    queue = _Queue(ids, pending_feats)
                else:
                    emitted = self._undrafted_round(queue, plain_rows, result)
                gate.record(drafting, len(emitted), time.perf_counter() - t0)
            elif speculating:
                emitted, ids, pending_feats = self._round(ids, pending_feats, result)
            else:
                emitted, root, _ = self._plain_round(root, plain_rows, result, ahead=self.overlap)
            emitted = self._cut(emitted, eos, max_new_tokens - len(result.token_ids), result)
            result.token_ids.extend(emitted)
            result.rounds[-1].emitted = len(emitted)
            yield emitted
        result.seconds = time.perf_counter() - start

    def _begin_sampling(self, sampling: SamplingConfig | None, dev: torch.device) -> None:
        """Sampling state of one stream() call: processors in force and a freshly seeded generator."""
        cfg = sampling if sampling is not None else self.sampling
        self._sampling = None if cfg is None or cfg.greedy else cfg
        self._generator = self._sampling.generator(dev) if self._sampling is not None else None
        if self.proposer is not None:
            self.proposer.sampling = self._sampling.draft_params if self._sampling is not None else None
            self.proposer.generator = self._generator

    def _continues(self, emitted: list[int], result: GenerationResult, then: int = 0) -> bool:
        """Whether the stream goes on to another round after `emitted` (this round's tokens, before `_cut` and
        before they join result.token_ids): no adaptive gate (its next round may be a plain step), no EOS among
        them and room left after them, and after `then` more tokens. What may launch the next round ahead
        (overlap); then = the most tokens a round emits: whether the round after the next may be launched too."""
        eos, max_new_tokens = self._stop
        room = max_new_tokens - len(result.token_ids)
        return self.gate is None and len(emitted) + then < room and eos.isdisjoint(emitted)

    def _next_token(self, logits: torch.Tensor) -> torch.Tensor:
        """The token after one row's logits [V], as a [1] device tensor (no host sync): argmax, or a
        sample of the processed target distribution."""
        if self._sampling is None:
            return logits.argmax(-1, keepdim=True)
        return sample(process_logits(logits, self._sampling.target), self._generator).reshape(1)

    @staticmethod
    def _cut(emitted: list[int], eos: set[int], room: int, result: GenerationResult) -> list[int]:
        """Stop exactly as HF generate does: at the first EOS (kept) or at max_new_tokens."""
        for i, tok in enumerate(emitted[:room]):
            if tok in eos:
                result.finish_reason = "stop"
                return emitted[: i + 1]
        return emitted[:room]

    def _plain_round(self, root: torch.Tensor, rows: _PlainRows, result: GenerationResult, ahead: bool = False
                     ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
        """Plain decoding, no tree: the root [1] -> one forward -> the next token (ONE host sync). Returns
        ([token], the token [1] on the device, the root's features [1, F]).

        ahead (overlap): the next token's forward is launched before the host reads the token, unless this token is
        the stream's last by length; the next call with that token as its root takes it instead of launching its
        own. An EOS found by the read leaves the launched step unused (the next stream resets the target)."""
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
        the token and the root's features queued for the drafter's next catch-up (the state a round leaves,
        contract 7, once the queue is joined). No copy of the growing ids / features per step."""
        emitted, nxt, feats = self._plain_round(queue.root, rows, result)
        queue.push(nxt, feats)
        return emitted

    def _draft_prefill(self, ids: torch.Tensor, pending_feats: torch.Tensor, keep: int) -> torch.Tensor:
        """Catch the drafter up on all but the last `keep` pending rows [n, F] (after the prefill: the prompt's);
        returns the rows left pending. A round graph catches up at most P rows, so without this the first round of
        every stream ran by phases: on the H200 the dynamic tree +1.2% with it (session 18, MT-bench 20, bench/ab.py
        in one process: 2788.9 -> 2821.8 tok/s).
        The drafter's rows and KV are the ones the first round's catch-up would compute, in two calls instead of
        one (contract 7: proposer.committed + the pending rows = the target's committed length)."""
        n = pending_feats.shape[0] - keep
        if n <= 0:
            return pending_feats
        self.proposer.catch_up(pending_feats[:n], shifted_tokens(ids, self.proposer.committed, n))
        return pending_feats[n:]

    def _round(self, ids: torch.Tensor, pending_feats: torch.Tensor, result: GenerationResult):
        """One speculative round: as one round graph where the engine has them (round_graph.py), else by phases.
        Returns (emitted tokens, ids, pending_feats) after the round."""
        if self.round_graph is not None:
            return self.round_graph.round(ids, pending_feats, result)
        return self._phased_round(ids, pending_feats, result)

    def _phased_round(self, ids: torch.Tensor, pending_feats: torch.Tensor, result: GenerationResult):
        """One speculative round, phase by phase. ids [N+1]: every token so far (the last is the root) on the
        device; pending_feats [n, F]: target features the drafter has not consumed yet (the last n rows)."""
        target = self.target
        root = result.token_ids[-1]  # ids[-1]: emitted, not yet in the target's KV (the tree's root row)
        t0 = time.perf_counter()
        next_tokens = shifted_tokens(ids, self.proposer.committed, pending_feats.shape[0])  # x_{t+1}, contract 4
        tree: DraftTree = self.proposer.propose(root, pending_feats, next_tokens)
        flat = flatten(tree)
        t1 = time.perf_counter()
        out = target.forward(flat.tokens, flat.depths, flat.visible)
        if self._sampling is None:
            acc = greedy_accept(flat, out.logits)
        else:  # lossless rejection sampling (real q when the tree records draft_probs, else point mass)
            p = process_logits(out.logits, self._sampling.target)  # [T, V]
            acc = sample_accept(flat, p, tree.draft_probs, self._generator)
        t2 = time.perf_counter()
        target.commit(acc.rows)  # contract 7: gathered by the flatten map, never by token equality
        pending_feats = out.features[acc.rows]
        ids = torch.cat([ids, acc.path_tokens[1:], acc.bonus_token])  # on the device: no host->device copy
        emitted = [*acc.tokens[1:], acc.bonus]  # read in acceptance's single host sync
        t3 = time.perf_counter()
        result.rounds.append(RoundStats(drafted=tree.size - 1, accepted=acc.accepted, emitted=len(emitted),
                                        draft_s=t1 - t0, verify_s=t2 - t1, commit_s=t3 - t2,
                                        detail=round_detail(tree, acc.rows)))
        return emitted, ids, pending_feats

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
                 eos_token_ids: Sequence[int] = (), sampling: SamplingConfig | None = None) -> GenerationResult:
        result = GenerationResult(list(prompt_ids), [])
        for _ in self.stream(prompt_ids, max_new_tokens, eos_token_ids, result, sampling):
            pass
        return result
