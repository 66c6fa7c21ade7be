"""Where a speculative round's time goes on the device: busy, idle bubbles, kernels by kind, time per phase.

    python bench/round_timeline.py [--tree chain|static|dynamic] [--depth/--top-k/--budget/--k]
        [--fit-json FIT] [--prompts 4] [--max-new-tokens 128] [--temperature 0] [--json OUT]
        [--trace OUT.trace.json] [--no-sync-before-verify] [--device cuda] [--dtype bfloat16]

The engine is built as `eaglespec bench` builds it (cli.bench.Bench: fast backend, draft graphs and round
graphs on CUDA, a synchronize before each verify forward unless --no-sync-before-verify, the production path).
After one warm-up generation per prompt (graph captures) every prompt is generated once under torch.profiler.
This process's engine instance and eaglespec.engine.loop's acceptance functions are wrapped in record_function
ranges: rt:round (SpeculativeEngine._round), rt:draft (proposer.propose), rt:sync_wait (the synchronize before
verify), rt:verify (target.forward), rt:accept (greedy_accept / sample_accept: the round's host sync),
rt:commit (target.commit). eaglespec.timeline turns the events into per-round numbers (its docstring defines
them); the summary gives medians and means over rounds. A round replayed as one round graph has no phase split
(--no-round-graphs gives it). Without CUDA the same flow runs as a smoke test on CPU numbers (top-level aten
ops stand in for kernels) and says so. Profiler overhead inflates host numbers; device busy times are the
reliable ones.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch

import eaglespec.engine.loop as engine_mod
from eaglespec.api import resolve_trees, tree_label
from eaglespec.cli.args import add_model_args, add_tree_args
from eaglespec.cli.bench import Bench, _load, _Synced, environment
from eaglespec.datasets import load_prompts
from eaglespec.errors import EagleSpecError
from eaglespec.timeline import ROUND, summarize, timeline
from eaglespec.tree import fit as tree_fit
from eaglespec.tree.core import TreeSpec


# -- instrumentation ------------------------------------------------------------------------------
def _labelled(label: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    return wrapper


def instrument(engine, sync_before_verify: bool = True) -> None:
    """Wrap this engine instance's round, propose, verify forward and commit, and eaglespec.engine.loop's
    acceptance functions, in record_function ranges (idempotent for the module functions)."""
    proxy = engine.target
    inner = proxy.inner if isinstance(proxy, _Synced) else proxy
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
    try:
        return tree_fit.fitted_spec(tree_fit.load_fitted(path), budget)
    except EagleSpecError as e:
        raise SystemExit(f"--fit-json {e}") from None


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
    report = {"environment": environment(device), "cuda": cuda,
              "config": {"tree": tree_label(spec), "dtype": str(es.model.dtype).replace("torch.", ""),
                         "temperature": args.temperature, "prompts": len(prompts),
                         "max_new_tokens": args.max_new_tokens, "sync_before_verify": args.sync_before_verify,
                         "sync_before_verify_applies": synced,
                         "draft": es.draft_note, "target": args.target or "SmolLM2-135M-Instruct"},
              "rounds": len(rounds), "tau": 1 + sum(r.accepted for res in results for r in res.rounds) / max(len(host), 1),
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
