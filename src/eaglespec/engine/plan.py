"""Speculation that fits the batch: per batch-size bucket, the draft depth with the most expected tokens per second.

The batched engine's greedy rounds draft `depth` tokens per row (0: a plain step; the arms are 0..k for batched
chains, else 0 and 1 = the engine's tree). Two measured inputs decide the depth:

    seconds[bucket][depth]   one round's wall time with `bucket` live rows at that depth, measured once on random
                             prompts when the engine is built (BatchEngine.calibrate)
    tokens[depth]            the tokens a row emits per round at that depth: the drafter's acceptance profile as a
                             prior worth `weight` row-rounds, then the engine's own rounds. A greedy chain that
                             accepted m of its k drafts also tells each shallower depth j what it would have emitted,
                             min(m, j) + 1 (a shorter chain drafts the same prefix), so shallower arms keep learning

For a live batch of B rows the plan takes the depth maximizing tokens[depth] / seconds[bucket][depth], where bucket is
the smallest measured one holding B (else the largest), and keeps a bucket's depth until another promises `margin`
more (a new depth is a new shape: its first rounds capture CUDA graphs). A plain step tells nothing about the
drafter, so while the plan takes plain steps, one round in `probe_every` (the first included) drafts the deepest
chain (or the tree) instead, and the estimates keep following the drafter. Every depth is lossless: the choice changes the speed only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from eaglespec.errors import EagleSpecError
from eaglespec.tree.auto import AcceptanceProfile, chain_tau
from eaglespec.tree.core import TreeSpec

DEFAULT_ACCEPT = 0.5  # per-depth acceptance of the prior when the drafter has no acceptance profile


class DepthPlan:
    """depth(batch) for the next round, record(...) after it (see the module docstring)."""

    def __init__(self, seconds: Mapping[int, Mapping[int, float]], prior: Sequence[float], weight: float = 8.0,
                 probe_every: int = 32, margin: float = 0.05):
        if not seconds:
            raise EagleSpecError("a depth plan needs the round times of at least one batch size")
        if not prior or prior[0] != 1.0:
            raise EagleSpecError(f"prior[0] (a plain step) must be 1.0 token per round, got {list(prior)[:1]}")
        depths = set(range(len(prior)))
        for bucket, row in seconds.items():
            if set(row) != depths or any(not s > 0 for s in row.values()):
                raise EagleSpecError(f"batch size {bucket}: round seconds must be > 0 for depths {sorted(depths)}, "
                                     f"got {dict(row)}")
        self.seconds = {int(b): {int(d): float(s) for d, s in row.items()} for b, row in sorted(seconds.items())}
        if probe_every < 1:
            raise EagleSpecError(f"probe_every must be >= 1, got {probe_every}")
        self.prior, self.weight, self.probe_every = [float(t) for t in prior], float(weight), probe_every
        self._plain = 0  # rounds the plan has answered with a plain step since its last probe
        self.margin = float(margin)
        self._kept: dict[int, int] = {}  # bucket -> the depth it takes now
        self._sum = [0.0] * len(prior)  # per depth: tokens the recorded rows emitted (or would have)
        self._rows = [0] * len(prior)  # per depth: recorded rows

    @property
    def depths(self) -> range:
        return range(len(self.prior))

    def bucket(self, batch: int) -> int:
        """The measured batch size whose round times stand for `batch` live rows."""
        return next((b for b in self.seconds if b >= batch), max(self.seconds))

    def tokens(self, depth: int) -> float:
        """Expected tokens per row and round at `depth`: the prior blended with the recorded rounds."""
        return (self.prior[depth] * self.weight + self._sum[depth]) / (self.weight + self._rows[depth])

    def tokens_per_second(self, batch: int, depth: int) -> float:
        """Expected tokens per second of the whole batch of `batch` rows at `depth`."""
        return batch * self.tokens(depth) / self.seconds[self.bucket(batch)][depth]

    def best(self, batch: int) -> int:
        """The depth with the most expected tokens per second for `batch` live rows (ties: the shallower)."""
        return max(self.depths, key=lambda d: (self.tokens_per_second(batch, d), -d))

    def depth(self, batch: int) -> int:
        """The next round's depth: the bucket's kept depth, moved to best(batch) when that promises `margin` more;
        while it is a plain step, one round in probe_every drafts the deepest depth."""
        bucket, best = self.bucket(batch), self.best(batch)
        kept = self._kept.get(bucket)
        rate = self.tokens_per_second
        if kept is not None and rate(batch, best) <= rate(batch, kept) * (1 + self.margin):
            best = kept
        self._kept[bucket] = best
        if best > 0 or len(self.prior) == 1:
            return best
        self._plain += 1
        if self._plain % self.probe_every == 1 or self.probe_every == 1:
            return len(self.prior) - 1
        return 0

    def record(self, depth: int, accepted: Iterable[int], chain: bool) -> None:
        """One round at `depth` in which the rows accepted `accepted` drafts each; `chain`: the rows drafted greedy
        chains, whose outcome also counts for every shallower depth."""
        if not 0 <= depth < len(self.prior):
            raise EagleSpecError(f"depth {depth} is not among the plan's depths 0..{len(self.prior) - 1}")
        for m in accepted:
            for d in range(1, depth + 1) if chain else (depth,) if depth else ():
                self._sum[d] += min(m, d) + 1 if chain else m + 1
                self._rows[d] += 1

    def summary(self) -> str:
        """One line: the depth each measured batch size takes now."""
        return ", ".join(f"B<={b}: depth {self.best(b)}" for b in self.seconds)


def drafter_prior(drafter, spec: TreeSpec, chains: bool) -> list[float]:
    """Expected tokens per round at each of the plan's depths (chains: 0..k drafts; else 0 and the tree) from the
    drafter's greedy acceptance profile (its manifest's acceptance_profile), else DEFAULT_ACCEPT per depth."""
    profile = AcceptanceProfile.from_manifest(getattr(drafter, "manifest", None))
    if profile is None:
        taus = [chain_tau([[DEFAULT_ACCEPT]] * spec.depth, k) for k in range(spec.depth + 1)]
        return taus if chains else [1.0, taus[-1]]
    acceptance = profile.acceptance(sampled=False)
    if chains:
        return [acceptance.tau(TreeSpec("chain", depth=k)) for k in range(spec.depth + 1)]
    return [1.0, acceptance.tau(spec)]
