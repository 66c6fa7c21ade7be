"""`eaglespec regenerate`: rewrite the assistant turns of a conversation file with the target itself.

Training on the target's own outputs raises acceptance (EAGLE-1's ablation; EAGLE-3 trains on regenerated data).
Conversations are regenerated turn by turn (later user turns see the regenerated earlier answers), batched across
conversations with left padding. The output is JSONL ({"id", "messages"} in OpenAI form; each regenerated
assistant turn also carries "token_ids", the ids the target generated up to its stop id, which training uses
instead of tokenizing the text again), appended one conversation at a time: running the same command again
resumes (ids already written are skipped). `shard=(i, n)` takes every n-th conversation of the length-sorted file
from the i-th on, so n processes (one per GPU, each with its own output) split one file into parts of alike
lengths; a resumed shard takes the same part. Each batch holds conversations of alike lengths (little padding), and the batches run in a seeded random
order, so a job cut short by a time limit has answered a sample of every length, not only the shortest prompts.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from eaglespec.backends.batched import BatchedDecoder, left_pad, make_decoder
from eaglespec.backends.loading import eos_ids
from eaglespec.errors import EagleSpecError
from eaglespec.sampling import SamplingParams
from eaglespec.train.data import chat_view, read_conversations, read_resumable

Answer = tuple[str, list[int]]  # an answer's text (decoded, stripped) and the ids generated, stop id excluded


def done_ids(out_path: Path) -> set[str]:
    """Ids already in the output (read_resumable: a torn last line from a kill is dropped and rewritten later; a
    file that is not a regenerate output is refused, never rewritten)."""

    def check(rec: dict) -> str:
        if not isinstance(rec["messages"], list):
            raise TypeError
        return str(rec["id"])

    return set(read_resumable(out_path, check, "a regenerated conversation ({id, messages})"))


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N; a clear error otherwise."""
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise EagleSpecError(f"--shard {text!r} is not of the form I/N (e.g. 0/2)") from None
    if n < 1 or not 0 <= i < n:
        raise EagleSpecError(f"--shard {text!r}: I must be in 0..N-1 and N >= 1")
    return i, n


def _prompts_until_turn(messages: list[dict], turn: int) -> list[dict] | None:
    """Messages before the `turn`-th assistant message (None when there is no such turn)."""
    seen = -1
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            seen += 1
            if seen == turn:
                return messages[:i]
    return None


def by_length(convs: list[dict]) -> list[dict]:
    """The conversations sorted by their first message's length."""
    return sorted(convs, key=lambda c: len(c["messages"][0]["content"]))


def length_batches(convs: list[dict], batch_size: int, seed: int = 0) -> list[list[dict]]:
    """Batches of `batch_size` conversations of alike first-message lengths, in a seeded random order."""
    ranked = by_length(convs)
    batches = [ranked[i:i + batch_size] for i in range(0, len(ranked), batch_size)]
    random.Random(seed).shuffle(batches)
    return batches


@torch.no_grad()
def generate_batch(model, tokenizer, chats: list[list[dict]], max_new_tokens: int, temperature: float,
                   max_prompt_tokens: int, decoder: BatchedDecoder | None = None) -> list[Answer]:
    """One batched generation over chat prompts (left padded): HF generate, or `decoder` (backends/batched.py);
    returns each answer's text and generated ids."""
    dev = next(model.parameters()).device
    prompts = []
    for chat in chats:
        text = tokenizer.apply_chat_template(chat_view(chat), tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompts.append(ids[-max_prompt_tokens:])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = eos_ids(model)
    if decoder is not None:  # temperature alone, as HF's kw below (top-k 0, top-p 1)
        rows = decoder.generate(prompts, max_new_tokens, SamplingParams(temperature=temperature), stops, pad)
    else:
        input_ids, valid = left_pad(prompts, pad)
        width = input_ids.shape[1]
        kw = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0 \
            else {"do_sample": False}
        out = model.generate(input_ids.to(dev), attention_mask=valid.long().to(dev), max_new_tokens=max_new_tokens,
                             pad_token_id=pad, **kw)
        rows = out[:, width:].cpu().tolist()
    answers, stop_set = [], set(stops)
    for row in rows:
        ids = until_stop(row, stop_set)
        answers.append((tokenizer.decode(ids, skip_special_tokens=True).strip(), ids))
    return answers


def until_stop(ids: list[int], stops: set[int]) -> list[int]:
    """The ids before the first stop id (a finished row's padding comes after it)."""
    for i, t in enumerate(ids):
        if t in stops:
            return ids[:i]
    return ids


def _answer_batch(group: list[dict], max_turns: int | None,
                  answer: Callable[[list[list[dict]]], list[Answer]]) -> list[list[dict]]:
    """One batch's conversations regenerated turn by turn (a later user turn sees the regenerated answers before it),
    each cut after its last regenerated answer; `answer(chats) -> [(text, ids)]` generates one turn for the whole
    batch."""
    batch = [[dict(m) for m in c["messages"]] for c in group]
    kept: list[list[dict]] = [[] for _ in batch]
    turn = 0
    while max_turns is None or turn < max_turns:
        jobs = [(i, before) for i, msgs in enumerate(batch)
                if (before := _prompts_until_turn(msgs, turn)) is not None]
        if not jobs:
            break
        for (i, before), (text, ids) in zip(jobs, answer([b for _, b in jobs])):
            batch[i][len(before)] = {"role": "assistant", "content": text, "token_ids": ids}
            kept[i] = batch[i][: len(before) + 1]
        turn += 1
    return kept


def regenerate(model, tokenizer, data: str | Path, out: str | Path, *, batch_size: int = 16,
               max_new_tokens: int = 512, temperature: float = 0.0, max_turns: int | None = None,
               limit: int | None = None, max_prompt_tokens: int = 1536, progress: bool = True,
               seed: int | None = None, shard: tuple[int, int] | None = None, decoder: str = "auto",
               time_budget: float | None = None, keep: Callable[[list[dict]], list[dict]] | None = None) -> int:
    """Regenerate every conversation of `data` not yet in `out`; returns how many were written. `seed` seeds the
    sampling (temperature > 0): without it a fresh process starts from torch's fixed default state, so two sampled
    passes over the same prompts and batches would write the same answers. `decoder`: "hf" (HF generate), "static"
    or "auto" (backends/batched.py, where the model allows it). `time_budget` seconds: no batch is started that the
    slowest one so far would not finish in time (a batch killed by an outer time limit is lost work). `keep(convs)`:
    the conversations to regenerate of those read (e.g. decontamination), before any sharding."""
    from tqdm import tqdm

    batched = make_decoder(model, decoder)

    if seed is not None:
        torch.manual_seed(seed)  # CPU and every CUDA device

    out = Path(out)
    convs = read_conversations(data, limit)
    if keep is not None:
        convs = keep(convs)
    if shard is not None:
        convs = by_length(convs)[shard[0]::shard[1]]
    done = done_ids(out)
    todo = [c for c in convs if c["id"] not in done]
    out.parent.mkdir(parents=True, exist_ok=True)

    def answer(chats: list[list[dict]]) -> list[Answer]:
        return generate_batch(model, tokenizer, chats, max_new_tokens, temperature, max_prompt_tokens, batched)

    deadline = None if time_budget is None else time.monotonic() + time_budget
    written, slowest = 0, 0.0
    bar = tqdm(total=len(convs), initial=len(convs) - len(todo), desc="regenerate", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    with open(out, "a", encoding="utf-8") as f:
        for group in length_batches(todo, batch_size):
            if deadline is not None and time.monotonic() + slowest > deadline:
                print(f"regenerate: time budget of {time_budget:g} s reached; {len(convs) - bar.n} conversations left "
                      "(the same command resumes)", file=sys.stderr)
                break
            began = time.monotonic()
            for conv, msgs in zip(group, _answer_batch(group, max_turns, answer)):
                if msgs:
                    f.write(json.dumps({"id": conv["id"], "messages": msgs}, ensure_ascii=False) + "\n")
                    written += 1
            f.flush()
            bar.update(len(group))
            slowest = max(slowest, time.monotonic() - began)
    bar.close()
    if not convs:
        raise EagleSpecError(f"{data}: nothing to regenerate")
    return written
