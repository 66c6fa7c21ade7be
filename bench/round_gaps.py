"""How long the GPU waits between one round (or plain step) and the next, unprofiled: CUDA events around each launch.

Why: round_timeline.py (torch.profiler) saw a dynamic 7/10/60 round keep the H200 busy ~1.32 ms while the benchmark's
rounds cost ~1.67 ms (session 17), but the profiler slows the host, so it cannot say how much of the difference is
the host's turn between rounds. Here every launch is bracketed by two timing events on the stream (recorded on the
host just before the launch is queued and just after), which cost nothing measurable:

    gpu ms   end[i] - start[i]: the launch's device time (its kernels and the gaps between them inside the graph)
    gap ms   start[i+1] - end[i]: the device idle between two launches of one generation (the host's turn: the
             round's one host read, its bookkeeping, the next launch)

A round-graph round is one RoundGraph._run (the replay); a plain step is one FastTarget.forward. Wall ms per round is
the generation's wall time over its rounds (prefill included). If gap is a large share of wall, launching further
ahead would pay; if not, only fewer or faster kernels will.

    PYTHONPATH=src python bench/round_gaps.py [--limit 10] [--max-new-tokens 256] [--configs plain,dynamic:7/10/60]
        [--turns 1] [--json OUT]

--turns N measures every config N times in turn (A B A B ...), one row per config and turn. Why: in one process a
dynamic tree's tok/s fell from turn to turn (session 20: 2,980 -> 2,670 over four turns of MT-bench 80) while plain
decoding's did not. A gap that grows with the turns says the host falls behind (state that grows with the engine's
history); a GPU time per launch that grows says the device slows down.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tree_sweep import configure

from eaglespec.engine import round_graph
from eaglespec.cli.bench import Bench, _load, environment, load_prompts
from eaglespec.cli.main import add_model_args
from eaglespec.backends.fast import FastTarget

SKIP = 3  # launches left out at the head of each generation


class Bracket:
    """Timing events around every call of `owner.name` (a class attribute), kept per generation."""

    def __init__(self, owner: type, name: str):
        self.owner, self.name, self.fn = owner, name, getattr(owner, name)
        self.calls: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        bracket = self

        def wrapped(*args, **kwargs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = bracket.fn(*args, **kwargs)
            end.record()
            bracket.calls.append((start, end))
            return out

        setattr(owner, name, wrapped)

    def restore(self) -> None:
        setattr(self.owner, self.name, self.fn)

    def take(self) -> tuple[list[float], list[float]]:
        """(device ms of each call, device ms between consecutive calls) of the calls since the last take."""
        torch.cuda.synchronize()
        calls, self.calls = self.calls, []
        gpu = [s.elapsed_time(e) for s, e in calls]
        gaps = [e.elapsed_time(s2) for (_, e), (s2, _) in itertools.pairwise(calls)]
        return gpu, gaps


def measure(bench: Bench, method: str, prompts: list[list[int]], max_new: int, eos) -> dict:
    engine, reason = bench.engine(method)
    if engine is None:
        raise SystemExit(f"round_gaps: {method}: {reason}")
    owner, name = (FastTarget, "forward") if method == "fast-plain" else (round_graph.RoundGraph, "_run")
    for ids in prompts[:2]:  # captures
        engine.generate(ids, max_new, eos)
    bracket = Bracket(owner, name)
    gpu: list[float] = []
    gaps: list[float] = []
    walls: list[float] = []
    tokens = rounds = 0
    try:
        for ids in prompts:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = engine.generate(ids, max_new, eos)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            g, gp = bracket.take()
            gpu += g[SKIP:]  # a generation's first launches are its prefill's chunks (plain) or follow it
            gaps += gp[SKIP:]
            walls.append(wall * 1e3 / max(1, len(res.rounds)))
            tokens += len(res.token_ids)
            rounds += len(res.rounds)
    finally:
        bracket.restore()
    mean = statistics.fmean
    return {"method": method, "prompts": len(prompts), "tokens": tokens, "rounds": rounds,
            "tau": tokens / max(1, rounds), "wall_ms": mean(walls), "gpu_ms": mean(gpu), "gap_ms": mean(gaps),
            "gap_ms_median": statistics.median(gaps), "gap_share": mean(gaps) / mean(walls)}


def run_args(description: str, limit: int) -> argparse.ArgumentParser:
    """The model, prompts and configs arguments of the timing scripts (this one, gen_phases.py)."""
    ap = argparse.ArgumentParser(description=description)
    add_model_args(ap)
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--limit", type=int, default=limit)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--configs", default="plain,dynamic:7/10/60",
                    help="plain, chain:K, static:DEPTH/TOPK/BUDGET, dynamic:DEPTH/TOPK/BUDGET")
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = run_args(__doc__.split("\n\n")[0], limit=10)
    ap.add_argument("--turns", type=int, default=1, help="measure every config this many times, in turn")
    ap.add_argument("--json", default=None, metavar="OUT")
    args = ap.parse_args(argv)
    if args.turns < 1:
        raise SystemExit("round_gaps: --turns must be >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("round_gaps: needs CUDA (it reads CUDA timing events)")
    es = _load(args, args.dtype)
    prompts = [es.encode(t) for t in load_prompts(args.dataset, args.limit)]
    args.max_len = max(len(p) for p in prompts) + args.max_new_tokens + 256
    args.k, args.depth, args.top_k, args.budget, args.temperature = 5, 7, 10, 60, 0.0
    args.compile = False
    bench = Bench(es.model, es.tokenizer, es.drafter, es.eos_ids(), args)
    rows = []
    for turn, text in itertools.product(range(args.turns), args.configs.split(",")):
        method = configure(bench, args, text)
        row = measure(bench, method, prompts, args.max_new_tokens, es.eos_ids())
        row["config"], row["turn"] = text, turn
        rows.append(row)
        print(f"| {text} | {turn} | {row['wall_ms']:.3f} | {row['gpu_ms']:.3f} | {row['gap_ms']:.3f} "
              f"({row['gap_ms_median']:.3f}) | {100 * row['gap_share']:.1f}% | {row['tau']:.2f} |", flush=True)
    report = {"environment": environment(bench.device), "dataset": args.dataset, "limit": args.limit,
              "max_new_tokens": args.max_new_tokens, "turns": args.turns, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    print("| config | turn | wall ms per round | GPU ms per launch | gap ms (median) | gap share | tau |\n"
          "|---|---|---|---|---|---|---|")
    main()
