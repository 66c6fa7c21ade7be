"""An environment switch A/B in ONE process: one Bench (its own FastTarget, CUDA graphs and engines) per value, each
captured under its value, then timed in alternating turns over the same prompts.

Why: on the H200 the same code's plain decoding ran at 891.7 and 1030.9 tok/s in two processes one after the other
(session 18, `gpu_x2.sh sk18b`): process-to-process swings of up to 15% drown a 3-5% change measured one process
per value. Here the values share the process, and turns go A B B A ... so drifts cancel too.

A switch read when a kernel is chosen (e.g. EAGLESPEC_SKINNY_GEMM) takes effect in the graphs captured under it;
each Bench's graphs are captured during its first turn with the variable set to its value, and the variable is set
again before each of its turns (eager paths read it per call). Reports per value and config: tok/s over all turns
(the sum of tokens over the sum of seconds), the per-turn tok/s, tau and ms per round, value B / value A, and the
share of prompts whose tokens are those of the first value (a switch that should not change a value, as PDL, must
give 1.0).

    PYTHONPATH=src python bench/ab.py --env EAGLESPEC_SKINNY_GEMM --values 0,1 [--configs plain,dynamic:7/10/60]
        [--limit 20] [--turns 4] [--temperature T] [--json OUT]

Several variables at once: `--env EAGLESPEC_PDL,EAGLESPEC_SKINNY_GEMM --values 0:0,1:0,1:1` (a value per variable,
colon-separated, in --env's order).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tree_sweep import configure

from eaglespec.cli.bench import Bench, _load, environment, load_prompts, summarize_run
from eaglespec.cli.main import add_model_args


def set_env(names: list[str], value: str) -> None:
    """os.environ[names[i]] = value.split(":")[i]; a value must name one entry per variable."""
    parts = value.split(":")
    if len(parts) != len(names):
        raise SystemExit(f"ab.py: value {value!r} has {len(parts)} entries for {len(names)} variables {names}")
    os.environ.update(zip(names, parts))


def same_tokens(a, b) -> float:
    """The share of prompts on which two runs emitted the same tokens."""
    return sum(x == y for x, y in zip(a.token_ids, b.token_ids)) / max(1, len(a.token_ids))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(ap)
    ap.add_argument("--env", required=True, help="the environment variable to switch (several: comma-separated)")
    ap.add_argument("--values", default="0,1", help="its values, comma-separated (the first is the baseline); "
                    "with several variables a value is one entry per variable, colon-separated")
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--configs", default="plain,dynamic:7/10/60")
    ap.add_argument("--turns", type=int, default=4, help="timed turns per value (A B B A ...)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, metavar="OUT")
    args = ap.parse_args(argv)
    values = args.values.split(",")
    names = args.env.split(",")
    for value in values:  # checked before the model loads
        set_env(names, value)
    es = _load(args, args.dtype)
    prompts = [es.encode(t) for t in load_prompts(args.dataset, args.limit)]
    args.max_len = max(len(p) for p in prompts) + args.max_new_tokens + 256
    args.k, args.depth, args.top_k, args.budget = 5, 7, 10, 60
    args.compile = False
    configs = args.configs.split(",")
    benches = {}
    runs: dict[tuple[str, str], list] = {}
    for turn in range(args.turns):
        order = values if turn % 2 == 0 else values[::-1]
        for value in order:
            set_env(names, value)
            first = value not in benches
            if first:
                benches[value] = Bench(es.model, es.tokenizer, es.drafter, es.eos_ids(), argparse.Namespace(**vars(args)))
            bench = benches[value]
            bench.args.warm_prompts = first  # every prompt's shapes warmed (captured) in its first turn only
            for text in configs:
                method = configure(bench, bench.args, text)
                run = bench.run(method, prompts, args.max_new_tokens, 1 if first else 0)
                runs.setdefault((value, text), []).append(run)
                s = summarize_run(run)
                print(f"turn {turn} {args.env}={value} {text}: {s.get('tokens_per_second', 0):.1f} tok/s "
                      f"tau {s.get('tau', 1.0):.2f}", file=sys.stderr, flush=True)
    same = {key: same_tokens(turns[0], runs[(values[0], key[1])][0]) for key, turns in runs.items()}  # first turns
    rows = []
    for text in configs:
        for value in values:
            turns = runs[(value, text)]
            per_turn = [round(sum(len(t) for t in r.token_ids) / sum(r.seconds), 1) for r in turns]
            merged = turns[0]
            for r in turns[1:]:
                merged.token_ids += r.token_ids
                merged.seconds += r.seconds
                merged.results += r.results
            s = summarize_run(merged)
            rows.append({"config": text, "value": value, "tokens_per_second": s["tokens_per_second"],
                         "tau": s.get("tau", 1.0), "ms_per_round": s.get("ms_per_round"), "per_turn": per_turn,
                         "same_tokens": round(same[(value, text)], 4)})
    base = {r["config"]: r["tokens_per_second"] for r in rows if r["value"] == values[0]}
    print(f"| config | {args.env} | tok/s | vs {values[0]} | tau | same tokens | "
          "draft / verify / accept+commit / other ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        r["vs_base"] = round(r["tokens_per_second"] / base[r["config"]], 4)
        ms = " / ".join(f"{v:.3f}" for v in (r["ms_per_round"] or {}).values())
        print(f"| {r['config']} | {r['value']} | {r['tokens_per_second']:.1f} | {r['vs_base']:.3f} | "
              f"{r['tau']:.2f} | {r['same_tokens']:.2f} | {ms} |", flush=True)
    report = {"environment": environment(next(es.model.parameters()).device), "env": args.env, "values": values,
              "dataset": args.dataset, "limit": args.limit, "turns": args.turns, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if torch.cuda.is_available():
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
