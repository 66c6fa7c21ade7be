"""Regeneration (batched, resumable) and the offline feature cache (manifest mismatch refused)."""

from __future__ import annotations

import json

import pytest
import torch

from eaglespec.checkpoint.manifest import build_manifest
from eaglespec.errors import EagleSpecError
from eaglespec.train.data import pack, read_conversations, read_resumable, tokenize_conversation
from eaglespec.train.features import TargetFeatures, open_feature_cache, write_feature_cache
from eaglespec.train.regenerate import done_ids, length_batches, parse_shard, regenerate
from train_helpers import greedy_samples, sharp_target


class CharTokenizer:
    """Characters 32..127 -> ids 0..95 (the tiny target's vocabulary), a ChatML-like template."""

    chat_template = "toy"
    pad_token_id = 0
    eos_token_id = 2

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role'][0]}>{m['content']}|" for m in messages)
        return text + ("<a>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [max(0, min(95, ord(c) - 32)) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + int(i)) for i in ids)


def test_regenerate_batched_and_resumable(tmp_path):
    model = sharp_target()
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "old"},
        {"from": "human", "value": "more"}, {"from": "gpt", "value": "old2"}]}) + "\n" for i in range(5)))
    out = tmp_path / "out.jsonl"
    tok = CharTokenizer()
    assert regenerate(model, tok, data, out, batch_size=2, max_new_tokens=6, limit=3, progress=False) == 3
    with open(out, "a") as f:
        f.write('{"id": "c3", "messa')  # a torn line from a kill
    assert regenerate(model, tok, data, out, batch_size=4, max_new_tokens=6, progress=False) == 2
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["id"] for r in recs) == [f"c{i}" for i in range(5)]
    for r in recs:
        roles = [m["role"] for m in r["messages"]]
        assert roles == ["user", "assistant", "user", "assistant"]
        assert r["messages"][1]["content"] != "old" and r["messages"][3]["content"] != "old2"
    # greedy regeneration is the target's own continuation of the prompt
    prompt = tok(tok.apply_chat_template([{"role": "user", "content": "q0"}], add_generation_prompt=True))["input_ids"]
    ref = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=6, do_sample=False, pad_token_id=0)[0, len(prompt):]
    first = next(r for r in recs if r["id"] == "c0")
    assert first["messages"][1]["content"] == tok.decode(ref).strip()
    gen = ref.tolist()[: ref.tolist().index(2)] if 2 in ref.tolist() else ref.tolist()  # up to the stop id (eos 2)
    assert first["messages"][1]["token_ids"] == gen
    # training reads the generated ids back: the answer's tokens are the target's, stop id excluded
    conv = next(c for c in read_conversations(out) if c["id"] == "c0")
    sample = tokenize_conversation(tok, conv["messages"][:2])
    assert sample.ids[sample.loss_mask].tolist()[: len(gen)] == gen


def test_static_decoder_writes_hf_generates_greedy_answers(tmp_path):
    """--decoder static (backends/batched.py) writes what HF generate writes, greedy, multi-turn, with left padding:
    prompts of different lengths in one batch; an unsupported choice is one clear error."""
    model = sharp_target()
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"from": "human", "value": "q" * (1 + 3 * i)}, {"from": "gpt", "value": "old"},
        {"from": "human", "value": f"and {i}?"}, {"from": "gpt", "value": "old2"}]}) + "\n" for i in range(6)))

    def answers(decoder: str) -> dict[str, list]:
        out = tmp_path / f"{decoder}.jsonl"
        assert regenerate(model, CharTokenizer(), data, out, batch_size=4, max_new_tokens=9, progress=False,
                          decoder=decoder) == 6
        return {r["id"]: r["messages"] for r in map(json.loads, out.read_text().splitlines())}

    hf = answers("hf")
    assert answers("static") == hf and answers("auto") == hf
    assert len({m[1]["content"] for m in hf.values()}) > 1  # the prompts lead to different answers
    with pytest.raises(EagleSpecError, match="--decoder 'fast'"):
        regenerate(model, CharTokenizer(), data, tmp_path / "x.jsonl", progress=False, decoder="fast")


def test_time_budget_starts_no_batch_the_slowest_would_not_finish(tmp_path, monkeypatch):
    """A fake clock: each batch takes 10 s. With 25 s, the first batch starts (nothing timed yet), the second at 10 s
    (10 + 10 <= 25), the third not (20 + 10 > 25); the same command resumes the rest."""
    import eaglespec.train.regenerate as regen

    now = [0.0]
    monkeypatch.setattr(regen.time, "monotonic", lambda: now[0])

    def answer(model, tokenizer, chats, *args):
        now[0] += 10.0
        return [("a", [65])] * len(chats)

    monkeypatch.setattr(regen, "generate_batch", answer)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"from": "human", "value": "q" * (i + 1)}, {"from": "gpt", "value": "old"}]}) + "\n" for i in range(7)))
    out = tmp_path / "out.jsonl"
    run = dict(batch_size=2, max_new_tokens=3, progress=False, time_budget=25.0)
    assert regenerate(sharp_target(), CharTokenizer(), data, out, **run) == 4 and now[0] == 20.0
    assert regenerate(sharp_target(), CharTokenizer(), data, out, **run) == 3  # 2 batches: 2 + the last 1
    assert sorted(done_ids(out)) == [f"c{i}" for i in range(7)]


@pytest.mark.parametrize("lines", [
    [json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "a"}]})],  # ShareGPT
    ['{"id": "c0", "messages": []}', "a note, not JSON", '{"id": "c1", "messages": []}'],  # a bad middle line
    ["plain text that is not JSON at all"],  # one unparsable line that none of our writers began
])
def test_regenerate_refuses_an_out_file_it_did_not_write(tmp_path, lines):
    """An --out that is not a regenerate output is refused by file and line, and left byte for byte as it was
    (never rewritten with only the lines that parse)."""
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"id": "c9", "messages": [{"role": "user", "content": "q"},
                                                          {"role": "assistant", "content": "a"}]}) + "\n")
    out = tmp_path / "mine.jsonl"
    text = "\n".join(lines)  # no newline at the end either
    out.write_text(text)
    with pytest.raises(EagleSpecError, match=r"mine.jsonl:\d+: not a regenerated conversation"):
        regenerate(sharp_target(), CharTokenizer(), data, out, max_new_tokens=2, progress=False)
    assert out.read_text() == text


def test_read_resumable_ends_a_whole_last_line_and_drops_only_our_torn_one(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text('{"id": "a", "messages": []}\n{"id": "b", "messages": []}')  # killed before the last newline
    assert done_ids(out) == {"a", "b"}
    assert out.read_text() == '{"id": "a", "messages": []}\n{"id": "b", "messages": []}\n'  # an append starts afresh
    out.write_text('{"id": "a", "messages": []}\n{"id": "b", "mess')
    assert done_ids(out) == {"a"} and out.read_text() == '{"id": "a", "messages": []}\n'
    assert read_resumable(tmp_path / "none.jsonl", dict, "x") == []
    out.write_text('{"id": "a", "messages": []}\n\n{"id": "b", "messages": "oops"}\n')
    with pytest.raises(EagleSpecError, match=r"o.jsonl:3: not x; give another --out"):
        read_resumable(out, lambda r: r["messages"] + [], "x")  # str + list: a TypeError, refused, not dropped


def test_sampled_regeneration_follows_its_seed(tmp_path):
    """Sampled passes over the same prompts: the same seed writes the same answers, another seed other ones (without
    a seed, every fresh process would start from torch's same default state)."""
    model = sharp_target()
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"q{i}"}, {"from": "gpt", "value": "old"}]}) + "\n" for i in range(4)))

    def answers(seed: int, name: str) -> list[str]:
        out = tmp_path / name
        regenerate(model, CharTokenizer(), data, out, batch_size=4, max_new_tokens=12, temperature=4.0,
                   progress=False, seed=seed)
        return [json.loads(line)["messages"][1]["content"] for line in out.read_text().splitlines()]

    torch.manual_seed(123)
    first = answers(1, "a.jsonl")
    torch.manual_seed(456)  # the state before the call does not matter
    assert answers(1, "b.jsonl") == first
    assert answers(2, "c.jsonl") != first


def test_length_batches_group_alike_lengths_in_a_random_order():
    """Each batch holds neighbours in length (little padding) and the batches do not run shortest first: a run cut by
    its time limit after half the batches has answered long prompts too (a sorted order would answer only the
    shortest)."""
    convs = [{"id": f"c{n}", "messages": [{"role": "user", "content": "q" * n}]} for n in range(40, 0, -1)]
    batches = length_batches(convs, 4)
    assert sorted(len(b) for b in batches) == [4] * 10
    lengths = [[len(c["messages"][0]["content"]) for c in b] for b in batches]
    assert sorted(n for b in lengths for n in b) == list(range(1, 41))  # every conversation once
    assert all(b == list(range(b[0], b[0] + 4)) and b[0] % 4 == 1 for b in lengths)  # 4 neighbours each
    first_half = [n for b in lengths[:5] for n in b]
    assert max(first_half) > 20 and min(first_half) <= 20  # both halves of the length range
    assert lengths != sorted(lengths) and length_batches(convs, 4) == batches  # shuffled, and the same each time
    assert length_batches(convs, 4, seed=1) != batches


def test_regenerate_shards_split_one_file(tmp_path):
    """N shards, each with its own output, write every conversation exactly once, in parts of alike lengths (every
    N-th of the length-sorted file); a resumed shard takes up its own part; a bad --shard is one clear error."""
    model = sharp_target()
    data = tmp_path / "in.jsonl"
    lengths = [7, 1, 5, 3, 6, 2, 4]  # first-message lengths, not in order
    data.write_text("".join(json.dumps({"id": f"c{n}", "conversations": [
        {"from": "human", "value": "q" * n}, {"from": "gpt", "value": "old"}]}) + "\n" for n in lengths))
    tok = CharTokenizer()

    def run(i: int) -> int:
        return regenerate(model, tok, data, tmp_path / f"out{i}.jsonl", batch_size=2, max_new_tokens=3,
                          progress=False, shard=(i, 2))

    def ids(i: int) -> list[str]:
        return [json.loads(line)["id"] for line in (tmp_path / f"out{i}.jsonl").read_text().splitlines()]

    assert run(0) == 4 and run(1) == 3
    assert sorted(ids(0)) == ["c1", "c3", "c5", "c7"] and sorted(ids(1)) == ["c2", "c4", "c6"]
    out0 = tmp_path / "out0.jsonl"
    out0.write_text("".join(line + "\n" for line in out0.read_text().splitlines()[:2]))  # killed after 2
    assert run(0) == 2 and run(1) == 0
    assert sorted(ids(0)) == ["c1", "c3", "c5", "c7"] and sorted(ids(1)) == ["c2", "c4", "c6"]
    for bad in ("2/2", "1", "a/b", "0/0", "-1/2"):
        with pytest.raises(EagleSpecError, match="--shard"):
            parse_shard(bad)
    assert parse_shard("1/3") == (1, 3)


def test_feature_cache_round_trip_and_refusal(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 3, new=5)
    ext = TargetFeatures(model, (2, 3))
    manifest = build_manifest(model, None, method="eagle3", feature_layer_ids=(2, 3))
    write_feature_cache(ext, samples, tmp_path / "cache", manifest, samples_per_shard=2, dtype=torch.float32)
    items = open_feature_cache(tmp_path / "cache", model, layer_ids=(2, 3))
    assert len(items) == 3
    torch.testing.assert_close(items[1]["features"], ext(pack([samples[1]])).features)
    assert torch.equal(items[2]["ids"], samples[2].ids)
    with pytest.raises(EagleSpecError, match="different target"):
        open_feature_cache(tmp_path / "cache", sharp_target(seed=7))
    with pytest.raises(EagleSpecError, match="feature_layer_ids"):
        open_feature_cache(tmp_path / "cache", model, layer_ids=(1, 3))


def test_offline_cached_features_train_like_online(tmp_path):
    """`--feature-cache`: the cache is written once, checked, and a training step on it equals online."""
    from eaglespec.train.features import attach_feature_cache
    from eaglespec.train.trainer import TrainConfig, Trainer, drafter_config, new_drafter

    model = sharp_target()
    samples = greedy_samples(model, 4, new=8)
    cfg = TrainConfig(steps=1, batch_size=4, lr=1e-3, ttt_steps=3, progress=False, eval_fraction=0.0, log_every=0)
    ids = drafter_config(model, "eagle3", 1).aux_layer_ids
    cached = attach_feature_cache(tmp_path / "fc", model, None, samples, ids)
    assert all(s.features is not None and s.features.shape[0] == s.ids.numel() for s in cached)
    metrics = []
    for data in (samples, cached):
        trainer = Trainer(model, new_drafter(model, "eagle3", None, seed=0), cfg)
        metrics.append(trainer.train_step([data], lr=1e-3))
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], rel=1e-3)
    assert metrics[0]["acc_by_step"] == metrics[1]["acc_by_step"]
    with pytest.raises(EagleSpecError, match="other samples"):  # a cache of other data is refused
        attach_feature_cache(tmp_path / "fc", model, None, samples[:2], ids)
