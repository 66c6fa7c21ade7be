"""Where a generation's time goes outside its steady rounds: the device timeline of one generate() call, by phase.

Why: bench/round_gaps.py (session 21, MT-bench 20) found a dynamic 7/10/60 round at 1.52 ms of wall time while its
launches cost 1.341 ms of device time with 0.017 ms of idle between them: ~0.16 ms a round (~8 ms a generation of
~52 rounds) is spent outside the rounds, against ~0.014 ms a step (~3 ms a generation) for plain decoding. This
splits each generation's device timeline (timing events, no profiler) into

    prefill    the target's prefill (engine.prefill): its kernels, from the generation's start
    pre-round  from the prefill's end to the first round's (or plain step's) launch: the drafter's prefill and the
               device idle while the host reads the first token and stages the first round
    rounds     the launches whose tokens were used: their device time, and the idle between them
    unused     launches queued ahead whose tokens were never used (the overlap's launch past an EOS)
    tail       from the last launch's end to the generation's end event

and the host's wall time of the call. Everything is in ms per generation, the mean over the prompts.

    PYTHONPATH=src python bench/gen_phases.py [--limit 20] [--max-new-tokens 256] [--configs plain,dynamic:7/10/60]
        [--json OUT]

On a CPU the events are host clocks (the phases then measure host time only): for checking the script.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from round_gaps import run_args
from tree_sweep import configure

from eaglespec.engine import loop as engine_mod
from eaglespec.engine import round_graph
from eaglespec.cli.bench import Bench, _load, environment, load_prompts
from eaglespec.backends.fast import FastTarget


class Mark:
    """A point on the device timeline: a CUDA timing event (a host clock on a CPU)."""

    def __init__(self, cuda: bool):
        self.ev = torch.cuda.Event(enable_timing=True) if cuda else None
        if self.ev is not None:
            self.ev.record()
        self.t = time.perf_counter()

    def ms_to(self, later: Mark) -> float:
        return self.ev.elapsed_time(later.ev) if self.ev is not None else (later.t - self.t) * 1e3


class Recorder:
    """Marks around engine.prefill, the drafter's prefill and every launch (RoundGraph._run / FastTarget.forward)."""

    def __init__(self, cuda: bool, plain: bool):
        self.cuda = cuda
        self.launches: list[tuple[Mark, Mark]] = []
        self.prefill: tuple[Mark, Mark] | None = None
        self.draft_prefill: tuple[Mark, Mark] | None = None
        self._in_prefill = False
        self._saved: list[tuple[object, str, object]] = []
        rec = self

        def wrap(owner, name, sink):
            fn = getattr(owner, name)

            def wrapped(*args, **kwargs):
                a = Mark(rec.cuda)
                out = fn(*args, **kwargs)
                sink((a, Mark(rec.cuda)))
                return out

            self._saved.append((owner, name, fn))
            setattr(owner, name, wrapped)

        def on_launch(pair):
            if not rec._in_prefill:
                rec.launches.append(pair)

        def on_prefill(pair):
            rec.prefill = pair

        def on_draft_prefill(pair):
            rec.draft_prefill = pair

        prefill_fn = engine_mod.prefill

        def prefill(*args, **kwargs):  # the target's forwards inside the prefill are not launches
            a = Mark(rec.cuda)
            rec._in_prefill = True
            try:
                out = prefill_fn(*args, **kwargs)
            finally:
                rec._in_prefill = False
            on_prefill((a, Mark(rec.cuda)))
            return out

        self._saved.append((engine_mod, "prefill", prefill_fn))
        engine_mod.prefill = prefill
        wrap(engine_mod.SpeculativeEngine, "_draft_prefill", on_draft_prefill)
        if plain:
            wrap(FastTarget, "forward", on_launch)
        else:
            wrap(round_graph.RoundGraph, "_run", on_launch)

    def restore(self) -> None:
        for owner, name, fn in reversed(self._saved):
            setattr(owner, name, fn)

    def reset(self) -> None:
        self.launches, self.prefill, self.draft_prefill = [], None, None


def phases(rec: Recorder, start: Mark, end: Mark, rounds: int) -> dict:
    """One generation's device timeline in ms (see the module docstring)."""
    used, unused = rec.launches[:rounds], rec.launches[rounds:]
    out = {"launches": len(rec.launches), "unused_launches": len(unused)}
    pre_end = rec.prefill[1] if rec.prefill else start
    out["prefill"] = start.ms_to(pre_end)
    first = used[0][0] if used else end
    out["pre_round"] = pre_end.ms_to(first)
    out["draft_prefill"] = rec.draft_prefill[0].ms_to(rec.draft_prefill[1]) if rec.draft_prefill else 0.0
    out["rounds_gpu"] = sum(a.ms_to(b) for a, b in used)
    out["rounds_gap"] = sum(b.ms_to(a2) for (_, b), (a2, _) in itertools.pairwise(used))
    out["first_round_gpu"] = used[0][0].ms_to(used[0][1]) if used else 0.0
    out["first_gap"] = used[0][1].ms_to(used[1][0]) if len(used) > 1 else 0.0
    last = used[-1][1] if used else first
    out["unused"] = last.ms_to(unused[-1][1]) if unused else 0.0
    out["tail"] = (unused[-1][1] if unused else last).ms_to(end)
    out["total"] = start.ms_to(end)
    return out


def measure(bench: Bench, method: str, prompts: list[list[int]], max_new: int, eos, cuda: bool) -> dict:
    engine, reason = bench.engine(method)
    if engine is None:
        raise SystemExit(f"gen_phases: {method}: {reason}")
    for ids in prompts:  # every prompt's captures (the drafter's prefill buckets and spans, the rounds' spans)
        engine.generate(ids, max_new, eos)
    rec = Recorder(cuda, plain=method == "fast-plain")
    rows, walls, tokens, rounds = [], [], 0, 0
    try:
        for ids in prompts:
            if cuda:
                torch.cuda.synchronize()
            rec.reset()
            t0 = time.perf_counter()
            start = Mark(cuda)
            res = engine.generate(ids, max_new, eos)
            end = Mark(cuda)
            wall = time.perf_counter() - t0
            if cuda:
                torch.cuda.synchronize()
            row = phases(rec, start, end, len(res.rounds))
            row["wall"] = wall * 1e3
            row["rounds"] = len(res.rounds)
            row["tokens"] = len(res.token_ids)
            row["finish"] = res.finish_reason
            rows.append(row)
            walls.append(wall)
            tokens += len(res.token_ids)
            rounds += len(res.rounds)
    finally:
        rec.restore()
    keys = [k for k in rows[0] if k != "finish"]
    mean = {k: statistics.fmean(r[k] for r in rows) for k in keys}
    return {"method": method, "prompts": len(prompts), "tokens": tokens, "rounds": rounds,
            "tau": tokens / max(1, rounds), "tokens_per_second": tokens / sum(walls),
            "eos_share": sum(r["finish"] == "stop" for r in rows) / len(rows), "mean_ms": mean, "per_prompt": rows}


COLS = ("wall", "total", "prefill", "pre_round", "draft_prefill", "first_round_gpu", "first_gap", "rounds_gpu",
        "rounds_gap", "unused", "tail")


def main(argv: list[str] | None = None) -> dict:
    ap = run_args(__doc__.split("\n\n")[0], limit=20)
    ap.add_argument("--json", default=None, metavar="OUT")
    args = ap.parse_args(argv)
    es = _load(args, args.dtype)
    cuda = es.model.device.type == "cuda" if hasattr(es.model, "device") else torch.cuda.is_available()
    prompts = [es.encode(t) for t in load_prompts(args.dataset, args.limit)]
    args.max_len = max(len(p) for p in prompts) + args.max_new_tokens + 256
    args.k, args.depth, args.top_k, args.budget, args.temperature = 5, 7, 10, 60, 0.0
    args.compile = False
    bench = Bench(es.model, es.tokenizer, es.drafter, es.eos_ids(), args)
    print("| config | tok/s | tau | rounds/gen | " + " | ".join(COLS) + " |")
    print("|---" * (4 + len(COLS)) + "|")
    rows = []
    for text in args.configs.split(","):
        method = configure(bench, args, text)
        row = measure(bench, method, prompts, args.max_new_tokens, es.eos_ids(), cuda)
        row["config"] = text
        rows.append(row)
        m = row["mean_ms"]
        print(f"| {text} | {row['tokens_per_second']:.1f} | {row['tau']:.2f} | {m['rounds']:.1f} | "
              + " | ".join(f"{m[c]:.3f}" for c in COLS) + " |", flush=True)
    report = {"environment": environment(bench.device), "dataset": args.dataset, "limit": args.limit,
              "max_new_tokens": args.max_new_tokens, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
