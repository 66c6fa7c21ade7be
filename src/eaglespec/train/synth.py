"""`eaglespec synth-prompts`: user queries written by the target itself, for `regenerate` to answer.

An instruction-tuned model given only its chat template's text up to a user turn's content continues it with a
plausible user query (the Magpie method, Xu et al. 2024): prompts in the distribution the model was tuned on, as many
as wanted, with no external data. The output is JSONL in OpenAI form, each query followed by a placeholder assistant
turn ("-") that `eaglespec regenerate` replaces with the target's answer. It is appended batch by batch: running the
same command again resumes (the batch number in the ids keeps the seeds apart) until `count` queries are written.

Kept are queries that the model ended itself (the template's end-of-turn token within `max_new_tokens`), 8-1500
characters, new (case- and whitespace-insensitive) and, with `exclude`, sharing no 13-word run with any of the given
texts (the benchmark's prompts: no test question leaks into training data).
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from eaglespec.backends.batched import BatchedDecoder, left_pad, make_decoder
from eaglespec.errors import EagleSpecError
from eaglespec.sampling import SamplingParams
from eaglespec.train.data import read_resumable

MARKER = "<<eaglespec-query-7f3c>>"  # stands in for the user's text when the template is rendered
NGRAM = 13  # words in a run shared with an excluded text (GPT-3's decontamination length)
MIN_CHARS, MAX_CHARS = 8, 1500  # make_prompts.py's bounds for ShareGPT user turns
STALL = 3  # batches in a row without a kept query before giving up
_ID = re.compile(r"^synth-s(-?\d+)-b(\d+)-\d+$")


def query_prefix(tokenizer) -> tuple[str, str]:
    """(prefix, end): the chat template's text before a user turn's content (the default system prompt
    included) and the text right after it (its end-of-turn marker first)."""
    if not getattr(tokenizer, "chat_template", None):
        raise EagleSpecError("the tokenizer has no chat template: cannot synthesize user queries")
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARKER}], tokenize=False)
    if text.count(MARKER) != 1:
        raise EagleSpecError("the chat template does not place a user's text verbatim: cannot synthesize queries")
    prefix, end = text.split(MARKER)
    return prefix, end


def _end_ids(tokenizer, end: str) -> list[int]:
    return tokenizer(end, add_special_tokens=False)["input_ids"] if end.strip() else []


def text_marker(tokenizer, end: str) -> str | None:
    """The template's end-of-turn text when it is plain text (e.g. " [/INST]" in older Mistral tokenizers), not one
    special token: a query then ends where that string appears. None for a special-token marker or none at all."""
    ids = _end_ids(tokenizer, end)
    if not ids:
        return None
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    return end.strip() if ids[0] not in special else None


def stop_ids(tokenizer, end: str) -> list[int]:
    """Token ids that end a user query: the template's end-of-turn token (when it is a special token) and the EOS."""
    marker = text_marker(tokenizer, end)
    out = _end_ids(tokenizer, end)[:1] if marker is None else []
    out += [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if not out and marker is None:
        raise EagleSpecError("the chat template has no end-of-turn marker and the tokenizer no EOS: a query "
                             "could not end")
    return sorted(set(out))


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def ngram_index(texts: Iterable[str], n: int = NGRAM) -> set[tuple[str, ...]]:
    """Every run of n words of the texts (a text shorter than n words: the whole of it)."""
    index: set[tuple[str, ...]] = set()
    for text in texts:
        w = _words(text)
        if not w:  # no words (e.g. "---"): nothing to match, and an empty run would match every query
            continue
        index.update(tuple(w[i:i + n]) for i in range(max(1, len(w) - n + 1)))
    return index


def shares_ngram(text: str, index: set[tuple[str, ...]], n: int = NGRAM) -> bool:
    """Whether `text` holds a run of `index` (the runs of texts shorter than n words are matched by their length:
    every length up to n is looked up, which costs per word of `text`, not per entry of `index`)."""
    if not index:
        return False
    w = _words(text)
    return any(tuple(w[i:i + k]) in index for k in range(1, n + 1) for i in range(len(w) - k + 1))


@torch.no_grad()
def sample_queries(model, tokenizer, rows: int, *, max_new_tokens: int, temperature: float, top_p: float,
                   seed: int, decoder: BatchedDecoder | None = None, starts: Sequence[str] = ()) -> list[str | None]:
    """`rows` queries sampled from the template's user prefix; None where the model did not end the turn. With
    `starts`, each query begins with one of them (drawn per row, seeded) and the model continues it. With `decoder`
    (backends/batched.py) instead of HF generate, unless the turn ends with a text marker (a stop string)."""
    prefix, end = query_prefix(tokenizer)
    stops, marker = stop_ids(tokenizer, end), text_marker(tokenizer, end)
    rng = random.Random(seed)
    lead = [rng.choice(starts) if starts else "" for _ in range(rows)]
    encoded = {s: tokenizer(prefix + s, add_special_tokens=False)["input_ids"] for s in set(lead)}
    prompts = [encoded[s] for s in lead]
    dev = next(model.parameters()).device
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stops or [0])[0]
    if decoder is not None and not marker:
        new = decoder.generate(prompts, max_new_tokens, SamplingParams(temperature=temperature, top_p=top_p), stops, pad)
    else:
        ids, valid = left_pad(prompts, pad)
        by_text = {"stop_strings": [marker], "tokenizer": tokenizer} if marker else {}
        out = model.generate(ids.to(dev), attention_mask=valid.long().to(dev), do_sample=True,
                             temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
                             eos_token_id=stops or None, pad_token_id=pad, **by_text)
        new = out[:, ids.shape[1]:].tolist()  # [rows, <= max_new_tokens]
    queries: list[str | None] = []
    for start, row in zip(lead, new):
        cut = next((i for i, t in enumerate(row) if t in stops), None)
        text = tokenizer.decode(row[:cut], skip_special_tokens=True)
        at = text.find(marker) if marker else -1
        if at >= 0:
            text, cut = text[:at], at
        queries.append(None if cut is None else (start + text).strip())
    return queries


def _existing(out: Path, seed: int) -> tuple[list[str], int]:
    """The queries already in `out` and the next batch number for this seed (read_resumable: a torn last line is
    dropped; any other line that is not a synth-prompts record is refused, so that no other file is rewritten)."""

    def check(rec: dict) -> tuple[str, re.Match]:
        m = _ID.match(str(rec["id"]))
        query = rec["messages"][0]["content"]
        if m is None or not isinstance(query, str):
            raise ValueError
        return query, m

    records = read_resumable(out, check, "a synth-prompts record")
    batches = [int(m.group(2)) + 1 for _, m in records if int(m.group(1)) == seed]
    return [q for q, _ in records], max(batches, default=0)


def synthesize(model, tokenizer, out: str | Path, count: int, *, batch_size: int = 256, max_new_tokens: int = 256,
               temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, exclude: Iterable[str] = (),
               max_batches: int | None = None, progress: bool = True, decoder: str = "hf",
               starts: Sequence[str] = ()) -> dict:
    """Append new queries to `out` until it holds `count`; returns counts of what was kept and dropped. `decoder`
    as regenerate's ("hf", "static" or "auto"); `starts`: words a query may begin with (sample_queries)."""
    from tqdm import tqdm

    batched = make_decoder(model, decoder)

    out = Path(out)
    have, batch = _existing(out, seed)
    seen = {_norm(q) for q in have}
    index = ngram_index(exclude)
    stats = {"kept": 0, "unfinished": 0, "length": 0, "duplicate": 0, "excluded": 0}
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=count, initial=min(len(have), count), desc="synth-prompts", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    tries = idle = 0
    with open(out, "a", encoding="utf-8") as f:
        while len(have) < count and (max_batches is None or tries < max_batches):
            if idle >= STALL:
                raise EagleSpecError(f"{out}: the target wrote no usable query in {STALL} batches in a row "
                                     f"({stats}); raise --max-new-tokens or --temperature")
            queries = sample_queries(model, tokenizer, batch_size, max_new_tokens=max_new_tokens,
                                     temperature=temperature, top_p=top_p, seed=seed * 1_000_003 + batch,
                                     decoder=batched, starts=starts)
            kept_before = stats["kept"]
            for j, q in enumerate(queries):
                if len(have) >= count:
                    break
                key = None if q is None else _norm(q)
                why = ("unfinished" if q is None else "length" if not MIN_CHARS <= len(q) <= MAX_CHARS
                       else "duplicate" if key in seen else "excluded" if shares_ngram(q, index) else None)
                if why is not None:
                    stats[why] += 1
                    continue
                seen.add(key)
                have.append(q)
                stats["kept"] += 1
                rec = {"id": f"synth-s{seed}-b{batch}-{j}",
                       "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": "-"}]}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                bar.update(1)
            f.flush()
            batch += 1
            tries += 1
            idle = 0 if stats["kept"] > kept_before else idle + 1
    bar.close()
    stats["total"] = len(have)
    return stats
