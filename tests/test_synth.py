"""`eaglespec synth-prompts`: user queries sampled from the chat template's user prefix (Magpie), filtered, resumable."""

from __future__ import annotations

import json

import pytest
import torch

import eaglespec.backends.loading
import eaglespec.train.synth as synth
from eaglespec.backends.batched import make_decoder
from eaglespec.cli.main import main
from eaglespec.errors import EagleSpecError
from eaglespec.train.data import read_conversations

from conftest import BYTE_VOCAB, CHAT_TEMPLATE, byte_tokenizer, tiny_target

EOT = 259  # "<|eot|>" in eot_tokenizer (the eos stays "<|im_end|>" = 2)
SYSTEM_TEMPLATE = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are helpful.<|eot|>{% endif %}"
                   "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|eot|>{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def eot_tokenizer():
    """The byte tokenizer with a default system prompt and an end-of-turn token other than the EOS."""
    tok = byte_tokenizer()
    tok.add_tokens(["<|eot|>"], special_tokens=True)
    assert tok.convert_tokens_to_ids("<|eot|>") == EOT and tok.eos_token_id == 2
    tok.chat_template = SYSTEM_TEMPLATE
    return tok


def enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def sentence(n: int, start: int = 0) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


# -- the template's user prefix and its stop tokens ------------------------------------------------
def test_query_prefix_is_the_text_before_the_user_content():
    tok = byte_tokenizer()
    prefix, end = synth.query_prefix(tok)
    assert (prefix, end) == ("<|im_start|>user\n", "<|im_end|>\n")
    tok = eot_tokenizer()  # a default system prompt belongs to the prefix
    prefix, end = synth.query_prefix(tok)
    assert prefix == "<|im_start|>system\nYou are helpful.<|eot|><|im_start|>user\n"
    assert end.startswith("<|eot|>") and "assistant" not in prefix + end  # no generation prompt
    assert prefix + "What is 2+2?" + end == tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                                                    tokenize=False)


@pytest.mark.parametrize("template, match", [
    (CHAT_TEMPLATE.replace("{{ m['content'] }}", "{{ m['content'] | upper }}"), "verbatim"),
    (CHAT_TEMPLATE.replace("{{ m['content'] }}", "{{ m['content'] }}\n{{ m['content'] }}"), "verbatim"),
    (None, "no chat template"),
])
def test_query_prefix_refuses_templates_it_cannot_use(template, match):
    tok = byte_tokenizer()
    tok.chat_template = template
    with pytest.raises(EagleSpecError, match=match):
        synth.query_prefix(tok)


def test_stop_ids_hold_the_end_of_turn_token_and_the_eos():
    tok = eot_tokenizer()
    assert synth.stop_ids(tok, synth.query_prefix(tok)[1]) == [2, EOT]
    tok = byte_tokenizer()  # ChatML: the end-of-turn token is the eos
    assert synth.stop_ids(tok, synth.query_prefix(tok)[1]) == [2]
    assert synth.stop_ids(tok, "\n") == [2]  # no marker (whitespace only): the eos alone

    class NoEos:
        eos_token_id = None

        def __call__(self, text, add_special_tokens=False):
            raise AssertionError("whitespace is not tokenized")

    with pytest.raises(EagleSpecError, match="end-of-turn"):
        synth.stop_ids(NoEos(), " \n")


# -- sampling ----------------------------------------------------------------------------------------
def test_sample_queries_cut_at_the_first_stop_token(monkeypatch):
    """Crafted continuations: a row is the decode of its tokens before the first stop (end-of-turn or eos, never the
    prefix's own end-of-turn token of the system turn), None without one."""
    tok = eot_tokenizer()
    model = tiny_target(vocab=BYTE_VOCAB + 1)
    prefix = enc(tok, synth.query_prefix(tok)[0])
    assert EOT in prefix  # the system turn's end: the cut must look only at the new tokens
    conts = [[*enc(tok, "hello world"), EOT, *enc(tok, "junk"), 2],
             [*enc(tok, "  padded query "), 2],
             enc(tok, "never ends at all"),
             [EOT, *enc(tok, "after")],
             [*enc(tok, "Grüße, 中文"), EOT]]
    width = max(map(len, conts))
    new = torch.tensor([c + [0] * (width - len(c)) for c in conts])
    seen = {}

    def generate(input_ids, **kw):
        seen.update(kw, input_ids=input_ids)
        return torch.cat([input_ids, new], dim=1)

    monkeypatch.setattr(model, "generate", generate)
    got = synth.sample_queries(model, tok, len(conts), max_new_tokens=width, temperature=0.7, top_p=0.9, seed=3)
    assert got == ["hello world", "padded query", None, "", "Grüße, 中文"]
    assert seen["input_ids"].tolist() == [prefix] * len(conts)
    assert seen["attention_mask"].shape == seen["input_ids"].shape and bool(seen["attention_mask"].all())
    assert sorted(seen["eos_token_id"]) == [2, EOT]
    assert (seen["do_sample"], seen["temperature"], seen["top_p"], seen["max_new_tokens"]) == (True, 0.7, 0.9, width)


def test_a_plain_text_end_marker_ends_queries_as_a_string(monkeypatch):
    """A template whose end-of-turn is plain text (as older Mistral tokenizers' " [/INST]"): its first token is an
    ordinary byte, so it is not a stop id (a query would be cut at every space); generate gets it as a stop string and
    the query is cut where the marker text appears, or at the eos."""
    tok = byte_tokenizer()
    tok.chat_template = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    prefix, end = synth.query_prefix(tok)
    assert (prefix, end) == ("[INST] ", " [/INST]")
    assert synth.text_marker(tok, end) == "[/INST]" and synth.stop_ids(tok, end) == [2]
    assert synth.text_marker(byte_tokenizer(), synth.query_prefix(byte_tokenizer())[1]) is None  # ChatML: special
    model = tiny_target(vocab=BYTE_VOCAB)
    conts = [enc(tok, "a b c [/INST] junk"), [*enc(tok, "ends by eos "), 2], enc(tok, "no end [/INS")]
    width = max(map(len, conts))
    new = torch.tensor([c + [0] * (width - len(c)) for c in conts])
    seen = {}

    def generate(input_ids, **kw):
        seen.update(kw)
        return torch.cat([input_ids, new], dim=1)

    monkeypatch.setattr(model, "generate", generate)
    got = synth.sample_queries(model, tok, 3, max_new_tokens=width, temperature=1.0, top_p=1.0, seed=0)
    assert got == ["a b c", "ends by eos", None]
    assert seen["stop_strings"] == ["[/INST]"] and seen["tokenizer"] is tok and seen["eos_token_id"] == [2]


def _real_target():
    return tiny_target(vocab=BYTE_VOCAB), byte_tokenizer()


def test_sample_queries_end_to_end_and_seeded(monkeypatch):
    """The real tiny model: `rows` answers, each the decode before the first <|im_end|> of what generate returned (or
    None); the same seed gives the same queries whatever the RNG state before, another seed others."""
    model, tok = _real_target()
    real = model.generate
    outs = []

    def spy(*a, **kw):
        outs.append(real(*a, **kw))
        return outs[-1]

    monkeypatch.setattr(model, "generate", spy)
    kw = dict(max_new_tokens=48, temperature=1.0, top_p=1.0)
    torch.manual_seed(123)
    first = synth.sample_queries(model, tok, 16, seed=5, **kw)
    assert len(first) == 16 and all(q is None or isinstance(q, str) for q in first)
    assert any(q is None for q in first) and any(q for q in first)  # both kinds within 48 tokens (seeded)
    n_prefix = len(enc(tok, synth.query_prefix(tok)[0]))
    for q, row in zip(first, outs[0][:, n_prefix:].tolist()):
        assert q == (tok.decode(row[:row.index(2)], skip_special_tokens=True).strip() if 2 in row else None)
    torch.manual_seed(456)
    assert synth.sample_queries(model, tok, 16, seed=5, **kw) == first
    assert synth.sample_queries(model, tok, 16, seed=6, **kw) != first


def test_sample_queries_with_the_static_decoder(monkeypatch):
    """--decoder static: the same prefix for every row, the stop ids and processors passed on, each query the decode
    before the first stop (None without one), seeded; a text end marker (a stop string) keeps HF generate."""
    model, tok = _real_target()
    decoder = make_decoder(model, "static")
    real, outs = decoder.generate, []

    def spy(prompts, max_new_tokens, params, stop_ids, pad_id, generator=None):
        outs.append((prompts, params, stop_ids, real(prompts, max_new_tokens, params, stop_ids, pad_id, generator)))
        return outs[-1][-1]

    monkeypatch.setattr(decoder, "generate", spy)
    kw = dict(max_new_tokens=48, temperature=0.9, top_p=0.95, decoder=decoder)
    first = synth.sample_queries(model, tok, 16, seed=5, **kw)
    prompts, params, stops, rows = outs[0]
    assert prompts == [enc(tok, synth.query_prefix(tok)[0])] * 16 and stops == synth.stop_ids(tok, synth.query_prefix(tok)[1]) == [2]
    assert (params.temperature, params.top_p) == (0.9, 0.95)
    assert any(q is None for q in first) and any(q for q in first)
    for q, row in zip(first, rows):
        cut = next((i for i, t in enumerate(row) if t in stops), None)
        assert q == (None if cut is None else tok.decode(row[:cut], skip_special_tokens=True).strip())
    assert synth.sample_queries(model, tok, 16, seed=5, **kw) == first != synth.sample_queries(model, tok, 16, seed=6, **kw)
    tok.chat_template = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
    called = []
    monkeypatch.setattr(model, "generate", lambda input_ids, **k: called.append(k) or input_ids)
    assert synth.sample_queries(model, tok, 2, seed=0, **kw) == [None, None] and len(outs) == 3 and called


@pytest.mark.parametrize("decoder", ["hf", "static"])
def test_starts_begin_the_queries(monkeypatch, decoder):
    """--starts: each row's prompt is the user prefix plus one start (drawn per row, seeded; starts of other lengths
    left-padded with a mask), and each finished query is that start followed by the model's continuation."""
    model, tok = _real_target()
    starts = ["Write", "Explain why"]
    prefix = synth.query_prefix(tok)[0]
    seen = []
    real = model.generate

    def spy(input_ids, attention_mask, **kw):
        seen.append((input_ids, attention_mask))
        return real(input_ids, attention_mask=attention_mask, **kw)

    monkeypatch.setattr(model, "generate", spy)
    kw = dict(max_new_tokens=40, temperature=1.0, top_p=1.0, decoder=make_decoder(model, decoder), starts=starts)
    got = synth.sample_queries(model, tok, 24, seed=3, **kw)
    assert any(q is not None for q in got) and synth.sample_queries(model, tok, 24, seed=3, **kw) == got
    lead = [q for q in got if q is not None]
    assert all(q.startswith(("Write", "Explain why")) for q in lead)
    if decoder == "hf":
        ids, mask = seen[0]
        lengths = {len(enc(tok, prefix + s)) for s in starts}
        assert sorted(set(mask.sum(-1).tolist())) == sorted(lengths) and not bool(mask[:, -1].logical_not().any())
        for row, m in zip(ids.tolist(), mask.tolist()):
            assert tok.decode(row[len(row) - sum(m):]) in (prefix + s for s in starts)
    else:
        assert not seen  # the static decoder did the sampling


# -- 13-word runs ------------------------------------------------------------------------------------
def test_shared_13_word_runs_are_found_case_and_punctuation_ignored():
    ref = "Explain, in detail: why the " + sentence(20) + " matters!"
    index = synth.ngram_index([ref])
    words = ref.replace(",", "").replace(":", "").split()
    run13 = " ".join(words[5:18])
    assert synth.shares_ngram(f"Please -- {run13.upper()}?! thanks", index)
    assert synth.shares_ngram("... " + ", ".join(words[5:18]) + ".", index)
    run12 = " ".join(words[5:17])
    assert not synth.shares_ngram(f"Please {run12} thanks", index)
    assert not synth.shares_ngram(f"{run12} {run12}", synth.ngram_index(["the " + run12]))  # 12 words + "the"
    assert not synth.shares_ngram(run13, set())


def test_a_reference_shorter_than_13_words_is_matched_whole():
    short = "Name three primary colours."
    index = synth.ngram_index([short, sentence(30)])
    assert synth.shares_ngram("Hi! NAME three primary colours, please.", index)
    assert not synth.shares_ngram("Name three colours.", index)
    assert not synth.shares_ngram("name three primary", index)
    assert synth.shares_ngram(sentence(13, 10), index) and not synth.shares_ngram(sentence(12, 10), index)


def test_a_reference_without_words_excludes_nothing():
    index = synth.ngram_index(["---", "Name three primary colours."])
    assert not synth.shares_ngram("Write a poem about the sea.", index)


# -- synthesize: filters, count, resume, stall (sample_queries scripted) ------------------------------
class Script:
    """sample_queries scripted by the batch number (seed % 1_000_003), so a re-sampled batch repeats itself."""

    def __init__(self, batches: dict[int, list[str | None]] | None = None, default=None):
        self.batches, self.default, self.calls = batches or {}, default, []

    def __call__(self, model, tokenizer, rows, *, max_new_tokens, temperature, top_p, seed, decoder=None, starts=()):
        self.calls.append(dict(rows=rows, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                               seed=seed, starts=tuple(starts)))
        b = seed % 1_000_003
        qs = self.batches[b] if b in self.batches else self.default(seed, rows)
        assert len(qs) == rows
        return list(qs)


def records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_synthesize_writes_records_and_counts_each_filter(tmp_path, monkeypatch):
    banned = "Tell me " + sentence(13, 100) + " now."
    b0 = ["How do rainbows form?", None, "short", "x" * 1501, "  how DO rainbows\n form? ", "y" * 1500,
          "Please " + sentence(13, 100).upper() + "!", "12345678"]
    b1 = [None, "How do rainbows form?", "Write a haiku about rain.", "Another question here?"]
    script = Script({0: b0, 1: b1[:8] + [None] * 4})
    monkeypatch.setattr(synth, "sample_queries", script)
    out = tmp_path / "sub" / "q.jsonl"
    st = synth.synthesize(object(), byte_tokenizer(), out, 5, batch_size=8, max_new_tokens=9, temperature=0.8,
                          top_p=0.95, seed=2, exclude=[banned], progress=False)
    assert st == {"kept": 5, "unfinished": 2, "length": 2, "duplicate": 2, "excluded": 1, "total": 5}
    recs = records(out)
    assert [r["id"] for r in recs] == ["synth-s2-b0-0", "synth-s2-b0-5", "synth-s2-b0-7", "synth-s2-b1-2",
                                       "synth-s2-b1-3"]
    assert [r["messages"] for r in recs[:2]] == [
        [{"role": "user", "content": "How do rainbows form?"}, {"role": "assistant", "content": "-"}],
        [{"role": "user", "content": "y" * 1500}, {"role": "assistant", "content": "-"}]]
    assert [c["seed"] for c in script.calls] == [2 * 1_000_003, 2 * 1_000_003 + 1]
    assert script.calls[0] | {"seed": 0} == dict(rows=8, max_new_tokens=9, temperature=0.8, top_p=0.95, seed=0,
                                                  starts=())
    convs = read_conversations(out)
    assert [c["id"] for c in convs] == [r["id"] for r in recs]
    assert [c["messages"][0]["content"] for c in convs][2:] == ["12345678", "Write a haiku about rain.",
                                                                "Another question here?"]
    assert all([m["role"] for m in c["messages"]] == ["user", "assistant"] for c in convs)


def test_synthesize_stops_at_exactly_count(tmp_path, monkeypatch):
    script = Script(default=lambda seed, rows: [f"question {seed} {j}?" for j in range(rows)])
    monkeypatch.setattr(synth, "sample_queries", script)
    out = tmp_path / "q.jsonl"
    st = synth.synthesize(None, None, out, 7, batch_size=4, progress=False)
    assert st["kept"] == st["total"] == 7 and len(records(out)) == 7 and len(script.calls) == 2
    assert records(out)[-1]["id"] == "synth-s0-b1-2"
    assert synth.synthesize(None, None, out, 7, batch_size=4, progress=False)["kept"] == 0  # already there
    assert len(script.calls) == 2 and len(records(out)) == 7
    assert synth.synthesize(None, None, out, 3, batch_size=4, progress=False)["total"] == 7  # nothing is removed


def test_synthesize_resumes_without_duplicates(tmp_path, monkeypatch):
    """A rerun continues with later batch numbers (a re-sampled batch would only repeat itself), drops a torn last
    line, and another seed's ids and queries stay apart."""
    script = Script(default=lambda seed, rows: [f"query {seed} {j}?" for j in range(rows)])
    monkeypatch.setattr(synth, "sample_queries", script)
    out = tmp_path / "q.jsonl"
    synth.synthesize(None, None, out, 5, batch_size=2, seed=1, progress=False)
    assert [c["seed"] % 1_000_003 for c in script.calls] == [0, 1, 2]
    with open(out, "a", encoding="utf-8") as f:
        f.write('{"id": "synth-s1-b3-0", "messages": [{"role": "user", "content": "tor')  # killed mid-line
    script.calls.clear()
    st = synth.synthesize(None, None, out, 9, batch_size=2, seed=1, progress=False)
    assert [c["seed"] % 1_000_003 for c in script.calls] == [3, 4]
    assert st == {"kept": 4, "unfinished": 0, "length": 0, "duplicate": 0, "excluded": 0, "total": 9}
    recs = records(out)  # every line parses: the torn one is gone
    ids = [r["id"] for r in recs]
    assert len(ids) == 9 and len(set(ids)) == 9 and ids[-1] == "synth-s1-b4-1"
    qs = [r["messages"][0]["content"] for r in recs]
    assert len(set(qs)) == 9 and not any(q.startswith("tor") for q in qs)
    read_conversations(out)
    # another seed on the same file: its own batch numbers from 0, the queries already there not written again
    monkeypatch.setattr(synth, "sample_queries", Script({0: ["Query 1000003 1?", "fresh one?"]},
                                                        default=lambda seed, rows: ["fresh two?"] * rows))
    st = synth.synthesize(None, None, out, 11, batch_size=2, seed=2, progress=False)
    assert (st["kept"], st["duplicate"]) == (2, 1)  # the last row is never looked at
    assert [r["id"] for r in records(out)][9:] == ["synth-s2-b0-1", "synth-s2-b1-0"]


def test_a_negative_seed_resumes_with_later_batches(tmp_path, monkeypatch):
    script = Script(default=lambda seed, rows: [f"query {seed} {j}?" for j in range(rows)])
    monkeypatch.setattr(synth, "sample_queries", script)
    out = tmp_path / "q.jsonl"
    synth.synthesize(None, None, out, 8, batch_size=2, seed=-1, progress=False)
    script.calls.clear()
    st = synth.synthesize(None, None, out, 10, batch_size=2, seed=-1, progress=False)
    assert st["duplicate"] == 0 and [c["seed"] for c in script.calls] == [-1_000_003 + 4]


def test_an_output_file_of_another_form_is_not_erased(tmp_path, monkeypatch):
    monkeypatch.setattr(synth, "sample_queries", Script(default=lambda seed, rows: ["a new question?"] * rows))
    out = tmp_path / "sharegpt.jsonl"
    lines = [json.dumps({"conversations": [{"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "a"}]})
             for i in range(3)]
    out.write_text("".join(line + "\n" for line in lines))
    with pytest.raises(EagleSpecError, match=r"sharegpt.jsonl:1: not a synth-prompts record"):
        synth.synthesize(None, None, out, 1, batch_size=1, progress=False)
    assert out.read_text().splitlines()[:3] == lines


def test_synthesize_gives_up_after_stall_batches_without_a_kept_query(tmp_path, monkeypatch):
    script = Script({0: ["a good question?", "fine question?"]}, default=lambda seed, rows: [None, "a good question?"])
    monkeypatch.setattr(synth, "sample_queries", script)
    with pytest.raises(EagleSpecError, match=f"no usable query in {synth.STALL} batches"):
        synth.synthesize(None, None, tmp_path / "q.jsonl", 10, batch_size=2, progress=False)
    assert len(script.calls) == 1 + synth.STALL  # unfinished and duplicate rows both count as nothing kept
    assert len(records(tmp_path / "q.jsonl")) == 2  # what was kept stays
    # a batch with a kept query starts the count again
    pattern = {b: ([f"q number {b}?", None] if b % synth.STALL == synth.STALL - 1 else [None, None]) for b in range(9)}
    monkeypatch.setattr(synth, "sample_queries", Script(pattern))
    st = synth.synthesize(None, None, tmp_path / "r.jsonl", 3, batch_size=2, progress=False)
    assert (st["kept"], st["unfinished"]) == (3, 14)
    # max_batches ends a run early without an error
    script = Script(default=lambda seed, rows: [None] * rows)
    monkeypatch.setattr(synth, "sample_queries", script)
    st = synth.synthesize(None, None, tmp_path / "s.jsonl", 3, batch_size=2, max_batches=2, progress=False)
    assert (st["total"], st["unfinished"], len(script.calls)) == (0, 4, 2)


def test_synthesize_stalls_on_a_target_that_never_ends_a_turn(tmp_path, monkeypatch):
    model, tok = _real_target()
    calls = []

    def generate(input_ids, max_new_tokens, **kw):
        calls.append(kw["eos_token_id"])
        return torch.cat([input_ids, torch.full((input_ids.shape[0], max_new_tokens), 70)], dim=1)

    monkeypatch.setattr(model, "generate", generate)
    with pytest.raises(EagleSpecError, match="raise --max-new-tokens or --temperature"):
        synth.synthesize(model, tok, tmp_path / "q.jsonl", 4, batch_size=3, max_new_tokens=5, progress=False)
    assert calls == [[2]] * synth.STALL and (tmp_path / "q.jsonl").read_text() == ""


# -- the command line -------------------------------------------------------------------------------
def _no_target(*a, **kw):
    raise AssertionError("the target is loaded only after the flags are checked")


@pytest.mark.parametrize("flags, flag", [
    (["--count", "0"], "--count must be > 0"),
    (["--count", "4", "--batch-size", "0"], "--batch-size must be > 0"),
    (["--count", "4", "--max-new-tokens", "-1"], "--max-new-tokens must be > 0"),
    (["--count", "4", "--temperature", "0"], "--temperature"),
    (["--count", "4", "--top-p", "1.5"], "--top-p"),
    (["--count", "4", "--exclude", "nosuchfile"], "--exclude nosuchfile: "),
    (["--count", "4", "--decoder", "fast"], "--decoder 'fast': expected one of hf, static, auto"),
])
def test_cli_bad_flags_are_one_line_exit_2(tmp_path, monkeypatch, capsys, flags, flag):
    monkeypatch.setattr(eaglespec.backends.loading, "load_target", _no_target)
    monkeypatch.chdir(tmp_path)
    assert main(["synth-prompts", "--out", str(tmp_path / "q.jsonl"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("eaglespec: error: ") and flag in err[0]
    assert not (tmp_path / "q.jsonl").exists()


def test_cli_passes_its_flags_and_excludes_a_file(tmp_path, monkeypatch, capsys):
    banned = "Write a short story about " + sentence(12, 200) + "."
    (tmp_path / "bench.txt").write_text(banned + "\n")
    monkeypatch.setattr(eaglespec.backends.loading, "load_target",
                        lambda name, device=None, dtype=None: (name, byte_tokenizer()))
    script = Script(default=lambda seed, rows: [banned.lower(), "A fine new question?", None][:rows])
    monkeypatch.setattr(synth, "sample_queries", script)
    out = tmp_path / "q.jsonl"
    assert main(["synth-prompts", "--target", "T", "--out", str(out), "--count", "1", "--batch-size", "3",
                 "--max-new-tokens", "17", "--temperature", "1.5", "--top-p", "0.5", "--seed", "4",
                 "--exclude", str(tmp_path / "bench.txt"), "--starts", "Write, Explain,,"]) == 0
    assert script.calls == [dict(rows=3, max_new_tokens=17, temperature=1.5, top_p=0.5, seed=4 * 1_000_003,
                                 starts=("Write", "Explain"))]
    assert [r["messages"][0]["content"] for r in records(out)] == ["A fine new question?"]
    err = capsys.readouterr().err
    assert "holds 1 queries (1 new" in err and "1 sharing a 13-word run with --exclude" in err


@pytest.mark.parametrize("decoder", ["hf", "static"])
def test_cli_writes_and_resumes_with_a_tiny_target(tmp_path, capsys, decoder):
    target = tmp_path / "target"
    tiny_target(vocab=BYTE_VOCAB).save_pretrained(target)
    byte_tokenizer().save_pretrained(target)
    out = tmp_path / "q.jsonl"
    common = ["synth-prompts", "--target", str(target), "--out", str(out), "--batch-size", "16",
              "--max-new-tokens", "48", "--device", "cpu", "--dtype", "float32", "--exclude", "", "--decoder", decoder]
    assert main([*common, "--count", "2"]) == 0
    assert len(records(out)) == 2 and "holds 2 queries" in capsys.readouterr().err
    assert main([*common, "--count", "4"]) == 0
    convs = read_conversations(out)
    assert len(convs) == 4 and len({c["id"] for c in convs}) == 4
    assert len({" ".join(c["messages"][0]["content"].lower().split()) for c in convs}) == 4
    assert all(c["id"].startswith("synth-s0-b") and c["messages"][1]["content"] == "-" for c in convs)
    assert "holds 4 queries" in capsys.readouterr().err
