"""Are regenerated answers the target's greedy continuation? A check of training data, on CPU in fp32.

    .venv/bin/python bench/greedy_check.py FILE.jsonl[.gz] [FILE2 ...] [--limit 200] [--seed 0] [--target T]
        [--tie 0.5] [--json OUT]

For a seeded sample of each file's conversations (tokenized as the trainer tokenizes them), one teacher-forced
forward of the target gives, at every assistant token but the turn's last (the end-of-turn marker, which a
length-cut answer gets from the template), whether the token is the target's argmax and, where it is not, the top-1
logit minus the token's logit. Greedy answers written in bf16 on a GPU may leave the fp32 argmax only at near-ties
(small gaps); a decoder bug (wrong positions, a stale cache row) shows as non-argmax tokens with large gaps.
Each conversation's first non-argmax token is classed: a near tie (gap < --tie), a split (the token's text is a
strict prefix of the argmax's: the text, re-tokenized, cut what the model wrote as one token, e.g. "\n\n" -> "\n",
"\n"), an end marker (a special token: a length-cut answer closed by the template), or other (the suspects).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
from pathlib import Path

import torch

from eaglespec.backends.loading import load_target
from eaglespec.train.data import tokenize_conversation

GAPS = (0.1, 0.5, 1.0, 2.0)


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


@torch.no_grad()
def token_gaps(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """At each checked position: top-1 logit minus the token's logit ([m] float, 0 where it is the argmax), the
    token ([m]) and the argmax ([m])."""
    logits = model(ids[None]).logits[0, :-1].float()  # [n-1, V] predicts ids[1:]
    nxt = ids[1:]
    checked = mask[1:].clone()
    ends = checked & ~torch.cat([checked[1:], checked.new_zeros(1)])  # the last token of each assistant span
    checked &= ~ends
    rows = checked.nonzero().squeeze(1)
    top = logits[rows].max(-1)
    return top.values - logits[rows, nxt[rows]], nxt[rows], top.indices


def first_kind(tokenizer, got: int, top: int, gap: float, tie: float) -> str:
    """The class of a conversation's first non-argmax token (the module docstring)."""
    if gap < tie:
        return "near_tie"
    if got in tokenizer.all_special_ids:
        return "end_marker"
    got_s, top_s = tokenizer.decode([got]), tokenizer.decode([top])
    return "split" if len(got_s) < len(top_s) and top_s.startswith(got_s) else "other"


def check_file(model, tokenizer, path: Path, limit: int, seed: int, tie: float) -> dict:
    rows = read_jsonl(path)
    random.Random(seed).shuffle(rows)
    gaps, first_off, kinds = [], [], {"none": 0, "near_tie": 0, "split": 0, "end_marker": 0, "other": 0}
    for row in rows[:limit]:
        sample = tokenize_conversation(tokenizer, row["messages"])
        g, got, top = token_gaps(model, sample.ids, sample.loss_mask)
        gaps.append(g)
        off = (g > 0).nonzero()
        first_off.append(int(off[0]) if len(off) else len(g))
        k = int(off[0]) if len(off) else None
        kinds["none" if k is None else first_kind(tokenizer, int(got[k]), int(top[k]), float(g[k]), tie)] += 1
    g = torch.cat(gaps)
    off = g[g > 0]
    out = {"file": str(path), "conversations": min(limit, len(rows)), "tokens": len(g),
           "argmax_share": round(float((g == 0).float().mean()), 5),
           "median_first_non_argmax": float(torch.tensor(first_off, dtype=torch.float).median())}
    for t in GAPS:
        out[f"non_argmax_gap_over_{t}"] = int((off > t).sum())
    out["max_gap"] = round(float(g.max()), 3) if len(g) else 0.0
    out["first_non_argmax"] = kinds
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tie", type=float, default=0.5, help="a gap below this is a near tie (default 0.5)")
    ap.add_argument("--target", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    model, tokenizer = load_target(a.target, device="cpu", dtype="float32")
    results = [check_file(model, tokenizer, p, a.limit, a.seed, a.tie) for p in a.files]
    for r in results:
        print(json.dumps(r))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
