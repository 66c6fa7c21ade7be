"""The state a generation carries: per-round statistics, the result, and what one stream's rounds share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from eaglespec.sampling import SamplingConfig
from eaglespec.tree.core import TreeSpec


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
        """Mean acceptance length, as vLLM and SGLang report it: 1 + accepted / rounds, the tokens each target
        verification yields counting its bonus token (a round that drafted nothing counts as one with 0 accepted).
        Counted before the cut at EOS / max_new_tokens, so a last round that overshoots still counts whole.
        0.0 without rounds."""
        rounds = len(self.rounds)
        return 1.0 + sum(r.accepted for r in self.rounds) / rounds if rounds else 0.0

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


class RoundContext(NamedTuple):
    """What every round of one stream() call shares, passed explicitly to the round graphs."""

    stream: int  # counts stream() calls: a round launched ahead belongs to one stream
    spec: TreeSpec  # the tree this stream drafts
    sampling: SamplingConfig | None  # None: greedy
    generator: torch.Generator | None  # the stream's random numbers (sampling)
    goes_on: Callable[[list[int], int, int], bool]  # goes_on(emitted, done, then): whether another round follows
