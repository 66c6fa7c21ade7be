"""Adaptive speculation: per round, draft or take one plain target step, whichever has cost less time per emitted
token lately (SpeculativeEngine(adaptive=True), `--adaptive`).

Speculation pays only when tokens per round outgrow the round's cost over a plain step. With a weak drafter that is
not so (on an H200 at T=1 the shipped SmolLM2 drafter ran at 0.60-0.70x plain decoding; on 2 CPU cores even at T=0):
then a plain step is the faster choice, and both choices emit exactly the target's tokens (greedy) or its
distribution (sampling), so switching between them per round is lossless. The gate measures both in place:

    start drafting; after `warmup` timed rounds, probe plain steps for `probe` rounds; then keep the mode with the
    lower seconds per token over each mode's last `window` rounds, and probe the other one for `probe` rounds
    every `every` rounds (the drafter's distribution and the costs change along a text)

The first round after a switch is not timed: drafting again starts with the drafter's catch-up over every token
the plain steps emitted, a one-off cost. Round times are host wall times; each round ends in a host sync (the
accepted tokens are read), so they include the device work.
"""

from __future__ import annotations

from collections import deque


class SpeculationGate:
    """Chooses, round by round, between a speculative round (draft() True) and a plain step (False)."""

    def __init__(self, warmup: int = 4, probe: int = 4, every: int = 64, window: int = 16):
        if min(warmup, probe, every, window) < 1:
            raise ValueError("warmup, probe, every and window must be >= 1")
        self.warmup, self.probe, self.every = warmup, probe, every
        self._times = {True: deque(maxlen=window), False: deque(maxlen=window)}  # per mode: (seconds, tokens)
        self._mode = True  # drafting
        self._left = warmup  # rounds left in the current phase (warm-up or probe)
        self._probing = False
        self._skip = True  # the next record is the first of its mode (a switch, or the very first round)
        self.switches = 0

    def draft(self) -> bool:
        """Whether the next round drafts."""
        return self._mode

    def seconds_per_token(self, drafting: bool) -> float | None:
        """The mode's recent seconds per emitted token, None before its first timed round."""
        times = self._times[drafting]
        tokens = sum(n for _, n in times)
        return sum(s for s, _ in times) / tokens if tokens else None

    def record(self, drafted: bool, tokens: int, seconds: float) -> None:
        """One finished round: its mode, tokens emitted and wall time; then decide the next round's mode."""
        if drafted != self._mode:
            raise ValueError("record() must follow the round draft() chose")
        if self._skip:
            self._skip = False
        elif tokens > 0:
            self._times[drafted].append((seconds, tokens))
        self._left -= 1
        if self._left > 0:
            return
        d, p = self.seconds_per_token(True), self.seconds_per_token(False)
        if d is None or p is None:  # a mode not timed yet: time it (go on in it, if it is the current one)
            self._switch(d is None, self.probe, probing=True)
        elif self._probing:  # a probe ended: settle on the faster mode (ties: drafting)
            self._switch(d <= p, self.every, probing=False)
        else:  # settled long enough: probe the other mode
            self._switch(not self._mode, self.probe, probing=True)

    def _switch(self, mode: bool, rounds: int, probing: bool) -> None:
        if mode != self._mode:
            self._skip = True
            self.switches += 1
        self._mode, self._left, self._probing = mode, rounds, probing
