"""Trees sized by measurement: a cost model of one round and the chooser behind `--tree auto`.

Inputs (no device needed here; engine/calibrate.py measures them):

    Acceptance   one temperature's acceptance profile of a drafter (its manifest's acceptance_profile.t0 / .t1):
                 accept[d][r] = P(the accepted child at depth d+1 is its parent's rank-r child | the parent was
                 accepted), tree.fit's table (at T=1 the r-th draw without replacement, tree.sampled_fit's), and
                 optionally `dynamic`: the measured tokens per round of EAGLE-2 dynamic trees per width, depth
                 and budget (DynamicTaus)
    CostModel    seconds of one drafter forward vs rows (draft curve) and of one target forward vs rows (verify
                 curve), and per temperature regime (greedy / sampled) the plain decoding step through the engine,
                 a fixed per-round overhead and an overhead per drafter step of the tree (the growth's top-k and
                 selection ops), both fitted to measured rounds, once for trees and once for chains (whose steps
                 take an argmax, not a top-k and a selection)

The model of one round of a tree spec (round_seconds):

    round = overhead + draft(tau rows: the catch-up on the verified tokens) + sum over the tree's drafter
            steps of (draft(rows of the step) + step overhead) + verify(nodes + 1), at least verify(nodes + 1)
    tau   = 1 + the sum of the tree's node values under independence (fit.expected_tau) for chains and static
            trees; the measured DynamicTaus for dynamic trees, interpolated in the budget
    tokens per second = tau / round

Plain decoding (no drafter work) is a candidate too: tau 1 at the measured plain step. `choose` returns the
candidate maximizing tokens per second among chains (k = 1..depth of the profile), static trees fitted to the
profile (tree.fit.fit_static_tree: every depth, every budget up to the verify curve's rows) and dynamic trees
of every measured width, depth and budget.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from eaglespec.checkpoint.manifest import read_acceptance_profile
from eaglespec.errors import EagleSpecError
from eaglespec.tree.core import TreeSpec
from eaglespec.tree.fit import fit_static_tree, fitted_spec, path_value

KINDS = ("plain", "chain", "static", "dynamic")
COSTS_VERSION = 3  # the CostModel's layout and the rounds it is fitted to (older caches: measured again)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# -- cost curves ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Curve:
    """Seconds of one forward over n rows, from measured (rows, seconds) points, rows ascending.

    bucketed: the backend pads a forward's rows up to the next measured row count (the fast backend's buckets), so n
    rows cost what the smallest measured count >= n costs; else linear interpolation between the points. Past the
    last point: linear extrapolation along the last segment (never decreasing)."""

    rows: tuple[int, ...]
    seconds: tuple[float, ...]
    bucketed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(self.rows))
        object.__setattr__(self, "seconds", tuple(float(s) for s in self.seconds))
        if not self.rows or len(self.rows) != len(self.seconds):
            raise EagleSpecError("a cost curve needs as many seconds as row counts, at least one")
        if any(not isinstance(r, int) or isinstance(r, bool) or r < 1 for r in self.rows) \
                or any(b <= a for a, b in itertools.pairwise(self.rows)):
            raise EagleSpecError(f"cost curve rows must be increasing integers >= 1, got {list(self.rows)}")
        if not all(math.isfinite(s) and s >= 0 for s in self.seconds):
            raise EagleSpecError(f"cost curve seconds must be finite and >= 0, got {list(self.seconds)}")

    @property
    def max_rows(self) -> int:
        return self.rows[-1]

    def __call__(self, n: float) -> float:
        """Seconds of one forward over n rows (bucketed where the curve is)."""
        return self._at(n, self.bucketed)

    def linear(self, n: float) -> float:
        """Seconds at n rows interpolated linearly, bucketed or not (for an expected number of rows)."""
        return self._at(n, False)

    def _at(self, n: float, bucketed: bool) -> float:
        rows, secs = self.rows, self.seconds
        if n <= rows[0]:
            return secs[0]
        i = bisect.bisect_left(rows, n)
        if i < len(rows):
            if bucketed or rows[i] == n:
                return secs[i]
            r0, r1 = rows[i - 1], rows[i]
            return secs[i - 1] + (secs[i] - secs[i - 1]) * (n - r0) / (r1 - r0)
        if len(rows) == 1:
            return secs[0]
        slope = max((secs[-1] - secs[-2]) / (rows[-1] - rows[-2]), 0.0)
        return secs[-1] + slope * (n - rows[-1])

    def to_dict(self) -> dict[str, Any]:
        return {"rows": list(self.rows), "seconds": list(self.seconds), "bucketed": self.bucketed}

    @classmethod
    def from_dict(cls, d: Any, name: str = "curve") -> Curve:
        if not isinstance(d, dict) or not isinstance(d.get("rows"), list) or not isinstance(d.get("seconds"), list):
            raise EagleSpecError(f"{name} must be an object with rows and seconds lists")
        if not all(_finite(s) for s in d["seconds"]):
            raise EagleSpecError(f"{name}.seconds must be numbers")
        try:
            return cls(tuple(d["rows"]), tuple(d["seconds"]), bool(d.get("bucketed", False)))
        except EagleSpecError as exc:
            raise EagleSpecError(f"{name}: {exc}") from None


@dataclass(frozen=True)
class Overhead:
    """Per temperature regime: the plain decoding step through the engine, and a round's seconds beyond its
    forwards: `round_s` once per round, `step_s` per drafter step of a tree, and chain_round_s / chain_step_s the
    same for chains (None: the trees' values). Any may be negative: a round graph replays the forwards with fewer
    launches than the forwards timed one by one."""

    plain_s: float
    round_s: float = 0.0
    step_s: float = 0.0
    chain_round_s: float | None = None
    chain_step_s: float | None = None

    def __post_init__(self) -> None:
        if not (_finite(self.plain_s) and self.plain_s > 0):
            raise EagleSpecError(f"the plain step must take > 0 seconds, got {self.plain_s!r}")
        extra = [x for x in (self.chain_round_s, self.chain_step_s) if x is not None]
        if not all(_finite(x) for x in (self.round_s, self.step_s, *extra)):
            raise EagleSpecError(f"round overheads must be finite, got {self.round_s!r}, {self.step_s!r}, "
                                 f"{self.chain_round_s!r}, {self.chain_step_s!r}")

    def of(self, chain: bool) -> tuple[float, float]:
        """(per round, per drafter step) of a chain's rounds or a tree's."""
        if chain and self.chain_round_s is not None and self.chain_step_s is not None:
            return self.chain_round_s, self.chain_step_s
        return self.round_s, self.step_s

    def to_dict(self) -> dict[str, float | None]:
        return {"plain_s": self.plain_s, "round_s": self.round_s, "step_s": self.step_s,
                "chain_round_s": self.chain_round_s, "chain_step_s": self.chain_step_s}

    @classmethod
    def from_dict(cls, d: Any, name: str) -> Overhead:
        keys, chain_keys = ("plain_s", "round_s", "step_s"), ("chain_round_s", "chain_step_s")
        if not isinstance(d, dict) or not all(_finite(d.get(k, 0.0)) for k in keys) \
                or not all(d.get(k) is None or _finite(d[k]) for k in chain_keys):
            raise EagleSpecError(f"{name} must be an object with numbers plain_s, round_s, step_s (and "
                                 "chain_round_s, chain_step_s: numbers or null)")
        chain = [None if d.get(k) is None else float(d[k]) for k in chain_keys]
        return cls(float(d.get("plain_s", 0.0)), float(d.get("round_s", 0.0)), float(d.get("step_s", 0.0)), *chain)


@dataclass(frozen=True)
class RoundShape:
    """What one round of a tree runs: the verify forward's rows (nodes + the root) and the rows of each drafter step
    of the growth after the catch-up (a chain of k: k-1 steps of one row); `chain`: a chain's round (its own
    overheads)."""

    verify_rows: int
    draft_rows: tuple[int, ...]
    chain: bool = False


def round_shape(spec: TreeSpec) -> RoundShape:
    """The RoundShape of a speculating spec: a chain's k-1 single-row steps; a static tree's one step per depth over
    its nodes that have children; a dynamic tree's depth-1 expansions of top_k rows (Proposer._dynamic)."""
    if spec.kind == "chain":
        return RoundShape(spec.depth + 1, (1,) * max(spec.depth - 1, 0), chain=True)
    if spec.kind == "dynamic":
        budget = min(spec.budget, dynamic_candidates(spec.top_k, spec.depth))
        return RoundShape(budget + 1, (spec.top_k,) * max(spec.depth - 1, 0))
    return static_shape(spec.static_choices())


def static_shape(paths: Iterable[Sequence[int]]) -> RoundShape:
    """RoundShape of a static tree given by its rank paths."""
    paths = {tuple(p) for p in paths}
    parents = {p[:-1] for p in paths if len(p) > 1}
    depth = max(map(len, paths), default=0)
    rows = tuple(sum(1 for p in parents if len(p) == d) for d in range(1, depth))
    return RoundShape(len(paths) + 1, rows)


def dynamic_candidates(top_k: int, depth: int) -> int:
    """Candidates an EAGLE-2 growth of width top_k and `depth` makes: top_k, then top_k * top_k per later depth."""
    return 0 if depth < 1 else top_k + (depth - 1) * top_k * top_k


@dataclass(frozen=True)
class CostModel:
    """Measured costs of one target + drafter on one device (see the module docstring). `sampled` None: the greedy
    overheads apply to sampled rounds too."""

    draft: Curve
    verify: Curve
    greedy: Overhead
    sampled: Overhead | None = None
    device: str = ""
    context: int = 0  # the committed prefix the curves were measured after

    def overhead(self, sampled: bool) -> Overhead:
        return self.sampled if sampled and self.sampled is not None else self.greedy

    def forward_seconds(self, shape: RoundShape, tau: float) -> float:
        """The round's forwards: the catch-up over tau rows, the tree's drafter steps, the verify forward."""
        return self.draft.linear(tau) + sum(self.draft(r) for r in shape.draft_rows) + self.verify(shape.verify_rows)

    def round_seconds(self, spec: TreeSpec, tau: float, sampled: bool = False) -> float:
        """Predicted seconds of one round of `spec` emitting tau tokens on average (plain decoding: the plain step)."""
        o = self.overhead(sampled)
        if not spec.speculates:
            return o.plain_s
        shape = round_shape(spec)
        return self._seconds(shape, tau, o)

    def _seconds(self, shape: RoundShape, tau: float, o: Overhead) -> float:
        """The round's forwards and overheads, never less than its verify forward alone (a negative fitted
        overhead corrects the forwards' sum, it cannot remove the verify)."""
        round_s, step_s = o.of(shape.chain)
        total = round_s + step_s * len(shape.draft_rows) + self.forward_seconds(shape, tau)
        return max(total, self.verify(shape.verify_rows), 1e-9)

    def to_dict(self) -> dict[str, Any]:
        return {"version": COSTS_VERSION, "device": self.device, "context": self.context,
                "draft": self.draft.to_dict(), "verify": self.verify.to_dict(), "greedy": self.greedy.to_dict(),
                "sampled": None if self.sampled is None else self.sampled.to_dict()}

    @classmethod
    def from_dict(cls, d: Any, where: str = "costs") -> CostModel:
        """A CostModel from to_dict's JSON; another version or a malformed one is a one-line EagleSpecError."""
        if not isinstance(d, dict) or d.get("version") != COSTS_VERSION:
            raise EagleSpecError(f"{where}: not a cost model of version {COSTS_VERSION}")
        return cls(draft=Curve.from_dict(d.get("draft"), f"{where}: draft"),
                   verify=Curve.from_dict(d.get("verify"), f"{where}: verify"),
                   greedy=Overhead.from_dict(d.get("greedy"), f"{where}: greedy"),
                   sampled=None if d.get("sampled") is None else Overhead.from_dict(d["sampled"], f"{where}: sampled"),
                   device=str(d.get("device", "")), context=int(d.get("context", 0) or 0))


def fit_overhead(points: Sequence[tuple[RoundShape, float, float]], draft: Curve, verify: Curve, plain_s: float
                 ) -> Overhead:
    """Overhead whose per-round and per-step values best explain measured rounds (least squares), points = (shape,
    tau, measured seconds) per round timed: the measured seconds less the forwards (CostModel.forward_seconds) =
    round_s + step_s * drafter steps, fitted to the tree rounds and to the chain rounds apart (with points of
    one kind only, both kinds take that fit; with none, zero)."""
    if not points:
        return Overhead(plain_s)
    model = CostModel(draft, verify, Overhead(plain_s))
    fits = {}
    for chain in (False, True):
        xy = [(float(len(shape.draft_rows)), secs - model.forward_seconds(shape, tau))
              for shape, tau, secs in points if shape.chain == chain]
        if xy:
            fits[chain] = _line(xy, -draft(1))
    trees = fits.get(False, fits.get(True))
    chains = fits.get(True)
    return Overhead(plain_s, *trees, *(chains if chains is not None else (None, None)))


def _line(xy: Sequence[tuple[float, float]], least_slope: float) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through xy, the slope kept >= least_slope (a drafter step never
    costs less than nothing; the intercept is then the mean of what is left); one x value: the mean, slope 0."""
    n = len(xy)
    mx, my = sum(x for x, _ in xy) / n, sum(y for _, y in xy) / n
    sxx = sum((x - mx) ** 2 for x, _ in xy)
    slope = max(sum((x - mx) * (y - my) for x, y in xy) / sxx, least_slope) if sxx > 0 else 0.0
    return sum(y - slope * x for x, y in xy) / n, slope


# -- the acceptance profile -------------------------------------------------------------------------------
@dataclass(frozen=True)
class DynamicTaus:
    """Measured tau (tokens per round) of dynamic trees: tau[i][d][j] for width top_k[i], depth d+1 and budget
    budgets[j]. Between budgets linear (through tau 1 at budget 0), past the last constant."""

    top_k: tuple[int, ...]
    budgets: tuple[int, ...]
    tau: tuple[tuple[tuple[float, ...], ...], ...]

    @property
    def depth(self) -> int:
        return len(self.tau[0]) if self.tau else 0

    def at(self, top_k: int, depth: int, budget: int) -> float | None:
        """tau of dynamic top_k/depth/budget, None when the width or the depth was not measured."""
        if depth == 0 or budget == 0:
            return 1.0
        if top_k not in self.top_k or depth > self.depth:
            return None
        row = self.tau[self.top_k.index(top_k)][depth - 1]
        xs, ys = (0, *self.budgets), (1.0, *row)
        i = bisect.bisect_left(xs, budget)
        if i >= len(xs):
            return ys[-1]
        if xs[i] == budget:
            return ys[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (budget - xs[i - 1]) / (xs[i] - xs[i - 1])

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DynamicTaus:
        return cls(tuple(d["top_k"]), tuple(d["budgets"]), tuple(tuple(tuple(r) for r in t) for t in d["tau"]))


@dataclass(frozen=True)
class Acceptance:
    """One temperature's acceptance profile: accept [D][K] (see the module docstring), optional dynamic taus."""

    accept: tuple[tuple[float, ...], ...]
    dynamic: DynamicTaus | None = None

    @property
    def depth(self) -> int:
        return len(self.accept)

    def tau(self, spec: TreeSpec) -> float:
        """Expected tokens per round of `spec`: 1 + its nodes' values (chains, static trees); a dynamic tree's
        measured tau, else the best static tree within its depth, width and budget (a lower bound)."""
        if not spec.speculates:
            return 1.0
        if spec.kind == "chain":
            return chain_tau(self.accept, spec.depth)
        if spec.kind == "static":
            return 1.0 + sum(path_value(self.accept, p) for p in spec.static_choices())
        found = None if self.dynamic is None else self.dynamic.at(spec.top_k, spec.depth, spec.budget)
        if found is not None:
            return found
        table = [list(r[: spec.top_k]) for r in self.accept[: spec.depth]]
        return 1.0 + sum(path_value(table, p) for p in fit_static_tree(table, spec.budget))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Acceptance:
        dyn = d.get("dynamic")
        return cls(tuple(tuple(r) for r in d["accept"]), None if dyn is None else DynamicTaus.from_dict(dyn))


@dataclass(frozen=True)
class AcceptanceProfile:
    """A drafter's acceptance at T=0 (greedy requests) and T=1 (sampled requests); either may be missing."""

    greedy: Acceptance | None
    sampled: Acceptance | None

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "drafter") -> AcceptanceProfile:
        """From an acceptance_profile object (validated: checkpoint.manifest.read_acceptance_profile)."""
        return cls._validated(read_acceptance_profile({"acceptance_profile": d}, where))

    def acceptance(self, sampled: bool) -> Acceptance:
        """The profile of greedy requests (T=0) or sampled ones (T=1); the other one where that is missing."""
        found = (self.sampled or self.greedy) if sampled else (self.greedy or self.sampled)
        assert found is not None, "an acceptance profile holds t0 or t1"
        return found

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any] | None, where: str = "drafter") -> AcceptanceProfile | None:
        """The manifest's acceptance_profile (None when it has none; malformed: a one-line EagleSpecError)."""
        d = read_acceptance_profile(manifest, where)
        return None if d is None else cls._validated(d)

    @classmethod
    def _validated(cls, d: dict[str, Any]) -> AcceptanceProfile:
        return cls(*(Acceptance.from_dict(d[k]) if k in d else None for k in ("t0", "t1")))


def chain_tau(accept: Sequence[Sequence[float]], k: int) -> float:
    """1 + sum over d = 1..k of prod_{i<d} accept[i][0]: a chain's expected tokens per round."""
    tau, value = 1.0, 1.0
    for d in range(min(k, len(accept))):
        value *= accept[d][0]
        tau += value
    return tau


# -- the chooser -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    """A candidate tree with its predicted tau, round seconds and tokens per second. `paths`: a static tree's rank
    paths (best first)."""

    kind: str  # plain | chain | static | dynamic
    tau: float
    round_s: float
    depth: int = 0
    top_k: int = 0
    budget: int = 0
    paths: tuple[tuple[int, ...], ...] | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tau / self.round_s

    def spec(self) -> TreeSpec:
        """The TreeSpec that drafts this candidate (plain decoding: a chain of 0)."""
        if self.kind == "plain":
            return TreeSpec("chain", depth=0)
        if self.kind == "chain":
            return TreeSpec("chain", depth=self.depth)
        if self.kind == "static":
            return fitted_spec(self.paths, self.budget)
        return TreeSpec("dynamic", depth=self.depth, top_k=self.top_k, budget=self.budget)

    def label(self) -> str:
        if self.kind == "plain":
            return "plain decoding"
        if self.kind == "chain":
            return f"chain k={self.depth}"
        if self.kind == "static":
            return f"static depth {self.depth} budget {self.budget}"
        return f"dynamic depth {self.depth} top-k {self.top_k} budget {self.budget}"

    def summary(self) -> str:
        """'dynamic depth 6 top-k 8 budget 40: predicted 3150 tok/s (tau 4.40, 1.397 ms a round)'."""
        return (f"{self.label()}: predicted {self.tokens_per_second:.1f} tok/s (tau {self.tau:.2f}, "
                f"{self.round_s * 1e3:.3f} ms a round)")


def predict(spec: TreeSpec, acceptance: Acceptance, costs: CostModel, sampled: bool = False) -> Prediction:
    """The predicted tau, round seconds and tokens per second of one spec."""
    tau = acceptance.tau(spec)
    secs = costs.round_seconds(spec, tau, sampled)
    if not spec.speculates:
        return Prediction("plain", 1.0, secs)
    if spec.kind == "static":
        paths = spec.static_choices()
        return Prediction("static", tau, secs, depth=max(map(len, paths)), top_k=spec.top_k, budget=len(paths),
                          paths=paths)
    return Prediction(spec.kind, tau, secs, depth=spec.depth, top_k=spec.top_k if spec.kind == "dynamic" else 0,
                      budget=spec.budget if spec.kind == "dynamic" else spec.depth)


def _fits(kind: str, depth: int, top_k: int, budget: int, fixed: dict[str, int]) -> bool:
    """Whether a candidate keeps the knobs the user fixed. `k` names a chain (only chains of that length remain);
    depth / budget name trees (static or dynamic of that depth / budget), top_k dynamic trees. Plain decoding
    remains only when nothing is fixed."""
    if not fixed:
        return True
    if kind == "plain":
        return False
    if "k" in fixed:
        return kind == "chain" and depth == fixed["k"]
    if kind == "chain":
        return False
    ok = fixed.get("depth", depth) == depth and fixed.get("budget", budget) == budget
    if kind == "dynamic":
        return ok and fixed.get("top_k", top_k) == top_k
    return ok and "top_k" not in fixed  # a width names a dynamic tree


def candidates(acceptance: Acceptance, costs: CostModel, sampled: bool = False, kinds: Sequence[str] = KINDS,
               fixed: dict[str, int | None] | None = None, max_budget: int | None = None) -> list[Prediction]:
    """Every candidate, fastest first (ties: in enumeration order, plain, chains, static, dynamic, smaller
    first). Budgets go up to max_budget (default: the verify curve's last row count less the root). fixed: knobs
    the user set (k, depth, top_k, budget; None = free), kept by every candidate (_fits). Dynamic trees only where
    the profile measured them (acceptance.dynamic)."""
    for kind in kinds:
        if kind not in KINDS:
            raise EagleSpecError(f"tree kind {kind!r} is not one of {', '.join(KINDS)}")
    fixed = {k: v for k, v in (fixed or {}).items() if v is not None}
    top = max(1, (max_budget if max_budget is not None else costs.verify.max_rows - 1))
    o = costs.overhead(sampled)
    accept = acceptance.accept
    out: list[Prediction] = []
    if "plain" in kinds and _fits("plain", 0, 0, 0, fixed):
        out.append(Prediction("plain", 1.0, o.plain_s))
    if "chain" in kinds:
        for k in range(1, min(acceptance.depth, top) + 1):
            if _fits("chain", k, 0, k, fixed):
                tau = chain_tau(accept, k)
                out.append(Prediction("chain", tau, costs._seconds(RoundShape(k + 1, (1,) * (k - 1)), tau, o),
                                      depth=k, budget=k))
    if "static" in kinds:
        out += _static_candidates(accept, costs, o, top, fixed)
    if "dynamic" in kinds and acceptance.dynamic is not None:
        dyn = acceptance.dynamic
        for width in dyn.top_k:
            for depth in range(1, dyn.depth + 1):
                for budget in range(1, min(top, dynamic_candidates(width, depth)) + 1):
                    if not _fits("dynamic", depth, width, budget, fixed):
                        continue
                    tau = dyn.at(width, depth, budget)
                    shape = RoundShape(budget + 1, (width,) * (depth - 1))
                    out.append(Prediction("dynamic", tau, costs._seconds(shape, tau, o), depth=depth, top_k=width,
                                          budget=budget))
    order = sorted(range(len(out)), key=lambda i: (-out[i].tokens_per_second, i))
    return [out[i] for i in order]


def _static_candidates(accept: Sequence[Sequence[float]], costs: CostModel, o: Overhead, top: int,
                       fixed: dict[str, int]) -> list[Prediction]:
    """The fitted static trees of every depth cap and budget: fit_static_tree lists the best tree's paths best
    first, so each prefix is the best tree of its size (its shape and value built up node by node)."""
    out: list[Prediction] = []
    for cap in range(1, len(accept) + 1):
        paths = fit_static_tree([list(r) for r in accept[:cap]], top)
        tau, depth = 1.0, 0
        expanded = [0] * (cap + 1)  # nodes with children, per depth
        parents: set[tuple[int, ...]] = set()
        for b, p in enumerate(paths, start=1):
            tau += path_value(accept, p)
            depth = max(depth, len(p))
            if len(p) > 1 and p[:-1] not in parents:
                parents.add(p[:-1])
                expanded[len(p) - 1] += 1
            # a tree shallower than the cap is the best of its size under its own depth's cap too: counted there
            if depth != cap or not _fits("static", depth, 0, b, fixed):
                continue
            shape = RoundShape(b + 1, tuple(expanded[d] for d in range(1, depth)))
            out.append(Prediction("static", tau, costs._seconds(shape, tau, o), depth=depth, top_k=10, budget=b,
                                  paths=tuple(paths[:b])))
    return out


def choose(acceptance: Acceptance, costs: CostModel, sampled: bool = False, kinds: Sequence[str] = KINDS,
           fixed: dict[str, int | None] | None = None, max_budget: int | None = None) -> Prediction:
    """The candidate with the most predicted tokens per second (see `candidates`)."""
    found = candidates(acceptance, costs, sampled, kinds, fixed, max_budget)
    if not found:
        raise EagleSpecError("--tree auto: no tree shape fits the knobs given (" +
                             ", ".join(f"{k} {v}" for k, v in (fixed or {}).items() if v is not None) + ")")
    return found[0]


# -- what --tree auto resolves to ---------------------------------------------------------------------------
SHAPE_KNOBS = ("k", "top_k", "depth", "budget")


def wants_auto(knobs: dict[str, Any], drafter, device: torch.device | str) -> bool:
    """Whether the tree knobs resolve by measurement: `--tree auto`, or no tree knob at all on a CUDA device with a
    drafter whose manifest has an acceptance_profile and recommends no GPU tree (tree_defaults.cuda, a choice
    measured on a GPU, wins over the model's)."""
    if knobs.get("tree") == "auto":
        return True
    if knobs.get("tree") is not None or any(knobs.get(k) is not None for k in SHAPE_KNOBS):
        return False
    manifest = getattr(drafter, "manifest", None) or {}
    recommends = isinstance(manifest.get("tree_defaults"), dict) and "cuda" in manifest["tree_defaults"]
    return torch.device(device).type == "cuda" and manifest.get("acceptance_profile") is not None and not recommends


def drafter_profile(drafter, where: str = "drafter") -> AcceptanceProfile:
    """The drafter's acceptance profile (its manifest's acceptance_profile); none is a one-line EagleSpecError."""
    profile = AcceptanceProfile.from_manifest(getattr(drafter, "manifest", None), where)
    if profile is None:
        raise EagleSpecError(f"--tree auto needs the drafter's acceptance profile: {where} has no "
                             "eaglespec_manifest.json field acceptance_profile (bench/acceptance_profile.py --write "
                             "measures and stores one)")
    return profile


def auto_trees(knobs: dict[str, Any], profile: AcceptanceProfile, costs: CostModel
               ) -> tuple[Prediction, Prediction | None]:
    """(the choice for greedy requests, the choice for sampled ones or None = the same tree). Greedy requests use
    the T=0 profile (else the T=1 one), sampled requests the T=1 profile with the sampled round costs (None without
    a T=1 profile). Knobs set besides the tree (k, top_k, depth, budget) are kept by every candidate."""
    fixed = {k: knobs.get(k) for k in SHAPE_KNOBS}
    greedy = choose(profile.acceptance(False), costs, sampled=False, fixed=fixed)
    sampled = None if profile.sampled is None else choose(profile.sampled, costs, sampled=True, fixed=fixed)
    return greedy, sampled


def auto_line(greedy: Prediction, sampled: Prediction | None, costs: CostModel) -> str:
    """One line naming the choices and their predicted tokens per second."""
    where = f" on {costs.device}" if costs.device else ""
    line = f"eaglespec: --tree auto{where}: greedy: {greedy.summary()}"
    if sampled is not None:
        line += f"; sampled (T=1): {sampled.summary()}"
    return line
