"""Trainer: frozen target, learning end to end (held-out top-1 and engine tau), resume, export, manifest."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from eaglespec.backends.hf import HFTarget
from eaglespec.checkpoint.drafter import load_drafter
from eaglespec.checkpoint.manifest import check_manifest
from eaglespec.engine.loop import SpeculativeEngine
from eaglespec.errors import EagleSpecError
from eaglespec.train.data import pack
from eaglespec.train.trainer import TrainConfig, Trainer, new_drafter, train, widen_mlp
from eaglespec.tree.core import TreeSpec
from train_helpers import greedy_samples, sharp_target


def small_cfg(**kw) -> TrainConfig:
    base = dict(steps=4, batch_size=4, lr=3e-3, ttt_steps=3, progress=False, eval_fraction=0.0, log_every=0)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize("method", ["eagle3", "hass", "eagle1"])
def test_frozen_target_and_drafter_grads(method):
    model = sharp_target()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    samples = greedy_samples(model, 4, new=8)
    drafter = new_drafter(model, method, None, seed=0)
    trainer = Trainer(model, drafter, small_cfg(method=method, hass_steps=2))
    prep = trainer.prepare(samples)
    counts = prep.sup.sum(1).float()
    loss, _ = trainer.micro_loss(prep, counts)
    loss.backward()
    assert all(p.grad is None for p in model.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in drafter.parameters())
    trainer.optimizer.step()
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not prep.target.features.requires_grad and not prep.target.hidden.requires_grad


@pytest.mark.parametrize("method", ["eagle3", "hass"])
def test_factored_ttt_attention_gives_the_dense_loss_and_grads(method):
    """--ttt-attention factored is the same objective as the dense masks: loss, metrics and every gradient."""
    model = sharp_target()
    samples = greedy_samples(model, 5, new=10)
    runs = []
    for attention in ("dense", "factored"):
        drafter = new_drafter(model, method, None, seed=0)
        trainer = Trainer(model, drafter, small_cfg(method=method, hass_steps=3, ttt_attention=attention))
        preps = trainer.prepare_many([samples[:2], samples[2:]])
        counts = torch.stack([p.sup.sum(1) for p in preps]).sum(0).float()
        loss, stats = trainer.micro_loss(preps, counts)
        loss.backward()
        runs.append((loss.detach(), stats, [p.grad for p in drafter.parameters()]))
    (loss, stats, grads), (f_loss, f_stats, f_grads) = runs
    torch.testing.assert_close(f_loss, loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(f_stats, stats, rtol=1e-5, atol=1e-4)
    for a, b in zip(f_grads, grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("method", ["eagle3", "eagle1"])
def test_widened_mlp_keeps_the_loss_then_learns(method):
    """widen_mlp (--init with --intermediate-size): the same loss as before widening, the new units silent (zero
    down columns) until one optimizer step moves them; the original weights are kept in the first rows/columns."""
    model = sharp_target()
    samples = greedy_samples(model, 4, new=8)
    drafter = new_drafter(model, method, None, seed=0)
    old = {k: v.clone() for k, v in drafter.state_dict().items()}
    narrow = drafter.cfg.intermediate_size
    losses = []
    for widen in (False, True):
        if widen:
            widen_mlp(drafter, 3 * narrow, seed=1)
        trainer = Trainer(model, drafter, small_cfg(method=method, hass_steps=2))
        prep = trainer.prepare(samples)
        loss, _ = trainer.micro_loss(prep, prep.sup.sum(1).float())
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    assert drafter.cfg.intermediate_size == 3 * narrow
    mlp = drafter.midlayer.mlp if method == "eagle3" else drafter.layers[0].mlp
    assert mlp.gate_proj.weight.shape == (3 * narrow, drafter.cfg.hidden_size)
    assert torch.equal(mlp.down_proj.weight[:, narrow:], torch.zeros_like(mlp.down_proj.weight[:, narrow:]))
    assert mlp.up_proj.weight[narrow:].std() > 0  # drawn, not zero
    prefix = "midlayer.mlp." if method == "eagle3" else "layers.0.mlp."
    assert torch.equal(mlp.gate_proj.weight[:narrow], old[prefix + "gate_proj.weight"])
    assert torch.equal(mlp.down_proj.weight[:, :narrow], old[prefix + "down_proj.weight"])
    loss.backward()
    assert mlp.down_proj.weight.grad[:, narrow:].abs().sum() > 0  # the new columns learn first
    trainer.optimizer.step()
    assert mlp.down_proj.weight[:, narrow:].abs().sum() > 0


def _fitted_head(drafter, model, seed: int = 0) -> torch.Tensor:
    """Set drafter.lm_head to an exact linear map of the target's output embeddings of its draft ids
    (E[ids] @ A + c); returns the stacked [A; c] [Ht + 1, H]."""
    g = torch.Generator().manual_seed(seed)
    emb = model.get_output_embeddings().weight.detach().float()
    fit = torch.randn(emb.shape[1] + 1, drafter.cfg.hidden_size, generator=g) * 0.3
    ids = drafter.to_target_ids(torch.arange(drafter.cfg.draft_vocab_size))
    with torch.no_grad():
        drafter.lm_head.weight.copy_(emb[ids] @ fit[:-1] + fit[-1])
    return fit


def test_grow_draft_vocab_keeps_the_rows_and_maps_the_new_ones():
    """grow_draft_vocab (--init with a larger --draft-vocab): the kept ids' rows copied, the new ids the most
    frequent others, sorted by id with d2t / t2d rebuilt, and the new rows from the least-squares map of the
    target's embeddings (exact here: the old rows are such a map)."""
    from eaglespec.train.trainer import grow_draft_vocab

    model = sharp_target()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    old_ids = torch.randperm(vocab, generator=g)[:48].sort().values
    drafter = new_drafter(model, "eagle3", old_ids, seed=0)
    fit = _fitted_head(drafter, model)
    before = drafter.lm_head.weight.clone()
    h = torch.randn(5, drafter.cfg.hidden_size, generator=g)
    logits_before = drafter.lm_head(h)
    counts = torch.randint(0, 1000, (vocab,), generator=g)
    counts[old_ids] = 0  # the kept ids join whatever their counts
    ids = grow_draft_vocab(drafter, model, counts, 70)
    others = torch.tensor([i for i in range(vocab) if i not in set(old_ids.tolist())])
    want_new = others[torch.sort(counts[others], descending=True, stable=True).indices[:22]]
    assert torch.equal(ids, torch.cat([old_ids, want_new]).sort().values)
    assert drafter.cfg.draft_vocab_size == 70 and drafter.lm_head.weight.shape == (70, drafter.cfg.hidden_size)
    assert torch.equal(drafter.to_target_ids(torch.arange(70)), ids)
    assert torch.equal(drafter.t2d.nonzero().squeeze(1), ids)
    slot = torch.searchsorted(ids, old_ids)
    assert torch.equal(drafter.lm_head.weight[slot], before)  # the kept rows, bit for bit
    torch.testing.assert_close(drafter.lm_head(h)[:, slot], logits_before)
    emb = model.get_output_embeddings().weight.detach().float()
    new_slot = torch.searchsorted(ids, want_new)
    torch.testing.assert_close(drafter.lm_head.weight[new_slot], emb[want_new] @ fit[:-1] + fit[-1], rtol=1e-3, atol=1e-3)
    full = grow_draft_vocab(drafter, model, counts, 10 ** 6)  # capped at the target's vocabulary
    assert torch.equal(full, torch.arange(vocab)) and not drafter.d2t.any() and bool(drafter.t2d.all())


def test_grown_vocab_trains_resumes_and_saves(tmp_path):
    """train(init_from=..., draft_vocab=larger): the saved drafter has the grown vocabulary, and a run killed and
    resumed (which grows the checkpoint again before loading its state) equals the uninterrupted one."""
    model = sharp_target()
    samples = greedy_samples(model, 24, new=10, seed=2)
    src = _trained(tmp_path, model, samples)  # draft vocab 64
    cfg = small_cfg(steps=4, save_every=2, init_from=str(src), draft_vocab=80)
    full = train(model, samples, cfg, tmp_path / "a")
    train(model, samples, cfg, tmp_path / "b", stop_after=3)
    resumed = train(model, samples, small_cfg(steps=4, save_every=2), tmp_path / "b", resume=True)
    a, b = full.drafter.state_dict(), resumed.drafter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    saved = load_drafter(tmp_path / "a", target_num_layers=4)
    assert saved.cfg.draft_vocab_size == 80 and saved.manifest["hyperparameters"]["draft_vocab"] == 80
    grown = load_drafter(src, target_num_layers=4).to_target_ids(torch.arange(64))
    assert bool(saved.t2d[grown].all())  # the checkpoint's ids are all still draft ids


def test_unknown_ttt_attention_is_refused():
    model = sharp_target()
    with pytest.raises(EagleSpecError, match="--ttt-attention 'sparse'"):
        train(model, greedy_samples(model, 2, new=4), small_cfg(ttt_attention="sparse"))


def test_zero_supervised_rows_skip_the_update():
    model = sharp_target()
    s = greedy_samples(model, 2, new=4)
    for x in s:
        x.loss_mask.zero_()
    drafter = new_drafter(model, "eagle3", None, seed=0)
    before = {k: v.clone() for k, v in drafter.state_dict().items()}
    trainer = Trainer(model, drafter, small_cfg(weight_decay=0.5))
    assert trainer.train_step([s], lr=1e-2) is None
    assert all(torch.equal(before[k], v) for k, v in drafter.state_dict().items())  # no weight decay either


def _tau(model, drafter, prompts, depth=4, new=24) -> float:
    engine = SpeculativeEngine(HFTarget(model), drafter.eval(), TreeSpec("chain", depth=depth))
    acc = [engine.generate(p, max_new_tokens=new) for p in prompts]
    return sum(r.tau for r in acc) / len(acc)


def test_learning_raises_top1_and_tau(capsys):
    torch.manual_seed(0)
    model = sharp_target()
    samples = greedy_samples(model, 96, new=28, seed=1)
    cfg = small_cfg(steps=150, batch_size=8, lr=5e-3, ttt_steps=3, eval_fraction=0.1, draft_vocab=64)
    untrained = new_drafter(model, "eagle3", None, seed=0)
    res = train(model, samples, cfg)
    prompts = [s.ids[:4].tolist() for s in greedy_samples(model, 6, new=0, seed=99)]
    tau_before = _tau(model, untrained, prompts)
    tau_after = _tau(model, res.drafter, prompts)
    first = res.history[0]["acc_by_step"]
    with capsys.disabled():
        print(f"\n[train e2e] held-out top-1 by TTT step {[round(a, 3) for a in res.eval['acc_by_step']]} "
              f"(first train step {[round(a, 3) for a in first]}); tau untrained {tau_before:.2f} -> "
              f"trained {tau_after:.2f} (chain depth 4)")
    assert res.drafter.cfg.draft_vocab_size == 64
    assert res.eval["acc_by_step"][0] > 0.6 and res.eval["acc_by_step"][0] > first[0] + 0.4
    assert tau_after > tau_before + 1.0


def test_kill_and_resume_equals_uninterrupted(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 24, new=10, seed=2)
    for method in ("eagle3", "hass"):
        cfg = small_cfg(method=method, steps=6, save_every=2, hass_steps=2, draft_vocab=80)
        full = train(model, samples, cfg, tmp_path / f"{method}-a")
        train(model, samples, cfg, tmp_path / f"{method}-b", stop_after=3)  # "killed" after step 3 (saved at 2)
        resumed = train(model, samples, cfg, tmp_path / f"{method}-b", resume=True)
        a, b = full.drafter.state_dict(), resumed.drafter.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), method
        la = load_drafter(tmp_path / f"{method}-a", target_num_layers=4)
        lb = load_drafter(tmp_path / f"{method}-b", target_num_layers=4)
        assert all(torch.equal(la.state_dict()[k], lb.state_dict()[k]) for k in la.state_dict())
    with pytest.raises(EagleSpecError, match="no training_state"):
        train(model, samples, small_cfg(), tmp_path / "nothing", resume=True)


def test_pause_writes_a_checkpoint_and_resume_finishes_the_same_run(tmp_path):
    """--stop-after: the paused run is saved at the pause (not only at save_every) and resumes to the same drafter."""
    model = sharp_target()
    samples = greedy_samples(model, 24, new=10, seed=2)
    cfg = small_cfg(steps=5, draft_vocab=80, log_every=1)
    full = train(model, samples, cfg, tmp_path / "a")
    part = train(model, samples, cfg, tmp_path / "b", pause_after=3)
    assert part.steps == 3 and [m["step"] for m in part.history] == [1, 2, 3]
    state = json.loads((tmp_path / "b" / "training_state.json").read_text())
    assert (state["step"], state["total_steps"]) == (3, 5)
    assert load_drafter(tmp_path / "b", target_num_layers=4).manifest["trained_steps"] == 3
    resumed = train(model, samples, cfg, tmp_path / "b", resume=True)
    assert [m["step"] for m in resumed.history] == [4, 5]
    a, b = full.drafter.state_dict(), resumed.drafter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    log = [json.loads(x) for x in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert [m["step"] for m in log] == [1, 2, 3, 4, 5] and all(m["elapsed_s"] >= 0 for m in log)
    # a pause past the end is no pause; with a time budget it waits until the schedule is fitted (step 11 here)
    assert train(model, samples, cfg, tmp_path / "c", pause_after=9).steps == 5
    budget = train(model, samples, small_cfg(steps=500, time_budget_s=1e-3), tmp_path / "d", pause_after=3)
    assert budget.steps == 11
    # --stop-after-seconds: the first step past the time pauses the same way, and the run resumes to the same drafter
    timed = train(model, samples, cfg, tmp_path / "e", pause_after_s=1e-9)
    assert timed.steps == 1 and json.loads((tmp_path / "e" / "training_state.json").read_text())["step"] == 1
    resumed = train(model, samples, cfg, tmp_path / "e", resume=True)
    assert all(torch.equal(v, resumed.drafter.state_dict()[k]) for k, v in full.drafter.state_dict().items())
    assert train(model, samples, cfg, tmp_path / "f", pause_after_s=1e9).steps == 5
    budget = train(model, samples, small_cfg(steps=500, time_budget_s=1e-3), tmp_path / "g", pause_after_s=1e-9)
    assert budget.steps == 11


def test_rng_state_from_a_machine_with_more_gpus(monkeypatch):
    """A checkpoint written on 2 GPUs resumes on 1: only the visible devices' CUDA generators are restored."""
    from eaglespec.train import trainer as tr

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: calls.append(device))
    fake = type("T", (), {"noise_gen": torch.Generator()})()
    st = {"torch": torch.get_rng_state(), "python": __import__("random").getstate(),
          "noise": torch.Generator().get_state(), "cuda": [torch.zeros(8, dtype=torch.uint8)] * 2}
    tr._set_rng_state(fake, st)
    assert calls == [0]


def test_export_round_trip_and_manifest(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 8, new=8)
    res = train(model, samples, small_cfg(steps=2, draft_vocab=50), tmp_path / "d")
    loaded = load_drafter(tmp_path / "d", target_num_layers=4, target_hidden_size=32, target_vocab_size=96)
    loaded.set_target_embedding(model.get_input_embeddings())
    assert loaded.cfg.draft_vocab_size == 50 and torch.equal(loaded.d2t, res.drafter.d2t)
    assert list(loaded.cfg.aux_layer_ids) == list(res.drafter.cfg.aux_layer_ids) and loaded.cfg.aux_layer_ids[0] >= 2
    feats = torch.randn(5, 3 * 32)
    tok, pos = torch.tensor([4, 9, 17, 33, 40]), torch.arange(5)
    with torch.no_grad():
        ref = res.drafter.eval()(res.drafter.project(feats), tok, pos, res.drafter.new_cache())[0]
        got = loaded(loaded.project(feats), tok, pos, loaded.new_cache())[0]
    torch.testing.assert_close(got, ref)
    manifest = loaded.manifest
    assert manifest["method"] == "eagle3" and manifest["feature_layer_ids"] == list(loaded.cfg.aux_layer_ids)
    assert manifest["hyperparameters"]["ttt_steps"] == 3
    assert check_manifest(manifest, model) == []
    other = sharp_target(seed=5)
    with pytest.warns(UserWarning, match="different target"):
        assert check_manifest(manifest, other)
    with pytest.raises(EagleSpecError, match="strict"):
        check_manifest(manifest, other, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_manifest(manifest, model.to(torch.bfloat16))  # same target in another dtype: no warning


def test_eagle1_checkpoint_loads(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 8, new=8)
    res = train(model, samples, small_cfg(method="eagle1", steps=2, noise="length-scaled"), tmp_path / "e1")
    loaded = load_drafter(tmp_path / "e1", target_num_layers=4)
    assert loaded.cfg.method == "eagle1" and res.history
    assert res.history[-1]["feature_err_by_step"][0] > 0


def test_packed_target_features_match_separate_forwards():
    """Packing (segment mask + per-segment positions) gives each sample its own target features."""
    model = sharp_target()
    s = greedy_samples(model, 2, new=6)
    drafter = new_drafter(model, "eagle3", None, seed=0)
    trainer = Trainer(model, drafter, small_cfg())
    both = trainer.extractor(pack(s))
    one = trainer.extractor(pack(s[1:]))
    n0 = s[0].ids.numel()
    torch.testing.assert_close(both.features[n0:], one.features, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(both.hidden[n0:], one.hidden, atol=1e-5, rtol=1e-5)


def test_batched_target_forward_matches_per_pack():
    model = sharp_target()
    s = greedy_samples(model, 3, new=6)
    trainer = Trainer(model, new_drafter(model, "eagle3", None, seed=0), small_cfg())
    packs = [pack(s[:2]), pack(s[2:])]
    for one, many in zip([trainer.extractor(p) for p in packs], trainer.extractor.batch(packs)):
        torch.testing.assert_close(many.features, one.features, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(many.hidden, one.hidden, atol=1e-5, rtol=1e-5)


def test_batched_packs_equal_pack_by_pack():
    """EAGLE-3 runs all packs of a step in one batched drafter call: same loss and grads as one by one."""
    model = sharp_target()
    drafter = new_drafter(model, "eagle3", None, seed=0)
    trainer = Trainer(model, drafter, small_cfg(method="eagle3"))
    samples = greedy_samples(model, 6, new=10)
    preps = trainer.prepare_many([samples[:1], samples[1:3], samples[3:]])  # packs of different sizes
    counts = torch.stack([p.sup.sum(1) for p in preps]).sum(0).float()
    loss, stats = trainer.micro_loss(preps, counts)
    loss.backward()
    grads = [p.grad.clone() for p in drafter.parameters()]
    drafter.zero_grad(set_to_none=True)
    ref_loss, ref_stats = 0.0, torch.zeros_like(stats)
    for prep in preps:
        part, st = trainer.micro_loss(prep, counts)
        part.backward()
        ref_loss, ref_stats = ref_loss + part.detach(), ref_stats + st
    torch.testing.assert_close(loss.detach(), ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats, ref_stats, rtol=1e-5, atol=1e-4)
    for g, p in zip(grads, drafter.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-6)


def test_top_k_recall_is_logged_and_bounds_top_1():
    from eaglespec.train.trainer import RECALL_K, topk_hits

    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0], [5.0, 0.0, 0.0, 4.0]])
    assert int(topk_hits(logits, torch.tensor([2, 3]), k=2)) == 2  # second-best is within the top 2
    assert int(topk_hits(logits, torch.tensor([3, 0]), k=2)) == 1  # third-best misses, best hits
    model = sharp_target()
    trainer = Trainer(model, new_drafter(model, "eagle3", None, seed=0), small_cfg(method="eagle3"))
    m = trainer.train_step([greedy_samples(model, 4, new=8)], lr=1e-3)
    recall, top1 = m[f"top{RECALL_K}_recall_by_step"], m["acc_by_step"]
    assert len(recall) == len(top1) and all(r >= a for r, a in zip(recall, top1))
    assert 0 < recall[0] <= 1


def test_fitted_total_fits_the_budget_and_clamps():
    from eaglespec.train.trainer import fitted_total

    # at step 8, 4 s spent, 0.5 s/step: 10 s of budget leaves 6 s = 12 more steps
    assert fitted_total(8, 1000, 4.0, 10.0, 0.5) == 20
    assert fitted_total(8, 15, 4.0, 10.0, 0.5) == 15  # never longer than the planned run
    assert fitted_total(8, 1000, 12.0, 10.0, 0.5) == 9  # over budget already: stop after the current step
    assert fitted_total(8, 1000, 4.0, 10.0, 0.1) == 68  # the pace, not the slow warm-up steps, sets the length


def test_time_budget_shortens_the_schedule(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 24, new=10, seed=2)
    res = train(model, samples, small_cfg(steps=500, time_budget_s=1e-3), tmp_path / "budget")
    assert res.steps == 11  # 2 warm-up + 8 timed steps, then the budget is spent: one more step and the end
    assert len(res.history) <= 11
    state = json.loads((tmp_path / "budget" / "training_state.json").read_text())
    assert state["total_steps"] == 11 and state["step"] == 11
    resumed = train(model, samples, small_cfg(steps=500, time_budget_s=1e-3), tmp_path / "budget", resume=True)
    assert resumed.steps == 11  # the saved schedule is kept on resume


# -- --init: warm start from a drafter checkpoint ------------------------------------------------
def _trained(tmp_path, model, samples, **kw):
    """A drafter checkpoint trained for a few steps on `samples` (EAGLE-3, draft vocab 64)."""
    cfg = small_cfg(**({"steps": 6, "draft_vocab": 64, "lr": 5e-3} | kw))
    train(model, samples, cfg, tmp_path / "init")
    return tmp_path / "init"


def test_init_with_zero_lr_reproduces_the_checkpoint(tmp_path):
    from eaglespec.checkpoint.drafter import save_drafter

    model = sharp_target()
    samples = greedy_samples(model, 24, new=10, seed=2)
    src = _trained(tmp_path, model, samples)
    ref = load_drafter(src, target_num_layers=4)
    res = train(model, samples, small_cfg(steps=3, lr=0.0, weight_decay=0.1, init_from=str(src)), tmp_path / "b")
    got = res.drafter.state_dict()
    assert res.history and set(got) == set(ref.state_dict())
    assert all(torch.equal(ref.state_dict()[k], got[k]) for k in got)  # d2t / t2d included
    assert res.drafter.cfg.draft_vocab_size == 64
    manifest = load_drafter(tmp_path / "b", target_num_layers=4).manifest
    assert manifest["hyperparameters"]["init_from"] == str(src)
    assert manifest["init"] == {"path": str(src), "trained_steps": 6, "init": None}
    # a bf16 checkpoint is trained in fp32 (its values exactly, widened)
    save_drafter(ref, tmp_path / "bf16", manifest=ref.manifest, dtype=torch.bfloat16)
    res = train(model, samples, small_cfg(steps=1, lr=0.0, init_from=str(tmp_path / "bf16")))
    for k, v in res.drafter.state_dict().items():
        if v.is_floating_point():
            assert v.dtype == torch.float32 and torch.equal(v, ref.state_dict()[k].to(torch.bfloat16).float()), k


def test_init_continues_from_a_better_loss(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 48, new=16, seed=4)
    src = _trained(tmp_path, model, samples, steps=40)
    cfg = dict(steps=3, draft_vocab=64, lr=1e-3)
    scratch = train(model, samples, small_cfg(**cfg))
    warm = train(model, samples, small_cfg(**cfg, init_from=str(src)))
    assert warm.history[0]["loss"] < 0.8 * scratch.history[0]["loss"]
    assert warm.history[0]["acc_by_step"][0] > scratch.history[0]["acc_by_step"][0] + 0.2


def test_init_run_killed_and_resumed_equals_uninterrupted(tmp_path):
    model = sharp_target()
    samples = greedy_samples(model, 24, new=10, seed=2)
    src = _trained(tmp_path, model, samples)
    cfg = small_cfg(steps=5, save_every=2, init_from=str(src))
    full = train(model, samples, cfg, tmp_path / "a")
    train(model, samples, cfg, tmp_path / "b", stop_after=3)
    resumed = train(model, samples, small_cfg(steps=5, save_every=2), tmp_path / "b", resume=True)
    a, b = full.drafter.state_dict(), resumed.drafter.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert load_drafter(tmp_path / "b", target_num_layers=4).manifest["hyperparameters"]["init_from"] == str(src)
    with pytest.raises(EagleSpecError, match="--init and --resume together"):
        train(model, samples, cfg, tmp_path / "b", resume=True)


def test_init_refuses_a_checkpoint_that_does_not_fit(tmp_path):
    from dataclasses import replace

    from eaglespec.checkpoint.drafter import build_drafter, save_drafter
    from eaglespec.train.trainer import drafter_config, init_drafter

    from conftest import tiny_target

    model = sharp_target()
    samples = greedy_samples(model, 8, new=8)
    src = _trained(tmp_path, model, samples, steps=1)

    def refused(path, match, target=model, **kw):
        with pytest.raises(EagleSpecError, match=match) as err:
            init_drafter(path, target, small_cfg(**kw))
        assert "\n" not in str(err.value) and str(path) in str(err.value)

    refused(src, r"config.json: method eagle3 does not match --method hass", method="hass")
    refused(src, r"draft_vocab_size 64 is above --draft-vocab 50: --init grows", draft_vocab=50)
    init_drafter(src, model, small_cfg(draft_vocab=64))  # the same size is fine
    init_drafter(src, model, small_cfg(draft_vocab=80))  # a larger one is grown by train (grow_draft_vocab)
    refused(src, r"eaglespec_manifest.json: .*weight_digest.*--init refuses it", target=sharp_target(seed=5))
    refused(src, r"'vocab_size' \(96\) does not match the target's vocabulary size 128", target=tiny_target(vocab=128))
    refused(src, r"eagle_aux_hidden_state_layer_ids.*out of range", target=sharp_target(layers=2))
    base = drafter_config(model, "eagle3", 96)  # the full vocabulary: identity d2t / t2d
    for name, cfg, match in [("wide", replace(base, hidden_size=48, head_dim=12), "hidden_size 48 does not match the "
                              "target's 32"),
                             ("other", replace(base, hidden_size=48, head_dim=12, target_hidden_size=48),
                              "'target_hidden_size' \\(48\\) does not match")]:
        save_drafter(build_drafter(cfg), tmp_path / name)
        refused(tmp_path / name, match)
    e1 = tmp_path / "e1"
    train(model, samples, small_cfg(method="eagle1", steps=1), e1)
    refused(e1, r"config.json: method eagle1 does not match --method eagle3")
    d = init_drafter(e1, model, small_cfg(method="hass"))  # HASS trains the EAGLE-1 architecture
    assert not d.embed_tokens.weight.requires_grad  # the file's copy of the target embedding stays frozen
