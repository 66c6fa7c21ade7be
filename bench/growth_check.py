"""GPU check that captured steps survive being dropped and captured again (34589fc: a CUDA graph pool whose graphs
were all freed took no new capture; torch asserted `use_count > 0`, which `bench --extra-draft` hit on the H200).
On the shipped pair in fp32 (TF32 off), greedy, round graphs on, each against HF generate's tokens:

1. growth: the target's KV cache starts at --start slots, so it reallocates (and drops every captured step and
   round) several times mid-stream;
2. switch: a random EAGLE-1 drafter on the same target (its feature layers differ: the target's steps are dropped),
   then the shipped EAGLE-3 drafter again (dropped and captured once more).

    PYTHONPATH=src python bench/growth_check.py [--max-new-tokens 300] [--start 64] [--device cuda] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eagle1_fused_check import eagle1_for, engine_for, hf_greedy

from eaglespec.api import EagleSpec, tree_spec
from eaglespec.cli.bench import environment, load_prompts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--start", type=int, default=64, help="the target cache's first size (slots)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    es = EagleSpec.from_pretrained(device=a.device, dtype="float32", backend="fast")
    prompt = es.encode(load_prompts("mtbench", 1)[0])
    ref = hf_greedy(es, prompt, a.max_new_tokens)
    spec = tree_spec("dynamic", depth=6, top_k=8, budget=40)
    report: dict = {}

    es.target._allocate(a.start)  # every reallocation drops the captured steps (and, since 34589fc, their pool)
    out = es.engine.generate(prompt, a.max_new_tokens)
    report["growth"] = {"identical": out.token_ids == ref, "cache_slots": es.target.max_len, "start": a.start}
    print(f"growth {a.start} -> {es.target.max_len} slots: identical to HF generate: {out.token_ids == ref}",
          flush=True)

    shipped = es.engine.drafter
    for name, drafter in (("eagle1", eagle1_for(es.model)), ("eagle3 again", shipped)):
        engine = engine_for(es, drafter, spec, fused=True)  # a new engine sets the target's feature layers
        toks = engine.generate(prompt, a.max_new_tokens).token_ids
        same = toks == ref
        report[f"switch to {name}"] = {"identical": same, "feature_layers": list(es.target.feature_layer_ids)}
        print(f"switch to {name} (feature layers {list(es.target.feature_layer_ids)}): identical to HF generate: "
              f"{same}", flush=True)
    report["environment"] = environment(torch.device(a.device))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0 if all(v["identical"] for k, v in report.items() if k != "environment") else 1


if __name__ == "__main__":
    raise SystemExit(main())
