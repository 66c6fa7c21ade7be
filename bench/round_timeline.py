"""Where a speculative round's wall time goes on the device: GPU busy time, GPU idle bubbles, kernels per round, and
per phase (draft / verify / accept / commit) the device time of the kernels each phase launched.

Why: on the H200 (bench/RESULTS.md, session 6) a greedy static-tree round costs ~2.6 ms by host timing
(draft 0.70 / verify 1.71 / accept+commit 0.10 / other 0.08 ms) while its CUDA graphs should need ~0.9 ms (drafter
tree) + ~1.2 ms (target verify of 26 rows). Drafting is asynchronous, so host timing cannot tell GPU busy time
from idle bubbles; this script reads the device timeline itself.

    PYTHONPATH=src python bench/round_timeline.py [--tree chain|static|dynamic] [--depth/--top-k/--budget/--k]
        [--prompts 4] [--max-new-tokens 128] [--temperature 0] [--json OUT] [--trace OUT.trace.json]
        [--no-sync-before-verify] [--device cuda] [--dtype bfloat16]

Flow: load the default pair (or --target/--draft) through bench.py's loader, build the engine exactly as
`eaglespec bench` does (bench.Bench.engine: fast target backend, draft graphs on CUDA, and its _Synced target
proxy that synchronizes before each verify forward so draft time is not billed to verify; --no-sync-before-verify
drops that proxy: the production path of EagleSpec, which never syncs there), warm up with one generation per
prompt (graph captures), then generate every prompt once under torch.profiler (CPU + CUDA activities; CUDA only
when available). The engine's methods are wrapped here, by monkeypatching this process's engine instance and
eaglespec.engine.loop's acceptance functions (src/ is untouched), in torch.profiler.record_function ranges:
    rt:round       SpeculativeEngine._round (one speculative round)
    rt:draft       proposer.propose
    rt:sync_wait   the _Synced proxy's torch.cuda.synchronize before verify (host waits for the drafter's GPU work)
    rt:verify      target.forward (the tree's verification forward)
    rt:accept      greedy_accept / sample_accept (holds the round's one host sync: reading the accepted tokens)
    rt:commit      target.commit
Round time not inside one of these (shifted_tokens, flatten, torch.cat, round_detail, logits processing at T>0) is
"other". The engine's own host split maps as: draft_s = draft + part of other, verify_s = sync_wait + verify +
accept (+ logits processing at T>0), commit_s = commit + part of other.

Per round (the CPU range of rt:round, host clock, to which the profiler aligns device timestamps):
    wall          the round's host range
    busy          the union of device activity intervals (kernels, memcpy, memset) clipped to the round
    idle          wall - busy: device bubbles inside the round; idle_head (round start -> first activity),
                  idle_tail (last activity end -> round end) and max_gap (the longest bubble) break it down
    activities    device activities LAUNCHED in the round (a CUDA graph replay counts every kernel it runs)
    after_round   device time of kernels launched in the round that ran after the round's host range ended
Per round, too, the activities it launched by kind (kernel_kind: the name without templates and arguments), with
their count and device time, averaged over rounds (summary "kinds"; the first 20 in the Markdown table): inside
one replayed round graph this is the only split there is.
Per phase: host ms (CPU range of the label) and the device busy ms (union) and count of the activities LAUNCHED
inside that phase's CPU range. Attribution of an activity to the phase that launched it: the activity's CUPTI
correlation id (FunctionEvent.id) matches the CUDA runtime/driver call that launched it (cudaLaunchKernel,
cudaGraphLaunch, cudaMemcpyAsync, ...: a CPU event with the same id and a cuda*/cu* name); that call's host
timestamp is placed in the innermost rt:* range containing it. Where no launching call is found, the start of the
profiler op named by the activity's linked_correlation_id (its enclosing aten op or rt:* range) stands in
("linked_by_enclosing_op"); where neither is found ("unlinked"), the activity's own start time is used, which is
only right if the device keeps up with the host. Summary numbers are medians over rounds (means in the JSON too).

On a machine without CUDA the same flow runs as a smoke test with CPU numbers and says so: "busy" is then the
union of the top-level aten ops' CPU intervals (host compute), "idle" the host time between them (Python and
framework overhead), and "activities" counts top-level aten ops. Profiler overhead inflates every host number;
read the device-side busy times as the reliable ones.

Status: run on an H200 in session 7 (bench/RESULTS.md; commit b63e624): every device activity was linked to its
launching call (0 unlinked), CUDA graph replays report their kernels. With round graphs (round_graph.py, the
default on CUDA since 7140b62) a round is one replay: the phase rows stay empty and the round row holds it all;
`--no-round-graphs` gives the per-phase split.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tree_sweep, when imported from elsewhere (the tests)

import itertools

from tree_sweep import fitted_choices

import eaglespec.engine.loop as engine_mod
from eaglespec.tree import fit as tree_fit
from eaglespec.api import resolve_trees, tree_label
from eaglespec.cli.bench import Bench, _load, _Synced, environment, load_prompts
from eaglespec.cli.main import add_model_args, add_tree_args
from eaglespec.tree.core import TreeSpec

PHASES = ("draft", "sync_wait", "verify", "accept", "commit")
ROUND = "rt:round"
LABELS = (ROUND, *(f"rt:{p}" for p in PHASES))


# -- instrumentation ------------------------------------------------------------------------------
def _labelled(label: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    return wrapper


def instrument(engine, sync_before_verify: bool = True) -> None:
    """Wrap this engine instance's round, propose, verify forward and commit, and eaglespec.engine.loop's acceptance
    functions, in record_function ranges (idempotent for the module functions)."""
    proxy = engine.target
    inner = proxy._t if isinstance(proxy, _Synced) else proxy
    verify = _labelled("rt:verify", inner.forward)
    if isinstance(proxy, _Synced) and sync_before_verify:
        dev = inner.device

        def forward(*args, **kwargs):
            with torch.profiler.record_function("rt:sync_wait"):
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
            return verify(*args, **kwargs)

        proxy.forward = forward
    else:
        engine.target = inner  # no sync before verify (EagleSpec's production path)
        inner.forward = verify
    inner.commit = _labelled("rt:commit", inner.commit)
    engine.proposer.propose = _labelled("rt:draft", engine.proposer.propose)
    engine._round = _labelled(ROUND, engine._round)
    for name in ("greedy_accept", "sample_accept"):
        fn = getattr(engine_mod, name)
        if not getattr(fn, "_round_timeline", False):
            wrapped = _labelled("rt:accept", fn)
            wrapped._round_timeline = True
            setattr(engine_mod, name, wrapped)


# -- timeline analysis (pure: lists of (start, end) in microseconds) ------------------------------------
def union(intervals: list[tuple[float, float]], lo: float | None = None, hi: float | None = None
          ) -> list[tuple[float, float]]:
    """Merged intervals, optionally clipped to [lo, hi]."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if lo is not None:
            s = max(s, lo)
        if hi is not None:
            e = min(e, hi)
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def kernel_kind(name: str, width: int = 60) -> str:
    """A device activity's name without its template and argument lists ("void at::native::foo<float, 4>(...)" ->
    "at::native::foo"), at most `width` characters: kernels of one kind counted together."""
    name = name.removeprefix("void ").strip()
    for stop in ("<", "("):
        if stop in name[1:]:
            name = name[: name.index(stop, 1)]
    return name[:width] or "?"


def round_metrics(start: float, end: float, acts: list[dict], phase_ranges: list[tuple[str, float, float]],
                  launched: list[dict] | None = None) -> dict:
    """One round. acts: {"start", "end", "launch"} device activities (or CPU ops) that may overlap the round;
    launched: those launched in it (default: picked from acts); phase_ranges: (phase, s, e) CPU ranges of the
    labelled phases inside the round. Times in us; the result in ms."""
    busy = union([(a["start"], a["end"]) for a in acts], start, end)
    busy_us = _length(busy)
    gaps = [b[0] - a[1] for a, b in itertools.pairwise(busy)]
    head = (busy[0][0] - start) if busy else end - start
    tail = (end - busy[-1][1]) if busy else 0.0
    if launched is None:
        launched = [a for a in acts if start <= a["launch"] < end]
    after = _length(union([(a["start"], a["end"]) for a in launched], end, None))
    phases: dict[str, dict] = {}
    for phase in (*PHASES, "other"):
        phases[phase] = {"host_ms": 0.0, "busy_ms": 0.0, "activities": 0}
    owner: dict[str, list[tuple[float, float]]] = {}
    for a in launched:
        # the innermost labelled range holding the launch (phase ranges do not nest within one round, except by
        # accident of wrapping; take the shortest)
        holders = [(e - s, p) for p, s, e in phase_ranges if s <= a["launch"] < e]
        phase = min(holders)[1] if holders else "other"
        owner.setdefault(phase, []).append((a["start"], a["end"]))
        phases[phase]["activities"] += 1
    for phase, ivs in owner.items():
        phases[phase]["busy_ms"] = _length(union(ivs)) / 1000
    kinds: dict[str, list[float]] = {}  # name -> [count, device us] of the activities launched in the round
    for a in launched:
        kind = kinds.setdefault(a.get("name", "?"), [0, 0.0])
        kind[0] += 1
        kind[1] += a["end"] - a["start"]
    labelled = 0.0
    for phase, s, e in phase_ranges:
        phases[phase]["host_ms"] += (e - s) / 1000
        labelled += e - s
    phases["other"]["host_ms"] = max(end - start - labelled, 0.0) / 1000
    return {"wall_ms": (end - start) / 1000, "busy_ms": busy_us / 1000, "idle_ms": (end - start - busy_us) / 1000,
            "idle_head_ms": head / 1000, "idle_tail_ms": tail / 1000, "max_gap_ms": max(gaps, default=0.0) / 1000,
            "activities": len(launched), "after_round_ms": after / 1000, "phases": phases, "kinds": kinds}


def _is_device(evt) -> bool:
    return evt.device_type != torch.autograd.DeviceType.CPU


def timeline(events, cuda: bool) -> tuple[list[dict], dict]:
    """Per-round metrics from profiler FunctionEvents, and linkage counts."""
    rounds = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.name == ROUND and not _is_device(e))
    phase_ranges = sorted((e.name[3:], e.time_range.start, e.time_range.end) for e in events
                          if e.name in LABELS and e.name != ROUND and not _is_device(e))
    acts: list[dict] = []
    linked = by_op = unlinked = 0
    if cuda:
        launches: dict[int, float] = {}  # CUPTI correlation id -> host time of the runtime/driver call
        ops: dict[int, float] = {}  # profiler op correlation id -> the op's host start (fallback)
        for e in events:
            if _is_device(e):
                continue
            if e.name.startswith("cu"):  # cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, cuLaunchKernel, ...
                launches.setdefault(e.id, e.time_range.start)
            else:
                ops.setdefault(e.id, e.time_range.start)
        for e in events:
            if not _is_device(e) or e.name in LABELS or getattr(e, "is_user_annotation", False):
                continue
            start = e.time_range.start
            launch = launches.get(e.id)
            if launch is not None and launch <= start + 1.0:
                linked += 1
            else:  # the enclosing profiler op (aten op or an rt:* range) named by linked_correlation_id
                launch = ops.get(getattr(e, "linked_correlation_id", 0) or -1)
                if launch is not None and launch <= start + 1.0:
                    by_op += 1
                else:
                    unlinked += 1
                    launch = start
            acts.append({"start": start, "end": e.time_range.end, "launch": launch, "name": kernel_kind(e.name)})
    else:  # CPU smoke path: top-level aten ops stand in for kernels
        for e in events:
            if _is_device(e) or not e.name.startswith("aten::"):
                continue
            parent, top = e.cpu_parent, True
            while parent is not None:
                if parent.name.startswith("aten::"):
                    top = False
                    break
                parent = parent.cpu_parent
            if top:
                acts.append({"start": e.time_range.start, "end": e.time_range.end, "launch": e.time_range.start,
                             "name": e.name})
    by_start = sorted(acts, key=lambda a: a["start"])
    starts = [a["start"] for a in by_start]
    by_launch = sorted(acts, key=lambda a: a["launch"])
    launch_times = [a["launch"] for a in by_launch]
    longest = max((a["end"] - a["start"] for a in acts), default=0.0)
    out = []
    for s, e in rounds:
        mine = [p for p in phase_ranges if s <= p[1] and p[2] <= e]
        running = [a for a in by_start[bisect.bisect_left(starts, s - longest):bisect.bisect_left(starts, e)]
                   if a["end"] > s]
        launched = by_launch[bisect.bisect_left(launch_times, s):bisect.bisect_left(launch_times, e)]
        out.append(round_metrics(s, e, running, mine, launched))
    return out, {"device_activities_linked": linked, "linked_by_enclosing_op": by_op,
                 "device_activities_unlinked": unlinked}


def summarize(rounds: list[dict], host: list[dict]) -> dict:
    def stat(values: list[float]) -> dict:
        return {"median": round(statistics.median(values), 4), "mean": round(statistics.fmean(values), 4)} \
            if values else {"median": 0.0, "mean": 0.0}

    keys = ("wall_ms", "busy_ms", "idle_ms", "idle_head_ms", "idle_tail_ms", "max_gap_ms", "activities",
            "after_round_ms")
    out = {k: stat([r[k] for r in rounds]) for k in keys}
    out["phases"] = {p: {k: stat([r["phases"][p][k] for r in rounds]) for k in ("host_ms", "busy_ms", "activities")}
                     for p in (*PHASES, "other")}
    out["engine_host_split_ms"] = {k: stat([h[k] for h in host]) for k in ("draft_ms", "verify_ms", "commit_ms")}
    out["kinds"] = kinds_per_round(rounds)
    return out


def kinds_per_round(rounds: list[dict]) -> list[dict]:
    """Activities by kind (kernel_kind), most numerous first: the mean count and device us per round."""
    total: dict[str, list[float]] = {}
    for r in rounds:
        for name, (count, us) in r.get("kinds", {}).items():
            acc = total.setdefault(name, [0, 0.0])
            acc[0] += count
            acc[1] += us
    n = max(len(rounds), 1)
    ranked = sorted(total.items(), key=lambda kv: (-kv[1][0], kv[0]))
    return [{"kind": name, "per_round": round(c / n, 2), "us_per_round": round(us / n, 2)}
            for name, (c, us) in ranked]


# -- markdown -------------------------------------------------------------------------------------
def _fmt(stat: dict, count: bool = False) -> str:
    return f"{stat['median']:.1f} / {stat['mean']:.1f}" if count else f"{stat['median']:.3f} / {stat['mean']:.3f}"


def markdown(report: dict) -> str:
    s, cfg = report["summary"], report["config"]
    unit = "GPU" if report["cuda"] else "CPU (smoke test: top-level aten ops, not GPU kernels)"
    act = "kernels" if report["cuda"] else "aten ops"
    lines = [f"\nround timeline: {cfg['tree']} on {report['environment']['device']}, {cfg['dtype']}, "
             f"T={cfg['temperature']}, {cfg['prompts']} prompts x {cfg['max_new_tokens']} tokens, "
             f"{report['rounds']} rounds, tau {report['tau']:.2f}, sync before verify: {cfg['sync_before_verify_applies']}; "
             f"busy/idle measured on: {unit}\n",
             f"| per round (median / mean) | wall ms | busy ms | idle ms | idle head ms | idle tail ms | max gap ms | "
             f"{act} | after round ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    keys = ("wall_ms", "busy_ms", "idle_ms", "idle_head_ms", "idle_tail_ms", "max_gap_ms", "activities",
            "after_round_ms")
    lines.append("| round | " + " | ".join(_fmt(s[k], k == "activities") for k in keys) + " |")
    lines += ["", f"| phase (median / mean per round) | host ms | {unit.split(' ')[0]} busy ms of what it launched | "
              f"{act} launched |", "|---|---|---|---|"]
    for p, v in s["phases"].items():
        if p == "sync_wait" and not cfg["sync_before_verify_applies"]:
            continue  # no _Synced proxy (CPU, or --no-sync-before-verify)
        lines.append(f"| {p} | " + " | ".join(_fmt(v[k], k == "activities")
                                              for k in ("host_ms", "busy_ms", "activities")) + " |")
    if s.get("kinds"):
        lines += ["", f"| {act} by kind (most numerous first) | per round | {unit.split(' ')[0]} us per round |",
                  "|---|---|---|"]
        lines += [f"| {k['kind']} | {k['per_round']:.1f} | {k['us_per_round']:.1f} |" for k in s["kinds"][:20]]
    h = s["engine_host_split_ms"]
    lines.append(f"\nengine RoundStats (profiled run, median): draft {h['draft_ms']['median']:.3f} / verify "
                 f"{h['verify_ms']['median']:.3f} / accept+commit {h['commit_ms']['median']:.3f} ms; "
                 + (f"linkage of device activities to their launches: {report['linkage']}" if report["cuda"]
                    else "(host-timed under the profiler)"))
    return "\n".join(lines) + "\n"


def fitted_spec(path: str, budget: int | None) -> TreeSpec:
    """The static TreeSpec of a fitted tree file's first `budget` paths (all of them without a budget)."""
    return tree_fit.fitted_spec(fitted_choices(path, None), budget)


# -- main -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    add_tree_args(ap)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=4, help="the first N MT-bench prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--sync-before-verify", action=argparse.BooleanOptionalAction, default=True,
                    help="keep bench.py's synchronize before each verify forward (default on, as `eaglespec bench` "
                         "measures); off: EagleSpec's production path")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--max-len", type=int, default=None)
    ap.add_argument("--json", default=None, metavar="OUT")
    ap.add_argument("--trace", default=None, metavar="OUT.json", help="also export the Chrome trace")
    ap.add_argument("--fit-json", default=None, metavar="FIT",
                    help="time a fitted static tree: the first --budget paths of FIT's \"tree\" (the --json of "
                         "bench/fit_static_tree.py or bench/fit_sampled_tree.py)")
    args = ap.parse_args(argv)

    es = _load(args, args.dtype)
    device = next(es.model.parameters()).device
    cuda = device.type == "cuda"
    knobs = {k: getattr(args, k) for k in ("tree", "k", "top_k", "depth", "budget")}
    spec, sampled = resolve_trees(knobs, es.drafter, device=device)
    if args.temperature and sampled is not None:
        spec = sampled
    if args.fit_json:
        spec = fitted_spec(args.fit_json, args.budget)
    if spec.kind == "chain":
        args.k = spec.depth
    else:
        args.depth, args.top_k, args.budget = spec.depth, spec.top_k, spec.budget
    prompts = [es.encode(t) for t in load_prompts("mtbench", args.prompts)]
    args.max_len = args.max_len or max(len(p) for p in prompts) + args.max_new_tokens + 2 * max(spec.budget, 64)
    bench = Bench(es.model, es.tokenizer, es.drafter, es.eos_ids(), args)
    bench.static_override = spec if spec.kind == "static" else None  # Bench's own pick ignores --depth/--budget
    engine, reason = bench.engine(f"eagle3-{spec.kind}")
    if engine is None:
        raise SystemExit(f"round_timeline: no engine: {reason}")
    synced = isinstance(engine.target, _Synced) and args.sync_before_verify
    instrument(engine, args.sync_before_verify)
    sampling, eos = bench.sampling(), es.eos_ids()
    print(f"round_timeline: {es.draft_note}; {tree_label(spec)}; warming up", file=sys.stderr, flush=True)
    for ids in prompts:
        engine.generate(ids, args.max_new_tokens, eos, sampling)
    if cuda:
        torch.cuda.synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    results = []
    with torch.profiler.profile(activities=activities) as prof:
        for ids in prompts:
            results.append(engine.generate(ids, args.max_new_tokens, eos, sampling))
        if cuda:
            torch.cuda.synchronize(device)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    rounds, linkage = timeline(prof.events(), cuda)
    host = [{"draft_ms": r.draft_s * 1000, "verify_ms": r.verify_s * 1000, "commit_ms": r.commit_s * 1000}
            for res in results for r in res.rounds]
    if len(host) != len(rounds):
        linkage["warning"] = f"{len(rounds)} profiled rounds vs {len(host)} engine rounds"
    tokens = sum(len(r.token_ids) for r in results)
    report = {"environment": environment(device), "cuda": cuda,
              "config": {"tree": tree_label(spec), "dtype": str(es.model.dtype).replace("torch.", ""),
                         "temperature": args.temperature, "prompts": len(prompts),
                         "max_new_tokens": args.max_new_tokens, "sync_before_verify": args.sync_before_verify,
                         "sync_before_verify_applies": synced,
                         "draft": es.draft_note, "target": args.target or "SmolLM2-135M-Instruct"},
              "rounds": len(rounds), "tau": (tokens - len(results)) / max(len(host), 1),
              "linkage": linkage, "summary": summarize(rounds, host),
              "per_round": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()
                             if k not in ("phases", "kinds")}
                            | {"phases": {p: {k: round(x, 4) for k, x in d.items()} for p, d in r["phases"].items()}}
                            for r in rounds]}
    print(markdown(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
