"""How much of the target's own greedy text can the drafter draft at all? (issue 6: tau >= 5 on MT-bench)

    OMP_NUM_THREADS=2 .venv/bin/python bench/vocab_coverage.py [--dataset mtbench] [--limit 8]
        [--max-new-tokens 128] [--draft DIR] [--counts DATA.jsonl] [--sizes 16000,24000,32000] [--json OUT]
        [--temperature T] [--seed 0]

An EAGLE-3 drafter proposes only ids of its draft vocabulary (d2t), so an answer token outside it is a rejection
whatever the drafter's states say. On CPU in fp32 this answers --limit prompts of --dataset greedily with the
target (plain decoding, the shipped pair by default) and reports the share of answer tokens outside the draft
vocabulary, the most frequent of them, and, with --counts (a conversations file: its assistant tokens are
counted), the share outside the vocabulary that `train --init --draft-vocab N` would grow to for each N of --sizes
(train.vocab.grown_draft_ids, the same rule).

With --temperature T > 0 the answers are sampled at T (seed --seed) and the report adds the MASS the target puts
outside each vocabulary at T, averaged over the answer positions (p = the engine's processed distribution, from one
target forward over prompt + answer): no draft from that vocabulary can be accepted with more than 1 - that mass.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import torch

from eaglespec.api import EagleSpec
from eaglespec.cli.bench import load_prompts
from eaglespec.sampling import SamplingConfig, SamplingParams, process_logits
from eaglespec.train.vocab import grown_draft_ids, token_counts
from eaglespec.tree.core import TreeSpec


def id_mask(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """[vocab] bool, True at `ids`."""
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    return mask


def outside_share(answers: list[list[int]], in_vocab: torch.Tensor) -> float:
    """The share of answer tokens whose id is not marked in `in_vocab` [V] bool."""
    ids = torch.tensor([x for a in answers for x in a], dtype=torch.long)
    return float((~in_vocab[ids]).float().mean()) if ids.numel() else 0.0


def grown_masks(draft_ids: torch.Tensor, counts: torch.Tensor, sizes: list[int]) -> dict[int, torch.Tensor]:
    """{N: [V] bool, the draft vocabulary grown to N ids by `counts`}."""
    return {n: id_mask(grown_draft_ids(draft_ids, counts, n), counts.numel()) for n in sizes}


def outside_mass(probs: torch.Tensor, in_vocab: torch.Tensor) -> float:
    """The mean over rows of the probability outside `in_vocab`: probs [n, V], in_vocab [V] bool."""
    return float(probs[:, ~in_vocab].sum(-1).mean()) if probs.shape[0] else 0.0


def answer_probs(es: EagleSpec, prompt: list[int], answer: list[int], temperature: float) -> torch.Tensor:
    """[len(answer), V]: the target's processed distribution at T for each answer token, teacher-forced."""
    ids = torch.tensor(prompt + answer, dtype=torch.long)
    es.target.reset()
    logits = es.target.forward(ids).logits  # [n, V]; row i predicts token i + 1
    es.target.reset()
    return process_logits(logits[len(prompt) - 1: len(ids) - 1], SamplingParams(temperature=temperature))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
            probs.append(answer_probs(es, list(ids), list(res.token_ids), args.temperature))
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
