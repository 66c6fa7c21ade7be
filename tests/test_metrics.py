"""Telemetry: summary math on hand-built rounds, a real run's calibration table + PNG, MoE router hooks."""

from __future__ import annotations

import json

import pytest
import torch

from eaglespec import EagleSpec
from eaglespec.backends.hf import HFTarget
from eaglespec.engine.loop import GenerationResult, RoundStats
from eaglespec.telemetry import ExpertTracker, format_report, plot_report, run_report, summarize
from eaglespec.tree.core import DraftTree, chain_tree

from conftest import byte_tokenizer, cycle_target, tiny_drafter


def _round(tree: DraftTree, rows: list[int], seconds=(0.1, 0.2, 0.05)) -> RoundStats:
    from eaglespec.telemetry import round_detail

    return RoundStats(drafted=tree.size - 1, accepted=len(rows) - 1, emitted=len(rows), draft_s=seconds[0],
                      verify_s=seconds[1], commit_s=seconds[2], detail=round_detail(tree, torch.tensor(rows)))


def test_summary_math_on_hand_built_rounds():
    # round 1: chain of 3, confidences 0.95, 0.5, 0.15; the first two accepted
    c1 = chain_tree(7, torch.tensor([1, 2, 3]))
    c1.logq = torch.log(torch.tensor([1.0, 0.95, 0.95 * 0.5, 0.95 * 0.5 * 0.15]))
    # round 2: a tree root -> {a (0.7), b (0.2)}, a -> c (0.9); a rejected: b tested, c never tested
    t2 = DraftTree(tokens=torch.tensor([7, 4, 5, 6]), parents=torch.tensor([-1, 0, 0, 1]),
                   depths=torch.tensor([0, 1, 1, 2]), logq=torch.log(torch.tensor([1.0, 0.7, 0.2, 0.63])),
                   stats={"expanded": 20, "kept": 3})
    res = GenerationResult([1, 2], [9, 1, 2, 8, 5], rounds=[_round(c1, [0, 1, 2]), _round(t2, [0, 2])], seconds=1.0)
    s = summarize([res])
    assert s["acceptance_length_hist"] == {"2": 1, "3": 1}
    assert s["tau"] == 2.5 and s["rounds"] == 2 and s["accepted"] == 3 and s["drafted"] == 6  # 1 + 3 / 2
    d = {row["depth"]: row for row in s["acceptance_by_depth"]}
    assert (d[1]["rounds"], d[1]["tested"], d[1]["accepted"]) == (2, 2, 2)
    assert (d[2]["rounds"], d[2]["tested"], d[2]["accepted"]) == (2, 1, 1)  # round 2's depth 2 never tested
    assert (d[3]["rounds"], d[3]["tested"], d[3]["accepted"]) == (1, 1, 0)
    cal = {b["lo"]: b for b in s["calibration"] if b["nodes"]}
    # tested nodes: 0.95 (acc), 0.5 (acc), 0.15 (rej), 0.7 (rej), 0.2 (acc); 0.9 (under a rejected parent) not
    assert {lo: (b["nodes"], b["accepted"]) for lo, b in cal.items()} == {
        0.9: (1, 1), 0.5: (1, 1), 0.1: (1, 0), 0.7: (1, 0), 0.2: (1, 1)}
    assert cal[0.9]["mean_confidence"] == pytest.approx(0.95)
    assert s["time_split"]["draft"] == pytest.approx(0.2) and s["time_split"]["other"] == pytest.approx(0.3)
    assert s["tree_nodes"] == {"expanded": 23, "kept": 6, "verified": 6, "per_round_verified": 3.0}


def _trained_cycle_pair(tok, steps: int = 30):
    """The cycle target + a drafter trained a few steps on it (next-token only: good at depth 1,
    over-confident deeper, so the calibration plot has something to show)."""
    model = cycle_target(tok)
    drafter = tiny_drafter(model, seed=1)
    target = HFTarget(model, drafter.feature_layer_ids)
    x = torch.tensor(tok.encode("aé中😀 " * 12, add_special_tokens=False))
    feats = target.forward(x).features
    n = x.numel() - 2
    opt = torch.optim.Adam(drafter.parameters(), lr=3e-3)
    for _ in range(steps):  # row t: feature f_t + token x_{t+1} -> x_{t+2} (contract 4)
        logits, _ = drafter(drafter.project(feats[:n]), x[1:n + 1], torch.arange(n), drafter.new_cache())
        loss = torch.nn.functional.cross_entropy(logits, x[2:n + 2])
        opt.zero_grad()
        loss.backward()
        opt.step()
    drafter.eval().requires_grad_(False)
    return model, drafter


def test_report_from_a_real_run(tmp_path):
    tok = byte_tokenizer()
    model, drafter = _trained_cycle_pair(tok)
    es = EagleSpec(model, tok, drafter)
    s = run_report(es, ["a", "é", "中", "x"], max_new_tokens=40, raw=True, progress=False)
    assert s["requests"] == 4 and s["new_tokens"] == 160
    assert sum(s["acceptance_length_hist"].values()) == s["rounds"]
    assert s["acceptance_by_depth"][0]["rate"] > 0.5  # the trained drafter gets depth 1 right
    tested = sum(b["nodes"] for b in s["calibration"])
    assert tested == sum(row["tested"] for row in s["acceptance_by_depth"]) > 0
    assert sum(b["accepted"] for b in s["calibration"]) == s["accepted"]
    assert s["kv_bytes"]["target_temp_bytes_max"] == 6 * s["kv_bytes"]["target_row_bytes"] > 0  # root + 5 drafts
    assert "moe_experts" not in s
    table = format_report(s)
    assert "draft confidence" in table and "depth" in table
    png = plot_report(s, tmp_path / "report.png")
    assert png.stat().st_size > 30_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(s)  # JSON-able


def test_expert_tracker_counts_distinct_experts():
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.Qwen2MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            shared_expert_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=256, decoder_sparse_step=1, mlp_only_layers=[],
                            bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = tf.Qwen2MoeForCausalLM(cfg).eval()
    tracker = ExpertTracker(model)
    assert tracker.num_moe_layers == 4
    ids = torch.tensor([[5, 9, 13, 21, 40, 41, 60]])
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    expected = sum(int(logits.topk(2, dim=-1).indices.unique().numel()) for logits in out.router_logits)
    assert tracker.finish() == [expected] and 2 <= expected <= 32
    tracker.remove()
    # through the engine: one count per verification forward, summarized
    es = EagleSpec(model, byte_tokenizer(), tiny_drafter(model))
    s = run_report(es, [[5, 9, 13]], max_new_tokens=10, progress=False)
    m = s["moe_experts"]
    assert len(m["per_verification"]) == s["rounds"] and 2 <= m["mean"] <= m["max"] <= 32
