"""Conversations -> token ids + assistant loss masks, and packing into training rows.

Input: JSON (an array, parsed object by object so a file cut off mid-way still yields every whole
conversation) or JSONL, in ShareGPT form (`conversations: [{from, value}]`) or OpenAI form
(`messages: [{role, content}]`). The loss mask covers assistant tokens only; it is located by
rendering prefixes of the conversation with the tokenizer's own chat template (no per-model regex).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import EagleSpecError

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


@dataclass
class Sample:
    ids: torch.Tensor  # [n] long
    loss_mask: torch.Tensor  # [n] bool (assistant tokens)
    features: torch.Tensor | None = None  # [n, F] cached target aux features (offline training)
    hidden: torch.Tensor | None = None  # [n, H] cached final hidden states (soft labels)


@dataclass
class Packed:
    """Several samples packed into one row: no attention across segments."""

    tokens: torch.Tensor  # [N] long
    segment: torch.Tensor  # [N] long (0, 1, ... per sample)
    position: torch.Tensor  # [N] long, restarting at 0 in every segment
    valid: torch.Tensor  # [N] bool (False = padding)
    loss_mask: torch.Tensor  # [N] bool

    def to(self, device) -> Packed:
        return Packed(*(getattr(self, f).to(device) for f in ("tokens", "segment", "position", "valid", "loss_mask")))


# -- reading ------------------------------------------------------------------------------------
def _iter_json_array(text: str, path: Path) -> Iterator[Any]:
    """Objects of a top-level JSON array, one by one; stops quietly at a cut-off tail."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the file is cut off inside this object: keep what was whole
        yield obj


def iter_records(path: str | Path) -> Iterator[Any]:
    """Raw records of a JSON array file or a JSONL file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EagleSpecError(f"{path}: cannot read the data file ({exc.strerror})") from None
    head = text.lstrip()[:1]
    if head == "[":
        yield from _iter_json_array(text, path)
        return
    if head == "{" and "\n" not in text.strip():
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EagleSpecError(f"{path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
        yield from (obj.get("data") or [obj]) if isinstance(obj, dict) else [obj]
        return
    for lineno, line in enumerate(text.split("\n"), 1):  # not splitlines: U+2028 may sit inside a string
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            raise EagleSpecError(f"{path}:{lineno}: malformed JSONL line ({exc.msg})") from None


def normalize_messages(record: Any, where: str) -> list[dict[str, str]]:
    """A ShareGPT or OpenAI record -> [{role, content}] with roles system|user|assistant."""
    if not isinstance(record, dict):
        raise EagleSpecError(f"{where}: expected an object with 'conversations' or 'messages'")
    turns = record.get("messages", record.get("conversations"))
    if not isinstance(turns, list):
        raise EagleSpecError(f"{where}: field 'conversations' (ShareGPT) or 'messages' (OpenAI) must be a list")
    out = []
    for j, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise EagleSpecError(f"{where}: turn {j} is not an object")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role not in ROLES or not isinstance(content, str):
            raise EagleSpecError(f"{where}: turn {j} needs a known 'from'/'role' and a string 'value'/'content', "
                                 f"got role {role!r}")
        out.append({"role": ROLES[role], "content": content})
    return out


def read_conversations(path: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """[{id, messages}] from a data file; records without an assistant turn are skipped."""
    convs = []
    for i, rec in enumerate(iter_records(path)):
        msgs = normalize_messages(rec, f"{path}: record {i}")
        while msgs and msgs[0]["role"] == "assistant":  # ShareGPT has conversations opening with the model
            msgs = msgs[1:]
        if not any(m["role"] == "assistant" for m in msgs):
            continue
        rid = rec.get("id", i) if isinstance(rec, dict) else i
        convs.append({"id": str(rid), "messages": msgs})
        if limit is not None and len(convs) >= limit:
            break
    if not convs:
        raise EagleSpecError(f"{path}: no conversation with an assistant turn found")
    return convs


# -- tokenizing ---------------------------------------------------------------------------------
def _render(tokenizer, messages: Sequence[dict], generation_prompt: bool) -> list[int]:
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def tokenize_conversation(tokenizer, messages: Sequence[dict], max_length: int | None = None) -> Sample:
    """Chat-template token ids and the assistant loss mask.

    Assistant turn k spans [len(render(messages[:k], generation prompt)), len(render(messages[:k+1])))
    in tokens of the full rendering (common-prefix lengths, so templates that rewrite earlier turns
    still give a conservative span).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise EagleSpecError("the tokenizer has no chat template: cannot locate the assistant turns")
    full = _render(tokenizer, messages, False)
    mask = torch.zeros(len(full), dtype=torch.bool)
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant" or k == 0:
            continue  # an opening assistant turn has no prompt to answer: context only
        start = _common_prefix(_render(tokenizer, messages[:k], True), full)
        end = _common_prefix(_render(tokenizer, messages[: k + 1], False), full)
        if end > start:
            mask[start:end] = True
    ids = torch.tensor(full, dtype=torch.long)
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return Sample(ids, mask)


def tokenize_all(tokenizer, conversations: Sequence[dict], max_length: int | None, progress: bool = False) -> list[Sample]:
    from tqdm import tqdm

    samples = []
    for conv in tqdm(conversations, desc="tokenize", disable=not progress, mininterval=2.0):
        s = tokenize_conversation(tokenizer, conv["messages"], max_length)
        if s.ids.numel() >= 3 and bool(s.loss_mask.any()):
            samples.append(s)
    return samples


# -- packing ------------------------------------------------------------------------------------
def pack(samples: Sequence[Sample], length: int | None = None) -> Packed:
    """Concatenate samples into one row with segment ids and per-segment positions.

    length: pad (valid=False) or cut to exactly this many tokens (None = the total length).
    """
    tokens = torch.cat([s.ids for s in samples]) if samples else torch.zeros(0, dtype=torch.long)
    loss = torch.cat([s.loss_mask for s in samples]) if samples else torch.zeros(0, dtype=torch.bool)
    segment = torch.cat([torch.full((s.ids.numel(),), i, dtype=torch.long) for i, s in enumerate(samples)]) \
        if samples else torch.zeros(0, dtype=torch.long)
    position = torch.cat([torch.arange(s.ids.numel()) for s in samples]) if samples else torch.zeros(0, dtype=torch.long)
    valid = torch.ones(tokens.numel(), dtype=torch.bool)
    if length is not None:
        pad = length - tokens.numel()
        if pad < 0:
            tokens, loss, segment, position, valid = (x[:length] for x in (tokens, loss, segment, position, valid))
        elif pad:
            tokens = torch.cat([tokens, tokens.new_zeros(pad)])
            loss = torch.cat([loss, loss.new_zeros(pad)])
            segment = torch.cat([segment, segment.new_full((pad,), len(samples))])
            position = torch.cat([position, torch.arange(pad)])
            valid = torch.cat([valid, valid.new_zeros(pad)])
    return Packed(tokens, segment, position, valid, loss)


def group_for_packing(samples: Sequence[Sample], max_tokens: int) -> list[list[Sample]]:
    """Greedy in-order groups of at most `max_tokens` tokens (a longer sample is a group of its own).

    Attention inside a pack is quadratic in its length, so a micro-batch is cut into packs of about
    one sample's maximum length rather than packed into one long row.
    """
    groups: list[list[Sample]] = []
    size = 0
    for s in samples:
        n = s.ids.numel()
        if not groups or size + n > max_tokens:
            groups.append([])
            size = 0
        groups[-1].append(s)
        size += n
    return groups


def split_eval(samples: Sequence[Sample], fraction: float, seed: int = 0) -> tuple[list[Sample], list[Sample]]:
    """Deterministic train/eval split (at least one eval sample when fraction > 0 and n >= 2)."""
    n = len(samples)
    n_eval = 0 if fraction <= 0 or n < 2 else max(1, round(n * fraction))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    ev = set(perm[:n_eval])
    return [s for i, s in enumerate(samples) if i not in ev], [samples[i] for i in sorted(ev)]
