"""The measurements behind `--tree auto` (tree/auto.py's model): a target + drafter's costs on this device, and a
drafter's acceptance profile on calibration prompts.

    costs = cached_costs(engine, model, drafter)        # measured once per target shape, drafter and device
    profile = measure_profile(engine, prompts, 256)     # the manifest's acceptance_profile (t0 and t1)

Costs (measure_costs, with eaglespec.scale's timers): the verify curve is one fast-target forward over R rows after
a `context`-token prefix, R = the target's row buckets; the draft curve one step of the drafter's row runner over n
rows, n = its buckets (both made non-decreasing in rows: monotone); then whole rounds through the engine (plain
decoding and ROUND_SPECS, greedy and sampled at T=1) fit the per-round and per-drafter-step overheads of trees
and of chains (tree.auto.fit_overhead). Every timing is the least of its samples (the one least disturbed by other work on the
device). cached_costs keeps them as JSON under the cache directory (EAGLESPEC_CACHE), keyed by the target's config
digest (the architecture part of its fingerprint, checkpoint/manifest.py), the dtype, the drafter's config, the
device's name and the engine's mode.

Acceptance (measure_profile): the target answers each prompt (plain decoding through the engine, greedy, then
sampled at T=1) and the drafter is driven over the answer as the engine drives it (catch-up rows from target
features; along a path, fed the path's tokens). Anchors are the answer positions whose whole depth lies in the text.
    t0.dynamic  replay_dynamic: at every anchor the proposer grows a dynamic tree of width K to the full depth with
                every candidate kept; the target's greedy path in it and its nodes' positions in the selection order
                give the accepted drafts of every depth D and budget B at once (a depth-D, budget-B tree is the
                first B candidates of depth <= D in that order). walk_rounds then follows each tree's greedy run
                over the anchors (a round rooted after the last one's accepted tokens), so tau is the tokens per
                round that run makes: at T=0 exactly the engine's rounds on that text
    t0.accept   tree.fit.measure_ranks' rank paths at the anchors where the widest, deepest of those runs (budget
                <= 64) rooted its rounds: P(the target's greedy token is the drafter's rank-r token at depth d+1)
                where rounds start (after a rejection), not at every position (which reads too high)
    t1.accept   sampled_rows: per depth, the sibling-acceptance curve a(j) (tree.sampled_fit.sibling_acceptance,
                j draws without replacement from the drafter's q against the target's p at T=1) along the
                sampled text, every anchor weighted alike; accept[d][r] = a(r+1) - a(r)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from eaglespec.checkpoint.manifest import config_digest, read_acceptance_profile
from eaglespec.draft.proposer import Proposer, shifted_tokens
from eaglespec.engine.timing import random_tokens, time_draft_steps, time_rounds, time_verify_curve
from eaglespec.errors import EagleSpecError
from eaglespec.sampling import SamplingConfig, SamplingParams, process_logits
from eaglespec.tree.auto import COSTS_VERSION, CostModel, Curve, dynamic_candidates, fit_overhead, round_shape
from eaglespec.tree.core import TreeSpec
from eaglespec.tree.fit import RankCounts, measure_ranks
from eaglespec.tree.sampled_fit import sibling_acceptance

PLAIN = TreeSpec("chain", depth=0)
# the rounds timed to fit the overheads: 0 to 6 drafter steps of 1 to 8 rows, 2 to 49 verify rows (a chain of 1
# and a one-level tree anchor the fits at rounds with no drafter step after the catch-up)
ROUND_SPECS = (TreeSpec("chain", depth=1), TreeSpec("chain", depth=2), TreeSpec("chain", depth=5),
               TreeSpec("static", depth=5, budget=25), TreeSpec("dynamic", depth=1, top_k=4, budget=4),
               TreeSpec("dynamic", depth=3, top_k=4, budget=8), TreeSpec("dynamic", depth=7, top_k=8, budget=48))
# rounds outside the fit, to check predictions against (round_errors)
CHECK_SPECS = (TreeSpec("chain", depth=4), TreeSpec("static", depth=4, budget=16),
               TreeSpec("dynamic", depth=5, top_k=6, budget=24), TreeSpec("dynamic", depth=7, top_k=10, budget=60),
               TreeSpec("dynamic", depth=8, top_k=10, budget=127))
DRAFT_ROWS = (1, 2, 4, 8, 16, 32, 64)  # a runner without buckets (eager rows)
ROOM = 256  # drafter KV rows a measured round may take past its prompt and new tokens (a tree's rows)
DYNAMIC_TOP_K = (4, 6, 8, 10)
DYNAMIC_BUDGETS = (1, 2, 3, 4, 6, 7, 8, 10, 12, 15, 16, 20, 24, 31, 32, 40, 48, 56, 63, 64, 80, 96, 112, 127)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- costs ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostSettings:
    """What measure_costs runs: the prefix the forwards follow, timed samples per point, engine runs per round
    policy (new tokens each, after one untimed run), and whether sampled (T=1) rounds are timed too."""

    context: int = 512
    samples: int = 3
    round_tokens: int = 48
    round_repeats: int = 2
    sampled: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("context", "samples", "round_repeats"):
            if getattr(self, name) < 1:
                raise EagleSpecError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.round_tokens < 3:
            raise EagleSpecError(f"round_tokens must be >= 3, got {self.round_tokens}")


class _Sampled:
    """An engine whose streams sample (timing.time_rounds calls stream(prompt, n, spec=...))."""

    def __init__(self, engine, sampling: SamplingConfig):
        self.engine, self.sampling = engine, sampling

    def stream(self, prompt, new_tokens: int, spec: TreeSpec | None = None):
        return self.engine.stream(prompt, new_tokens, sampling=self.sampling, spec=spec)


def monotone(seconds: Sequence[float]) -> tuple[float, ...]:
    """Measured seconds by ascending rows with each point lowered to the least of it and every later point: a forward
    over fewer rows is taken to cost no more than one over more (a slower small point is timing noise)."""
    out = list(seconds)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return tuple(out)


def context_for(settings: CostSettings, target, runner) -> int:
    """settings.context, shortened where the target's cache cap (max_slots) or the drafter's static KV (its max_len)
    would not hold it with a round's rows after it."""
    ctx = settings.context
    if getattr(target, "max_slots", None):
        ctx = min(ctx, target.max_slots - target.buckets[-1])
    if getattr(runner, "max_len", None):
        ctx = min(ctx, runner.max_len - settings.round_tokens - ROOM)
    if ctx < 1:
        raise EagleSpecError("the target's context or the drafter's KV is too short to measure round costs in")
    return ctx


def device_label(device: torch.device | str) -> str:
    """The GPU's name, or "cpu (N threads)" (CPU costs follow the threads)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type} ({torch.get_num_threads()} threads)"


def _inner(engine):
    return getattr(engine.target, "inner", engine.target)


@torch.no_grad()
def measure_costs(engine, settings: CostSettings | None = None, log: Callable[[str], None] = lambda s: None
                  ) -> CostModel:
    """The CostModel of the engine's target (the fast backend) and drafter on their device (module docstring). The
    target and the proposer are left reset."""
    from eaglespec.backends.fast import FastTarget

    settings = settings or CostSettings()
    target = _inner(engine)
    if not isinstance(target, FastTarget):
        raise EagleSpecError(f"--tree auto measures its costs on the fast backend, not on {target.name}: use the fast "
                             "backend or name a tree (--tree chain|static|dynamic)")
    if engine.proposer is None:
        raise EagleSpecError("--tree auto needs a drafter")
    gen = torch.Generator().manual_seed(settings.seed)
    vrows = tuple(target.buckets)
    ctx = context_for(settings, target, engine.proposer.runner)
    curve = time_verify_curve(target, (ctx,), vrows, settings.samples, gen)[ctx]
    verify = Curve(vrows, monotone([min(p["samples"]) / 1e3 for p in curve]), bucketed=True)
    log("eaglespec: verify ms by rows: " + " ".join(f"{r}:{1e3 * s:.3f}" for r, s in zip(vrows, verify.seconds)))
    runner = engine.proposer.runner
    drows = tuple(getattr(runner, "buckets", DRAFT_ROWS))
    steps = time_draft_steps(engine.proposer, ctx, drows, settings.samples, gen, target.vocab_size)
    draft = Curve(drows, monotone([min(steps[n]["samples"]) / 1e3 for n in drows]), bucketed=hasattr(runner, "buckets"))
    log("eaglespec: draft step ms by rows: " + " ".join(f"{r}:{1e3 * s:.3f}" for r, s in zip(drows, draft.seconds)))
    prompt = random_tokens(ctx, target.vocab_size, gen, torch.device("cpu")).tolist()
    regimes = {"greedy": engine}
    if settings.sampled:
        regimes["sampled"] = _Sampled(engine, SamplingConfig(SamplingParams(temperature=1.0), seed=settings.seed))
    overheads = {}
    for name, runs in regimes.items():
        plain = time_rounds(runs, prompt, PLAIN, settings.round_tokens, settings.round_repeats)
        points = []
        for spec in ROUND_SPECS:
            r = time_rounds(runs, prompt, spec, settings.round_tokens, settings.round_repeats)
            points.append((round_shape(spec), r["tau"], min(r["samples"]) / 1e3))
        o = overheads[name] = fit_overhead(points, draft, verify, min(plain["samples"]) / 1e3)
        chain_round, chain_step = o.of(chain=True)
        log(f"eaglespec: {name} rounds: plain step {o.plain_s * 1e3:.3f} ms, overhead {o.round_s * 1e3:.3f} ms a "
            f"round + {o.step_s * 1e3:.3f} ms a drafter step (chains: {chain_round * 1e3:.3f} + "
            f"{chain_step * 1e3:.3f} ms)")
    target.reset()
    engine.proposer.reset()
    return CostModel(draft, verify, overheads["greedy"], overheads.get("sampled"), device=device_label(target.device),
                     context=ctx)


@torch.no_grad()
def round_errors(engine, costs: CostModel, specs: Sequence[TreeSpec] = CHECK_SPECS, context: int | None = None,
                 new_tokens: int = 48, repeats: int = 3, seed: int = 1) -> list[dict[str, Any]]:
    """Predicted against measured round costs (greedy): per spec, the rounds of the engine after a random prompt of
    `context` tokens (default: the costs' context; timing.time_rounds, the least of `repeats` runs) and
    costs.round_seconds at the measured tau. Returns [{spec, tau, measured_ms, predicted_ms, error_pct}]."""

    target = _inner(engine)
    gen = torch.Generator().manual_seed(seed)
    prompt = random_tokens(context or costs.context or 512, target.vocab_size, gen, torch.device("cpu")).tolist()
    out = []
    for spec in specs:
        r = time_rounds(engine, prompt, spec, new_tokens, repeats)
        measured, predicted = min(r["samples"]), 1e3 * costs.round_seconds(spec, r["tau"])
        out.append({"spec": spec, "tau": r["tau"], "measured_ms": measured, "predicted_ms": predicted,
                    "error_pct": 100.0 * (predicted - measured) / measured})
    return out


def costs_key(engine, model, drafter) -> dict[str, Any]:
    """What a cached cost model is keyed by: the target's config digest, dtype, the drafter's config, the device's
    name and the engine's mode (backend, CUDA graphs, round graphs, draft runner)."""
    target = _inner(engine)
    cfg = getattr(drafter, "cfg", None)
    draft_cfg = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else repr(cfg)
    return {"version": COSTS_VERSION, "target": config_digest(model),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "drafter": hashlib.sha256(json.dumps(draft_cfg, sort_keys=True, default=str).encode()).hexdigest()[:16],
            "device": device_label(target.device), "backend": target.name,
            "cuda_graphs": bool(getattr(target, "use_graphs", False)), "round_graphs": engine.graphs is not None,
            "draft_runner": type(engine.proposer.runner).__name__ if engine.proposer is not None else None}


def costs_path(key: dict[str, Any], root: Path | None = None) -> Path:
    """The cache file of a costs_key: <cache dir>/tree_costs/<device>-<target digest>-<key digest>.json."""
    from eaglespec.backends.loading import cache_dir

    device = re.sub(r"[^a-z0-9]+", "-", key["device"].lower()).strip("-")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return (root or cache_dir()) / "tree_costs" / f"{device}-{key['target'][:12]}-{digest}.json"


def cached_costs(engine, model, drafter, settings: CostSettings | None = None, refresh: bool = False,
                 log: Callable[[str], None] = log) -> CostModel:
    """The engine's CostModel from the cache (costs_path), measured and stored there on first use (or `refresh`).
    A cache file that does not read back is measured again."""
    key = costs_key(engine, model, drafter)
    path = costs_path(key)
    if path.is_file() and not refresh:
        try:
            return CostModel.from_dict(json.loads(path.read_text())["costs"], str(path))
        except (OSError, ValueError, KeyError, TypeError, EagleSpecError) as exc:
            log(f"eaglespec: {path}: {exc}; measuring again")
    log(f"eaglespec: --tree auto: measuring the round costs of this target and drafter on {key['device']} "
        f"(once: cached in {path})")
    costs = measure_costs(engine, settings, log)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "costs": costs.to_dict()}, indent=1) + "\n")
    tmp.replace(path)
    return costs


def costs_for(target, drafter, model, config, draft_max_len: int | None = None,
              log: Callable[[str], None] = log) -> CostModel:
    """cached_costs of an engine over `target` and `drafter` built as the EngineConfig `config` says (e.g. bench's
    fast target, whose engines are built per method)."""
    from eaglespec.engine.build import build_engine

    need = CostSettings().context + CostSettings().round_tokens + ROOM
    engine = build_engine(target, drafter, TreeSpec(), config, draft_max_len=max(draft_max_len or 0, need))
    return cached_costs(engine, model, drafter, log=log)


# -- acceptance ---------------------------------------------------------------------------------------------
def _forward(engine, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One target forward over ids: (logits [n, V], features [n, F]) on the drafter's device; the target reset."""
    target = engine.target
    dev = next(engine.proposer.drafter.parameters()).device
    target.reset()
    out = target.forward(ids.to(getattr(target, "device", dev)))
    target.reset()
    return out.logits.to(dev), out.features.to(dev)


def _anchors(start: int, n: int, depth: int) -> range:
    """Catch-up rows t of the answer (root ids[t+1], t >= start-1) whose depth-`depth` token lies in the text."""
    return range(start - 1, n - 1 - depth)


def _catch_up_to(prop: Proposer, feats: torch.Tensor, ids: torch.Tensor, first: int) -> None:
    if first > 0:
        prop.catch_up(feats[:first], shifted_tokens(ids, 0, first))


@torch.no_grad()
def replay_dynamic(engine, ids: Sequence[int] | torch.Tensor, start: int, top_ks: Sequence[int], depth: int,
                   budgets: Sequence[int]) -> torch.Tensor:
    """Accepted drafts of greedy dynamic trees at every anchor of one text (module docstring).

    ids: prompt + the target's greedy answer from index `start`. Returns accepted [A, len(top_ks), depth,
    len(budgets)] long: the drafts the tree of width top_ks[i], depth d+1 and budget budgets[j] rooted at anchor a
    accepts (anchors: the catch-up rows t = start-1, start, ... whose whole depth lies in the text; A may be 0)."""
    if engine.proposer is None:
        raise EagleSpecError("replay_dynamic needs an engine with a drafter")
    drafter = engine.proposer.drafter
    dev = next(drafter.parameters()).device
    ids = torch.as_tensor(ids, dtype=torch.long).to(dev).reshape(-1)
    anchors = _anchors(start, ids.numel(), depth) if start >= 1 and depth >= 1 else range(0)
    out = torch.zeros(len(anchors), len(top_ks), depth, len(budgets), dtype=torch.long)
    if not anchors:
        return out
    logits, feats = _forward(engine, ids)
    truth = logits.argmax(-1).cpu()  # truth[j]: the target's greedy token after row j
    text = ids.cpu()
    cap = torch.tensor(budgets, dtype=torch.long)
    within = torch.arange(depth)[:, None] < torch.arange(1, depth + 1)[None, :]  # [L, D]: path node l has depth <= D
    for i, width in enumerate(top_ks):
        spec = TreeSpec("dynamic", depth=depth, top_k=width, budget=dynamic_candidates(width, depth))
        prop = Proposer(drafter, spec, kernels=False)
        _catch_up_to(prop, feats, ids, anchors[0])
        for a, t in enumerate(anchors):
            tree = prop.propose(ids[t + 1], feats[t:t + 1], shifted_tokens(ids, t, 1))
            tokens, parents = tree.tokens.cpu(), tree.parents.cpu()
            path, node = [], 0
            for d in range(1, depth + 1):
                want = truth[t + d]  # the target's token at depth d below the root ids[t+1]
                hit = ((parents == node) & (tokens == want)).nonzero()
                if not hit.numel():
                    break
                node = int(hit[0, 0])
                path.append(node - 1)
                if text[t + 1 + d] != want:
                    break  # the text leaves the greedy path: deeper tokens are not observed
            if not path:
                continue
            logq, depths = tree.logq[1:].float().cpu(), tree.depths[1:].cpu()
            order = torch.sort(-logq, stable=True).indices  # the selection order: (-value, depth, candidate id)
            pos = torch.empty_like(order)
            pos[order] = torch.arange(order.numel())
            nodes = torch.tensor(path)
            before = (pos[None, :] < pos[nodes][:, None]).double()  # [L, N]
            rank = (before @ F.one_hot(depths - 1, depth).double()).cumsum(1)  # [L, D]: nodes of depth <= D first
            kept = (rank[:, :, None] < cap[None, None, :]) & within[: len(path), :, None]  # [L, D, B]
            out[a, i] = kept.sum(0)
    return out


def walk_rounds(accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rounds a greedy run of each tree makes over consecutive anchors: the first rooted at anchor 0, each next
    one the accepted drafts + 1 anchors later (exactly a T=0 run's rounds on that text: the drafter's state at a
    root does not depend on the rounds before it, contract 7). accepted [A, ...] (replay_dynamic). Returns
    (tokens [...] emitted, rounds [...], visited [A, ...] bool: the anchors rounds were rooted at), over the rounds
    rooted at an anchor."""
    a, shape = accepted.shape[0], accepted.shape[1:]
    flat = accepted.reshape(a, -1)  # [A, C]
    cols = torch.arange(flat.shape[1])
    pos = torch.zeros_like(cols)
    tokens, rounds = torch.zeros_like(cols), torch.zeros_like(cols)
    visited = torch.zeros(flat.shape, dtype=torch.bool)
    while a and bool((live := pos < a).any()):
        at = pos[live]
        got = flat[at, cols[live]]
        visited[at, cols[live]] = True
        tokens[live] += got + 1
        rounds[live] += 1
        pos[live] = at + got + 1
    return tokens.reshape(shape), rounds.reshape(shape), visited.reshape(a, *shape)


def rank_table(paths: Sequence[Sequence[int]], depth: int, top_k: int) -> list[list[float]]:
    """accept [depth][top_k] from rank paths (tree.fit.RankCounts.paths: per anchor the rank of the target's token
    at each depth, top_k = not among the top-k): P(rank r at depth d+1 | the path reached depth d+1)."""
    counts = RankCounts.zeros(depth, top_k)
    for path in paths:
        for d, r in enumerate(path):
            counts.counts[d, r] += 1
    return counts.accept().tolist()


@torch.no_grad()
def sampled_rows(engine, ids: Sequence[int] | torch.Tensor, start: int, depth: int, width: int,
                 generator: torch.Generator | None = None, samples: int = 32, stride: int = 1
                 ) -> tuple[torch.Tensor, int]:
    """Sibling-acceptance curves at T=1 summed over the anchors of one sampled text (module docstring).

    ids: prompt + a sampled answer from index `start`. Per anchor and depth d: q = the drafter's distribution
    (temperature 1) after the anchor's catch-up row fed the text's tokens, p = the target's at T=1 after the same
    text; a(j), j = 1..width, by sibling_acceptance. Returns (sums [depth, width] float64, anchors measured)."""
    if engine.proposer is None:
        raise EagleSpecError("sampled_rows needs an engine with a drafter")
    drafter = engine.proposer.drafter
    dev = next(drafter.parameters()).device
    ids = torch.as_tensor(ids, dtype=torch.long).to(dev).reshape(-1)
    n = ids.numel()
    sums = torch.zeros(depth, width, dtype=torch.float64)
    anchors = _anchors(start, n, depth)
    if start < 1 or depth < 1 or not anchors:
        return sums, 0
    logits, feats = _forward(engine, ids)
    p_all = process_logits(logits, SamplingParams(temperature=1.0))  # [n, V]
    dv_ids = drafter.to_target_ids(torch.arange(drafter.cfg.draft_vocab_size, device=dev))  # [Vd] target ids
    prop = Proposer(drafter, TreeSpec("chain", depth=depth), kernels=False)
    _catch_up_to(prop, feats, ids, anchors[0])
    timed = 0
    for t in anchors:
        logits_d, state = prop.catch_up(feats[t:t + 1], shifted_tokens(ids, t, 1))  # predicts depth 1
        if (t - anchors[0]) % stride:
            continue
        q_rows, p_rows = [], []
        try:
            for d in range(1, depth + 1):
                q_rows.append(torch.softmax(logits_d.float(), -1))
                p_rows.append(p_all[t + d, dv_ids])  # the target at depth d: after row t+d
                if d == depth:
                    break
                pos = torch.full((1,), prop.committed + d - 1, dtype=torch.long, device=dev)
                step, states = prop.runner.run(state[None], ids[t + 1 + d: t + 2 + d], pos)  # fed the depth-d token
                logits_d, state = step[0], states[0]
        finally:
            prop.runner.crop(prop.committed)
        curve = sibling_acceptance(torch.stack(p_rows).cpu(), torch.stack(q_rows).cpu(), width, generator, samples)
        sums += curve.double()
        timed += 1
    return sums, timed


def curve_table(curves: torch.Tensor) -> list[list[float]]:
    """[D, N] sibling curves a_d(1..N) -> accept [D][N]: a_d(r+1) - a_d(r), the curve made non-decreasing first."""
    out = []
    for row in curves.tolist():
        a = [0.0, *accumulate(row, max)]
        out.append([max(a[r + 1] - a[r], 0.0) for r in range(len(row))])
    return out


@torch.no_grad()
def measure_profile(engine, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos: Sequence[int] = (),
                    depth: int = 8, top_k: int = 10, dynamic_top_k: Sequence[int] = DYNAMIC_TOP_K,
                    budgets: Sequence[int] = DYNAMIC_BUDGETS, temperatures: Sequence[str] = ("t0", "t1"),
                    samples: int = 32, stride: int = 1, seed: int = 0,
                    log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The drafter's acceptance profile on calibration prompts (token ids), as the manifest's acceptance_profile
    (checkpoint.manifest.read_acceptance_profile): t0 (accept and dynamic) from greedy answers, t1 (accept) from
    answers sampled at T=1, each of up to max_new_tokens (module docstring). Widths of dynamic_top_k above the
    draft vocabulary are left out; at T=1 every `stride`-th anchor is measured (the drafter catches up on all)."""
    if engine.proposer is None:
        raise EagleSpecError("measuring an acceptance profile needs an engine with a drafter")
    unknown = set(temperatures) - {"t0", "t1"}
    if unknown or not temperatures:
        raise EagleSpecError(f"temperatures must be among t0, t1, got {list(temperatures)}")
    for name, value in (("depth", depth), ("top_k", top_k), ("stride", stride), ("samples", samples)):
        if value < 1:
            raise EagleSpecError(f"{name} must be >= 1, got {value}")
    drafter = engine.proposer.drafter
    vd = drafter.cfg.draft_vocab_size
    widths = tuple(k for k in dynamic_top_k if k <= vd)
    out: dict[str, Any] = {}
    tokens = 0
    if "t0" in temperatures:
        paths: list[tuple[int, ...]] = []  # rank paths of the anchors rounds were rooted at
        walked = torch.zeros(2, len(widths), depth, len(budgets), dtype=torch.long)  # tokens, rounds
        # the tree whose rounds' roots weigh the rank table: the widest, deepest, with the largest budget <= 64
        ref = (len(widths) - 1, depth - 1, max((j for j, b in enumerate(budgets) if b <= 64), default=0))
        for i, ids in enumerate(prompts):
            answer = engine.generate(list(ids), max_new_tokens, eos, spec=PLAIN).token_ids
            full = list(ids) + answer
            tokens += len(answer)
            ranks = measure_ranks(engine, full, len(ids), depth, top_k)  # paths of anchors start-1, start, ...
            if widths:
                emitted, rounds, visited = walk_rounds(replay_dynamic(engine, full, len(ids), widths, depth, budgets))
                walked += torch.stack([emitted, rounds])
                paths += [p for p, seen in zip(ranks.paths, visited[(slice(None), *ref)].tolist()) if seen]
            else:
                paths += ranks.paths
            log(f"eaglespec: acceptance at T=0: prompt {i + 1}/{len(prompts)}, {len(answer)} tokens")
        out["t0"] = {"accept": [[round(x, 6) for x in r] for r in rank_table(paths, depth, top_k)],
                     "anchors": len(paths)}
        if widths and int(walked[1].min()) > 0:
            tau = walked[0].double() / walked[1].double()
            out["t0"]["dynamic"] = {"top_k": list(widths), "budgets": list(budgets),
                                    "tau": [[[round(x, 4) for x in row] for row in t] for t in tau.tolist()],
                                    "rounds": int(walked[1].sum())}
    if "t1" in temperatures:
        gen = torch.Generator().manual_seed(seed)
        sums, anchors = torch.zeros(depth, top_k, dtype=torch.float64), 0
        for i, ids in enumerate(prompts):
            sampling = SamplingConfig(SamplingParams(temperature=1.0), seed=seed + i)
            answer = engine.generate(list(ids), max_new_tokens, eos, sampling=sampling, spec=PLAIN).token_ids
            tokens += len(answer)
            s, m = sampled_rows(engine, list(ids) + answer, len(ids), depth, min(top_k, vd), gen, samples, stride)
            sums[:, : s.shape[1]] += s
            anchors += m
            log(f"eaglespec: acceptance at T=1: prompt {i + 1}/{len(prompts)}, {len(answer)} tokens")
        if anchors:
            out["t1"] = {"accept": [[round(x, 6) for x in r] for r in curve_table(sums / anchors)],
                         "anchors": anchors}
    if not any(k in out for k in ("t0", "t1")):
        raise EagleSpecError("no answer token to measure acceptance on: longer answers or more prompts are needed")
    dev = next(drafter.parameters())
    out["measured"] = (f"eaglespec.engine.calibrate.measure_profile: {len(prompts)} prompts, {tokens} answer tokens, "
                       f"depth {depth}, top-{top_k}, {dev.dtype} on {device_label(dev.device)}")
    read_acceptance_profile({"acceptance_profile": out}, "the measured profile")  # validates
    return out
