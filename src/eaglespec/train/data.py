"""Conversations -> token ids + assistant loss masks, and packing into training rows.

Input: JSON (an array, parsed object by object so a file cut off mid-way still yields every whole
conversation) or JSONL, in ShareGPT form (`conversations: [{from, value}]`) or OpenAI form
(`messages: [{role, content}]`). The loss mask covers assistant tokens only; it is located by
rendering prefixes of the conversation with the tokenizer's own chat template (no per-model regex).
tokenize_all spreads chunks of conversations over forked worker processes (same samples, same order).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eaglespec.errors import EagleSpecError

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


TORN_HEAD = '{"id": '  # how every line regenerate and synth-prompts write begins (json.dumps, "id" first)


def read_resumable(path: Path, check: Callable[[Any], Any], what: str) -> list[Any]:
    """The records of a JSONL output that a killed run resumes: `check(record)` returns what to keep or raises
    ValueError/KeyError/IndexError/TypeError. A torn last line (a kill mid-write: one of ours, cut before it parses)
    is dropped, and a whole last line missing its newline gets one, so that an append cannot join it; any other bad
    line is refused, naming the file and line, and then nothing is rewritten."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")  # not splitlines (U+2028 inside a string)
    kept, torn = [], False
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if k == len(lines) - 1 and line.startswith(TORN_HEAD):
                torn = True
                continue
            raise EagleSpecError(f"{path}:{k + 1}: not {what} (not JSON); give another --out") from None
        try:
            kept.append(check(rec))
        except (ValueError, KeyError, IndexError, TypeError):
            raise EagleSpecError(f"{path}:{k + 1}: not {what}; give another --out") from None
    if torn or (text.strip() and not text.endswith("\n")):
        whole = lines[:-1] if torn else lines
        path.write_text("".join(line + "\n" for line in whole if line.strip()), encoding="utf-8")
    return kept


def normalize_messages(record: Any, where: str) -> list[dict[str, Any]]:
    """A ShareGPT or OpenAI record -> [{role, content}] with roles system|user|assistant; an assistant turn keeps
    its 'token_ids' (the ids the target generated, written by `regenerate`) where the record has them."""
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
        msg = {"role": ROLES[role], "content": content}
        ids = turn.get("token_ids")
        if ids is not None:
            if ROLES[role] != "assistant" or not isinstance(ids, list) or not all(type(i) is int for i in ids):
                raise EagleSpecError(f"{where}: turn {j}: 'token_ids' must be a list of integers on an assistant turn")
            msg["token_ids"] = ids
        out.append(msg)
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
PARALLEL_MIN = 200  # fewer conversations than this are tokenized in-process (a pool's start-up would not pay)
CHUNK = 64  # conversations per pool task


def _check_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise EagleSpecError("the tokenizer has no chat template: cannot locate the assistant turns")


def chat_view(messages: Sequence[dict]) -> list[dict[str, str]]:
    """The messages as a chat template takes them: role and content only."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _render_text(tokenizer, messages: Sequence[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(chat_view(messages), tokenize=False, add_generation_prompt=generation_prompt)


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text; one batched call for a fast tokenizer (same ids as one call per text)."""
    if getattr(tokenizer, "is_fast", False):
        out = tokenizer(texts, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False)
        return out["input_ids"]
    return [list(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (a prefix rendering tokenizes to a prefix): one C-level compare
        return n
    i = 0
    while a[i] == b[i]:  # stops before n: a mismatch exists
        i += 1
    return i


def _conversation_texts(tokenizer, messages: Sequence[dict]) -> tuple[list[str], list[tuple[int, int, int]]]:
    """The renderings one conversation needs: texts[0] is the whole conversation; for each assistant turn
    k > 0, k and the indices into texts of render(messages[:k], generation prompt) and render(messages[:k+1]).

    Equal texts are kept once (the last turn's closing rendering is the whole conversation).
    """
    texts: list[str] = []
    where: dict[str, int] = {}

    def index(text: str) -> int:
        if text not in where:
            where[text] = len(texts)
            texts.append(text)
        return where[text]

    index(_render_text(tokenizer, messages, False))
    turns = []
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant" or k == 0:
            continue  # an opening assistant turn has no prompt to answer: context only
        a = index(_render_text(tokenizer, messages[:k], True))
        b = 0 if k + 1 == len(messages) else index(_render_text(tokenizer, messages[: k + 1], False))
        turns.append((k, a, b))
    return texts, turns


Encoded = tuple[list[int], list[tuple[int, int]]]  # full ids, assistant spans [start, end) into them


def _encode_conversations(tokenizer, conversations: Sequence[Sequence[dict]]) -> list[Encoded]:
    """Token ids and assistant spans of several conversations (one tokenizer call for all their renderings).

    Assistant turn k spans [len(render(messages[:k], generation prompt)), len(render(messages[:k+1])))
    in tokens of the full rendering (common-prefix lengths, so templates that rewrite earlier turns
    still give a conservative span). A turn with 'token_ids' has its content's tokens replaced by them
    (_splice_answer): the sequence the target generated, not its text tokenized again.
    """
    _check_template(tokenizer)
    texts: list[str] = []
    plans = []
    for messages in conversations:
        t, turns = _conversation_texts(tokenizer, messages)
        plans.append((messages, len(texts), turns))
        texts += t
    ids = _encode(tokenizer, texts)
    out = []
    for messages, base, turns in plans:
        full = ids[base]
        spans = []
        for k, a, b in turns:
            start = _common_prefix(ids[base + a], full)
            end = len(full) if b == 0 else _common_prefix(ids[base + b], full)
            if end > start:
                spans.append((k, start, end))
        out.append(_splice_answers(tokenizer, messages, full, spans))
    return out


def _content_end(tokenizer, span: list[int], content: str) -> int | None:
    """j such that span[:j] are the turn's content tokens (they decode to `content`; the rest is the template's
    end of turn, a few tokens), or None."""
    for j in range(len(span), max(-1, len(span) - 9), -1):
        if tokenizer.decode(span[:j]) == content:
            return j
    return None


def _splice_answers(tokenizer, messages: Sequence[dict], full: list[int],
                    spans: list[tuple[int, int, int]]) -> Encoded:
    """`full` with each assistant turn's content tokens replaced by its 'token_ids' where it has them and they
    decode to its content (else the text's tokens stay: an edited answer, a template that wraps the content);
    the spans shifted to match. Text tokenized again can differ from what the target generated (SmolLM2's
    "\n\n" + "1" comes back as "\n", "\n", "1"), and the drafter should learn the sequences it will meet."""
    out, kept, shift = full, [], 0
    for k, start, end in spans:
        start, end = start + shift, end + shift
        gen = messages[k].get("token_ids")
        content = messages[k]["content"]
        if gen is not None and tokenizer.decode(gen, skip_special_tokens=True).strip() == content:
            j = _content_end(tokenizer, out[start:end], content)
            if j is not None:
                out = out[:start] + list(gen) + out[start + j:]
                end += len(gen) - j
                shift += len(gen) - j
        kept.append((start, end))
    return out, kept


def _to_sample(full: list[int], spans: list[tuple[int, int]], max_length: int | None) -> Sample:
    ids = torch.tensor(full, dtype=torch.long)
    mask = torch.zeros(len(full), dtype=torch.bool)
    for start, end in spans:
        mask[start:end] = True
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return Sample(ids, mask)


def tokenize_conversation(tokenizer, messages: Sequence[dict], max_length: int | None = None) -> Sample:
    """Chat-template token ids and the assistant loss mask (see _encode_conversations)."""
    return _to_sample(*_encode_conversations(tokenizer, [messages])[0], max_length)


def _keep(full: list[int], spans: list[tuple[int, int]], max_length: int | None) -> Encoded | None:
    """Cut to max_length; None when fewer than 3 tokens or no assistant token is left."""
    n = len(full) if max_length is None else min(len(full), max_length)
    spans = [(s, min(e, n)) for s, e in spans if s < n]
    return (full[:n], spans) if n >= 3 and spans else None


_WORKER: dict[str, Any] = {}


def _worker_init(tokenizer, conversations: Sequence[dict], max_length: int | None) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: the pool is the parallelism
    _WORKER.update(tokenizer=tokenizer, conversations=conversations, max_length=max_length)


def _encode_range(tokenizer, conversations: Sequence[dict], max_length: int | None, lo: int, hi: int
                  ) -> list[Encoded | None]:
    enc = _encode_conversations(tokenizer, [c["messages"] for c in conversations[lo:hi]])
    return [_keep(full, spans, max_length) for full, spans in enc]


def _worker_range(lo_hi: tuple[int, int]) -> list[Encoded | None]:
    w = _WORKER
    return _encode_range(w["tokenizer"], w["conversations"], w["max_length"], *lo_hi)


def default_workers(n: int) -> int:
    """Tokenizer processes for n conversations: min(cores, 16) shared by the ranks on this node, 1 for small n."""
    if n < PARALLEL_MIN:
        return 1
    cores = os.cpu_count() or 1
    if hasattr(os, "sched_getaffinity"):
        cores = min(cores, len(os.sched_getaffinity(0)))  # the cores this process may run on
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))  # set by torchrun
    return max(1, min(cores, 16) // local_ranks)


def tokenize_all(tokenizer, conversations: Sequence[dict], max_length: int | None, progress: bool = False,
                 workers: int | None = None) -> list[Sample]:
    """Samples of all conversations, in order; those with < 3 tokens or no assistant token are dropped.

    workers: tokenizer processes (None = default_workers); the result does not depend on it.
    """
    from tqdm import tqdm

    _check_template(tokenizer)
    n = len(conversations)
    workers = default_workers(n) if workers is None else workers
    if workers < 1:
        raise EagleSpecError(f"tokenize_all: workers must be >= 1, got {workers}")
    chunk = max(1, min(CHUNK, -(-n // (workers * 4))))
    ranges = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
    workers = min(workers, len(ranges))
    encoded: list[Encoded | None] = []
    if workers <= 1:
        bar = tqdm(total=n, desc="tokenize", disable=not progress, mininterval=2.0)
        for lo, hi in ranges:
            encoded += _encode_range(tokenizer, conversations, max_length, lo, hi)
            bar.update(hi - lo)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
        # Forked workers must not use the parent's tokenizer thread pool: the variable is set across the fork
        # (which also keeps the tokenizers library from warning about it) and restored once the workers exist.
        # The progress bar (a thread) starts after the fork.
        saved = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            pool = ctx.Pool(workers, _worker_init, (tokenizer, conversations, max_length))
        finally:
            if saved is None:
                del os.environ["TOKENIZERS_PARALLELISM"]
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = saved
        bar = tqdm(total=n, desc=f"tokenize ({workers} processes)", disable=not progress, mininterval=2.0)
        with pool:
            for (lo, hi), part in zip(ranges, pool.imap(_worker_range, ranges)):
                encoded += part
                bar.update(hi - lo)
    bar.close()
    return [_to_sample(e[0], e[1], None) for e in encoded if e is not None]


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


def samples_digest(samples: Sequence[Sample]) -> str:
    """sha256 of the samples' token ids and loss masks, in order: two runs index the same data iff equal."""
    h = hashlib.sha256()
    for s in samples:
        ids = s.ids.to(torch.int64).numpy()
        h.update(len(ids).to_bytes(8, "little"))
        h.update(ids.tobytes())
        h.update(s.loss_mask.to(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _prompt_key(sample: Sample) -> bytes:
    """The tokens before the first loss token (the prompt): two answers to one prompt share it."""
    mask = sample.loss_mask
    first = int(mask.to(torch.uint8).argmax()) if bool(mask.any()) else len(mask)
    return sample.ids[:first].numpy().tobytes()


def split_eval(samples: Sequence[Sample], fraction: float, seed: int = 0) -> tuple[list[Sample], list[Sample]]:
    """Deterministic train/eval split by prompt: every answer to one prompt (greedy and sampled regenerations of the
    same query) falls on the same side, so the held-out numbers are on prompts never trained on. Groups are drawn
    in a seeded order, each if it fits in round(n * fraction) samples (the first group always, unless it is all
    of them); with distinct prompts this is a plain seeded permutation of the samples."""
    n = len(samples)
    n_eval = 0 if fraction <= 0 or n < 2 else max(1, round(n * fraction))
    groups: dict[bytes, list[int]] = {}
    for i, sample in enumerate(samples):
        groups.setdefault(_prompt_key(sample), []).append(i)
    members = list(groups.values())  # in first-appearance order
    perm = torch.randperm(len(members), generator=torch.Generator().manual_seed(seed)).tolist()
    ev: set[int] = set()
    for g in perm:
        if len(ev) >= n_eval:
            break
        size = len(members[g])
        if len(ev) + size <= n_eval or (not ev and size < n):  # the first group may overshoot; train never empty
            ev.update(members[g])
    return [s for i, s in enumerate(samples) if i not in ev], [samples[i] for i in sorted(ev)]
