"""eaglespec.scale on CPU: shape registry and parameter arithmetic, the floor and implied speedup, and one
end-to-end run of the measurements on the `tiny` shape."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from eaglespec import scale
from eaglespec.errors import EagleSpecError
from eaglespec.scale import (
    SHAPES,
    Settings,
    build_drafter_for,
    build_model,
    floor_ms,
    format_tables,
    get_shapes,
    implied_speedup,
    model_param_counts,
    param_counts,
    parse_tau,
)


def test_param_counts_of_published_shapes():
    """Arithmetic from the configs alone (nothing built): the published totals."""
    c8 = param_counts(SHAPES["llama-3.1-8b"])
    assert c8.total == 8_030_261_248
    assert c8.total == pytest.approx(8.0e9, rel=0.01)
    assert c8.read_per_token == c8.total - c8.embedding  # untied: the input embedding is one row per token
    c1 = param_counts(SHAPES["llama-3.2-1b"])
    assert c1.total == 1_235_814_400
    assert c1.total == pytest.approx(1.24e9, rel=0.01)
    assert c1.lm_head == 0 and c1.read_per_token == c1.total  # tied: the table is the head, read once
    assert param_counts(SHAPES["qwen3-8b"]).total == 8_190_735_360
    assert param_counts(SHAPES["smollm2-135m"]).total == 134_515_008  # the default target's shape
    c70 = param_counts(SHAPES["llama-3.1-70b-8layers"])
    assert c70.per_layer == 855_654_400
    assert param_counts(replace(SHAPES["llama-3.1-70b-8layers"], num_layers=80)).total == pytest.approx(70.55e9,
                                                                                                       rel=0.001)


def test_param_counts_match_the_built_config():
    """The arithmetic agrees with transformers' own model of each shape (on the meta device: no memory)."""
    from transformers import AutoModelForCausalLM

    for name in ("llama-3.2-1b", "qwen3-8b"):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(SHAPES[name].config())
        assert sum(p.numel() for p in model.parameters()) == param_counts(SHAPES[name]).total


@pytest.mark.parametrize("family,tied", [("llama", False), ("llama", True), ("qwen3", False)])
def test_tiny_models_built_with_the_named_counts(family, tied):
    shape = replace(SHAPES["tiny"], family=family, tie_embeddings=tied)
    model = build_model(shape, "cpu", torch.float32)
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model_param_counts(model) == param_counts(shape)
    assert sum(p.numel() for p in model.parameters()) == param_counts(shape).total
    with torch.no_grad():
        logits = model(torch.arange(3, 19)[None]).logits
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_random_drafter_shapes():
    model = build_model(SHAPES["tiny"], "cpu", torch.float32)
    full = build_drafter_for(model)
    assert full.lm_head.weight.shape == (512, 64) and full.feature_layer_ids == (2, 4, 5)
    cut = build_drafter_for(model, draft_vocab=100)
    assert cut.lm_head.weight.shape == (100, 64) and int(cut.t2d.sum()) == 100
    assert torch.equal(cut.to_target_ids(torch.arange(100)), torch.arange(100))
    with pytest.raises(EagleSpecError, match="draft vocabulary"):
        build_drafter_for(model, draft_vocab=513)


def test_floor_arithmetic():
    assert floor_ms(4.8e9, 4800) == pytest.approx(1.0)
    assert floor_ms(2 * param_counts(SHAPES["llama-3.1-8b"]).read_per_token, 4800) == pytest.approx(3.127, abs=1e-3)
    with pytest.raises(EagleSpecError, match="bandwidth"):
        floor_ms(1, 0)


def test_implied_speedup_arithmetic():
    assert implied_speedup(4.62, 3.0, 1.5) == pytest.approx(2.31)
    assert implied_speedup(2.0, 1.0, 1.0) == pytest.approx(2.0)
    with pytest.raises(EagleSpecError):
        implied_speedup(3.0, 0.0, 1.0)


def test_parse_tau_and_shapes():
    assert parse_tau(None) == {"chain": 2.95, "static": 3.55, "dynamic": 4.62}
    assert parse_tau("chain=3.0,dynamic=4.6") == {"chain": 3.0, "static": 3.55, "dynamic": 4.6}
    for bad in ("tree=3", "chain", "chain=x", "chain=-1"):
        with pytest.raises(EagleSpecError, match="--tau"):
            parse_tau(bad)
    assert [s.name for s in get_shapes("tiny, llama-3.1-8b")] == ["tiny", "llama-3.1-8b"]
    with pytest.raises(EagleSpecError, match="unknown shape 'gpt'"):
        get_shapes("tiny,gpt")


TINY = Settings(context=16, decode_steps=2, samples=1, verify_contexts=(8, 24), verify_rows=(1, 2, 4),
                draft_rows=(1, 3), round_tokens=6, round_repeats=1)


def test_measure_shape_tiny_end_to_end():
    report = scale.run(get_shapes("tiny"), replace(TINY, batches=(1, 3), batch_steps=2, predict=True), "cpu",
                       torch.float32)
    s = report["shapes"]["tiny"]
    assert s["backend"] == "fast" and s["params"] == param_counts(SHAPES["tiny"]).total
    p = s["plain"]
    assert p["ms"] > 0 and p["floor_ms"] > 0 and 0 < p["floor_pct"] < 100
    assert p["read_bytes"] == 4 * param_counts(SHAPES["tiny"]).read_per_token
    assert s["per_layer"]["ms"] >= 0 and s["per_layer"]["head_ms"] > 0
    assert set(s["verify"]) == {"8", "24"}
    for points in s["verify"].values():
        assert [q["rows"] for q in points] == [1, 2, 4]
        assert points[0]["ratio"] == 1.0 and all(q["ms"] > 0 for q in points)
    assert set(s["draft"]) == {"1", "3"} and all(v["ms"] > 0 for v in s["draft"].values())
    rounds = s["rounds"]
    assert rounds["plain"]["ms"] > 0 and rounds["plain"]["tau"] == 1.0
    for name in ("chain", "static", "dynamic"):
        r = rounds[name]
        assert r["ms"] > 0 and r["rounds"] >= 1 and r["ratio"] == pytest.approx(r["ms"] / rounds["plain"]["ms"])
        assert r["implied_speedup"] == pytest.approx(r["tau_profile"] / r["ratio"])
        assert math.isfinite(r["implied_speedup"])
    for b in ("1", "3"):
        v = s["batched"][b]
        assert v["plain"]["ms"] > 0 and v["chain"]["ms"] > 0 and v["ratio"] == pytest.approx(
            v["chain"]["ms"] / v["plain"]["ms"])
        assert v["plain"]["tokens_per_step"] == v["plain_hf"]["tokens_per_step"] == int(b)  # a token a row a step
        assert v["chain"]["tokens_per_step"] >= int(b)
    labels = [r["spec"] for r in s["predicted"]]
    assert labels[:3] == ["chain k=5", "static 5/10/25", "dynamic 7/10/60"] and len(labels) == 3 + 5
    assert all(r["measured_ms"] > 0 and r["predicted_ms"] > 0 and math.isfinite(r["error_pct"])
               for r in s["predicted"])
    json.dumps(report)  # every number JSON-ready
    text = format_tables(report)
    assert "| tiny |" in text and "R=4" in text and "| tiny | 3 |" in text and "| tiny | dynamic 7/10/60 |" in text


def test_out_of_memory_is_one_line_and_the_run_goes_on(monkeypatch):
    calls, lines = [], []

    def fake(shape, *a, **k):
        calls.append(shape.name)
        if shape.name == "llama-3.1-70b-8layers":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return {"shape": shape.name}

    monkeypatch.setattr(scale, "measure_shape", fake)
    report = scale.run(get_shapes("llama-3.1-70b-8layers,tiny"), TINY, "cpu", torch.float32, log=lines.append)
    assert calls == ["llama-3.1-70b-8layers", "tiny"]
    assert report["shapes"]["llama-3.1-70b-8layers"] == {"shape": "llama-3.1-70b-8layers", "error": "out of memory"}
    assert len(lines) == 1 and "does not fit" in lines[0]


def test_settings_refuse_bad_sizes():
    with pytest.raises(EagleSpecError, match="verify_rows"):
        Settings(verify_rows=())
    with pytest.raises(EagleSpecError, match="context"):
        Settings(context=0)
