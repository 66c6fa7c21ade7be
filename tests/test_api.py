"""The Python API: generate / stream for strings, chat messages and ids; stop strings; streaming text."""

from __future__ import annotations

import pytest

from eaglespec import EagleSpec, EagleSpecError
from eaglespec.api import TextStream

from conftest import BYTE_VOCAB, byte_tokenizer, cycle_target, reference_greedy, tiny_drafter, tiny_target

CYCLE = "aé中😀 "


@pytest.fixture(scope="module")
def tok():
    return byte_tokenizer()


@pytest.fixture(scope="module")
def cycle_es(tok):
    model = cycle_target(tok, CYCLE)
    return EagleSpec(model, tok, tiny_drafter(model))


@pytest.fixture(scope="module")
def random_es(tok):
    model = tiny_target(vocab=BYTE_VOCAB, seed=5)
    return EagleSpec(model, tok, tiny_drafter(model))


def test_text_stream_waits_for_whole_characters(tok):
    ids = tok.encode(CYCLE * 2, add_special_tokens=False)
    ts = TextStream(tok)
    pieces = [ts.push([t]) for t in ids] + [ts.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == CYCLE * 2
    assert sum(1 for p in pieces if p) == len(CYCLE) * 2  # one piece per character, none split


def test_text_stream_stop_strings(tok):
    ids = tok.encode("hello wor" + "ld 中😀 after", add_special_tokens=False)
    ts = TextStream(tok, stop=["中😀", "zzz"])
    pieces = [ts.push([t]) for t in ids] + [ts.flush()]
    assert "".join(pieces) == "hello world " and ts.stopped
    # a suffix that may grow into a stop string is held back, then released at the end
    ts = TextStream(tok, stop="xyz")
    assert ts.push(tok.encode("abcxy", add_special_tokens=False)) == "abc"
    assert ts.flush() == "xy" and not ts.stopped


def test_stream_equals_generate_with_split_characters(cycle_es, tok):
    for n in (7, 23, 40):  # 7 and 23 end inside a character
        out = cycle_es.generate("a", max_new_tokens=n, raw=True)
        st = cycle_es.stream("a", max_new_tokens=n, raw=True)
        pieces = list(st)
        assert "".join(pieces) == out.text == tok.decode(out.token_ids)
        assert st.token_ids == out.token_ids and len(out.token_ids) == n
        assert all("\ufffd" not in p for p in pieces[:-1])
    # the rounds really cut characters in the middle: some round boundary is inside a UTF-8 sequence
    emitted = [1] + [r.emitted for r in out.result.rounds]
    cuts, pos = set(), 0
    for e in emitted:
        pos += e
        cuts.add(pos)
    starts = {i for i, t in enumerate(out.token_ids) if (tok.decode([t]).encode("utf-8", "replace") != b"\xef\xbf\xbd")}
    assert cuts - starts - {len(out.token_ids)}, "no round ended inside a multi-byte character"
    assert "中😀" in out.text


def test_stop_string_cuts_text(cycle_es):
    out = cycle_es.generate("a", max_new_tokens=60, raw=True, stop=["😀"])
    assert out.text == "é中" and out.finish_reason == "stop"
    out = cycle_es.generate("a", max_new_tokens=60, raw=True, stop="nope")
    assert out.finish_reason == "length" and out.text.startswith("é中😀 aé")


def test_greedy_matches_target_for_every_prompt_form(random_es, tok):
    model = random_es.model
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    for prompt, raw in (("hello", True), ("hello", False), (msgs, False), ([5, 6, 7, 8], False)):
        ids = random_es.encode(prompt, raw)
        out = random_es.generate(prompt, max_new_tokens=20, raw=raw)
        assert out.prompt_token_ids == ids
        assert out.token_ids == reference_greedy(model, ids, 20, eos=2)
        assert out.stats["new_tokens"] == len(out.token_ids)
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    assert random_es.encode("hello", raw=False) == tok(text, add_special_tokens=False)["input_ids"]


def test_context_and_interleaving_errors(random_es):
    with pytest.raises(EagleSpecError, match="context length"):
        random_es.generate([3] * 500, max_new_tokens=20)
    a = iter(random_es.stream("one", max_new_tokens=30, raw=True))
    next(a)
    b = random_es.stream("two", max_new_tokens=5, raw=True)
    assert "".join(b) == b.text  # the newer stream owns the engine
    with pytest.raises(EagleSpecError, match="one sequence at a time"):
        list(a)
    assert random_es.generate("one", max_new_tokens=5, raw=True).token_ids  # still usable


def test_sampling_options_pass_through(random_es):
    a = random_es.generate("hi", max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7)
    b = random_es.generate("hi", max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7)
    assert a.token_ids == b.token_ids  # seeded: reproducible
    greedy = random_es.generate("hi", max_new_tokens=12, temperature=0.0, seed=7)
    assert greedy.token_ids == random_es.generate("hi", max_new_tokens=12).token_ids


def test_draft_temperature_reaches_the_engine(random_es, monkeypatch):
    """draft_temperature=0 under a sampling temperature: the drafter's processors are greedy (top-k children), the
    target's stay sampled; seeded runs repeat; a negative value is one line naming the option."""
    seen = []
    real = random_es._sampled_stream

    def watch(ids, max_new_tokens, result, cfg):
        seen.append(cfg)
        return real(ids, max_new_tokens, result, cfg)

    monkeypatch.setattr(random_es, "_sampled_stream", watch)
    a = random_es.generate("hi", max_new_tokens=12, temperature=0.9, draft_temperature=0.0, seed=7)
    b = random_es.generate("hi", max_new_tokens=12, temperature=0.9, draft_temperature=0.0, seed=7)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 12
    assert seen[0].target.temperature == 0.9 and seen[0].draft_params.greedy
    random_es.generate("hi", max_new_tokens=4, temperature=0.9, seed=7)
    assert seen[-1].draft is None  # without it the drafter takes the target's processors
    with pytest.raises(EagleSpecError, match="draft_temperature must be >= 0"):
        random_es.generate("hi", max_new_tokens=4, temperature=0.9, draft_temperature=-1)
