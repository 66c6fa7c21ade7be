"""The generation loop: prefill, then rounds of draft -> verify -> accept -> publish -> reseed.

State between rounds (DESIGN.md contract 7): `ids` holds every emitted token; the target has
committed KV and features for ids[:-1]; ids[-1] (the bonus / frontier token) is emitted but
append-required: it is the root row of the next verification forward.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from .draft.proposer import Proposer, shifted_tokens
from .metrics import round_detail
from .sampling import SamplingConfig, process_logits, sample
from .target.base import TargetBackend
from .tree import DraftTree, TreeSpec, chain_tree, flatten
from .verify import greedy_accept, sample_accept


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


class SpeculativeEngine:
    """Speculative decoding (greedy, or lossless sampling) of one sequence with a target backend and an
    optional drafter."""

    def __init__(self, target: TargetBackend, drafter: nn.Module | None = None, spec: TreeSpec | None = None,
                 sampling: SamplingConfig | None = None):
        self.target = target
        self.sampling = sampling  # None or temperature 0: the exact greedy path
        self._sampling: SamplingConfig | None = None  # in force for the current stream() call
        self._generator: torch.Generator | None = None
        self.spec = spec or TreeSpec()
        self.drafter = drafter
        self.proposer = Proposer(drafter, self.spec) if drafter is not None else None
        if drafter is not None:
            if hasattr(drafter, "set_target_embedding") and getattr(drafter, "embed_tokens", None) is None:
                drafter.set_target_embedding(target.embedding())
            if hasattr(drafter, "set_target_head"):  # EAGLE-1: the target's final norm + lm_head
                from .draft.eagle1 import target_head

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
        start = time.perf_counter()
        target, dev = self.target, getattr(self.target, "device", torch.device("cpu"))
        target.reset()
        if self.proposer is not None:
            self.proposer.reset()
        self._begin_sampling(sampling, dev)
        ids = torch.tensor(list(prompt_ids), dtype=torch.long, device=dev)
        if max_new_tokens <= 0:
            result.seconds = time.perf_counter() - start
            return

        # prefill: commit the prompt; its last logits give the first token (the first root)
        out = target.forward(ids)
        target.commit(torch.arange(ids.numel(), device=dev))
        pending_feats = out.features  # [n, F]: features not yet consumed by the drafter
        first = self._next_token(out.logits[-1])
        ids = torch.cat([ids, ids.new_tensor([first])])
        result.token_ids.append(first)
        yield [first]
        if first in eos:
            result.finish_reason = "stop"
        while result.finish_reason != "stop" and len(result.token_ids) < max_new_tokens:
            emitted, pending_feats = self._round(ids, pending_feats, result)
            emitted = self._cut(emitted, eos, max_new_tokens - len(result.token_ids), result)
            ids = torch.cat([ids, ids.new_tensor(emitted)])
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

    def _next_token(self, logits: torch.Tensor) -> int:
        """The token after one row's logits [V]: argmax, or a sample of the processed target distribution."""
        if self._sampling is None:
            return int(logits.argmax())
        return int(sample(process_logits(logits, self._sampling.target), self._generator))

    @staticmethod
    def _cut(emitted: list[int], eos: set[int], room: int, result: GenerationResult) -> list[int]:
        """Stop exactly as HF generate does: at the first EOS (kept) or at max_new_tokens."""
        for i, tok in enumerate(emitted[:room]):
            if tok in eos:
                result.finish_reason = "stop"
                return emitted[: i + 1]
        return emitted[:room]

    def _round(self, ids: torch.Tensor, pending_feats: torch.Tensor, result: GenerationResult):
        target = self.target
        root = result.token_ids[-1]  # ids[-1]: emitted, not yet in the target's KV (the tree's root row)
        t0 = time.perf_counter()
        if self.speculating:
            d0 = self.proposer.committed
            next_tokens = shifted_tokens(ids, d0, pending_feats.shape[0])
            tree: DraftTree = self.proposer.propose(root, pending_feats, next_tokens)
            pending_feats = pending_feats[:0]
        else:
            tree = chain_tree(root, ids.new_empty(0))
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
        if self.speculating:
            pending_feats = torch.cat([pending_feats, out.features[acc.rows]])
        emitted = [*acc.tokens[1:], acc.bonus]  # read in acceptance's single host sync
        t3 = time.perf_counter()
        result.rounds.append(RoundStats(drafted=tree.size - 1, accepted=acc.accepted, emitted=len(emitted),
                                        draft_s=t1 - t0, verify_s=t2 - t1, commit_s=t3 - t2,
                                        detail=round_detail(tree, acc.rows)))
        return emitted, pending_feats

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int = 128,
                 eos_token_ids: Sequence[int] = (), sampling: SamplingConfig | None = None) -> GenerationResult:
        result = GenerationResult(list(prompt_ids), [])
        for _ in self.stream(prompt_ids, max_new_tokens, eos_token_ids, result, sampling):
            pass
        return result
