"""Adaptive speculation: per round, choose how deep to draft (0: one plain target step) by the time per emitted
token each choice has cost lately (EngineConfig.adaptive, `--adaptive`).

Speculation pays only when tokens per round outgrow the round's cost over a plain step; with a weak drafter (high
temperatures, a CPU) or a large batch a plain step, or a shorter chain, can be the faster choice. Every choice
emits exactly the target's tokens (greedy) or its distribution (sampling), so switching per round is lossless.
The gate measures its arms in place (ordered depths, e.g. (0, 1) = plain step / draft the engine's tree, or
(0, 1, ..., k) = plain step / chains of 1..k drafts):
    start at the deepest arm; after `warmup` timed rounds, probe its neighbours (the next shallower and deeper
    arms) for `probe` rounds each; keep the arm with the lower seconds per token over each arm's last `window`
    rounds, and while the best arm moves, probe its next neighbour too (a climb along the depths); then stay for
    `interval` settled rounds and probe the settled arm's neighbours again
    backoff: `interval` starts at `every`; probes that confirm the settled arm double it (up to `max_every`),
    probes that move it reset it to `every`
The first round after a switch is not timed (a drafting round after plain steps first catches the drafter up on
every token they emitted). Round times are host wall times; each round ends in a host sync, so they include the
device work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


class SpeculationGate:
    """Chooses, round by round, one of `arms` (ordered depths; 0 is a plain step): arm() and record()."""

    def __init__(self, warmup: int = 4, probe: int = 4, every: int = 64, window: int = 16, max_every: int = 1024,
                 arms: Sequence[int] = (0, 1)):
        if min(warmup, probe, every, window) < 1:
            raise ValueError("warmup, probe, every and window must be >= 1")
        if max_every < every:
            raise ValueError("max_every must be >= every")
        self.arms = tuple(sorted({int(a) for a in arms}))
        if not self.arms or self.arms[0] < 0:
            raise ValueError(f"arms must be depths >= 0, got {list(arms)}")
        self.warmup, self.probe, self.every, self.max_every = warmup, probe, every, max_every
        self.interval = every  # settled rounds before the next probe (the backoff doubles it, a move resets it)
        self._times = {a: deque(maxlen=window) for a in self.arms}  # per arm: (seconds, tokens)
        self._arm = self.arms[-1]  # start at the deepest
        self._left = warmup  # rounds left in the current phase (warm-up, probe or settled)
        self._probing = False
        self._queue: list[int] = []  # arms still to probe in the running probe
        self._probed: set[int] = set()  # arms the running probe has compared
        self._center = self._arm  # the arm the running probe started from
        self._settled: int | None = None  # the arm the last probe settled on (None: no probe yet)
        self._skip = True  # the next record is the first of its arm (a switch, or the very first round)
        self.switches = 0

    def arm(self) -> int:
        """The depth the next round drafts (0: a plain step)."""
        return self._arm

    def draft(self) -> bool:
        """Whether the next round drafts."""
        return self._arm > 0

    def seconds_per_token(self, arm: int) -> float | None:
        """The arm's recent seconds per emitted token, None before its first timed round."""
        times = self._times[int(arm)]
        tokens = sum(n for _, n in times)
        return sum(s for s, _ in times) / tokens if tokens else None

    def record(self, arm: int, tokens: int, seconds: float) -> None:
        """One finished round: its arm (a bool: drafted or not, for arms (0, 1)), tokens emitted and wall time;
        then decide the next round's arm."""
        if int(arm) != self._arm:
            raise ValueError(f"record() must follow the round arm() chose (draft depth {self._arm}), got {int(arm)}")
        if self._skip:
            self._skip = False
        elif tokens > 0:
            self._times[self._arm].append((seconds, tokens))
        self._left -= 1
        if self._left > 0:
            return
        if self.seconds_per_token(self._arm) is None:  # not timed yet: stay on it
            self._left = self.probe
        elif self._queue:  # the running probe goes on with its next arm
            self._next_probe()
        elif self._probing:
            self._settle()
        else:  # warm-up or a settled period ended: probe the neighbours
            self._center, self._probed, self._probing = self._arm, {self._arm}, True
            self._queue = self._neighbours(self._arm)
            if self._queue:
                self._next_probe()
            else:  # one arm: nothing to compare
                self._settle()

    def _settle(self) -> None:
        """The probe's arms are timed: take the fastest (ties: the deeper); while it moves, probe its next
        neighbour; else settle on it and back off, or reset the interval if it moved from the settled arm."""
        best = min(self._probed, key=lambda a: (self.seconds_per_token(a), -a))
        if best != self._center and (todo := self._neighbours(best)):
            self._center, self._queue = best, todo
            self._next_probe()
            return
        if self._settled is not None and best == self._settled:
            self.interval = min(2 * self.interval, self.max_every)  # confirmed: probe half as often
        else:
            self.interval = self.every  # moved (or the first settlement): the base rate
        self._settled, self._probing = best, False
        self._switch(best, self.interval)

    def _neighbours(self, arm: int) -> list[int]:
        """The next shallower and deeper arms not compared in the running probe."""
        i = self.arms.index(arm)
        near = [self.arms[j] for j in (i - 1, i + 1) if 0 <= j < len(self.arms)]
        return [a for a in near if a not in self._probed]

    def _next_probe(self) -> None:
        arm = self._queue.pop(0)
        self._probed.add(arm)
        self._switch(arm, self.probe)

    def _switch(self, arm: int, rounds: int) -> None:
        if arm != self._arm:
            self._skip = True
            self.switches += 1
        self._arm, self._left = arm, rounds
