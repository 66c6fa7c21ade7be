"""Chain vs EAGLE-2 dynamic tree on CPU: tau (tokens per verification forward) at equal verification
cost (draft tokens verified per round), with tiny drafters fitted to agree with a tiny target.

    .venv/bin/python bench/cpu_tree_vs_chain.py [--steps 300] [--prompts 12] [--new 64] [--json OUT]

The target is a tiny random Llama (conftest.tiny_target); the drafters (EAGLE-3 and EAGLE-1) are
fitted with tests/_agree.py on the target's own greedy continuations. Every run is also checked
token-for-token against plain greedy decoding.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _agree import fit_drafter  # noqa: E402
from eaglespec.draft.eagle1 import Eagle1Drafter  # noqa: E402
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.backends.hf import HFTarget
from eaglespec.tree.core import TreeSpec

from conftest import tiny_draft_config, tiny_drafter, tiny_target  # noqa: E402


def configs() -> list[tuple[str, TreeSpec]]:
    out = []
    for cost in (4, 8):  # equal verification cost: `cost` draft tokens per round
        out.append((f"chain k={cost}", TreeSpec("chain", depth=cost)))
        out.append((f"dynamic budget={cost} depth={cost} top_k=4", TreeSpec("dynamic", depth=cost, top_k=4, budget=cost)))
    out.append(("chain k=5 (default)", TreeSpec("chain", depth=5)))
    out.append(("static mc_sim_7b_63 (25 nodes)", TreeSpec("static")))
    out.append(("dynamic budget=60 depth=8 top_k=10 (default)", TreeSpec("dynamic", depth=8, top_k=10, budget=60)))
    return out


def run(model, drafter, spec: TreeSpec, prompts: list[list[int]], new: int, plain: list[list[int]]) -> dict:
    engine = SpeculativeEngine(HFTarget(model), drafter, spec)
    tokens = rounds = drafted = accepted = 0
    seconds = 0.0
    exact = True
    for prompt, ref in zip(prompts, plain):
        out = engine.generate(prompt, new)
        exact &= out.token_ids == ref
        tokens += len(out.token_ids) - 1
        rounds += len(out.rounds)
        drafted += sum(r.drafted for r in out.rounds)
        accepted += sum(r.accepted for r in out.rounds)
        seconds += out.seconds
    return {"tau": round(tokens / rounds, 3), "drafted_per_round": round(drafted / rounds, 1),
            "accepted_per_round": round(accepted / rounds, 3), "tok_per_s": round(tokens / seconds, 1),
            "exact": exact}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=96)
    ap.add_argument("--seqs", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model = tiny_target("llama", seed=3, vocab=args.vocab)
    g = torch.Generator().manual_seed(1234)  # held-out prompts (the fit uses seed 0)
    prompts = [torch.randint(3, args.vocab, (8,), generator=g).tolist() for _ in range(args.prompts)]
    base = SpeculativeEngine(HFTarget(model))
    t0 = time.perf_counter()
    plain = [base.generate(p, args.new).token_ids for p in prompts]
    plain_tps = args.prompts * (args.new - 1) / (time.perf_counter() - t0)

    results = {}
    for method in ("eagle3", "eagle1"):
        torch.manual_seed(0)
        if method == "eagle1":
            drafter = Eagle1Drafter(tiny_draft_config(model, method="eagle1", aux_layer_ids=()))
        else:
            drafter = tiny_drafter(model, seed=0)
        t0 = time.perf_counter()
        fit_drafter(model, drafter, steps=args.steps, n_seqs=args.seqs, length=48)
        fit_s = time.perf_counter() - t0
        for name, spec in configs():
            r = run(model, drafter, spec, prompts, args.new, plain)
            results[f"{method} | {name}"] = r
            print(f"{method:6s} {name:48s} tau {r['tau']:.3f}  drafted/round {r['drafted_per_round']:5.1f}  "
                  f"accepted/round {r['accepted_per_round']:.3f}  {r['tok_per_s']:7.1f} tok/s  exact {r['exact']}",
                  flush=True)
        print(f"  ({method} fit: {args.steps} steps in {fit_s:.1f} s)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    import transformers

    meta = {"commit": commit, "torch": torch.__version__, "transformers": transformers.__version__,
            "machine": f"CPU ({platform.processor() or platform.machine()}), torch threads {args.threads}",
            "plain_tok_per_s": round(plain_tps, 1), "args": vars(args)}
    print(json.dumps(meta))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
