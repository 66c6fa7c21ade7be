"""Adaptive speculation: per round, draft or take one plain target step, whichever has cost less time per emitted
token lately (EngineConfig.adaptive, `--adaptive`).

Speculation pays only when tokens per round outgrow the round's cost over a plain step; with a weak drafter (high
temperatures, a CPU) a plain step can be the faster choice. Both choices emit exactly the target's tokens (greedy)
or its distribution (sampling), so switching per round is lossless. The gate measures both in place:
    start drafting; after `warmup` timed rounds, probe plain steps for `probe` rounds; then keep the mode with the
    lower seconds per token over each mode's last `window` rounds, and probe the other one for `probe` rounds
    after `interval` settled rounds
    backoff: `interval` starts at `every`; a probe that confirms the settled mode doubles it (up to `max_every`),
    a probe that flips the mode resets it to `every`
The first round after a switch is not timed (a drafting round after plain steps first catches the drafter up on
every token they emitted). Round times are host wall times; each round ends in a host sync, so they include the
device work.
"""

from __future__ import annotations

from collections import deque


class SpeculationGate:
    """Chooses, round by round, between a speculative round (draft() True) and a plain step (False)."""

    def __init__(self, warmup: int = 4, probe: int = 4, every: int = 64, window: int = 16, max_every: int = 1024):
        if min(warmup, probe, every, window) < 1:
            raise ValueError("warmup, probe, every and window must be >= 1")
        if max_every < every:
            raise ValueError("max_every must be >= every")
        self.warmup, self.probe, self.every, self.max_every = warmup, probe, every, max_every
        self.interval = every  # settled rounds before the next probe (the backoff doubles it, a flip resets it)
        self._times = {True: deque(maxlen=window), False: deque(maxlen=window)}  # per mode: (seconds, tokens)
        self._mode = True  # drafting
        self._left = warmup  # rounds left in the current phase (warm-up, probe or settled)
        self._probing = False
        self._settled: bool | None = None  # the mode a running probe may overturn (None: the first probe)
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
        elif self._probing:  # a probe ended: settle on the faster mode (ties: drafting), back off or reset
            mode = d <= p
            if self._settled is not None and mode == self._settled:
                self.interval = min(2 * self.interval, self.max_every)  # confirmed: probe half as often
            else:
                self.interval = self.every  # flipped (or the first settlement): the base rate
            self._settled = mode
            self._switch(mode, self.interval, probing=False)
        else:  # settled long enough: probe the other mode
            self._switch(not self._mode, self.probe, probing=True)

    def _switch(self, mode: bool, rounds: int, probing: bool) -> None:
        if mode != self._mode:
            self._skip = True
            self.switches += 1
        self._mode, self._left, self._probing = mode, rounds, probing
