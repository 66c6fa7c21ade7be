"""How much of the target's own greedy text can the drafter draft at all? (issue 6: tau >= 5 on MT-bench)

    OMP_NUM_THREADS=2 .venv/bin/python bench/vocab_coverage.py [--dataset mtbench] [--limit 8]
        [--max-new-tokens 128] [--draft DIR] [--counts DATA.jsonl] [--sizes 16000,24000,32000] [--json OUT]

An EAGLE-3 drafter proposes only ids of its draft vocabulary (d2t), so an answer token outside it is a rejection
whatever the drafter's states say. On CPU in fp32 this answers --limit prompts of --dataset greedily with the
target (plain decoding, the shipped pair by default) and reports the share of answer tokens outside the draft
vocabulary, the most frequent of them, and, with --counts (a conversations file: its assistant tokens are
counted), the share outside the vocabulary that `train --init --draft-vocab N` would grow to for each N of --sizes
(train.vocab.grown_draft_ids, the same rule).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

import torch

from eaglespec.api import EagleSpec
from eaglespec.bench import load_prompts
from eaglespec.train.vocab import grown_draft_ids, token_counts
from eaglespec.tree import TreeSpec


def id_mask(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """[vocab] bool, True at `ids`."""
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    return mask


def outside_share(answers: list[list[int]], in_vocab: torch.Tensor) -> float:
    """The share of answer tokens whose id is not marked in `in_vocab` [V] bool."""
    ids = torch.tensor([x for a in answers for x in a], dtype=torch.long)
    return float((~in_vocab[ids]).float().mean()) if ids.numel() else 0.0


def grown_shares(answers: list[list[int]], draft_ids: torch.Tensor, counts: torch.Tensor,
                 sizes: list[int]) -> dict[int, float]:
    """{N: outside_share for the draft vocabulary grown to N ids by `counts`}."""
    return {n: outside_share(answers, id_mask(grown_draft_ids(draft_ids, counts, n), counts.numel())) for n in sizes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mtbench")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft", default=None, help="drafter directory (default: the shipped one)")
    ap.add_argument("--counts", default=None, help="conversations file whose assistant tokens rank the grown ids")
    ap.add_argument("--sizes", default="16000,24000,32000")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    es = EagleSpec.from_pretrained(device="cpu", dtype="float32", draft=args.draft, spec=TreeSpec("chain", depth=0))
    draft_ids = es.drafter.to_target_ids(torch.arange(es.drafter.d2t.numel()))
    vocab = es.drafter.t2d.numel()
    in_vocab = id_mask(draft_ids, vocab)
    answers = []
    for i, prompt in enumerate(load_prompts(args.dataset, args.limit)):
        res = es.engine.generate(es.encode(prompt), args.max_new_tokens, es.eos_ids())
        answers.append(res.token_ids)
        print(f"prompt {i}: {len(res.token_ids)} tokens", file=sys.stderr, flush=True)
    missing = Counter(es.tokenizer.decode([x]) for a in answers for x in a if not in_vocab[x])
    report = {"dataset": args.dataset, "prompts": len(answers), "answer_tokens": sum(map(len, answers)),
              "draft_vocab": int(draft_ids.numel()), "outside_share": round(outside_share(answers, in_vocab), 4),
              "most_common_outside": missing.most_common(30)}
    if args.counts:
        from eaglespec.train.data import read_conversations, tokenize_all

        samples = tokenize_all(es.tokenizer, read_conversations(args.counts), 4096)
        counts = token_counts(((s.ids, s.loss_mask) for s in samples), vocab)
        sizes = [int(n) for n in args.sizes.split(",") if n]
        report["grown_outside_share"] = {n: round(v, 4) for n, v in
                                         grown_shares(answers, draft_ids, counts, sizes).items()}
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
