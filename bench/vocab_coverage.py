"""Share of the target's answer tokens (and at T > 0 of its mass) outside the drafter's vocabulary.

    python bench/vocab_coverage.py [--dataset mtbench] [--limit 8] [--max-new-tokens 128] [--draft DIR]
        [--counts DATA.jsonl] [--sizes 16000,24000,32000] [--temperature T] [--seed 0] [--json OUT]

On CPU in fp32 the target (the default pair's, plain decoding) answers --limit prompts of --dataset, greedily
or sampled at --temperature; the report gives the share of answer tokens outside the draft vocabulary and the
most frequent of them; at T > 0 also the mean mass the target puts outside it (an upper bound on any draft's
acceptance: 1 - that mass). With --counts (a conversations file whose assistant tokens are counted) it gives
the same for the vocabulary `train --init --draft-vocab N` would grow to, for each N of --sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import torch

from eaglespec.api import EagleSpec
from eaglespec.datasets import load_prompts
from eaglespec.sampling import SamplingConfig, SamplingParams
from eaglespec.train.vocab import token_counts
from eaglespec.train.vocab_coverage import answer_probs, grown_masks, id_mask, outside_mass, outside_share
from eaglespec.tree.core import TreeSpec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft", default=None, help="drafter directory (default: the shipped one)")
    ap.add_argument("--counts", default=None, help="conversations file whose assistant tokens rank the grown ids")
    ap.add_argument("--sizes", default="16000,24000,32000")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: sampled answers and the mass outside")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.temperature < 0:
        ap.error(f"--temperature must be >= 0, got {args.temperature}")
    es = EagleSpec.from_pretrained(device="cpu", dtype="float32", draft=args.draft, spec=TreeSpec("chain", depth=0))
    draft_ids = es.drafter.to_target_ids(torch.arange(es.drafter.d2t.numel()))
    vocab = es.drafter.t2d.numel()
    in_vocab = id_mask(draft_ids, vocab)
    sampling = (SamplingConfig(SamplingParams(temperature=args.temperature), seed=args.seed)
                if args.temperature > 0 else None)
    answers, probs = [], []
    for i, prompt in enumerate(load_prompts(args.dataset, args.limit)):
        ids = es.encode(prompt)
        res = es.engine.generate(ids, args.max_new_tokens, es.eos_ids(), sampling)
        answers.append(res.token_ids)
        if sampling is not None and res.token_ids:
            probs.append(answer_probs(es.target, list(ids), list(res.token_ids), args.temperature))
        print(f"prompt {i}: {len(res.token_ids)} tokens", file=sys.stderr, flush=True)
    probs_all = torch.cat(probs) if probs else None  # [answer tokens, V]
    missing = Counter(es.tokenizer.decode([x]) for a in answers for x in a if not in_vocab[x])
    report = {"dataset": args.dataset, "prompts": len(answers), "answer_tokens": sum(map(len, answers)),
              "draft_vocab": int(draft_ids.numel()), "outside_share": round(outside_share(answers, in_vocab), 4),
              "temperature": args.temperature, "most_common_outside": missing.most_common(30)}
    if probs_all is not None:
        report["outside_mass"] = round(outside_mass(probs_all, in_vocab), 4)
    if args.counts:
        from eaglespec.train.data import read_conversations, tokenize_all

        samples = tokenize_all(es.tokenizer, read_conversations(args.counts), 4096)
        counts = token_counts(((s.ids, s.loss_mask) for s in samples), vocab)
        sizes = [int(n) for n in args.sizes.split(",") if n]
        masks = grown_masks(draft_ids, counts, sizes)
        report["grown_outside_share"] = {n: round(outside_share(answers, m), 4) for n, m in masks.items()}
        if probs_all is not None:
            report["grown_outside_mass"] = {n: round(outside_mass(probs_all, m), 4) for n, m in masks.items()}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
