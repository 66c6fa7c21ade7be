"""GPU check of the fused EAGLE-1 (HASS) draft step (draft/fused.py FusedEagle1Step): a random EAGLE-1 drafter
shaped for the default target (SmolLM2: hidden 576, 9 heads, 3 kv heads), on the fast backend with draft graphs,
fused=True vs fused=False (the drafter's own forward over the static KV):

1. fp32 (TF32 off): greedy generations of both equal HF generate's tokens (chain k=4 and a dynamic 6/8/40 tree);
2. bf16: tok/s of each over the same prompts (round graphs on: the default on CUDA); the drafter is random, so tau
   is ~1 and the numbers compare draft cost only.

    PYTHONPATH=src python bench/eagle1_fused_check.py [--prompts 3] [--max-new-tokens 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from eaglespec.api import EagleSpec, tree_spec
from eaglespec.cli.bench import environment, load_prompts
from eaglespec.checkpoint.config import DraftConfig
from eaglespec.draft.eagle1 import Eagle1Drafter
from eaglespec.draft.fast import enable_draft_graphs
from eaglespec.engine.round_graph import enable_round_graphs


def eagle1_for(model, seed: int = 0) -> Eagle1Drafter:
    """A random one-layer EAGLE-1 drafter with the target's shapes."""
    c = model.config
    cfg = DraftConfig(method="eagle1", hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                      num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                      head_dim=c.hidden_size // c.num_attention_heads, vocab_size=c.vocab_size,
                      draft_vocab_size=c.vocab_size, target_hidden_size=c.hidden_size, aux_layer_ids=(),
                      num_hidden_layers=1, layout="eagle1", rms_norm_eps=c.rms_norm_eps)
    torch.manual_seed(seed)
    return Eagle1Drafter(cfg).eval()


def engine_for(es: EagleSpec, drafter, spec, fused: bool):
    from eaglespec.engine.loop import SpeculativeEngine

    drafter.to(device=es.model.device, dtype=es.model.dtype)
    engine = SpeculativeEngine(es.target, drafter, spec)  # wires the target's embedding, norm and lm_head
    enable_draft_graphs(engine, max_len=2048, fused=fused)
    enable_round_graphs(engine)
    return engine


def hf_greedy(es: EagleSpec, ids: list[int], n: int) -> list[int]:
    x = torch.tensor([ids], device=es.model.device)
    out = es.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                            min_new_tokens=n, pad_token_id=es.tokenizer.pad_token_id or 0)
    return out[0, len(ids):].tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: the fp32 part only (a smoke test)")
    a = ap.parse_args()
    report: dict = {"fp32_identical": {}, "bf16_tok_s": {}}
    specs = {"chain": tree_spec("chain", k=4), "dynamic": tree_spec("dynamic", depth=6, top_k=8, budget=40)}
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    es = EagleSpec.from_pretrained(device=a.device, dtype="float32", backend="fast")
    prompts = [es.encode(t) for t in load_prompts("mtbench", a.prompts)]
    refs = [hf_greedy(es, p, a.max_new_tokens) for p in prompts]
    for kind, spec in specs.items():
        for fused in (False, True):
            engine = engine_for(es, eagle1_for(es.model), spec, fused)
            same = sum(engine.generate(p, a.max_new_tokens).token_ids == r for p, r in zip(prompts, refs))
            report["fp32_identical"][f"{kind} fused={fused}"] = f"{same}/{len(prompts)}"
            print(f"fp32 {kind} fused={fused}: {same}/{len(prompts)} identical to HF generate", flush=True)
    del es
    if a.device != "cuda":
        print(json.dumps(report))
        return 0
    es = EagleSpec.from_pretrained(device="cuda", dtype="bfloat16", backend="fast")
    prompts = [es.encode(t) for t in load_prompts("mtbench", a.prompts)]
    for kind, spec in specs.items():
        for fused in (False, True):
            engine = engine_for(es, eagle1_for(es.model), spec, fused)
            engine.generate(prompts[0], a.max_new_tokens)  # capture
            torch.cuda.synchronize()
            t0, toks = time.perf_counter(), 0
            for p in prompts:
                toks += len(engine.generate(p, a.max_new_tokens).token_ids)
            torch.cuda.synchronize()
            rate = toks / (time.perf_counter() - t0)
            report["bf16_tok_s"][f"{kind} fused={fused}"] = round(rate, 1)
            print(f"bf16 {kind} fused={fused}: {rate:.1f} tok/s (random drafter: draft cost only)", flush=True)
    report["environment"] = environment(torch.device(a.device))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
