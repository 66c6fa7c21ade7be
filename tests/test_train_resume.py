"""Exact resume: the training state as JSON + safetensors shards of bounded size; two halves == one whole run."""

from __future__ import annotations

import json

import pytest
import torch

from eaglespec.errors import EagleSpecError
from eaglespec.train.state import (
    MIN_SHARD_BYTES,
    pack_optimizer,
    plan_shards,
    read_state,
    unpack_optimizer,
    write_state,
)
from eaglespec.train.trainer import TrainConfig, read_training_state, train
from train_helpers import greedy_samples, sharp_target

LIMIT = 6000  # bytes: far below the tiny drafter's size, so the state spans many shards and splits tensors


def cfg_of(**kw) -> TrainConfig:
    base = dict(steps=6, batch_size=3, lr=3e-3, ttt_steps=3, hass_steps=2, draft_vocab=80, progress=False,
                eval_fraction=0.0, log_every=1, state_shard_bytes=LIMIT)
    return TrainConfig(**(base | kw))


def _shards(out):
    return sorted(out.glob("training_state-*.safetensors"))


def _assert_same_state(a: dict, b: dict) -> None:
    """Drafter weights, optimizer moments and step counts, hyperparameters and RNG states: bit for bit."""
    assert a["drafter"].keys() == b["drafter"].keys()
    assert all(torch.equal(a["drafter"][k], b["drafter"][k]) for k in a["drafter"])
    oa, ob = a["optimizer"], b["optimizer"]
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    for pid, entries in oa["state"].items():
        assert entries.keys() == ob["state"][pid].keys()
        assert all(torch.equal(v, ob["state"][pid][k]) for k, v in entries.items())
    assert torch.equal(a["rng"]["noise"], b["rng"]["noise"]) and torch.equal(a["rng"]["torch"], b["rng"]["torch"])
    assert a["rng"]["python"] == b["rng"]["python"]
    assert (a["step"], a["total_steps"], a["data"]) == (b["step"], b["total_steps"], b["data"])


@pytest.mark.parametrize("method,grad_accum", [("eagle3", 1), ("eagle3", 2), ("hass", 2)])
def test_two_halves_equal_one_whole_run_bit_for_bit(tmp_path, method, grad_accum, monkeypatch):
    """Paused after 2 steps and resumed for the other 4 (fp32, CPU): the same drafter, optimizer state, RNG states,
    learning rates and log as one uninterrupted run; the state is read back without torch.load."""
    model = sharp_target()
    samples = greedy_samples(model, 20, new=10, seed=2)
    cfg = cfg_of(method=method, grad_accum=grad_accum)
    whole = train(model, samples, cfg, tmp_path / "whole")
    half = train(model, samples, cfg, tmp_path / "halves", pause_after=2)
    assert half.steps == 2
    paused = json.loads((tmp_path / "halves" / "training_state.json").read_text())
    assert paused["data"]["next_micro_batch"] == 2 * grad_accum  # MicroBatches index of step 3's first pack
    assert paused["data"]["micro_batches_per_step"] == grad_accum and paused["data"]["train_samples"] == 20

    def no_pickle(*a, **k):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", no_pickle)
    rest = train(model, samples, cfg_of(method=method, grad_accum=grad_accum, lr=1.0), tmp_path / "halves",
                 resume=True)  # lr 1.0 here: the saved run's lr is kept
    assert [m["step"] for m in rest.history] == [3, 4, 5, 6]
    assert [m["lr"] for m in half.history + rest.history] == [m["lr"] for m in whole.history]  # the schedule
    assert [m["loss"] for m in half.history + rest.history] == [m["loss"] for m in whole.history]
    assert [m["run_tokens"] for m in half.history + rest.history] == [m["run_tokens"] for m in whole.history]
    a, b = whole.drafter.state_dict(), rest.drafter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    _assert_same_state(read_training_state(tmp_path / "whole"), read_training_state(tmp_path / "halves"))


def test_shards_stay_within_the_limit_and_split_large_tensors(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 12, new=8, seed=2)
    train(model, samples, cfg_of(steps=2), tmp_path / "d")
    shards = _shards(tmp_path / "d")
    assert len(shards) > 5 and all(p.stat().st_size <= LIMIT for p in shards)
    doc = json.loads((tmp_path / "d" / "training_state.json").read_text())
    assert [s["file"] for s in doc["shards"]] == [p.name for p in shards]
    assert len(doc["tensors"]["drafter.lm_head.weight"]["parts"]) > 1  # 80 x 32 fp32 = 10 KB > LIMIT
    assert {"rng.torch", "rng.noise", "optimizer.state.0.exp_avg", "optimizer.state.0.step"} <= doc["tensors"].keys()
    assert doc["tensors"]["rng.torch"]["dtype"] == "uint8"
    assert doc["optimizer"]["param_groups"][0]["betas"] == [0.9, 0.95]
    assert isinstance(doc["rng"]["python"][1], list) and len(doc["rng"]["python"][1]) == 625
    assert not list((tmp_path / "d").glob("*.pt"))
    default = train(model, samples, cfg_of(steps=1, state_shard_bytes=15 * 1000**2), tmp_path / "e")
    assert default.steps == 1 and len(_shards(tmp_path / "e")) == 1


def _damaged(tmp_path, how: str):
    model = sharp_target()
    samples = greedy_samples(model, 12, new=8, seed=2)
    cfg = cfg_of(steps=3)
    out = tmp_path / how
    train(model, samples, cfg, out, pause_after=1)
    shard = _shards(out)[3]
    if how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-100])
    elif how == "corrupt":
        blob = bytearray(shard.read_bytes())
        blob[-5] ^= 0xFF
        shard.write_bytes(bytes(blob))
    elif how == "missing":
        shard.unlink()
    elif how == "json":
        (out / "training_state.json").write_text("{not json")
    with pytest.raises(EagleSpecError) as err:
        train(model, samples, cfg, out, resume=True)
    return str(err.value), shard


@pytest.mark.parametrize("how,match", [("truncated", "truncated or altered"), ("corrupt", "corrupt"),
                                       ("missing", "shard missing"), ("json", "unreadable training state")])
def test_a_damaged_state_is_one_line_naming_the_file(tmp_path, how, match):
    msg, shard = _damaged(tmp_path, how)
    assert "\n" not in msg and match in msg
    assert str(shard if how != "json" else shard.with_name("training_state.json")) in msg


def test_the_pickled_layout_and_other_runs_are_refused(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 12, new=8, seed=2)
    old = tmp_path / "old"
    old.mkdir()
    torch.save({"step": 1}, old / "training_state.pt")
    with pytest.raises(EagleSpecError, match=r"training_state.pt \(the pickled layout, not read\)") as err:
        train(model, samples, cfg_of(), old, resume=True)
    assert "\n" not in str(err.value)
    train(model, samples, cfg_of(), tmp_path / "a", pause_after=1)
    train(model, samples, cfg_of(grad_accum=2), tmp_path / "b", pause_after=1)
    with pytest.raises(EagleSpecError, match=r"2 micro-batches per step.*this one 1: keep the global batch"):
        train(model, samples, cfg_of(grad_accum=1), tmp_path / "b", resume=True)
    other = greedy_samples(model, 12, new=8, seed=5)
    with pytest.raises(EagleSpecError, match="the training samples differ from the saved run's"):
        train(model, other, cfg_of(), tmp_path / "a", resume=True)
    with pytest.raises(EagleSpecError, match=f"at least {MIN_SHARD_BYTES} bytes"):
        train(model, samples, cfg_of(state_shard_bytes=100), tmp_path / "c")


def test_state_round_trip_of_odd_tensors(tmp_path):
    """Scalars, empty, bool, int64 and bf16 tensors, in pieces across shards, come back equal."""
    g = torch.Generator().manual_seed(0)
    tensors = {"scalar": torch.tensor(3.5), "empty": torch.zeros(0, 4), "mask": torch.rand(40, 7, generator=g) > 0.5,
               "ids": torch.randint(-9, 9, (300,), generator=g), "half": torch.randn(33, 21, generator=g).bfloat16(),
               "big": torch.randn(700, generator=g)}
    files = write_state(tmp_path, {"step": 7, "note": "x"}, tensors, max_shard_bytes=MIN_SHARD_BYTES)
    assert all(p.stat().st_size <= MIN_SHARD_BYTES for p in files if p.suffix == ".safetensors")
    doc, back = read_state(tmp_path)
    assert doc["step"] == 7 and doc["note"] == "x" and back.keys() == tensors.keys()
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    for entries in plan_shards({k: v.reshape(-1) for k, v in tensors.items()}, 4096):
        assert entries


def test_optimizer_pack_round_trip():
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    for _ in range(2):
        sum((p ** 2).sum() for p in params).backward()
        opt.step()
    meta, tensors = pack_optimizer(opt.state_dict())
    json.dumps(meta)  # JSON-safe
    fresh = torch.optim.AdamW([torch.nn.Parameter(p.detach().clone()) for p in params], lr=5.0)
    fresh.load_state_dict(unpack_optimizer(json.loads(json.dumps(meta)), tensors))
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"] and b["param_groups"][0]["betas"] == (0.9, 0.95)
    assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i])


def test_the_state_alone_brings_a_finished_run_back(tmp_path):
    """Only training_state* files copied (the drafter's own weights file left behind): --resume of the finished run
    trains no step and writes the same drafter again."""
    from eaglespec.checkpoint.drafter import load_drafter

    model = sharp_target()
    samples = greedy_samples(model, 12, new=8, seed=2)
    train(model, samples, cfg_of(steps=3), tmp_path / "gpu")
    carried = tmp_path / "carried"
    carried.mkdir()
    for p in (tmp_path / "gpu").glob("training_state*"):
        (carried / p.name).write_bytes(p.read_bytes())
    again = train(model, samples, cfg_of(steps=3), carried, resume=True)
    assert again.steps == 3 and again.history == []
    a, b = load_drafter(tmp_path / "gpu", target_num_layers=4), load_drafter(carried, target_num_layers=4)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert b.manifest["trained_steps"] == 3
