"""tokenize_all in a process pool gives the serial samples exactly (ids, loss masks, order, drops)."""

from __future__ import annotations

import itertools
import multiprocessing
import os

import pytest
import torch

from eaglespec.errors import EagleSpecError
from eaglespec.train import data
from eaglespec.train.data import tokenize_all

from conftest import byte_tokenizer

L = 160  # max_length

# the generation prompt ends in a "#" the full rendering does not have: a prefix rendering is not a token
# prefix of the full one (its last token differs), so the spans come from the element-by-element compare
HASH_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n#{% endif %}")


def _conversations() -> list[dict]:
    convs = []
    for i in range(37):  # not a multiple of the chunk size
        u, a = {"role": "user", "content": f"question {i} é"}, {"role": "assistant", "content": f"answer {i} " + "x" * i}
        if i % 5 == 0:
            msgs = [{"role": "system", "content": "be brief"}, u, a, {"role": "user", "content": f"more {i}"},
                    {"role": "assistant", "content": f"second {i}"}]
        elif i % 5 == 1:
            msgs = [{"role": "user", "content": "u" * (200 + i)}, a]  # the answer lies past max_length: dropped
        elif i % 5 == 2:
            msgs = [a, u, a, u, a]  # an opening assistant turn is context only
        elif i % 5 == 3:
            msgs = [u, {"role": "assistant", "content": "y" * (150 + i)}]  # cut by max_length
        else:
            msgs = [u, a]
        convs.append({"id": str(i), "messages": msgs})
    return convs


def _reference(tok, convs: list[dict], max_length: int) -> list[tuple[list[int], list[bool]]]:
    """A reference for the loss masks: three renderings per assistant turn, token by token common prefixes."""
    def render(msgs, gen):
        return tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen),
                   add_special_tokens=False)["input_ids"]

    def common(a, b):
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    out = []
    for c in convs:
        m = c["messages"]
        full = render(m, False)
        mask = [False] * len(full)
        for k in range(1, len(m)):
            if m[k]["role"] == "assistant":
                start, end = common(render(m[:k], True), full), common(render(m[: k + 1], False), full)
                mask[start:end] = [True] * max(0, end - start)
        ids, mask = full[:max_length], mask[:max_length]
        if len(ids) >= 3 and any(mask):
            out.append((ids, mask))
    return out


def _plain(samples) -> list[tuple[list[int], list[bool]]]:
    assert all(s.ids.dtype == torch.long and s.loss_mask.dtype == torch.bool for s in samples)
    return [(s.ids.tolist(), s.loss_mask.tolist()) for s in samples]


@pytest.fixture
def pools(monkeypatch):
    """Records the process count of every pool tokenize_all starts."""
    started: list[int] = []
    real = multiprocessing.get_context

    def get_context(method=None):
        ctx = real(method)

        class Spy:
            def Pool(self, n, *args):
                started.append(n)
                return ctx.Pool(n, *args)

        return Spy()

    monkeypatch.setattr(multiprocessing, "get_context", get_context)
    return started


@pytest.mark.parametrize("template", ["chatml", "hash"])
def test_parallel_equals_serial_and_reference(template, pools):
    tok = byte_tokenizer()
    if template == "hash":
        tok.chat_template = HASH_TEMPLATE
    convs = _conversations()
    serial = _plain(tokenize_all(tok, convs, L, workers=1))
    assert pools == []
    parallel = _plain(tokenize_all(tok, convs, L, workers=2))
    assert pools == [2]
    ref = _reference(tok, convs, L)
    assert serial == ref and parallel == ref
    assert 0 < len(ref) < len(convs)  # some conversations were dropped
    assert any(len(ids) == L for ids, _ in ref)  # some were cut
    assert any(sum(a != b for a, b in itertools.pairwise(m)) > 2 for _, m in ref)  # multi-turn masks survived
    assert _plain(tokenize_all(tok, convs, None, workers=2)) == _reference(tok, convs, 10**9)


def test_default_workers_threshold_and_pool(monkeypatch, pools):
    tok = byte_tokenizer()
    convs = _conversations()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    serial = _plain(tokenize_all(tok, convs, L))
    assert pools == []  # fewer than PARALLEL_MIN conversations: no pool
    monkeypatch.setattr(data, "PARALLEL_MIN", 1)
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    assert _plain(tokenize_all(tok, convs, L, progress=True)) == serial
    assert pools == [2]
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before  # set for the fork only


def test_default_workers_shares_cores_between_local_ranks(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert data.default_workers(10_000) == 16  # capped at 16
    assert data.default_workers(10) == 1  # small input: no pool
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert data.default_workers(10_000) == 8  # 2 ranks x 8 workers <= 16 of 32 cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    assert data.default_workers(10_000) == 1  # 12 // 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert data.default_workers(10_000) == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert data.default_workers(10_000) == 3  # a process pinned to 3 cores
    with pytest.raises(EagleSpecError, match="workers"):
        tokenize_all(byte_tokenizer(), _conversations(), L, workers=0)


def test_no_chat_template_fails_in_the_pool_too():
    tok = byte_tokenizer()
    tok.chat_template = None
    with pytest.raises(EagleSpecError, match="chat template"):
        tokenize_all(tok, _conversations(), L, workers=2)
